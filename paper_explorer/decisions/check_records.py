"""The figures of the four consistency checks of a decide run (``decisions.checks`` computes them),
as ``RUN/metrics.json`` holds them under ``checks``. Every figure is over the measured questions
the check reads, with its n beside it; a figure of no questions is None, never 0.

The probabilities read are the ones the run recorded (``DecisionRecord.probabilities``): a
temperature applied afterwards (``calibrate``) never changes a likeliest option, which most of
these figures count, but it does move the probabilities, so the checks say what the model said.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from paper_explorer.evaluation.records import MeanInterval


class CheckRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OrderAgreement(CheckRecord):
    """One question set read twice, its options listed in one order and then in the reverse."""

    questions: int  # measured in both orders
    agreeing: int  # the same option is the likeliest in both
    agreement: float | None  # agreeing / questions
    mean_total_variation: float | None  # mean of 1/2 sum |p(option) - p'(option)|, options matched by text
    max_total_variation: float | None


class ReversedCheck(CheckRecord):
    all: OrderAgreement
    kinds: dict[str, OrderAgreement]  # each kind the paired questions hold, in KINDS order
    unpaired: int  # questions with a reading missing in one order (not measured there)


class NegationCheck(CheckRecord):
    """noul questions q and their negations not-q (``negation_of``): yes to one is no to the other."""

    pairs: int  # both measured
    not_measured: int  # pairs in the run with a side not measured
    consistent: int  # the likeliest answers map onto each other: yes-no, no-yes, unknown-unknown
    consistency: float | None
    mean_yes_no_gap: float | None  # mean |P(yes | q) - P(no | not-q)|


class SeverityLean(CheckRecord):
    """Ordered options (least to most severe; a score's levels, lowest first) against the label,
    in levels (positions 0 to K-1) and as a share of the scale (divided by K-1)."""

    questions: int  # ordered, measured, labelled
    mean_error_levels: float | None  # mean of predicted level - label level
    mean_error_scale: float | None  # the same, each divided by its question's K-1
    errors: int  # questions whose likeliest option is not the label
    more_severe: int  # of those, predicted above the label
    less_severe: int  # below it
    more_severe_share: float | None  # more_severe / errors
    sign_test_p: float | None  # two-sided: more and less severe errors equally likely (binomial, 1/2)
    expected_lean_levels: float | None  # mean of E[level] - label level, E over the option probabilities
    expected_lean_scale: MeanInterval  # the same divided by K-1, with a seeded bootstrap interval


class SeverityCheck(CheckRecord):
    all: SeverityLean
    kinds: dict[str, SeverityLean]  # choice (ordered: true) and score, where the run has them


class UnknownCheck(CheckRecord):
    """noul questions with a label: "unknown" (the document cannot answer) or yes/no (it can)."""

    unanswerable: int  # measured, labelled unknown
    unknown_chosen: int  # of those, unknown the likeliest
    unknown_rate: float | None
    mean_p_unknown: float | None  # mean P(unknown) on those
    answerable: int  # measured, labelled yes or no
    false_unknown: int  # of those, unknown the likeliest
    false_unknown_rate: float | None
    mean_p_unknown_answerable: float | None


class DecisionChecks(CheckRecord):
    reversed: ReversedCheck | None = None  # None: the run did not read the options reversed (decide --check-reversed)
    negation: NegationCheck
    severity: SeverityCheck
    unknown: UnknownCheck


__all__ = [
    "DecisionChecks",
    "NegationCheck",
    "OrderAgreement",
    "ReversedCheck",
    "SeverityCheck",
    "SeverityLean",
    "UnknownCheck",
]
