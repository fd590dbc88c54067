"""Significance and uncertainty, all through scipy: Fisher's exact test on two abstention tables,
the exact McNemar test on paired per-question correctness, bootstrap intervals for a mean."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def abstention_fisher(table_a: dict, table_b: dict, row: str) -> dict:
    """Two-sided Fisher exact test: do runs A and B abstain at different rates on ``row``
    ("answerable" or "unanswerable") questions? Table: run x (abstained, answered)."""
    counts = [[table_a[row]["abstained"], table_a[row]["answered"]], [table_b[row]["abstained"], table_b[row]["answered"]]]
    result = stats.fisher_exact(counts, alternative="two-sided")
    return {"row": row, "table": counts, "odds_ratio": _finite(result.statistic), "p_value": float(result.pvalue)}


def exact_mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict:
    """Exact (binomial) McNemar test on paired outcomes: only the discordant pairs count."""
    if len(correct_a) != len(correct_b):
        raise ValueError("paired outcomes need the same questions on both sides")
    only_a = sum(1 for a, b in zip(correct_a, correct_b) if a and not b)
    only_b = sum(1 for a, b in zip(correct_a, correct_b) if b and not a)
    discordant = only_a + only_b
    p_value = 1.0 if discordant == 0 else float(stats.binomtest(only_a, discordant, 0.5, alternative="two-sided").pvalue)
    return {"pairs": len(correct_a), "only_a_correct": only_a, "only_b_correct": only_b, "p_value": p_value}


def bootstrap_mean_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> dict:
    """Percentile-BCa bootstrap interval of the mean (scipy.stats.bootstrap), seeded: reproducible."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return {"mean": None, "low": None, "high": None, "confidence": confidence}
    if data.size == 1 or np.all(data == data[0]):
        return {"mean": float(data[0]), "low": float(data[0]), "high": float(data[0]), "confidence": confidence}
    result = stats.bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=resamples,
                             method="BCa", random_state=np.random.default_rng(seed))
    return {"mean": float(data.mean()), "low": float(result.confidence_interval.low),
            "high": float(result.confidence_interval.high), "confidence": confidence}


def _finite(value: float) -> float | None:
    """JSON has no infinity: an infinite odds ratio (a zero cell) is reported as None."""
    value = float(value)
    return value if np.isfinite(value) else None
