"""Score a run: every episode against its gold question, then the run's metrics and detector rates."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from statistics import fmean, median
from typing import Annotated, Any

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

from paper_explorer.agent.trajectory import Status, Trajectory, research_before_end
from paper_explorer.corpus.schema import Question
from paper_explorer.evaluation.answer_metrics import (
    ANSWER_F1,
    EXACT_MATCH,
    Answered,
    MetricValues,
    answer_metrics,
    flat_schema,
    flattened,
    gathered,
    registered_only,
)
from paper_explorer.evaluation.answers import ABSTENTION, answer_type, normalize_answer
from paper_explorer.evaluation.benchmarks import benchmark_tables
from paper_explorer.evaluation.calibration import probe_mass, run_calibration
from paper_explorer.evaluation.detectors import SHORTCUT_COLLAPSE_RATE, Flag, detect, detector_rates, verdict
from paper_explorer.evaluation.records import (
    AbstentionRow,
    AbstentionTable,
    MeanInterval,
    RunMetrics,
    SampleMetrics,
)
from paper_explorer.evaluation.replay_drift import replay_drift
from paper_explorer.evaluation.stats import bootstrap_mean_ci
from paper_explorer.evaluation.tokens import model_tokens, readings


def prediction(trajectory: Trajectory) -> str:
    """What the episode answered: the submitted answer, "Unanswerable" for an abstention, and ""
    (which scores zero against every reference) when it ended without either - a limit, a policy
    error, or no_answer (the policy's own answer was invalid: empty, or cut at its cap)."""
    outcome = trajectory.outcome
    if outcome.status == "submitted":
        return outcome.answer or ""
    return ABSTENTION if outcome.status == "abstained" else ""


def question_type(question: Question) -> str:
    """The first annotator's answer type (used when no annotator has a reference answer)."""
    kinds = [answer.kind for answer in question.answers if answer.kind]
    return kinds[0] if kinds else "empty"


# A figure in [0, 1] (an F1, a match): finite, never NaN (a line read back is bounded like one written).
Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
SHARE: TypeAdapter[float] = TypeAdapter(Share)


class ProbeScore(BaseModel):
    """An episode's option probe at its end (``Trajectory.probes``, at_step None), as calibration
    reads it: the options and their probabilities, or why there are none."""

    model_config = ConfigDict(extra="forbid")

    probe: str
    options: list[str]
    probabilities: list[float] | None = None  # renormalised over the options; None: not measured
    mass: float | None = None  # the options' share of the next-token distribution before renormalising
    min_mass: float | None = None  # the run's probe_min_mass: below it, no belief measured
    not_measured: str | None = None

    @property
    def low_mass(self) -> bool:
        """Measured, but its options held less than the run's minimum share of the distribution."""
        return self.probabilities is not None and self.mass is not None and self.min_mass is not None and self.mass < self.min_mass

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


def probe_scores(trajectory: Trajectory) -> list[ProbeScore] | None:
    """The probes asked at the episode's end (the last of each name), or None when there are none:
    the line of scores.jsonl of a run without probes stays as it was."""
    final = {probe.probe: probe for probe in trajectory.probes if probe.at_step is None}
    if not final:
        return None
    floor = trajectory.config.probe_min_mass
    return [
        ProbeScore(
            probe=p.probe,
            options=p.options,
            probabilities=p.probabilities,
            mass=p.mass,
            min_mass=floor,
            not_measured=p.not_measured or None,
        )
        if p.probabilities is not None
        else ProbeScore(probe=p.probe, options=p.options, not_measured=p.not_measured or "no probabilities recorded")
        for p in final.values()
    ]


class EpisodeScore(MetricValues, BaseModel):
    """One line of scores.jsonl: an episode's outcome, its detector flags and, when the question has
    gold answers, the answer metrics (``evaluation.answer_metrics``; absent when it has none)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=lambda schema, _: flat_schema(schema, "answer_metrics", {"type": "number", "minimum": 0, "maximum": 1}),
    )

    episode_id: str
    question_id: str | None
    question: str
    sample: int = Field(0, ge=0)  # which of the question's attempts (--samples K)
    status: Status
    prediction: str
    steps: int = Field(ge=0)
    tool_calls: int = Field(ge=0)
    tool_calls_before_end: int = Field(
        ge=0
    )  # research whose result reached the policy before the end (agent.trajectory.research_before_end)
    flags: list[Flag]
    benchmark: str | None = None  # the question's Question.benchmark ("longbench/hotpotqa"): its per-benchmark table
    type: str | None = None
    answerable: bool | None = None
    # by metric name; written flat (each under its own key, in the registry's order), here in the line
    answer_metrics: dict[str, Share] = Field(default_factory=dict)
    abstained: bool | None = None
    model_tokens: int | None = Field(None, ge=0)  # evaluation.tokens.model_tokens: None when the episode made no model call
    document_tokens: int | None = Field(None, ge=0)  # the memory reader's document (None for other policies)
    unread_tokens: int | None = Field(None, ge=0)  # of it, what its token budget left unread
    probes: list[ProbeScore] | None = None  # option probes at the episode's end (evaluation.calibration reads them)

    @property
    def scored(self) -> bool:
        return ANSWER_F1 in self.answer_metrics

    def value(self, name: str) -> float:
        """A scored episode's value of a metric every scored line holds (``Metric.required``;
        ``evaluation.derived`` refuses a line without one)."""
        value = self.answer_metrics.get(name)
        if value is None:
            raise ValueError(f"episode {self.episode_id} has no {name}: it is not scored")
        return value

    def fields(self) -> dict[str, Any]:
        """Every field as its value, the answer metrics under their own names (None where absent), in
        the order of a line of scores.jsonl: a row of ``Run.to_pandas``."""
        row: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name == "answer_metrics":
                row |= {metric.name: self.metric(metric.name) for metric in answer_metrics()}
            else:
                row[name] = getattr(self, name)
        return row

    @model_validator(mode="before")
    @classmethod
    def _gather_metrics(cls, data: Any) -> Any:
        return gathered(data, "answer_metrics", {metric.name: metric.name for metric in answer_metrics()}, cls.__name__, SHARE)

    @field_validator("answer_metrics")
    @classmethod
    def _registered(cls, values: dict[str, float]) -> dict[str, float]:
        return registered_only(values)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        values = dumped["answer_metrics"]
        written = flattened(dumped, "answer_metrics", {m.name: values[m.name] for m in answer_metrics() if m.name in values})
        return {key: value for key, value in written.items() if value is not None}


def score_episode(trajectory: Trajectory, question: Question | None) -> EpisodeScore:
    predicted = prediction(trajectory)
    gold: dict[str, Any] = {}
    if question is not None:
        answered = Answered(
            prediction=predicted,
            evidence=[item.text for item in trajectory.outcome.evidence],
            question=question,
            decided=trajectory.outcome.status in ENDED_BY_POLICY,
        )
        gold = {
            "benchmark": question.benchmark,
            "type": answer_type(predicted, question) or question_type(question),
            "answerable": question.answerable,
            "answer_metrics": {metric.name: metric.score(answered) for metric in answer_metrics()},
            "abstained": trajectory.outcome.status == "abstained",
        }
    return EpisodeScore(
        episode_id=trajectory.episode_id,
        question_id=trajectory.question_id,
        question=trajectory.question,
        sample=trajectory.sample,
        status=trajectory.outcome.status,
        prediction=predicted,
        steps=len(trajectory.steps),
        tool_calls=sum(len(step.tool_calls) for step in trajectory.steps),
        tool_calls_before_end=sum(1 for _ in research_before_end(trajectory)),
        flags=detect(trajectory, question),
        model_tokens=model_tokens(trajectory),
        probes=probe_scores(trajectory),
        **_reading_tokens(trajectory),
        **gold,
    )


def _reading_tokens(trajectory: Trajectory) -> dict[str, int]:
    """The memory reader's document and unread tokens (nothing for an episode without a reading record)."""
    read = readings(trajectory)
    if not read:
        return {}
    return {"document_tokens": sum(r.document_tokens for r in read), "unread_tokens": sum(r.unread_tokens for r in read)}


