"""The per-episode answer metrics, each declared once: what it is called, how it is scored against
the gold question, and how a run's figure, ``explorer compare`` and the reports treat it.

```python
register_metric(Metric("yes_no_match", "yes/no match", lambda a: best(yes_no_match, a), yes_no=True))
```

Everything that handles answer metrics reads this registry, in its order: ``scoring`` (a line of
scores.jsonl, the run's ``RunMetrics``), ``derived`` (which fields a scored line must hold),
``compare`` (paired figures, McNemar on the yes/no ones), the report pages and ``explorer
inspect``, and ``export``. A metric registered after runs were scored is absent from their lines;
their run figure for it is None, and ``Run.load`` still reads them.

Each metric keeps its own key in scores.jsonl and metrics.json (``answer_f1``, ``exact_match``,
...): the records keep the values in a dict (``EpisodeScore.answer_metrics``) and write them flat,
in this order, where those keys always stood.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails

from paper_explorer.corpus.schema import Question
from paper_explorer.evaluation.answers import (
    answer_evidence_f1,
    best_over_references,
    exact_match,
    hotpotqa_f1,
    sub_exact_match,
    substring_exact_match,
    token_f1,
)

V = TypeVar("V")

# The metrics the rest of the code reads by name: the primary one (F1 by question type, its
# interval, the majority vote of samples, the worst episodes) and the one that says "correct" (pass@k).
ANSWER_F1 = "answer_f1"
EXACT_MATCH = "exact_match"
# evaluation.derived checks, without the corpus, that the strict evidence F1 is the official one of
# an episode that decided and 0 of one that did not.
EVIDENCE_F1 = "evidence_f1"
EVIDENCE_F1_STRICT = "evidence_f1_strict"
# The per-benchmark tables (evaluation.benchmarks) read these: a benchmark's F1 is answer_f1
# (LongBench's qa_f1_score) or HotpotQA's; its SubEM the bidirectional substring one.
HOTPOTQA_F1 = "hotpotqa_f1"
SUB_EXACT_MATCH_SUBSTRING = "sub_exact_match_substring"


@dataclass(frozen=True)
class Answered:
    """What an episode answered, against the gold question: what every metric reads."""

    prediction: str  # "Unanswerable" for an abstention, "" when the episode ended without either
    evidence: list[str]  # the paragraphs it submitted as evidence
    question: Question
    decided: bool  # it submitted or abstained (not a limit, a policy error or no_answer)


@dataclass(frozen=True)
class Metric:
    """One answer metric. Its values are shares in [0, 1]; the run's figure aggregates the scored
    episodes' values (None when one of them lacks it: a line scored before the metric existed)."""

    name: str  # its key in scores.jsonl, metrics.json and compare's record
    label: str  # what tables and reports call it
    score: Callable[[Answered], float]
    yes_no: bool = False  # a 0/1 outcome: shown as 0/1, tested by exact McNemar in compare
    higher_is_better: bool = True
    interval: bool = False  # metrics.json holds NAME_ci95 (bootstrap over questions); compare a paired interval of B - A
    compared: bool = True  # explorer compare and the two-run report pair it
    required: bool = False  # every scored line holds it (False for one added after runs were scored)
    aggregate: Callable[[Sequence[float]], float] = fmean  # the run's figure from the scored episodes' values

    @property
    def heading(self) -> str:
        """The label as a table's row names it: with its direction when lower is better."""
        return self.label if self.higher_is_better else f"{self.label} (lower is better)"

    @property
    def digits(self) -> int:
        """Decimals an episode's value is shown with: 0/1 for a yes/no metric, else three."""
        return 0 if self.yes_no else 3

    def shown(self, value: float | None) -> str:
        return "-" if value is None else f"{value:.{self.digits}f}"


_registry: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    """Declare an answer metric; scoring, the records, compare, the reports and export follow."""
    if metric.name in _registry:
        raise ValueError(f"answer metric {metric.name!r} is registered twice")
    _registry[metric.name] = metric
    return metric


def answer_metrics() -> tuple[Metric, ...]:
    """The registered metrics, in the order they were registered (the order of every table)."""
    return tuple(_registry.values())


def answer_metric(name: str) -> Metric:
    return _registry[name]


def best(metric: Callable[[str, str], float], answered: Answered) -> float:
    """A metric of two strings against every annotator's reference, keeping the best (QASPER's rule)."""
    return best_over_references(metric, answered.prediction, answered.question)


def evidence_f1(answered: Answered, text_evidence_only: bool = False) -> float:
    return answer_evidence_f1(answered.evidence, answered.question, text_evidence_only)


