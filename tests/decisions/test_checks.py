"""The four checks of a decide run, each against figures worked out by hand on constructed records."""

from __future__ import annotations

import pytest

from paper_explorer.decisions.checks import (
    check_lines,
    checks_of,
    negation_check,
    order_agreement,
    order_agreement_of_runs,
    reversed_check,
    severity_check,
    unknown_check,
)
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.records import DecisionRecord

NOUL = ["yes", "no", "unknown"]


def reading(
    question_id: str,
    kind: str,
    options: list[str],
    probabilities: list[float] | None,
    label: str | None = None,
    *,
    ordered: bool = False,
    negation_of: str | None = None,
) -> DecisionRecord:
    """A record as decide writes one: the options as listed, the likeliest the first of equals."""
    measured = {}
    if probabilities is not None:
        best = max(range(len(options)), key=probabilities.__getitem__)
        measured = {"probabilities": probabilities, "loglikelihoods": [-1.0] * len(options), "predicted": options[best]}
    return DecisionRecord(
        question_id=question_id,
        document_id="d",
        kind=kind,  # type: ignore[arg-type]
        question="?",
        options=options,
        ordered=ordered or kind == "score",
        label=label,
        negation_of=negation_of,
        option_tokens=[2] * len(options),
        document_tokens=10,
        seconds=0.0,
        not_measured=None if probabilities is not None else "over the context",
        **measured,
    )


def given_and_reversed() -> list[tuple[DecisionRecord, DecisionRecord]]:
    return [
        # aligned by text: yes .6/.5, no .3/.3, unknown .1/.2: TV 0.1, both yes
        (reading("a", "noul", NOUL, [0.6, 0.3, 0.1]), reading("a", "noul", NOUL[::-1], [0.2, 0.3, 0.5])),
        # A .5/.3, B .4/.6, C .1/.1: TV 0.2, A against B
        (reading("b", "choice", ["A", "B", "C"], [0.5, 0.4, 0.1]), reading("b", "choice", ["C", "B", "A"], [0.1, 0.6, 0.3])),
        # the same distribution: TV 0, both 1
        (reading("c", "score", ["1", "2"], [0.9, 0.1]), reading("c", "score", ["2", "1"], [0.1, 0.9])),
        # not measured reversed: unpaired
        (reading("d", "noul", NOUL, [0.6, 0.3, 0.1]), reading("d", "noul", NOUL[::-1], None)),
    ]


def test_reversed_options_agreement_and_total_variation_per_kind():
    check = order_agreement(given_and_reversed())
    assert (check.all.questions, check.all.agreeing, check.unpaired) == (3, 2, 1)
    assert check.all.agreement == pytest.approx(2 / 3)
    assert check.all.mean_total_variation == pytest.approx(0.1)
    assert check.all.max_total_variation == pytest.approx(0.2)
    assert list(check.kinds) == ["noul", "choice", "score"]
    assert (check.kinds["noul"].agreeing, check.kinds["noul"].mean_total_variation) == (1, pytest.approx(0.1))
    assert (check.kinds["choice"].agreement, check.kinds["choice"].mean_total_variation) == (0.0, pytest.approx(0.2))
    assert (check.kinds["score"].agreement, check.kinds["score"].mean_total_variation) == (1.0, pytest.approx(0.0))


def test_the_reversed_reading_in_the_record_and_two_runs_give_one_figure():
    pairs = given_and_reversed()
    nested = [given.model_copy(update={"reversed": other}) for given, other in pairs]
    from_record = reversed_check(nested)
    from_runs = order_agreement_of_runs([given for given, _ in pairs], [other for _, other in pairs])
    assert from_record == from_runs == order_agreement(pairs)
    assert reversed_check([given for given, _ in pairs]) is None  # a run without --check-reversed


def test_two_runs_pair_by_question_id_and_refuse_other_options():
    pairs = given_and_reversed()
    first, second = [given for given, _ in pairs], [other for _, other in pairs][:3]
    only_first = order_agreement_of_runs(first + [reading("e", "noul", NOUL, [0.5, 0.3, 0.2])], second[::-1])
    assert (only_first.all.questions, only_first.unpaired) == (3, 2)  # d unmeasured reversed is missing here; e is in one run only
    with pytest.raises(DecisionError, match="share no question"):
        order_agreement_of_runs(first, [reading("z", "noul", NOUL, [0.5, 0.3, 0.2])])
    with pytest.raises(DecisionError, match="question 'b' has other options"):
        order_agreement_of_runs(first, [reading("b", "choice", ["A", "B", "D"], [0.5, 0.4, 0.1])])