ENDED_BY_POLICY = ("submitted", "abstained")


def abstention_table(scores: list[EpisodeScore]) -> AbstentionTable:
    """Gold answerable or not, against how each scored episode ended."""
    table = AbstentionTable()
    for score in scores:
        if not score.scored:
            continue
        row = table.answerable if score.answerable else table.unanswerable
        column = {"submitted": "answered", "abstained": "abstained"}.get(score.status, score.status)  # else its own column
        setattr(row, column, getattr(row, column) + 1)
    return table


def per_question_means(scored: list[EpisodeScore], name: str) -> list[float]:
    """The unit an interval resamples: a question, not an episode. K samples of one question are
    not K independent draws, so with --samples they are averaged first (one sample each: the
    episodes' own values, unchanged)."""
    by_question: dict[str, list[float]] = defaultdict(list)
    for position, score in enumerate(scored):
        by_question[score.question_id or f"episode-{position}"].append(score.value(name))
    return [fmean(values) for values in by_question.values()]


def answer_figures(scored: list[EpisodeScore]) -> tuple[dict[str, float | None], dict[str, MeanInterval]]:
    """Each answer metric over the scored episodes (None when there are none, or when one was
    scored before the metric existed), and the bootstrap interval of those declared with one."""
    figures: dict[str, float | None] = {}
    intervals: dict[str, MeanInterval] = {}
    for metric in answer_metrics():
        values = [score.metric(metric.name) for score in scored]
        present = [value for value in values if value is not None]
        figures[metric.name] = metric.aggregate(present) if present and len(present) == len(values) else None
        if metric.interval and (figures[metric.name] is not None or not scored):
            intervals[metric.name] = bootstrap_mean_ci(per_question_means(scored, metric.name))
    return figures, intervals


