"""What training writes about itself: each validation, and the run's summary, as typed records.

``validation.jsonl`` holds one ``ValidationRecord`` per line; ``training_summary.json`` is a
``TrainingSummary``. Unset (None) fields stay out of the JSON."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import Sparse
from evaluation.records import AbstentionTable


class TeacherForced(Sparse):
    """Loss and token accuracy on assistant tokens, by turn type (tool-call turns, the final turn,
    all), and the probability that the first action starts with submit/abstain."""

    loss_tool: float | None = None
    accuracy_tool: float | None = None
    loss_final: float | None = None
    accuracy_final: float | None = None
    loss_all: float | None = None
    accuracy_all: float | None = None
    first_action_end_probability: float | None = None


class Behaviour(Sparse):
    """Greedy validation episodes with the weights being trained, scored like ``explorer eval``."""

    episodes: int = 0
    answer_f1: float | None = None
    exact_match: float | None = None
    direct_submit_rate: float | None = None
    abstention: AbstentionTable | None = None
    tool_calls_before_submit: float | None = None
    status: dict[str, int] | None = None


class ValidationRecord(Sparse):
    step: int
    epoch: float | None = None
    seconds: float = 0.0
    teacher_forced: TeacherForced = Field(default_factory=TeacherForced)
    behaviour: Behaviour = Field(default_factory=Behaviour)
    checkpoint: str | None = None  # None: an --eval-steps validation, which makes no checkpoint


class Selection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    criterion: str
    best_checkpoint: str | None = None
    warnings: list[str] = Field(default_factory=list)


class TrainingSummary(Selection):
    train_loss: float
    steps: int
    seconds: float
    losses: list[float]
    checkpoints: list[ValidationRecord]
