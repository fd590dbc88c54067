"""Significance and uncertainty, all through scipy: Fisher's exact test on two abstention tables
(the unpaired design), the exact McNemar test on paired per-question outcomes, bootstrap intervals
for a mean, and p-values written for people. Each result is a record of ``evaluation.records``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy import stats

from paper_explorer.evaluation.records import AbstentionTable, FisherTest, MeanInterval


def abstention_fisher(
    table_a: AbstentionTable, table_b: AbstentionTable, row: Literal["answerable", "unanswerable"], alpha: float | None = None
) -> FisherTest:
    """Two-sided Fisher exact test: do runs A and B abstain at different rates on ``row``
    ("answerable" or "unanswerable") questions? Table: run x (abstained, answered). With ``alpha``,
    the test says whether its p-value is below it."""
    a, b = getattr(table_a, row), getattr(table_b, row)
    counts = [[a.abstained, a.answered], [b.abstained, b.answered]]
    result = stats.fisher_exact(counts, alternative="two-sided")
    p_value = float(result.pvalue)
    return FisherTest(
        row=row, table=counts, odds_ratio=_finite(result.statistic), p_value=p_value, significant=None if alpha is None else p_value < alpha
    )


def discordant_pairs(outcome_a: Sequence[bool], outcome_b: Sequence[bool]) -> tuple[int, int]:
    """Paired yes/no outcomes (correct, abstained) of the same questions: how many were yes in A
    only, and how many in B only."""
    if len(outcome_a) != len(outcome_b):
        raise ValueError("paired outcomes need the same questions on both sides")
    only_a = sum(1 for a, b in zip(outcome_a, outcome_b) if a and not b)
    only_b = sum(1 for a, b in zip(outcome_a, outcome_b) if b and not a)
    return only_a, only_b


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: under no difference each discordant pair is a fair coin,
    so ``only_a`` is Binomial(only_a + only_b, 1/2). No discordant pair: nothing differs, p = 1."""
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0
    return float(stats.binomtest(only_a, discordant, 0.5, alternative="two-sided").pvalue)


def bootstrap_mean_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> MeanInterval:
    """Percentile-BCa bootstrap interval of the mean (scipy.stats.bootstrap), seeded: reproducible."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return MeanInterval(mean=None, low=None, high=None, confidence=confidence)
    if data.size == 1 or np.all(data == data[0]):
        return MeanInterval(mean=float(data[0]), low=float(data[0]), high=float(data[0]), confidence=confidence)
    result = stats.bootstrap(
        (data,), np.mean, confidence_level=confidence, n_resamples=resamples, method="BCa", random_state=np.random.default_rng(seed)
    )
    return MeanInterval(
        mean=float(data.mean()),
        low=float(result.confidence_interval.low),
        high=float(result.confidence_interval.high),
        confidence=confidence,
    )


def format_p(p_value: float | None, floor: float = 1e-4) -> str:
    """A p-value for people: "p < 1e-4" below ``floor`` (an exact test's tiny p is not worth its
    digits, and "p = 0.0000" reads as impossible), two significant figures below 0.001,
    three decimals above."""
    if p_value is None or not np.isfinite(p_value):
        return "p = n/a"
    if p_value < floor:
        return f"p < {floor:.0e}".replace("e-0", "e-")
    if p_value < 0.001:
        return f"p = {p_value:.2g}"
    return f"p = {p_value:.3f}"


def _finite(value: float) -> float | None:
    """JSON has no infinity: an infinite odds ratio (a zero cell) is reported as None."""
    value = float(value)
    return value if np.isfinite(value) else None
