"""Top-label calibration of typed decisions, per kind: is the likeliest option as often right as
its probability says?

Per measured, labelled question: the confidence is the likeliest option's probability (p_max), the
outcome whether that option is the label. ECE (equal-width and equal-mass bins), the reliability
bins and the bootstrap intervals are ``evaluation.calibration``'s, computed on those pairs; Brier is
the multi-class score (sum over options of (p - [option is the label])^2, 0 to 2) and NLL the
-log of the label's probability, clipped as ``evaluation.calibration.CLIP``. Questions of one kind
may have different numbers of options, so rows are ragged.

Temperature scaling (``scaled``, ``fit_temperature``) divides each option's log-likelihood by T and
renormalises: for T > 0 the order of the options, and so the likeliest one, never changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from paper_explorer.decisions.records import DecisionRecord, KindFigures
from paper_explorer.decisions.schema import KINDS
from paper_explorer.evaluation.calibration import CLIP, DEFAULT_BINS, TEMPERATURE_BOUNDS, bootstrap_interval, ece, reliability
from paper_explorer.evaluation.errors import EvaluationError


def labelled(records: Sequence[DecisionRecord]) -> tuple[list[np.ndarray], np.ndarray]:
    """(each measured, labelled question's probabilities, the label's position in them)."""
    rows, labels = [], []
    for record in records:
        if record.probabilities is not None and record.label is not None:
            rows.append(np.asarray(record.probabilities, dtype=float))
            labels.append(record.options.index(record.label))
    return rows, np.asarray(labels, dtype=int)


def scaled(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(log p / T): the likeliest option stays the likeliest for any T > 0."""
    logits = np.log(np.clip(probabilities, np.finfo(float).tiny, None)) / temperature
    return np.exp(logits - logsumexp(logits))


def scaled_nll(rows: list[np.ndarray], labels: np.ndarray, temperature: float) -> float:
    total = 0.0
    for row, label in zip(rows, labels):
        logits = np.log(np.clip(row, np.finfo(float).tiny, None)) / temperature
        total -= float(logits[label] - logsumexp(logits))
    return total / len(rows)


def fit_temperature(rows: list[np.ndarray], labels: np.ndarray) -> float:
    """The T in the bounds of ``evaluation.calibration`` that minimises the labels' NLL."""
    if not rows:
        raise EvaluationError("a temperature needs at least one measured question with a label")
    fitted = minimize_scalar(lambda t: scaled_nll(rows, labels, t), bounds=TEMPERATURE_BOUNDS, method="bounded", options={"xatol": 1e-6})
    return float(fitted.x)


def kind_figures(
    kind: str, records: Sequence[DecisionRecord], bins: int = DEFAULT_BINS, seed: int = 0, temperature: float | None = None
) -> KindFigures:
    """The figures of one kind's records (any number, none measured included)."""
    measured = [record for record in records if record.probabilities is not None]
    rows, labels = labelled(records)
    if temperature is not None:
        rows = [scaled(row, temperature) for row in rows]
    p_max = [max(record.probabilities or [0.0]) for record in measured]
    base = {
        "kind": kind,
        "questions": len(records),
        "measured": len(measured),
        "labelled": len(rows),
        "mean_options": float(np.mean([len(record.options) for record in records])) if records else 0.0,
        "mean_confidence": float(np.mean([record.confidence for record in measured])) if measured else None,
        "mean_p_max": float(np.mean(p_max)) if measured else None,
        "bins": bins,
        "nll_clip": CLIP,
        "temperature": temperature,
    }
    if not rows:
        return KindFigures(**base)
    confidence = np.array([row.max() for row in rows])
    correct = np.array([int(np.argmax(row)) == label for row, label in zip(rows, labels)])
    # The bootstrap resamples questions: Brier and NLL are means of per-question values, so their
    # intervals resample those values with the same statistic as ECE's (a mean over the draw).
    brier_each = np.array([np.sum((row - np.eye(row.size)[label]) ** 2) for row, label in zip(rows, labels)])
    nll_each = np.array([-np.log(np.clip(row[label], CLIP, 1 - CLIP)) for row, label in zip(rows, labels)])

    def ece_width(c: np.ndarray, t: np.ndarray) -> float:
        return ece(c, t, bins)

    def ece_mass(c: np.ndarray, t: np.ndarray) -> float:
        return ece(c, t, bins, equal_mass=True)

    def mean_of(values: np.ndarray, _: np.ndarray) -> float:
        return float(values.mean())

    return KindFigures(
        **base,
        accuracy=float(correct.mean()),
        ece_equal_width=ece_width(confidence, correct),
        ece_equal_width_ci95=bootstrap_interval(ece_width, confidence, correct, seed),
        ece_equal_mass=ece_mass(confidence, correct),
        ece_equal_mass_ci95=bootstrap_interval(ece_mass, confidence, correct, seed),
        brier=float(brier_each.mean()),
        brier_ci95=bootstrap_interval(mean_of, brier_each, correct, seed),
        nll=float(nll_each.mean()),
        nll_ci95=bootstrap_interval(mean_of, nll_each, correct, seed),
        reliability_equal_width=reliability(confidence, correct, bins, equal_mass=False),
        reliability_equal_mass=reliability(confidence, correct, bins, equal_mass=True),
    )


def figures_by_kind(
    records: Sequence[DecisionRecord], bins: int = DEFAULT_BINS, temperatures: dict[str, float] | None = None
) -> dict[str, KindFigures]:
    """Each kind the records hold, in ``KINDS`` order."""
    return {
        kind: kind_figures(kind, [record for record in records if record.kind == kind], bins, temperature=(temperatures or {}).get(kind))
        for kind in KINDS
        if any(record.kind == kind for record in records)
    }


__all__ = ["figures_by_kind", "fit_temperature", "kind_figures", "labelled", "scaled", "scaled_nll"]
