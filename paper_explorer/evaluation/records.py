"""A run's figures as ``metrics.json`` holds them: one typed record, read and written through it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

from paper_explorer.evaluation.answer_metrics import MetricValues, answer_metrics, flat_schema, flattened, gathered, registered_only


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AbstentionRow(Record):
    answered: int = 0  # submitted an answer
    abstained: int = 0
    # ended without either: not decisions, so never counted as answered (nor in Fisher or McNemar tables)
    step_limit: int = 0
    context_limit: int = 0
    policy_error: int = 0
    no_answer: int = 0  # the policy's own answer was invalid (the memory reader's: empty, or cut at its cap)

    def undecided(self) -> int:
        """Episodes that neither answered nor abstained (every column but the first two)."""
        return self.step_limit + self.context_limit + self.policy_error + self.no_answer


class AbstentionTable(Record):
    """Gold (answerable or not) against how the episode ended: answered, abstained, or neither
    (step limit, context limit, policy error, no answer - their own columns)."""

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
    value: int | float | None  # a count of abstentions; an ECE (the calibration rule); None: nothing to measure
    passed: bool = Field(alias="pass")


class FisherTest(Record):
    """Fisher's exact test on run x (abstained, answered), the unpaired design (``evaluation.stats``):
    a preregistered comparison's, judged against its alpha, and ``explorer compare``'s, secondary there."""

    row: str  # "unanswerable" or "answerable" gold
    table: list[list[int]]
    odds_ratio: float | None = None  # None: infinite or undefined (a zero cell)
    p_value: float
    significant: bool | None = None  # p_value < the preregistered alpha; None where no alpha was set (compare)
    design: Literal["unpaired"] = "unpaired"


class Comparison(Record):
    run: str
    alpha: float
    fisher: list[FisherTest]


class PreregistrationResult(Record):
    file: str
    passed: bool = Field(alias="pass")
    checks: list[RuleCheck]
    comparison: Comparison | None = None
    # rules this command cannot judge, each with the command that does (a [calibration] rule that
    # pins a calibration file: explorer calibrate apply); None when there are none
    pending: list[str] | None = None


class Interval(Record):
    """A seeded percentile bootstrap interval of a figure, resampling episodes."""

    low: float
    high: float
    confidence: float = 0.95
    resamples: int


class ReliabilityBin(Record):
    """One bin of a reliability diagram: the episodes whose probability fell in it, their mean
    probability (confidence) and how often the label held (accuracy); None for an empty bin."""

    low: float  # the bin's edges: fixed (equal-width), or its least and greatest probability (equal-mass)
    high: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


class ProbeMass(Record):
    """How much of the model's next-token distribution one probe's options held (``mass``, before
    renormalising), over the episodes that measured it: a probe the model does not answer with its
    options renormalises noise, and its probabilities measure no belief."""

    measured: int  # episodes with probabilities and a recorded mass
    mean: float
    min: float
    min_mass: float  # the run's probe_min_mass
    below: int  # episodes under it: kept out of calibration figures


class ProbeCalibration(Record):
    """``evaluation.calibration``: how well one probe's probability of its first option (its
    affirmative, "yes") predicts the label, over the episodes that measured it and have one."""

    probe: str  # "answerable", "correct"
    label: str  # the label definition (evaluation.calibration.LABELS): "gold-answerable", "answer-f1>=0.5"
    option: str  # the option whose probability is judged (the probe's first)
    n: int  # episodes with a probability and a label
    positives: int  # of them, where the label held
    not_measured: int  # episodes whose probe was recorded without probabilities (over the context)
    low_mass: int = 0  # episodes left out: the options held less of the distribution than the run's minimum
    bins: int
    ece_equal_width: float
    ece_equal_width_ci95: Interval
    ece_equal_mass: float
    ece_equal_mass_ci95: Interval
    brier: float
    brier_ci95: Interval
    nll: float  # mean negative log-likelihood (natural log), probabilities clipped to [nll_clip, 1 - nll_clip]
    nll_ci95: Interval
    nll_clip: float
    accuracy: float  # the argmax option against the label
    reliability_equal_width: list[ReliabilityBin]
    reliability_equal_mass: list[ReliabilityBin]


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


class BenchmarkFigures(Record):
    """One benchmark/subset of a run (``evaluation.benchmarks``), as its released tables report it:
    the means over its scored episodes, every episode in the denominator (one that failed, ran
    out of its limits or gave no valid answer scores 0 and is counted in ``failed`` or ``no_answer``)."""

    questions: int
    episodes: int  # questions x samples
    exact_match: float | None  # None: an episode was scored before the metric existed
    f1: float | None
    f1_metric: str  # the answer metric that is this benchmark's F1: answer_f1 (LongBench's qa_f1_score) or hotpotqa_f1
    sub_exact_match: float | None  # bidirectional, substring (sub_exact_match_substring)
    failed: int  # ended at a step or context limit, or in a policy error
    no_answer: int  # the policy's own answer was invalid (agent.policies.base.NoAnswer: empty, or cut at its cap)


class MacroAverage(Record):
    """LongBench's QA average as its released tables report it: the mean of its five subsets'
    means (each subset weighs the same, whatever its size); None when a subset is missing."""

    subsets: list[str]
    exact_match: float | None
    f1: float | None
    sub_exact_match: float | None
    missing: list[str]  # the subsets the run has no question of


class BenchmarkTables(Record):
    """The per-benchmark tables of a run whose questions carry ``Question.benchmark``."""

    by_benchmark: dict[str, BenchmarkFigures]  # by "benchmark/subset", sorted
    longbench_qa: MacroAverage | None = None  # None: the run has no longbench question


class DerivedFrom(Record):
    """What scores.jsonl and metrics.json were computed from, as ``evaluation.derived`` digests it:
    ``Run.load`` refuses a run whose log or scores are no longer these."""

    episodes: int = Field(ge=0)  # the log's counted episodes, one line of scores.jsonl each
    episodes_sha256: str  # evaluation.derived.episodes_sha256: their records without wall-clock fields, in log order
    scores_sha256: str  # evaluation.derived.scores_sha256: scores.jsonl's records, in order


def _without_intervals(schema: dict[str, Any]) -> None:
    """metrics.json's schema: its answer metrics flat, each interval after its metric (``answer_metrics.flat_schema``)."""
    interval = schema["properties"].pop("answer_intervals")["additionalProperties"]
    flat_schema(schema, "answer_metrics", {"anyOf": [{"type": "number"}, {"type": "null"}]}, interval)


