"""The settings of sft's entry points, each declared once with its default, help text and bounds:
``TrainConfig`` (``explorer train``, ``sft.train.train``), ``BuildConfig`` (``explorer sft
build``, ``sft.build.build_dataset``) and ``ImproveSettings`` (``explorer improve``,
``sft.improve.improve``). Each is a frozen pydantic model that refuses unknown fields; a flag, a
TOML file (``--config``) and a Python caller all go through it, so all three get the same defaults.

Each field's ``description`` is its help text and its ``Field`` bounds are the only bounds: the
command's flags are made from them (``cli.flags``), never restated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from paper_explorer.agent.config import THREADS_HELP
from paper_explorer.agent.trajectory import MAX_STEPS

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
REPORTERS = ("none", "tensorboard", "wandb")
BASE_MODEL = "Qwen/Qwen3-8B"  # the reference recipe's base model, for train and improve alike


class TrainConfig(BaseModel):
    """The reference recipe by default (Qwen3-8B on one 24 GB L4). Every field can be set in a TOML
    file (``explorer train --config``) or by a Python caller, and every field but one has a flag
    generated from it (``cli.flags``: its description is the help, its bounds the flag's):
    gradient_checkpointing is set in the file only (``cli.flags`` says why).
    A checkpoint records the whole config, and a resume refuses one that differs
    (``sft.checkpoints.RESUMABLE_CHANGES`` names the fields that may)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str = Field(BASE_MODEL, description="Base model: a directory or hub id.")
    quantization: Literal["auto", "4bit", "none"] = Field(
        "auto", description="auto (4-bit NF4 on CUDA, full precision on CPU), 4bit or none."
    )
    threads: int | None = Field(None, ge=1, le=1024, description=THREADS_HELP)
    lora_r: int = Field(4, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(8, ge=1, description="LoRA scaling numerator (the update is scaled by alpha / r).")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the input of each LoRA layer.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(TARGET_MODULES), description="The projections LoRA adapts (by default every attention and MLP one)."
    )
    learning_rate: float = Field(2e-4, gt=0, description="AdamW's learning rate at the start; it decays linearly to 0.")
    batch_size: int = Field(1, ge=1, description="Examples per process in one forward pass.")
    gradient_accumulation_steps: int = Field(4, ge=1, description="Forward passes per optimizer step.")
    max_length: int = Field(8192, ge=128, description="Longest example in tokens; data with longer ones is refused.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass: less memory, slower steps.")
    epochs: float = Field(2, gt=0, description="Passes over the training data (a fraction stops part-way).")
    max_steps: int = Field(-1, ge=-1, description="Optimizer steps to train, instead of epochs (-1: train by epochs).")
    eval_steps: int | None = Field(None, ge=1, description="Also validate every N optimizer steps (logged, not checkpointed).")
    save_steps: int | None = Field(
        None, ge=1, description="Also save (and validate) a checkpoint every N optimizer steps, besides one per epoch."
    )
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        "none",
        description="Also send the loss and the validation figures (eval/direct_submit_rate, eval/answer_f1, ...) "
        "to tensorboard (OUT/runs), wandb, or none. Each needs its package installed.",
    )
    seed: int = Field(0, description="Seeds the LoRA weights, the order of the examples and dropout.")
    validation_examples: int = Field(64, ge=1, description="Teacher-forced metrics on at most this many validation examples.")
    validation_episodes: int = Field(16, ge=0, description="Greedy validation episodes per checkpoint.")
    validation_max_steps: int = Field(6, ge=1, le=MAX_STEPS, description="Actions per validation episode.")
    validation_max_new_tokens: int = Field(256, ge=1, description="Tokens per action of a validation episode.")
    max_direct_submit_rate: float = Field(
        0.25, ge=0, le=1, description="Only a checkpoint whose validation episodes submit at once less often than this is selected."
    )
    selection_metric: Literal["answer_f1", "exact_match"] = Field(
        "answer_f1", description="Selects the best checkpoint among those under max_direct_submit_rate: answer_f1 or exact_match."
    )

    @field_validator("max_steps")
    @classmethod
    def _steps_or_epochs(cls, steps: int) -> int:
        if steps == 0:  # the Trainer would read 0 as "train by epochs" without a word
            raise ValueError("max_steps is -1 (train by epochs) or at least 1")
        return steps


def load_config(path: Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """The recipe from a TOML file (or the defaults), the flags winning; read as every config is."""
    from paper_explorer.agent.config import load_config as load_any_config

    return load_any_config(TrainConfig, path, overrides)


class BuildConfig(BaseModel):
    """How trajectories become training examples; recorded whole as ``settings`` in the build
    report (``sft.records.BuildReport``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_answer_f1: float = Field(0.5, ge=0, le=1, description="Keep submitted answers at least this good.")
    keep_correct_abstentions: bool = Field(True, description="Keep correct abstentions (on unanswerable questions).")
    max_length: int = Field(8192, ge=128, description="Longest example in tokens.")
    overflow: Literal["drop", "split"] = Field("drop", description="Longer examples: drop, or split (keep the whole turns that fit).")
    validation_share: float = Field(0.2, ge=0, le=0.9, description="Share of papers held out for validation.")
    evaluation_split: Literal["train", "validation", "test", "none"] = Field(
        "test", description="Split kept out of training entirely (none to disable)."
    )
    train_thinking: bool = Field(False, description="Thinking-mode trajectories: train the think blocks too, not only the actions.")
    best_of: int | None = Field(
        None,
        ge=1,
        description="Keep per question at most N successful attempts, the best (answer F1, "
        "then fewer steps, more tool use); never a direct submit (one that answers before any research showed it anything).",
    )


class ImproveSettings(BaseModel):
    """Expert iteration's settings (``sft.improve``), recorded whole in ``OUT/improve.json``: a
    rerun with other settings is refused. The round's training takes ``TrainConfig``'s recipe
    for everything not named here."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str = Field(BASE_MODEL, description="Base model: a directory or hub id.")
    adapter: str | None = Field(None, description="A LoRA adapter to sample round 1 with (default: the base model).")
    corpus: str | None = Field(None, description="The corpus whose train split is sampled, as named (default: the demo corpus).")
    rounds: int = Field(2, ge=1, description="Rounds of sample -> filter -> build -> train -> validate.")
    samples: int = Field(4, ge=1, description="Attempts per question per round.")
    temperature: float = Field(0.7, gt=0, le=10, allow_inf_nan=False, description="Sampling temperature of the attempts.")
    limit: int | None = Field(None, ge=1, description="Only the first N train questions each round.")
    best_of: int = Field(1, ge=1, description="Successful attempts kept per question.")
    seed_data: list[str] = Field(default_factory=list, description="Trajectories added to every round's data (e.g. sft teach's).")
    max_steps: int = Field(10, ge=1, le=MAX_STEPS, description="Actions per episode, sampled and validated.")
    max_new_tokens: int = Field(512, ge=1, description="Tokens per action of a sampled episode.")
    train_max_steps: int | None = Field(None, ge=1, description="Optimizer steps per round (default: the recipe's epochs).")
    validation_episodes: int = Field(16, ge=0, description="Greedy validation episodes per checkpoint.")
    quantization: Literal["auto", "4bit", "none"] = Field(
        "auto", description="auto (4-bit NF4 on CUDA, full precision on CPU), 4bit or none, as explorer train."
    )
    base_url: str | None = Field(None, description="Sample on a vLLM server with runtime LoRA loading instead of in-process.")
    seed: int = Field(0, description="Seeds the sampling (round N's episodes take seed + N) and training.")

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} must start with http:// or https://")
        return url