def negation_records(listed_reversed: bool = False) -> list[DecisionRecord]:
    def noul(question_id, probabilities, negation_of=None):
        if listed_reversed:  # the same readings, options listed last first
            return reading(question_id, "noul", NOUL[::-1], None if probabilities is None else probabilities[::-1], negation_of=negation_of)
        return reading(question_id, "noul", NOUL, probabilities, negation_of=negation_of)

    return [
        noul("q1", [0.7, 0.2, 0.1]),  # yes
        noul("q1n", [0.1, 0.6, 0.3], "q1"),  # no: consistent; |0.7 - 0.6| = 0.1
        noul("q2", [0.5, 0.4, 0.1]),  # yes
        noul("q2n", [0.5, 0.3, 0.2], "q2"),  # yes: inconsistent; |0.5 - 0.3| = 0.2
        noul("q3", [0.3, 0.2, 0.5], "q3n"),  # unknown, named from both sides: one pair
        noul("q3n", [0.1, 0.3, 0.6], "q3"),  # unknown: consistent; |0.3 - 0.3| = 0
        noul("q4", [0.6, 0.3, 0.1]),
        noul("q4n", None, "q4"),  # not measured
        noul("q5n", [0.6, 0.3, 0.1], "q5"),  # q5 is not in these records: no pair
    ]


@pytest.mark.parametrize("listed_reversed", [False, True])
def test_negation_consistency_and_yes_no_gap(listed_reversed):
    check = negation_check(negation_records(listed_reversed))
    assert (check.pairs, check.not_measured, check.consistent) == (3, 1, 2)
    assert check.consistency == pytest.approx(2 / 3)
    assert check.mean_yes_no_gap == pytest.approx(0.1)


def severity_records(listed_reversed: bool = False) -> list[DecisionRecord]:
    def ordered(question_id, kind, options, probabilities, label):
        if listed_reversed:
            return reading(question_id, kind, options[::-1], probabilities[::-1], label, ordered=True)
        return reading(question_id, kind, options, probabilities, label, ordered=True)

    return [
        # level 3 against 1: +2 levels, +0.5 of the scale; E = 2.4, lean +1.4 (+0.35)
        ordered("s1", "score", ["1", "2", "3", "4", "5"], [0.1, 0.1, 0.2, 0.5, 0.1], "2"),
        # level 1 against 2: -1, -0.5; E = 0.9, lean -1.1 (-0.55)
        ordered("s2", "choice", ["minor", "major", "critical"], [0.2, 0.7, 0.1], "critical"),
        # right: 0; E = 0.2, lean +0.2 (+0.2)
        ordered("s3", "score", ["low", "high"], [0.8, 0.2], "low"),
        reading("s4", "score", ["1", "2", "3"], [0.1, 0.1, 0.8]),  # no label: not read
        reading("s5", "choice", ["x", "y", "z"], [0.1, 0.1, 0.8], "x"),  # not ordered: not read
        reading("s6", "score", ["1", "2", "3"], None, "1"),  # not measured: not read
    ]


@pytest.mark.parametrize("listed_reversed", [False, True])
def test_severity_lean_in_levels_in_scale_and_expected(listed_reversed):
    check = severity_check(severity_records(listed_reversed), order="reversed" if listed_reversed else "given")
    lean = check.all
    assert (lean.questions, lean.errors, lean.more_severe, lean.less_severe) == (3, 2, 1, 1)
    assert lean.mean_error_levels == pytest.approx(1 / 3)
    assert lean.mean_error_scale == pytest.approx(0.0)
    assert lean.more_severe_share == pytest.approx(0.5)
    assert lean.sign_test_p == pytest.approx(1.0)
    assert lean.expected_lean_levels == pytest.approx(0.5 / 3)
    assert lean.expected_lean_scale.mean == pytest.approx(0.0)
    assert lean.expected_lean_scale.low is not None and lean.expected_lean_scale.low <= 0.0 <= (lean.expected_lean_scale.high or 0.0)
    score = check.kinds["score"]
    assert (score.questions, score.more_severe, score.less_severe) == (2, 1, 0)
    assert (score.mean_error_levels, score.mean_error_scale) == (pytest.approx(1.0), pytest.approx(0.25))
    assert score.expected_lean_levels == pytest.approx(0.8)
    assert check.kinds["choice"].mean_error_scale == pytest.approx(-0.5)


