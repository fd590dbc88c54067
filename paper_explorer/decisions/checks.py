"""The four checks a typed decision model is held to, each a figure from a run's records
(``decisions.check_records`` holds them; ``decide`` writes them into metrics.json and prints
``check_lines``):

1. **Reversed options** (``order_agreement``): each question read twice, its options listed in
   one order and then in the reverse (``decide --check-reversed`` records the second reading in
   ``DecisionRecord.reversed``; two runs ``--order given`` and ``--order reversed`` of one file
   are paired by question id with ``order_agreement_of_runs``). Agreement: the same option is the
   likeliest in both readings. Total variation: half the summed |difference| of each option's
   probability, options matched by their text, 0 (the same distribution) to 1 (disjoint).
2. **Negation** (``negation_check``): a noul question q and the one that negates it (``negation_of``):
   consistent when the likeliest answers map onto each other (yes to no, no to yes, unknown to
   unknown); the gap is |P(yes | q) - P(no | not-q)|, 0 for a model that reads both alike.
3. **Severity lean** (``severity_check``): on ordered options (``ordered: true`` choices, least to
   most severe, and every score, lowest first) with a label, where the likeliest option stands
   against the label in levels (positions 0 to K-1 in the file's order) and as a share of the
   scale (divided by K-1, so a 1-10 rubric and a 3-level choice weigh alike); how many errors are
   more severe than the label and how many less, with a two-sided sign test (each error equally
   likely either way under no lean); and the expected-level lean, E[level] - label with E over the
   option probabilities, which sees a lean the likeliest option hides.
4. **Unknown rate** (``unknown_check``): on noul questions labelled unknown (the document cannot
   answer), how often unknown is the likeliest and its mean probability; on those labelled yes or
   no, how often unknown is chosen anyway (false unknown).

Each check reads only measured questions and says how many; a check the run has nothing for is a
figure of n 0 with None values, printed "not measured: ..." and never as 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binomtest

from paper_explorer.decisions.check_records import (
    DecisionChecks,
    NegationCheck,
    OrderAgreement,
    ReversedCheck,
    SeverityCheck,
    SeverityLean,
    UnknownCheck,
)
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.records import DecisionRecord
from paper_explorer.decisions.schema import KINDS
from paper_explorer.evaluation.stats import bootstrap_mean_ci

NEGATED = {"yes": "no", "no": "yes", "unknown": "unknown"}
Pair = tuple[DecisionRecord, DecisionRecord | None]


def checks_of(records: Sequence[DecisionRecord], order: str) -> DecisionChecks:
    """Every check of one run's records; ``order`` is the run's (``--order``: how its options were listed)."""
    return DecisionChecks(
        reversed=reversed_check(records),
        negation=negation_check(records),
        severity=severity_check(records, order),
        unknown=unknown_check(records),
    )


# -- 1. reversed options ------------------------------------------------------------------------


def reversed_check(records: Sequence[DecisionRecord]) -> ReversedCheck | None:
    """Each record against its own reversed reading; None when the run made none."""
    if not any(record.reversed is not None for record in records):
        return None
    return order_agreement([(record, record.reversed) for record in records])


def order_agreement_of_runs(first: Sequence[DecisionRecord], second: Sequence[DecisionRecord]) -> ReversedCheck:
    """Two runs of the same questions, say ``--order given`` and ``--order reversed``, paired by
    question id; a question in one run only counts as unpaired."""
    by_id = {record.question_id: record for record in second}
    pairs: list[Pair] = [(record, by_id.get(record.question_id)) for record in first]
    ids = {record.question_id for record in first}
    pairs += [(record, None) for record in second if record.question_id not in ids]
    if all(other is None for _, other in pairs):
        raise DecisionError("the two runs share no question id; compare two runs of one decision file")
    return order_agreement(pairs)


def order_agreement(pairs: Sequence[Pair]) -> ReversedCheck:
    """Agreement and total variation of paired readings of one question, per kind and in all."""
    measured: list[tuple[DecisionRecord, DecisionRecord]] = []
    for record, other in pairs:
        if other is None or not (record.measured and other.measured):
            continue
        if sorted(record.options) != sorted(other.options):
            raise DecisionError(
                f"question {record.question_id!r} has other options in the second reading; pair readings of the same question only"
            )
        measured.append((record, other))
    kinds = {
        kind: _agreement([pair for pair in measured if pair[0].kind == kind]) for kind in KINDS if any(a.kind == kind for a, _ in measured)
    }
    return ReversedCheck(all=_agreement(measured), kinds=kinds, unpaired=len(pairs) - len(measured))


def total_variation(record: DecisionRecord, other: DecisionRecord) -> float:
    """1/2 sum over options of |p - p'|, each option matched by its text."""
    theirs = dict(zip(other.options, other.probabilities or []))
    return 0.5 * sum(abs(p - theirs[option]) for option, p in zip(record.options, record.probabilities or []))


