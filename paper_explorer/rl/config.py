"""``RLConfig``: every setting of ``explorer rl`` (``rl.run.reinforce``), declared once with its
default, help text and bounds. The ``[policy]`` and ``[episode]`` tables are eval's: the policy
that samples (hf in this process, openai on a vLLM server, or the memory reader over either) and
the episodes' budgets; the rest is the update and the reward. Recorded whole in ``OUT/rl.json``:
a rerun with other settings is refused, so a resumed run trains exactly what an uninterrupted one
would.

```toml
rounds = 10
questions_per_round = 8
group_size = 4

[policy]                # the sampler: its model is the base the adapter trains on
name = "hf"
model = ".models/smollm2-135m-instruct"
adapter = "runs/sft/checkpoint-24"   # round 1 samples it and the update starts from it
temperature = 1.0

[reward]                # part -> weight (rl.rewards): the default makes the direct submit unprofitable
answer_f1 = 1.0
direct_submit = -1.0
format_errors = -0.2
```
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from paper_explorer.agent.config import Config, PolicySettings, RunConfig
from paper_explorer.agent.policy_registry import SettingRefused, make_config
from paper_explorer.agent.trajectory import MAX_STEPS, EpisodeConfig
from paper_explorer.corpus.setting_names import setting
from paper_explorer.rl.rewards import DEFAULT_REWARD, check_reward
from paper_explorer.sft.config import BASE_MODEL, REPORTERS, TARGET_MODULES

# The policies whose episodes can be trained on: a model whose sampled ids and log-probabilities
# are recorded (agent.trajectory.Sampled), in this process or on a server.
SAMPLERS = ("hf", "openai", "memory-reader")
# Sampling is the point of RL: a policy given no temperature samples at this one (TRL's and verl's default).
DEFAULT_TEMPERATURE = 1.0


class RLConfig(Config):
    """On-policy rounds: sample ``group_size`` episodes per question with the current adapter,
    reward them, and update the adapter with a group-relative policy gradient."""

    policy: PolicySettings = Field(default_factory=lambda: make_config("hf"), description="The policy that samples and its settings.")
    # episode.seed seeds the whole run: round N's episodes take seed + N, the new adapter and the minibatches too
    episode: EpisodeConfig = EpisodeConfig(max_steps=6)
    corpus: str | None = Field(None, description="The corpus whose train split is sampled, as named (default: the demo corpus).")
    rounds: int = Field(10, ge=1, le=100_000, description="Rounds of sample -> reward -> update -> validate.")
    questions_per_round: int = Field(
        8, ge=1, description="Train questions a round samples; rounds take the next ones in order, wrapping around the split."
    )
    group_size: int = Field(4, ge=2, le=1000, description="Episodes per question per round (G): the group its advantages compare.")
    advantage: Literal["grpo", "rloo"] = Field(
        "grpo", description="grpo (reward minus the group mean, over the group's std) or rloo (minus the mean of the others)."
    )
    scale_rewards: bool = Field(True, description="grpo: divide by the group's standard deviation (off: Dr. GRPO's unscaled advantage).")
    loss_normalization: Literal["token", "episode"] = Field(
        "token",
        description="token: every trained token weighs the same (DAPO, TRL's default); episode: each episode's tokens averaged first.",
    )
    clip_epsilon: float = Field(0.2, gt=0, lt=1, description="The ratio to the sampler's probability is clipped to 1 +- epsilon.")
    kl_beta: float = Field(
        0.001, ge=0, le=100, description="Weight of the KL penalty toward the frozen base (the adapter disabled); 0: none."
    )
    learning_rate: float = Field(2e-5, gt=0, le=1, description="AdamW's learning rate, constant over the rounds.")
    minibatches: int = Field(2, ge=1, description="Optimizer steps per round: the round's episodes split into this many.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradients are clipped to this norm before each step.")
    lora_r: int = Field(8, ge=1, description="LoRA rank of a new adapter (one given as policy.adapter keeps its own).")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling numerator of a new adapter.")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on LoRA inputs (0: the trained log-probabilities are the sampler's at the first step)."
    )
    target_modules: list[str] = Field(default_factory=lambda: list(TARGET_MODULES), description="The projections a new adapter adapts.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass: less memory, slower steps.")
    reward: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_REWARD),
        description="Reward parts and their weights (rl.rewards): answer metrics, correct_abstention, detectors.",
    )
    ray: str | None = Field(
        None,
        min_length=1,
        pattern=r"^\S+$",
        description="Run each round's sampling and validation episodes as tasks on this Ray cluster (HOST:PORT, auto).",
    )
    validation_episodes: int = Field(8, ge=0, description="Greedy validation episodes per round (and before round 1).")
    validation_max_steps: int = Field(6, ge=1, le=MAX_STEPS, description="Actions per validation episode.")
    validation_max_new_tokens: int = Field(256, ge=1, description="Tokens per action of a validation episode.")
    max_direct_submit_rate: float = Field(
        0.25, ge=0, le=1, description="Only a round whose validation episodes submit at once less often than this is selected."
    )
    selection_metric: Literal["answer_f1", "exact_match"] = Field(
        "answer_f1", description="Selects the best round among those under max_direct_submit_rate: answer_f1 or exact_match."
    )
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        "none", description="Also send each round's figures to tensorboard (OUT/runs), wandb, or none. Each needs its package installed."
    )

    @model_validator(mode="before")
    @classmethod
    def _sampling_by_default(cls, data: Any) -> Any:
        """The policy is hf unless named, of the reference recipe's model unless given one, and samples
        at DEFAULT_TEMPERATURE unless given one."""
        if isinstance(data, dict):
            policy = data.get("policy")
            if policy is None or isinstance(policy, dict):
                policy = {"name": "hf", **(policy or {})}  # hf: a model in this process is what rl samples by default
                if policy["name"] in SAMPLERS:
                    policy.setdefault("temperature", DEFAULT_TEMPERATURE)
                    policy.setdefault("model", BASE_MODEL)  # the reference recipe's, as explorer train's
                data = {**data, "policy": policy}
        return data

    @field_validator("policy")
    @classmethod
    def _a_sampling_model(cls, policy):
        if policy.name not in SAMPLERS:
            raise ValueError(f"explorer rl trains a model: {setting('policy.name')} is one of {', '.join(SAMPLERS)}, not {policy.name!r}")
        if getattr(policy, "temperature", 0) == 0:
            raise ValueError(f"explorer rl learns from samples: {setting('policy.temperature')} must be above 0 (e.g. 1.0)")
        if getattr(policy, "api", "completions") == "chat":
            raise ValueError(f"explorer rl trains on token ids: {setting('policy.api', 'chat')} returns text; use the completions API")
        if getattr(policy, "served_adapter", None) is not None:
            raise ValueError("policy.served_adapter is set by explorer rl for each round; remove it from the config")
        return policy

    @field_validator("reward")
    @classmethod
    def _known_parts(cls, reward: dict[str, float]) -> dict[str, float]:
        return check_reward(reward)

    @field_validator("report_to")
    @classmethod
    def _reporter(cls, value: str) -> str:
        assert value in REPORTERS
        return value

    @model_validator(mode="after")
    def _steps_of_whole_episodes(self) -> RLConfig:
        """A minibatch holds whole episodes: more optimizer steps than a round's episodes cannot be taken."""
        episodes = self.questions_per_round * self.group_size
        if self.minibatches > episodes:
            raise SettingRefused(
                f"{setting('minibatches', self.minibatches)} is more than a round's {episodes} episodes "
                f"({setting('questions_per_round')} x {setting('group_size')}); give at most {episodes}"
            )
        return self

    def sampling_run(self) -> RunConfig:
        """What a round's sampling runs with, besides its adapter and seed (rl.rounds)."""
        return RunConfig(policy=self.policy, episode=self.episode.model_copy(update={"record_prompt_ids": True, "record_sampled": True}))
