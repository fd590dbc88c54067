"""What sft/ writes, as typed records.

Built data: ``train.jsonl`` and ``validation.jsonl`` hold one ``Example`` per line,
``build_report.json`` is a ``BuildReport``. Training: ``validation.jsonl`` holds one
``ValidationRecord`` per line, ``training_summary.json`` is a ``TrainingSummary``, and every
checkpoint's ``explorer_manifest.json`` is a ``CheckpointManifest``. Unset (None) fields of
sparse records stay out of the JSON."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.agent.trajectory import Record, Sparse
from paper_explorer.evaluation.records import AbstentionTable


class Turn(Record):
    """One assistant turn of an example: its trained span [start, end) and where the turn ends."""

    start: int
    end: int
    type: Literal["tool", "final"]  # final: the action submits or abstains
    end_of_turn: int


class Example(Record):
    """One training sequence: a whole trajectory through the renderer, labels -100 but on assistant tokens."""

    episode_id: str
    question_id: str | None
    paper_id: str
    question: str
    first_action_submits: bool  # a direct submit (agent.trajectory.is_direct_submit); the name built files have
    input_ids: list[int]
    labels: list[int]
    turns: list[Turn]
    split_at_turn: int | None = None  # cut after this many whole turns to fit max_length


class DataStatistics(Sparse):
    trajectories: int = 0
    turns_per_trajectory: float | None = None
    tokens: int | None = None
    tokens_per_trajectory: float | None = None
    max_tokens: int | None = None
    trained_tokens: int | None = None
    trained_token_share: dict[str, float] | None = None  # by turn type
    first_action_submits_share: float | None = None  # of direct submits (agent.trajectory.is_direct_submit)


class SplitCheck(Record):
    """No paper or question id may be shared between train, validation and evaluation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    passed: bool = Field(alias="pass")
    overlaps: dict[str, list[str]] = Field(default_factory=dict)


class ParityReport(Record):
    """``sft build``'s parity check of every trajectory against the tokenizer it builds with."""

    trajectories: int
    steps: int
    served_records: int  # steps that recorded the prompt they were served
    mismatches: int
    first_mismatch: str | None = None
    allowed: bool = False  # --allow-parity-mismatch: built anyway


class BuildReport(Record):
    trajectories_read: int
    sources: list[str]
    kept: dict[str, int]
    dropped: dict[str, int]
    split_at_turn_boundary: int
    settings: dict[str, Any]
    split_check: SplitCheck
    tokenizer: str
    tokenizer_sha256: str
    chat_template: dict[str, Any] | None = (
        None  # the renderer's check of the template (agent.renderer.TemplateCheck); None before it existed
    )
    corpus: list[str]
    corpus_sha256: str
    questions_sha256: str
    statistics: dict[str, DataStatistics]
    parity: ParityReport | None = None  # None in reports written before the check existed


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
    format_error_rate: float | None = None  # share of the episodes' steps whose text held no action
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
    """The whole run, across every --resume: ``losses`` holds the loss of each step 1..``steps``
    (the Trainer's log history, which a checkpoint carries) and ``train_loss`` is their mean;
    ``seconds`` is the last session's wall time, which trained steps ``resumed_from_step`` + 1 .. ``steps``."""

    train_loss: float
    steps: int
    seconds: float
    losses: list[float]
    checkpoints: list[ValidationRecord]
    resumed_from_step: int = 0  # 0: the last session started the run


class CheckpointManifest(Record):
    """``explorer_manifest.json`` in every checkpoint: what it was trained from, its validation, its files.

    Written last, after every process has saved its part: a checkpoint directory without it was
    cut off while saving and is never resumed from. A checkpoint saved because training was
    interrupted (Ctrl-C) says so and carries no validation (it was not run); it can be resumed
    from with ``explorer train --resume`` but is never selected."""

    base_model: str
    quantized: bool
    config: dict[str, Any]
    data: str
    data_build_report_sha256: str
    data_tokenizer_sha256: str | None = None
    validation: ValidationRecord | None  # None: not validated (an interrupted checkpoint)
    interrupted: bool = False  # saved at the end of the step during which Ctrl-C came
    step: int | None = None  # None in manifests written before the field existed
    files: dict[str, str]  # SHA-256 of every file, by path relative to the checkpoint