def _agreement(pairs: list[tuple[DecisionRecord, DecisionRecord]]) -> OrderAgreement:
    distances = [total_variation(record, other) for record, other in pairs]
    agreeing = sum(record.predicted == other.predicted for record, other in pairs)
    return OrderAgreement(
        questions=len(pairs),
        agreeing=agreeing,
        agreement=agreeing / len(pairs) if pairs else None,
        mean_total_variation=float(np.mean(distances)) if pairs else None,
        max_total_variation=max(distances) if pairs else None,
    )


# -- 2. negation --------------------------------------------------------------------------------


def negation_check(records: Sequence[DecisionRecord]) -> NegationCheck:
    """Each question that negates another of the run against it. A pair named from both sides
    counts once, the earlier question of the two as q (the gap is P(yes) of q against P(no) of not-q)."""
    by_id = {record.question_id: record for record in records}
    pairs: dict[frozenset[str], tuple[DecisionRecord, DecisionRecord]] = {}
    for negation in records:
        if negation.negation_of is None or negation.negation_of not in by_id:
            continue
        question = by_id[negation.negation_of]
        # records run in file order, so the first of a pair named from both sides is the earlier question
        mutual = question.negation_of == negation.question_id
        pairs.setdefault(frozenset((negation.question_id, question.question_id)), (negation, question) if mutual else (question, negation))
    measured = [(question, negation) for question, negation in pairs.values() if question.measured and negation.measured]
    consistent = sum(NEGATED[question.predicted or ""] == negation.predicted for question, negation in measured)
    gaps = [abs(probability(question, "yes") - probability(negation, "no")) for question, negation in measured]
    return NegationCheck(
        pairs=len(measured),
        not_measured=len(pairs) - len(measured),
        consistent=consistent,
        consistency=consistent / len(measured) if measured else None,
        mean_yes_no_gap=float(np.mean(gaps)) if gaps else None,
    )


def probability(record: DecisionRecord, option: str) -> float:
    return (record.probabilities or [])[record.options.index(option)]


# -- 3. severity lean ---------------------------------------------------------------------------


def severity_check(records: Sequence[DecisionRecord], order: str = "given") -> SeverityCheck:
    """The lean of the ordered, measured, labelled questions, in all and per kind. ``order`` is how
    the run listed the options ("reversed": most severe first), so levels count in the file's order."""
    rows = [record for record in records if record.ordered and record.measured and record.label is not None]
    kinds = {kind: _lean([r for r in rows if r.kind == kind], order) for kind in KINDS if any(r.kind == kind for r in rows)}
    return SeverityCheck(all=_lean(rows, order), kinds=kinds)


def levels(record: DecisionRecord, order: str) -> tuple[list[float], int, int]:
    """(each level's probability, least severe first; the label's level; the likeliest option's level)."""
    options, probabilities = list(record.options), list(record.probabilities or [])
    if order == "reversed":
        options.reverse()
        probabilities.reverse()
    return probabilities, options.index(record.label or ""), options.index(record.predicted or "")


def _lean(rows: list[DecisionRecord], order: str) -> SeverityLean:
    errors, errors_scale, leans, leans_scale = [], [], [], []
    for record in rows:
        probabilities, label, predicted = levels(record, order)
        span = len(probabilities) - 1
        expected = float(np.dot(np.arange(len(probabilities)), probabilities))
        errors.append(predicted - label)
        errors_scale.append((predicted - label) / span)
        leans.append(expected - label)
        leans_scale.append((expected - label) / span)
    more = sum(error > 0 for error in errors)
    less = sum(error < 0 for error in errors)
    return SeverityLean(
        questions=len(rows),
        mean_error_levels=_mean(errors),
        mean_error_scale=_mean(errors_scale),
        errors=more + less,
        more_severe=more,
        less_severe=less,
        more_severe_share=more / (more + less) if more + less else None,
        sign_test_p=float(binomtest(more, more + less, 0.5).pvalue) if more + less else None,
        expected_lean_levels=_mean(leans),
        expected_lean_scale=bootstrap_mean_ci(leans_scale),
    )


