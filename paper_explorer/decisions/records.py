"""The files of a ``explorer decide`` run, each one typed record read and written through pydantic.

RUN/manifest.json    how the decisions were made (``DecisionManifest``); written first, never rewritten
RUN/decisions.jsonl  one line per question (``DecisionRecord``), appended whole and fsynced
RUN/metrics.json     the run's figures (``DecisionMetrics``), rewritten at the end
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.decisions.check_records import DecisionChecks
from paper_explorer.evaluation.records import Interval, ReliabilityBin

DECISION_RUN_VERSION: Literal[1] = 1
MANIFEST = "manifest.json"
DECISIONS = "decisions.jsonl"
METRICS = "metrics.json"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecisionManifest(Record):
    """Written before the first question; ``decide --resume`` checks a run against it."""

    decision_run_version: Literal[1] = DECISION_RUN_VERSION
    created_at: str
    command: list[str]
    file: str  # the decision file, resolved
    file_sha256: str
    corpus: list[str] | None = None  # the corpus files papers were read from, when a document names one
    corpus_sha256: str | None = None
    questions: int
    kinds: dict[str, int]
    backend: Literal["hf", "openai"]
    model: dict[str, Any]  # the model's settings, as the backend records them (weights, adapter, dtype, server)
    prompts_sha256: str
    context: int  # the most tokens a prompt and its longest option may take
    cut: Literal["none", "start", "end"]
    order: Literal["given", "reversed"]  # reversed: every question's options listed and scored last first
    mode: Literal["shared", "separate"]  # shared: the prompt's cache once for all options; separate: one pass per option
    check_reversed: bool = False  # each question read a second time, its options in the reverse order (DecisionRecord.reversed)
    versions: dict[str, str]
    git_commit: str | None
    hardware: dict[str, Any]


class CutRecord(Record):
    side: Literal["start", "end"]
    tokens: int  # document tokens dropped
    kept: int  # document tokens kept


class DecisionRecord(Record):
    """One question's reading: every option's log-likelihood and probability, in the order they
    were listed in the prompt (``options``), or why there is none (``not_measured``)."""

    question_id: str
    document_id: str
    kind: Literal["noul", "choice", "score"]
    question: str
    options: list[str]  # as listed and scored (reversed under --order reversed)
    ordered: bool  # the options run from least to most severe (in the file's order)
    label: str | None = None
    negation_of: str | None = None
    loglikelihoods: list[float] | None = None  # per option: its continuation's summed log-probability
    probabilities: list[float] | None = None  # normalised over the options
    log_mass: float | None = None  # log of the options' total probability under the model
    predicted: str | None = None  # the likeliest option
    p_max: float | None = None
    confidence: float | None = None  # (K * p_max - 1) / (K - 1)
    correct: bool | None = None  # predicted == label, where there is a label
    option_tokens: list[int]  # each option's continuation length, its end-of-turn token included
    prompt_tokens: int | None = None
    prompt_sha256: str | None = None
    document_tokens: int
    cut: CutRecord | None = None
    cached_tokens: int | None = None  # prompt tokens reused from the previous question's cache
    forward_passes: int | None = None
    seconds: float = Field(ge=0)
    not_measured: str | None = None
    reversed: DecisionRecord | None = None  # decide --check-reversed: this question again, its options listed in reverse

    @property
    def measured(self) -> bool:
        return self.probabilities is not None


class KindFigures(Record):
    """Top-label calibration of one kind: the likeliest option's probability against whether it
    is the label, over the measured questions that have a label."""

    kind: str
    questions: int  # of this kind
    measured: int
    labelled: int  # measured, with a label: the figures' n
    mean_options: float
    mean_confidence: float | None  # the statistic (K * p_max - 1) / (K - 1), over measured questions
    mean_p_max: float | None
    accuracy: float | None = None
    bins: int
    ece_equal_width: float | None = None
    ece_equal_width_ci95: Interval | None = None
    ece_equal_mass: float | None = None
    ece_equal_mass_ci95: Interval | None = None
    brier: float | None = None  # multi-class: sum over options of (p - [option is the label])^2
    brier_ci95: Interval | None = None
    nll: float | None = None  # -log of the label's probability (clipped at nll_clip)
    nll_ci95: Interval | None = None
    nll_clip: float
    temperature: float | None = None  # where a calibration was applied: the kind's fitted temperature
    reliability_equal_width: list[ReliabilityBin] = Field(default_factory=list)
    reliability_equal_mass: list[ReliabilityBin] = Field(default_factory=list)


class DecisionMetrics(Record):
    questions: int
    measured: int
    not_measured: int
    cut: int  # questions whose document was cut to fit
    kinds: dict[str, KindFigures]
    option_tokens_scored: int
    seconds: float  # scoring time, summed over questions
    checks: DecisionChecks | None = None  # the consistency checks' figures (decisions.checks)


__all__ = [
    "DECISIONS",
    "DECISION_RUN_VERSION",
    "MANIFEST",
    "METRICS",
    "CutRecord",
    "DecisionManifest",
    "DecisionMetrics",
    "DecisionRecord",
    "KindFigures",
]