def run_metrics(scores: list[EpisodeScore], collapse_threshold: float = SHORTCUT_COLLAPSE_RATE) -> RunMetrics:
    scored = [s for s in scores if s.scored]
    table = abstention_table(scores)
    by_type: dict[str, list[float]] = defaultdict(list)
    for s in scored:
        by_type[s.type or "empty"].append(s.value(ANSWER_F1))

    def rate(counts: AbstentionRow, column: str) -> float | None:
        total = counts.answered + counts.abstained + counts.undecided()
        return getattr(counts, column) / total if total else None

    figures, intervals = answer_figures(scored)
    rates = detector_rates([s.flags for s in scores])
    return RunMetrics(
        episodes=len(scores),
        scored=len(scored),
        answer_metrics=figures,
        answer_intervals=intervals,
        answer_f1_by_type={kind: fmean(values) for kind, values in sorted(by_type.items())},
        benchmarks=benchmark_tables(scored),
        abstention=table,
        false_abstention_rate=rate(table.answerable, "abstained"),
        missed_abstention_rate=rate(table.unanswerable, "answered"),
        status=dict(sorted(Counter(s.status for s in scores).items())),
        mean_steps=fmean(s.steps for s in scores) if scores else None,
        mean_tool_calls=fmean(s.tool_calls for s in scores) if scores else None,
        **token_metrics(scores),
        detector_rates=rates,
        verdict=verdict(rates, collapse_threshold),
        sampling=sample_metrics(scores),
        calibration=run_calibration(scores),
        probe_mass=probe_mass(scores),
    )


def token_metrics(scores: list[EpisodeScore]) -> dict[str, float | None]:
    """Tokens spent over the episodes that made a model call (all episodes, scored or not), and the
    memory reader's document and unread tokens over the episodes that recorded them."""
    spent = [s.model_tokens for s in scores if s.model_tokens is not None]
    documents = [s.document_tokens for s in scores if s.document_tokens is not None]
    unread = [s.unread_tokens for s in scores if s.unread_tokens is not None]
    return {
        "mean_model_tokens": fmean(spent) if spent else None,
        "median_model_tokens": float(median(spent)) if spent else None,
        "mean_document_tokens": fmean(documents) if documents else None,
        "mean_unread_tokens": fmean(unread) if unread else None,
    }


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimator of P(at least one of k samples is correct) from n samples, c correct."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def sample_metrics(scores: list[EpisodeScore]) -> SampleMetrics | None:
    """pass@k, mean and majority-vote answer F1 and agreement over each question's samples; None
    when no question was asked more than once. Correct means exact match (an abstention on an
    unanswerable question included). Only answers given vote: an episode that ended at a limit
    or in a policy error does not (it still counts against agreement)."""
    by_question: dict[str, list[EpisodeScore]] = defaultdict(list)
    for score in scores:
        if score.scored and score.question_id is not None:
            by_question[score.question_id].append(score)
    if not by_question or max(len(group) for group in by_question.values()) < 2:
        return None
    k_max = min(len(group) for group in by_question.values())
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= k_max} | {k_max})
    majority_f1, agreement = [], []
    for group in by_question.values():
        voters = [s for s in group if s.status in ENDED_BY_POLICY] or group  # a step limit or server error casts no vote
        votes = Counter(normalize_answer(score.prediction) for score in voters)
        top = max(votes.values())
        winner = next(
            normalize_answer(s.prediction) for s in sorted(voters, key=lambda s: s.sample) if votes[normalize_answer(s.prediction)] == top
        )  # ties: the earliest sample's answer
        majority_f1.append(next(s.value(ANSWER_F1) for s in voters if normalize_answer(s.prediction) == winner))
        agreement.append(top / len(group))
    return SampleMetrics(
        samples=k_max,
        questions=len(by_question),
        pass_at_k={
            str(k): fmean(pass_at_k(len(g), sum(s.value(EXACT_MATCH) >= 1 for s in g), k) for g in by_question.values()) for k in ks
        },
        mean_answer_f1=fmean(fmean(s.value(ANSWER_F1) for s in g) for g in by_question.values()),
        majority_answer_f1=fmean(majority_f1),
        agreement=fmean(agreement),
    )


def model_metrics(trajectories: list[Trajectory]) -> dict:
    """What the policy reported about the run: the server and the generation cap (model policies), drift (replay)."""
    generations = [step.generation for t in trajectories for step in t.steps if step.generation is not None]
    return {
        "api_retries": sum(g.api_retries for g in generations) + sum(t.failed_request_retries for t in trajectories),
        "parity_warnings": sum(1 for g in generations if g.parity_warning),
        "hit_cap_steps": sum(1 for g in generations if g.hit_cap),
        "replay": replay_drift(trajectories),
    }