# -- 4. unknown rate ----------------------------------------------------------------------------


def unknown_check(records: Sequence[DecisionRecord]) -> UnknownCheck:
    labelled = [record for record in records if record.kind == "noul" and record.measured and record.label is not None]
    unanswerable = [record for record in labelled if record.label == "unknown"]
    answerable = [record for record in labelled if record.label != "unknown"]
    chosen = sum(record.predicted == "unknown" for record in unanswerable)
    false = sum(record.predicted == "unknown" for record in answerable)
    return UnknownCheck(
        unanswerable=len(unanswerable),
        unknown_chosen=chosen,
        unknown_rate=chosen / len(unanswerable) if unanswerable else None,
        mean_p_unknown=_mean([probability(record, "unknown") for record in unanswerable]),
        answerable=len(answerable),
        false_unknown=false,
        false_unknown_rate=false / len(answerable) if answerable else None,
        mean_p_unknown_answerable=_mean([probability(record, "unknown") for record in answerable]),
    )


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


# -- printed ------------------------------------------------------------------------------------


def check_lines(checks: DecisionChecks) -> list[str]:
    """One line per check, each with its n; a check with nothing to read says so."""
    return [
        _reversed_line(checks.reversed),
        _negation_line(checks.negation),
        _severity_line(checks.severity.all),
        _unknown_line(checks.unknown),
    ]


def _reversed_line(check: ReversedCheck | None) -> str:
    if check is None:
        return "reversed options: not run (decide --check-reversed reads every question again with its options reversed)"
    if not check.all.questions:
        return f"reversed options: not measured: no question measured in both orders ({check.unpaired} unpaired)"
    kinds = ", ".join(f"{kind} {figures.agreeing}/{figures.questions}" for kind, figures in check.kinds.items())
    unpaired = f"; {check.unpaired} unpaired" if check.unpaired else ""
    return (
        f"reversed options: n={check.all.questions}, same likeliest option {_share(check.all.agreement)} ({kinds}), "
        f"mean total variation {check.all.mean_total_variation:.3f} (max {check.all.max_total_variation:.3f}){unpaired}"
    )


def _negation_line(check: NegationCheck) -> str:
    if not check.pairs:
        said = f" ({check.not_measured} with a side not measured)" if check.not_measured else ""
        return f"negation: not measured: no pairs{said}"
    return (
        f"negation: n={check.pairs} pair{'' if check.pairs == 1 else 's'}, consistent {_share(check.consistency)} ({check.consistent} of {check.pairs}), "
        f"mean |P(yes|q) - P(no|not q)| {check.mean_yes_no_gap:.3f}"
    )


def _severity_line(lean: SeverityLean) -> str:
    if not lean.questions:
        return "severity lean: not measured: no labelled question with ordered options"
    sign = "" if lean.sign_test_p is None else f", sign test p = {lean.sign_test_p:.3f}"
    interval = lean.expected_lean_scale
    return (
        f"severity lean: n={lean.questions}, mean error {lean.mean_error_levels:+.3f} levels ({lean.mean_error_scale:+.3f} of the scale); "
        f"errors {lean.more_severe} more severe, {lean.less_severe} less{sign}; "
        f"expected-level lean {lean.expected_lean_levels:+.3f} levels ({_signed(interval.mean)} of the scale, "
        f"95% CI {_signed(interval.low)} to {_signed(interval.high)})"
    )


def _unknown_line(check: UnknownCheck) -> str:
    if not check.unanswerable and not check.answerable:
        return "unknown: not measured: no labelled noul question"
    parts = []
    if check.unanswerable:
        parts.append(
            f"n={check.unanswerable} unanswerable, unknown chosen {_share(check.unknown_rate)} ({check.unknown_chosen} of "
            f"{check.unanswerable}), mean P(unknown) {check.mean_p_unknown:.3f}"
        )
    else:
        parts.append("unanswerable not measured: no noul question labelled unknown")
    if check.answerable:
        parts.append(
            f"n={check.answerable} answerable, false unknown {_share(check.false_unknown_rate)} ({check.false_unknown} of {check.answerable})"
        )
    else:
        parts.append("answerable not measured: no noul question labelled yes or no")
    return "unknown: " + "; ".join(parts)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


__all__ = [
    "check_lines",
    "checks_of",
    "levels",
    "negation_check",
    "order_agreement",
    "order_agreement_of_runs",
    "reversed_check",
    "severity_check",
    "total_variation",
    "unknown_check",
]