register_metric(Metric(ANSWER_F1, "answer F1", lambda a: best(token_f1, a), interval=True, required=True))
register_metric(Metric(EXACT_MATCH, "exact match", lambda a: best(exact_match, a), yes_no=True, required=True))
# SubEM, ours: whole tokens (answers.sub_exact_match); LongBench's: character substrings (answers.substring_exact_match)
register_metric(Metric("sub_exact_match", "SubEM (whole tokens)", lambda a: best(sub_exact_match, a), yes_no=True, required=True))
register_metric(
    Metric(SUB_EXACT_MATCH_SUBSTRING, "SubEM (substring, LongBench)", lambda a: best(substring_exact_match, a), yes_no=True, required=True)
)
# QASPER's official rule: empty predicted and gold evidence count 1.0
register_metric(Metric(EVIDENCE_F1, "evidence F1", evidence_f1, compared=False, required=True))
register_metric(
    Metric(
        "evidence_f1_text_only", "evidence F1 (text only)", lambda a: evidence_f1(a, text_evidence_only=True), compared=False, required=True
    )
)
# ours: an episode that never submitted nor abstained earns 0, not that 1.0
register_metric(
    Metric(EVIDENCE_F1_STRICT, "evidence F1 (strict)", lambda a: evidence_f1(a) if a.decided else 0.0, compared=False, required=True)
)
# HotpotQA's F1 (answers.hotpotqa_f1): no credit for a yes/no/noanswer that is not the gold's.
# Registered after runs were scored: their lines lack it (not required).
register_metric(Metric(HOTPOTQA_F1, "HotpotQA F1 (yes/no/noanswer exact)", lambda a: best(hotpotqa_f1, a)))


# -- the records' flat JSON ---------------------------------------------------------------------


def gathered(data: Any, field: str, keys: dict[str, str], record: str, value_type: TypeAdapter[Any] | None = None) -> Any:
    """A record's input with its flat keys (``keys``: flat key -> key in ``field``) moved into the
    dict ``field``, as the records read scores.jsonl, metrics.json and compare's JSON (None: absent).
    With ``value_type``, each value is validated here, so that a refusal names the key the file
    holds (``answer_f1``), not the dict it is kept in."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    values = dict(data.get(field) or {})
    errors: list[InitErrorDetails] = []
    for flat, key in keys.items():
        if flat in data:
            value = data.pop(flat)
            if value is None:
                continue
            if value_type is not None:
                try:
                    value = value_type.validate_python(value)
                except ValidationError as error:
                    errors += [
                        InitErrorDetails(type=e["type"], loc=(flat, *e["loc"]), input=e["input"], ctx=e.get("ctx", {}))
                        for e in error.errors()
                    ]
            values[key] = value
    if errors:
        raise ValidationError.from_exception_data(record, errors)
    data[field] = values
    return data


def flattened(dumped: dict[str, Any], field: str, flat: dict[str, Any]) -> dict[str, Any]:
    """A record's dump with ``field`` replaced, where it stood, by the flat keys of ``flat``."""
    written: dict[str, Any] = {}
    for key, value in dumped.items():
        if key == field:
            written.update(flat)
        else:
            written[key] = value
    return written


def registered_only(values: dict[str, V]) -> dict[str, V]:
    """A record's answer metrics by name, refused when one is not registered."""
    if unknown := [name for name in values if name not in _registry]:
        raise ValueError(f"{', '.join(unknown)}: no answer metric of that name is registered")
    return values


class MetricValues:
    """What a record that keeps answer metrics by name (``answer_metrics``) answers about them:
    ``EpisodeScore`` (an episode's values) and ``RunMetrics`` (the run's figures)."""

    if TYPE_CHECKING:
        answer_metrics: Mapping[str, float | None]

    def metric(self, name: str) -> float | None:
        """The value of an answer metric; None when unscored, or scored before the metric existed."""
        return self.answer_metrics.get(name)

    @property
    def answer_f1(self) -> float | None:
        return self.metric(ANSWER_F1)

    @property
    def exact_match(self) -> float | None:
        return self.metric(EXACT_MATCH)


def flat_schema(schema: dict[str, Any], field: str, value: dict[str, Any], interval: dict[str, Any] | None = None) -> None:
    """A record's JSON Schema (``explorer schema``) as its file holds it: ``field`` replaced, where it
    stood, by one property per answer metric (``value``'s schema, titled by the metric's label), each
    followed by NAME_ci95 (``interval``'s schema) where the metric declares an interval."""
    properties: dict[str, Any] = {}
    for key, described in schema["properties"].items():
        if key != field:
            properties[key] = described
            continue
        for metric in answer_metrics():
            properties[metric.name] = {**value, "title": metric.label}
            if interval is not None and metric.interval:
                properties[f"{metric.name}_ci95"] = {**interval, "title": f"{metric.label}: bootstrap interval"}
    schema["properties"] = properties
