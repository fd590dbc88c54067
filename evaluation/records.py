"""A run's figures as ``metrics.json`` holds them: one typed record, read and written through it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AbstentionRow(Record):
    answered: int = 0  # submitted an answer
    abstained: int = 0
    # ended without either: not decisions, so never counted as answered (nor in Fisher or McNemar tables)
    step_limit: int = 0
    context_limit: int = 0
    policy_error: int = 0

    def no_answer(self) -> int:
        return self.step_limit + self.context_limit + self.policy_error


class AbstentionTable(Record):
    """Gold (answerable or not) against how the episode ended: answered, abstained, or neither
    (step limit, context limit, policy error - their own columns)."""

    answerable: AbstentionRow = Field(default_factory=AbstentionRow)
    unanswerable: AbstentionRow = Field(default_factory=AbstentionRow)

    def rows(self) -> list[tuple[str, AbstentionRow]]:
        return [("answerable", self.answerable), ("unanswerable", self.unanswerable)]


class MeanInterval(Record):
    """A bootstrap interval of a mean (all None when there is nothing to average)."""

    mean: float | None
    low: float | None
    high: float | None
    confidence: float


class Verdict(Record):
    verdict: str  # "shortcut collapse" or "no shortcut collapse"
    direct_submit_rate: float
    threshold: float


class RuleCheck(Record):
    check: str
    value: int
    passed: bool = Field(alias="pass")


class FisherTest(Record):
    row: str
    table: list[list[int]]
    odds_ratio: float | None = None
    p_value: float
    significant: bool = False


class Comparison(Record):
    run: str
    alpha: float
    fisher: list[FisherTest]


class PreregistrationResult(Record):
    file: str
    passed: bool = Field(alias="pass")
    checks: list[RuleCheck]
    comparison: Comparison | None = None


class FirstChange(Record):
    """The first recorded observation a replay did not reproduce, in log order."""

    episode_id: str
    question_id: str | None
    step: int  # 0-based index of the step whose observation changed (shown as step + 1)
    position: int  # the first character that differs
    recorded: str  # the recorded observation around that character
    current: str  # what the runtime showed instead


class ReplayDrift(Record):
    """What ``--policy replay`` found over a run: how many recorded observations the current
    runtime reproduced, and where the first one that it did not differs."""

    episodes: int  # episodes replayed
    steps: int  # actions replayed
    observations_compared: int
    observations_changed: int
    episodes_changed: int  # episodes with at least one changed observation
    first_change: FirstChange | None = None


class SampleMetrics(Record):
    """``explorer eval --samples K``: each question answered K times with its own seeds."""

    samples: int  # K: episodes per question (the smallest count when a question has fewer)
    questions: int
    pass_at_k: dict[str, float]  # unbiased pass@k (Chen et al., 2021) on exact match, for k = 1, 2, 4, ... and K
    mean_answer_f1: float  # mean over questions of the mean answer F1 of their samples
    majority_answer_f1: float  # answer F1 of each question's most common (normalised) prediction
    agreement: float  # mean share of a question's samples that give its most common prediction


class RunMetrics(Record):
    """What ``explorer eval`` measured over a run's episodes (QASPER's metrics on the scored ones)."""

    episodes: int
    scored: int
    answer_f1: float | None
    answer_f1_ci95: MeanInterval
    exact_match: float | None
    sub_exact_match: float | None
    evidence_f1: float | None  # QASPER's official rule: empty predicted and gold evidence count 1.0
    evidence_f1_text_only: float | None
    evidence_f1_strict: float | None = None  # ours: an episode that never submitted nor abstained earns 0, not that 1.0
    answer_f1_by_type: dict[str, float]
    abstention: AbstentionTable
    false_abstention_rate: float | None
    missed_abstention_rate: float | None
    status: dict[str, int]
    mean_steps: float | None
    mean_tool_calls: float | None
    detector_rates: dict[str, float]
    verdict: Verdict
    api_retries: int = 0
    parity_warnings: int = 0
    hit_cap_steps: int = 0
    duplicate_lines: int = 0
    retrieval: dict[str, float | int | None] = Field(default_factory=dict)  # recall@k and MRR of search on the questions
    preregistration: PreregistrationResult | None = None
    replay: ReplayDrift | None = None  # --policy replay only
    sampling: SampleMetrics | None = None  # with --samples K > 1

    # What the terminal summary and the HTML report lead with, in this order.
    HEADLINE: ClassVar[tuple[str, ...]] = (
        "episodes",
        "answer_f1",
        "exact_match",
        "sub_exact_match",
        "evidence_f1",
        "evidence_f1_text_only",
        "evidence_f1_strict",
        "false_abstention_rate",
        "missed_abstention_rate",
        "mean_steps",
        "mean_tool_calls",
    )

    def headline(self) -> list[tuple[str, float | int | None]]:
        return [(name, getattr(self, name)) for name in self.HEADLINE]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)
