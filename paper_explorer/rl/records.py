"""What an rl run records: each episode's reward (``rewards.jsonl``), each round's update and the
round as a whole (``round.json``), and the run's summary (``rl_summary.json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.sft.records import Behaviour


class EpisodeReward(BaseModel):
    """One sampled episode's reward, its parts, and its advantage in its group."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    question_id: str | None
    sample: int
    status: str
    reward: float
    parts: dict[str, float]
    advantage: float
    sampled_tokens: int  # tokens the model drew in the episode (all its calls)


class UpdateRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    minibatches: int
    sequences: int
    tokens_trained: int
    loss: list[float]
    grad_norm: list[float]
    ratio_mean: float | None
    clip_fraction: float | None
    kl: float | None
    sampler_logprob_gap: float | None
    sampler_logprob_gap_max: float | None
    first_step_ratio_gap_max: float | None = None  # max |ratio - 1| at the first minibatch (rl.update)
    old_logprobs_recomputed: int = 0  # sequences whose ratio's denominator the update recomputed (a server's raw log-probabilities)


class RoundRecord(BaseModel):
    """Everything one round measured (``round.json``)."""

    model_config = ConfigDict(extra="forbid")

    round: int
    sampled_with: str  # the adapter sampled, or "base"
    questions: int
    episodes: int
    groups: int
    groups_without_signal: int  # groups whose rewards were all equal: advantage 0, nothing to learn
    reward_mean: float
    reward_std: float
    reward_parts: dict[str, float]  # each part's mean over the episodes (before its weight)
    advantage_abs_mean: float
    status: dict[str, int]
    detector_rates: dict[str, float]
    answer_f1: float | None  # of the samples
    direct_submit_rate: float
    sampled_tokens: int
    sampled_tokens_per_episode: float
    steps_per_episode: float
    update: UpdateRecord
    adapter: str  # the adapter the update wrote (round-N/update/adapter)
    adapter_files: dict[str, str]  # its files' SHA-256: checked before the next round samples it
    optimizer_sha256: str | None = None  # AdamW's state the next round continues from, checked with the adapter
    validation: Behaviour
    seconds: dict[str, float] = Field(default_factory=dict)  # sampling, update, validation: the last session's


class RLSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int
    reward_mean: list[float]  # per round
    criterion: str
    best_round: int | None  # 0: the starting weights were best
    best_adapter: str | None  # None: the starting weights had no adapter (the base) or nothing qualified
    warnings: list[str] = Field(default_factory=list)