FIGURE: TypeAdapter[float] = TypeAdapter(float)
INTERVAL: TypeAdapter[MeanInterval] = TypeAdapter(MeanInterval)


class RunMetrics(MetricValues, Record):
    """What ``explorer eval`` measured over a run's episodes (QASPER's metrics on the scored ones)."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra=lambda schema, _: _without_intervals(schema),
    )

    episodes: int
    scored: int
    # each answer metric (evaluation.answer_metrics) over the scored episodes, by name: None when
    # none was scored, or when the run was scored before the metric existed. Written flat, here,
    # each followed by NAME_ci95 where the metric declares an interval (answer_intervals).
    answer_metrics: dict[str, float | None] = Field(default_factory=dict)
    answer_intervals: dict[str, MeanInterval] = Field(default_factory=dict)
    answer_f1_by_type: dict[str, float]
    # per benchmark/subset and LongBench's QA average (evaluation.benchmarks); None: no question carries a benchmark
    benchmarks: BenchmarkTables | None = None
    abstention: AbstentionTable
    false_abstention_rate: float | None
    missed_abstention_rate: float | None
    status: dict[str, int]
    mean_steps: float | None
    mean_tool_calls: float | None
    # tokens spent (evaluation.tokens): over the episodes that made a model call; None when none did
    mean_model_tokens: float | None = None
    median_model_tokens: float | None = None
    # the memory reader's document and what its token budget left unread; None for runs without reading records
    mean_document_tokens: float | None = None
    mean_unread_tokens: float | None = None
    detector_rates: dict[str, float]
    verdict: Verdict
    api_retries: int = 0
    parity_warnings: int = 0
    hit_cap_steps: int = 0
    duplicate_lines: int = 0
    retrieval: dict[str, float | int | None] = Field(default_factory=dict)  # recall@k and MRR of search on the questions' text
    searched_episodes: int | None = None  # episodes that searched (a search call that ran); None in runs scored before it
    preregistration: PreregistrationResult | None = None
    replay: ReplayDrift | None = None  # --policy replay only
    sampling: SampleMetrics | None = None  # with --samples K > 1
    calibration: dict[str, ProbeCalibration] | None = None  # per probe (evaluation.calibration); None: the run measured none
    probe_mass: dict[str, ProbeMass] | None = None  # per probe, the options' share of the distribution; None: none recorded
    derived_from: DerivedFrom | None = None  # None only in files written before it was recorded (refused by Run.load)

    # What the terminal summary and the HTML report lead with, in this order (the answer metrics first).
    HEADLINE: ClassVar[tuple[str, ...]] = (
        "mean_model_tokens",
        "median_model_tokens",
        "false_abstention_rate",
        "missed_abstention_rate",
        "mean_steps",
        "mean_tool_calls",
        "mean_document_tokens",
        "mean_unread_tokens",
    )

    # Shown only for runs that have them (the memory reader's), not as "-" in every other run.
    READER_FIGURES: ClassVar[tuple[str, ...]] = ("mean_document_tokens", "mean_unread_tokens")

    def headline(self) -> list[tuple[str, float | int | None]]:
        figures: list[tuple[str, float | int | None]] = [("episodes", self.episodes)]
        figures += [(metric.name, self.metric(metric.name)) for metric in answer_metrics()]
        figures += [(name, getattr(self, name)) for name in self.HEADLINE]
        return [(name, value) for name, value in figures if value is not None or name not in self.READER_FIGURES]

    def interval(self, name: str) -> MeanInterval | None:
        """The bootstrap interval of a metric that declares one (None: it declares none, or has no figure)."""
        return self.answer_intervals.get(name)

    @model_validator(mode="before")
    @classmethod
    def _gather_metrics(cls, data: Any) -> Any:
        metrics = answer_metrics()
        data = gathered(data, "answer_metrics", {metric.name: metric.name for metric in metrics}, cls.__name__, FIGURE)
        return gathered(data, "answer_intervals", {f"{m.name}_ci95": m.name for m in metrics if m.interval}, cls.__name__, INTERVAL)

    @field_validator("answer_metrics", "answer_intervals")
    @classmethod
    def _registered(cls, values: dict[str, Any]) -> dict[str, Any]:
        return registered_only(values)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        intervals = dumped.pop("answer_intervals")
        flat: dict[str, Any] = {}
        for metric in answer_metrics():
            flat[metric.name] = dumped["answer_metrics"].get(metric.name)
            if metric.name in intervals:
                flat[f"{metric.name}_ci95"] = intervals[metric.name]
        return flattened(dumped, "answer_metrics", flat)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)


# What the summary and the reports call a figure besides its metrics.json key, where the key alone
# would not say which variant it is (an answer metric's is its declared label).
FIGURE_LABELS = {
    "mean_model_tokens": "model tokens per episode, mean",
    "median_model_tokens": "model tokens per episode, median",
    "mean_document_tokens": "memory reader: document tokens, mean",
    "mean_unread_tokens": "memory reader: tokens left unread, mean",
}


def figure_label(name: str) -> str:
    """A metrics.json key as the summary and the reports show it: the key, then what it means
    where the key does not say it (an answer metric's label that is more than its key spelled out)."""
    known = {metric.name: metric for metric in answer_metrics()}
    label = known[name].heading if name in known else FIGURE_LABELS.get(name)
    if label is None or label.lower() == name.replace("_", " "):
        return name
    return f"{name}: {label}"


def figure_text(name: str, value: float | int | None) -> str:
    """A figure for people: "-" for none, token counts as whole numbers, rates to three decimals."""
    if value is None:
        return "-"
    if name.endswith("_tokens"):
        return f"{value:,.0f}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