def test_severity_sign_test_sees_a_one_sided_lean():
    leaning = [reading(f"s{n}", "score", ["1", "2", "3"], [0.1, 0.2, 0.7], "1") for n in range(8)]
    lean = severity_check(leaning).all
    assert (lean.more_severe, lean.less_severe, lean.more_severe_share) == (8, 0, 1.0)
    assert lean.sign_test_p == pytest.approx(2 * 0.5**8)  # two-sided binomial, 8 of 8
    assert lean.mean_error_scale == pytest.approx(1.0)
    assert lean.expected_lean_scale.mean == pytest.approx((0.2 + 1.4) / 2)
    assert lean.expected_lean_scale.low == lean.expected_lean_scale.high == pytest.approx(0.8)  # every value alike


def test_unknown_rate_on_unanswerable_and_false_unknown_on_answerable():
    check = unknown_check(
        [
            reading("u1", "noul", NOUL, [0.2, 0.2, 0.6], "unknown"),  # unknown chosen
            reading("u2", "noul", NOUL[::-1], [0.2, 0.3, 0.5], "unknown"),  # listed reversed: yes .5 chosen, P(unknown) .2
            reading("a1", "noul", NOUL, [0.3, 0.2, 0.5], "yes"),  # false unknown
            reading("a2", "noul", NOUL, [0.1, 0.8, 0.1], "no"),
            reading("a3", "noul", NOUL, None, "yes"),  # not measured
            reading("n1", "noul", NOUL, [0.1, 0.1, 0.8]),  # no label
            reading("c1", "choice", ["unknown", "b"], [0.9, 0.1], "b"),  # not noul
        ]
    )
    assert (check.unanswerable, check.unknown_chosen, check.answerable, check.false_unknown) == (2, 1, 2, 1)
    assert (check.unknown_rate, check.false_unknown_rate) == (0.5, 0.5)
    assert check.mean_p_unknown == pytest.approx(0.4)
    assert check.mean_p_unknown_answerable == pytest.approx(0.3)


def test_a_run_with_nothing_to_check_says_not_measured_never_zero():
    checks = checks_of([reading("c", "choice", ["a", "b"], [0.6, 0.4])], "given")
    assert checks.reversed is None
    assert checks.negation.consistency is None and checks.negation.mean_yes_no_gap is None
    assert checks.severity.all.mean_error_levels is None and checks.severity.all.expected_lean_scale.mean is None
    assert checks.unknown.unknown_rate is None and checks.unknown.false_unknown_rate is None
    lines = check_lines(checks)
    assert lines[0].startswith("reversed options: not run")
    assert lines[1] == "negation: not measured: no pairs"
    assert lines[2] == "severity lean: not measured: no labelled question with ordered options"
    assert lines[3] == "unknown: not measured: no labelled noul question"


def test_each_check_prints_one_line_with_its_n():
    records = negation_records() + severity_records() + [reading("u", "noul", NOUL, [0.2, 0.2, 0.6], "unknown")]
    records = [record.model_copy(update={"reversed": record}) for record in records]
    reversed_line, negation, severity, unknown = check_lines(checks_of(records, "given"))
    assert reversed_line.startswith("reversed options: n=14, same likeliest option 1.000 (noul 9/9, choice 2/2, score 3/3)")
    assert "mean total variation 0.000" in reversed_line and "2 unpaired" in reversed_line  # q4n and s6 are not measured
    assert negation == "negation: n=3 pairs, consistent 0.667 (2 of 3), mean |P(yes|q) - P(no|not q)| 0.100"
    assert severity.startswith("severity lean: n=3, mean error +0.333 levels (+0.000 of the scale); errors 1 more severe, 1 less")
    assert (
        unknown
        == "unknown: n=1 unanswerable, unknown chosen 1.000 (1 of 1), mean P(unknown) 0.600; answerable not measured: no noul question labelled yes or no"
    )
