"""Calibration measured: when the policy says it is sure, is it right?

Each option probe (``agent.probes``, recorded in ``Trajectory.probes`` and copied to the episode's
line of scores.jsonl as ``EpisodeScore.probes``) gives, at the episode's end, a probability for each
of its options. What is judged is the probability of the probe's FIRST option - its affirmative,
"yes" - against a label, one per episode:

- ``gold-answerable``: the gold question is answerable (the ``answerable`` probe's default);
- ``answer-f1>=X``: the episode's answer F1 is at least X (the ``correct`` probe's default, X = 0.5).

The label definition is a named setting, recorded beside every figure it produced. Only scored
episodes (with gold answers) whose probe has probabilities count; a probe recorded without them
(over the context: never truncated) is counted as ``not_measured``.

The figures, per probe: the expected calibration error (ECE) with equal-width bins (fixed edges
0, 1/B, ..., 1; the last bin closed) and with equal-mass bins (the episodes sorted by probability
and cut into B runs whose sizes differ by at most one; tied probabilities may fall either side of a
cut), the Brier score, the negative log-likelihood (natural log; probabilities clipped to
[1e-12, 1 - 1e-12] so that a recorded 0 or 1 costs a finite amount, and the clip is stated in the
figures), each with a seeded percentile bootstrap 95% interval resampling episodes, the accuracy
of the argmax option, and both binnings' reliability bins (count, mean probability, accuracy).

Temperature scaling (``scaled``, ``fit_temperature``) divides the log of each option's probability
by T and renormalises: for two options ``sigmoid(logit(p) / T)``. T > 0 keeps the order of the
options, so it never changes which one wins. T is fitted by minimising the NLL on a validation run
(``scipy.optimize.minimize_scalar``, bounded to [0.05, 20]). Fitting, the calibration file and
applying it are ``evaluation.calibration_fit``'s.

Why one module: the labels, the exclusions (not measured, under the minimum mass), the figures
and temperature scaling are read together by every consumer (metrics, compare, prereg, calibrate);
split, the rule for which episodes count would sit apart from the figures computed over them.

Not covered: probes asked during the episode (``at_step`` set; only the end's are judged), and the
calibration of options other than the first (top-label calibration).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from paper_explorer.agent.trajectory import DEFAULT_PROBE_MIN_MASS, ProbeResult
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import Interval, ProbeCalibration, ProbeMass, ReliabilityBin


class Probed(Protocol):
    """What calibration reads of a ProbeScore (``evaluation.scoring``, which imports this module)."""

    @property
    def probe(self) -> str: ...
    @property
    def options(self) -> list[str]: ...
    @property
    def probabilities(self) -> list[float] | None: ...
    @property
    def mass(self) -> float | None: ...
    @property
    def min_mass(self) -> float | None: ...


class EpisodeScore(Protocol):
    """What calibration reads of a line of scores.jsonl (``evaluation.scoring.EpisodeScore``)."""

    @property
    def episode_id(self) -> str: ...
    @property
    def answerable(self) -> bool | None: ...
    @property
    def answer_f1(self) -> float | None: ...
    @property
    def probes(self) -> Sequence[Probed] | None: ...
    @property
    def scored(self) -> bool: ...


DEFAULT_BINS = 10
CLIP = 1e-12  # probabilities are kept in [CLIP, 1 - CLIP] before a logarithm
RESAMPLES = 2_000  # bootstrap resamples of the episodes
TEMPERATURE_BOUNDS = (0.05, 20.0)
DEFAULT_LABELS = {"answerable": "gold-answerable", "correct": "answer-f1>=0.5"}
LABELS = "gold-answerable, answer-f1>=X (X in (0, 1])"  # for messages: the definitions there are


# -- labels -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    """A label definition: its name as metrics.json and the calibration file record it, and the
    rule that labels an episode (None: the episode cannot be labelled, e.g. no gold answers)."""

    name: str
    of: Callable[[EpisodeScore], bool | None]


def _answerable(score: EpisodeScore) -> bool | None:
    return score.answerable if score.scored else None


def parse_label(name: str) -> Label:
    """``gold-answerable`` or ``answer-f1>=X``; anything else is one clear line."""
    if name == "gold-answerable":
        return Label(name, _answerable)
    found = re.fullmatch(r"answer-f1>=([0-9]*\.?[0-9]+)", name)
    if found is not None and 0 < float(found.group(1)) <= 1:
        floor = float(found.group(1))
        return Label(name, lambda score: None if score.answer_f1 is None else score.answer_f1 >= floor)
    raise EvaluationError(f"unknown label definition {name!r}; use one of: {LABELS}")


def default_label(probe: str) -> str:
    """The label a probe is judged against unless one is named: answer-f1>=0.5 for any but ``answerable``."""
    return DEFAULT_LABELS.get(probe, DEFAULT_LABELS["correct"])


@dataclass(frozen=True)
class Observations:
    """One probe's measured episodes: option probabilities (n x options) and labels, in run order."""

    probe: str
    label: str
    options: list[str]
    probabilities: np.ndarray  # rows renormalised over the options
    labels: np.ndarray  # bool
    episode_ids: list[str]
    not_measured: int
    low_mass: int = 0  # measured and labelled, but kept out: the options held less than the minimum mass
    min_mass: float | None = None  # the minimum applied (None: the run's own, per episode)

    @property
    def confidence(self) -> np.ndarray:
        """The probability of the first option."""
        return self.probabilities[:, 0]


SUM_TOLERANCE = 1e-6  # how far from 1 a recorded row may sum (agent.probes renormalises it in floating point)


def probability_problem(options: Sequence[str], probabilities: Sequence[float]) -> str | None:
    """Why a recorded row is not a probability per option (NaN, infinity, outside [0, 1], a row that
    does not sum to 1, or one value too many or few), or None when it is one. A temperature or a
    McNemar test computed from such a row would be a number that means nothing."""
    if len(probabilities) != len(options):
        return f"{len(probabilities)} probabilities for {len(options)} options"
    for value in probabilities:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:  # NaN fails both comparisons
            return f"{value!r} is not a probability (finite, in [0, 1])"
    if abs(math.fsum(probabilities) - 1) > SUM_TOLERANCE:
        return f"they sum to {math.fsum(probabilities)!r}, not 1"
    return None


READING_TOLERANCE = 1e-9  # how far a recorded probability or mass may be from what its log-probabilities give


def reading_problem(result: ProbeResult) -> str | None:
    """Why a measured probe's probabilities and mass are not what its own recorded
    log-probabilities give (``agent.probes.from_logprobs``, which wrote them), or None. A mass
    raised above the run's minimum, or probabilities moved, without their log-probabilities is an
    edited record: rescore would find it with the model, this finds it without."""
    if result.probabilities is None or result.logprobs is None or len(result.logprobs) != len(result.options):
        return None
    from paper_explorer.agent.probes import from_logprobs

    try:  # a log-probability of -inf is recorded as null (agent.probes._recordable)
        probabilities, mass = from_logprobs([-math.inf if value is None else value for value in result.logprobs])
    except ValueError as error:
        return f"its log-probabilities {result.logprobs!r} are no reading ({error})"
    if result.mass is not None and not math.isclose(result.mass, mass, rel_tol=READING_TOLERANCE, abs_tol=1e-300):
        return f"its mass {result.mass!r} is not the {mass!r} its log-probabilities {result.logprobs!r} give"
    if len(probabilities) == len(result.probabilities) and any(
        not abs(a - b) <= READING_TOLERANCE for a, b in zip(probabilities, result.probabilities)
    ):
        return f"its probabilities {result.probabilities!r} are not the {probabilities!r} its log-probabilities give"
    return None


def below_min_mass(found: Probed, min_mass: float | None = None) -> bool:
    """Whether a measured probe's options held less of the distribution than ``min_mass`` (None:
    the minimum its run recorded; a run recorded before there was one is held to the default)."""
    floor = min_mass if min_mass is not None else found.min_mass if found.min_mass is not None else DEFAULT_PROBE_MIN_MASS
    return found.mass is not None and found.mass < floor


def observations(scores: Sequence[EpisodeScore], probe: str, label: str | None = None, min_mass: float | None = None) -> Observations:
    """The episodes of ``scores`` whose end-of-episode ``probe`` has probabilities, held at least
    the minimum mass (``below_min_mass``; counted in ``low_mass`` otherwise), and whose label is
    defined. Options must agree across episodes (one probes file per run); a row that is not
    probabilities (``probability_problem``) is refused, naming the episode."""
    rule = parse_label(label or default_label(probe))
    rows, labels, ids, options, not_measured, low_mass = [], [], [], None, 0, 0
    for score in scores:
        found = next((p for p in score.probes or [] if p.probe == probe), None)
        if found is None:
            continue
        if found.probabilities is None:
            not_measured += 1
            continue
        problem = probability_problem(found.options, found.probabilities)
        if problem is not None:
            raise EvaluationError(
                f"episode {score.episode_id}: probe {probe!r} recorded {found.probabilities[:8]!r} for options {found.options[:8]!r}: "
                f"{problem}; the run's record was edited or damaged: run the episode again"
            )
        truth = rule.of(score)
        if truth is None:
            continue
        if below_min_mass(found, min_mass):
            low_mass += 1
            continue
        if options is None:
            options = found.options
        elif found.options != options:
            raise EvaluationError(f"probe {probe!r} has options {found.options} in episode {score.episode_id} but {options} before it")
        rows.append(found.probabilities)
        labels.append(bool(truth))
        ids.append(score.episode_id)
    probabilities = np.asarray(rows, dtype=float).reshape(len(rows), len(options or []))
    return Observations(
        probe, rule.name, options or [], probabilities, np.asarray(labels, dtype=bool), ids, not_measured, low_mass, min_mass
    )


def probe_mass(scores: Sequence[EpisodeScore]) -> dict[str, ProbeMass] | None:
    """metrics.json's ``probe_mass``: per probe the episodes can tell it of (measured, with a
    recorded mass), the mass's mean and least value, the minimum in force and how many fell below
    it; None when no episode recorded one."""
    found: dict[str, list[Probed]] = {}
    for score in scores:
        for probe in score.probes or []:
            if probe.probabilities is not None and probe.mass is not None:
                found.setdefault(probe.probe, []).append(probe)
    return {
        name: ProbeMass(
            measured=len(probes),
            mean=math.fsum(float(p.mass or 0) for p in probes) / len(probes),
            min=min(float(p.mass or 0) for p in probes),
            min_mass=max(p.min_mass if p.min_mass is not None else DEFAULT_PROBE_MIN_MASS for p in probes),
            below=sum(below_min_mass(p) for p in probes),
        )
        for name, probes in found.items()
    } or None


def mass_line(name: str, m: ProbeMass) -> str:
    """One plain line for the terminal: how much of the model's distribution a probe's options held."""
    line = f"probe {name}: its options held {m.mean:.3g} of the next-token distribution on average (least {m.min:.3g})"
    if m.below:
        line += (
            f"; {m.below} of {m.measured} episodes under the minimum {m.min_mass:g} measured no belief and are left out of "
            "calibration (docs/calibration.md, 'Check the mass')"
        )
    return line


def probes_in(scores: Sequence[EpisodeScore]) -> list[str]:
    """The probe names the episodes recorded at their end, in first-seen order."""
    names: dict[str, None] = {}
    for score in scores:
        for probe in score.probes or []:
            names.setdefault(probe.probe)
    return list(names)


# -- the figures --------------------------------------------------------------------------------


def equal_width_bins(confidence: np.ndarray, bins: int) -> list[np.ndarray]:
    """Indices per bin [k/B, (k+1)/B), the last closed: a probability of exactly 1 is counted."""
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    return [np.flatnonzero(which == k) for k in range(bins)]


def equal_mass_bins(confidence: np.ndarray, bins: int) -> list[np.ndarray]:
    """Indices per bin, the episodes sorted by probability (stable) and cut into ``bins`` runs whose
    sizes differ by at most one (``np.array_split``); fewer episodes than bins leaves bins empty."""
    order = np.argsort(confidence, kind="stable")
    return list(np.array_split(order, bins))


def reliability(confidence: np.ndarray, labels: np.ndarray, bins: int, equal_mass: bool) -> list[ReliabilityBin]:
    """Each bin's count, mean probability and accuracy (None when empty)."""
    result = []
    for k, members in enumerate((equal_mass_bins if equal_mass else equal_width_bins)(confidence, bins)):
        if equal_mass:
            low, high = (float(confidence[members].min()), float(confidence[members].max())) if members.size else (float("nan"),) * 2
        else:
            low, high = k / bins, (k + 1) / bins
        result.append(
            ReliabilityBin(
                low=low,
                high=high,
                count=int(members.size),
                mean_confidence=float(confidence[members].mean()) if members.size else None,
                accuracy=float(labels[members].mean()) if members.size else None,
            )
        )
    return [b for b in result if b.count or not equal_mass]  # an empty equal-mass bin has no edges to show


def ece(confidence: np.ndarray, labels: np.ndarray, bins: int = DEFAULT_BINS, equal_mass: bool = False) -> float:
    """Sum over bins of (bin's share of episodes) x |accuracy - mean probability|."""
    total = confidence.size
    if total == 0:
        raise EvaluationError("ECE of no episodes")
    grouped = (equal_mass_bins if equal_mass else equal_width_bins)(confidence, bins)
    return float(sum(m.size / total * abs(labels[m].mean() - confidence[m].mean()) for m in grouped if m.size))


def brier(confidence: np.ndarray, labels: np.ndarray) -> float:
    """Mean squared difference between the probability and the label (1 or 0)."""
    return float(np.mean((confidence - labels) ** 2))


def nll(confidence: np.ndarray, labels: np.ndarray) -> float:
    """Mean -log of the probability given to what happened, the probability clipped to [CLIP, 1 - CLIP]."""
    p = np.clip(confidence, CLIP, 1 - CLIP)
    return float(-np.mean(np.where(labels, np.log(p), np.log1p(-p))))


def accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """How often the argmax option is the first exactly when the label holds."""
    return float(np.mean((np.argmax(probabilities, axis=1) == 0) == labels))


def bootstrap_interval(
    statistic: Callable[[np.ndarray, np.ndarray], float],
    confidence: np.ndarray,
    labels: np.ndarray,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = 0.95,
) -> Interval:
    """Percentile interval of ``statistic`` over episodes resampled with replacement, seeded:
    the same run gives the same interval."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, confidence.size, size=(resamples, confidence.size))
    values = np.array([statistic(confidence[d], labels[d]) for d in draws])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(low=float(low), high=float(high), confidence=level, resamples=resamples)


def probe_calibration(found: Observations, bins: int = DEFAULT_BINS, seed: int = 0) -> ProbeCalibration:
    """Every figure of one probe's observations (at least one episode)."""
    p, y = found.confidence, found.labels

    def ece_width(c, t):
        return ece(c, t, bins)

    def ece_mass(c, t):
        return ece(c, t, bins, equal_mass=True)

    return ProbeCalibration(
        probe=found.probe,
        label=found.label,
        option=found.options[0],
        n=int(p.size),
        positives=int(y.sum()),
        not_measured=found.not_measured,
        low_mass=found.low_mass,
        bins=bins,
        ece_equal_width=ece_width(p, y),
        ece_equal_width_ci95=bootstrap_interval(ece_width, p, y, seed),
        ece_equal_mass=ece_mass(p, y),
        ece_equal_mass_ci95=bootstrap_interval(ece_mass, p, y, seed),
        brier=brier(p, y),
        brier_ci95=bootstrap_interval(brier, p, y, seed),
        nll=nll(p, y),
        nll_ci95=bootstrap_interval(nll, p, y, seed),
        nll_clip=CLIP,
        accuracy=accuracy(found.probabilities, y),
        reliability_equal_width=reliability(p, y, bins, equal_mass=False),
        reliability_equal_mass=reliability(p, y, bins, equal_mass=True),
    )


def run_calibration(
    scores: Sequence[EpisodeScore], bins: int = DEFAULT_BINS, labels: dict[str, str] | None = None
) -> dict[str, ProbeCalibration] | None:
    """metrics.json's ``calibration``: per probe with at least one measured, labelled episode, its
    figures under the probe's label (``labels``, else the default); None when there are none (a run
    without probes: its metrics.json is as before)."""
    figures = {}
    for probe in probes_in(scores):
        found = observations(scores, probe, (labels or {}).get(probe))
        if found.labels.size:
            figures[probe] = probe_calibration(found, bins)
    return figures or None


def calibration_summary(figures: dict[str, ProbeCalibration] | None) -> list[str]:
    """One plain line per probe for the terminal (``explorer eval``'s and ``inspect``'s summary)."""
    return [
        f"calibration of probe {c.probe} (P({c.option}) against {c.label}, n = {c.n}"
        + (f", {c.not_measured} not measured" if c.not_measured else "")
        + (f", {c.low_mass} under the minimum mass left out" if c.low_mass else "")
        + f"): ECE {c.ece_equal_width:.3f} (95% CI {c.ece_equal_width_ci95.low:.3f}-{c.ece_equal_width_ci95.high:.3f}) "
        f"with {c.bins} equal-width bins, {c.ece_equal_mass:.3f} equal-mass; Brier {c.brier:.3f}; NLL {c.nll:.3f}; accuracy {c.accuracy:.3f}"
        for c in (figures or {}).values()
    ]


# -- temperature scaling ------------------------------------------------------------------------


def log_scaled(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """Log of softmax(log p / T) per row: the options' order is kept for any T > 0."""
    logits = np.log(np.clip(probabilities, np.finfo(float).tiny, None)) / temperature
    return logits - logsumexp(logits, axis=1, keepdims=True)


def scaled(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """The options' probabilities after temperature scaling (two options: sigmoid(logit(p) / T))."""
    return np.exp(log_scaled(probabilities, temperature))


def scaled_nll(probabilities: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """The NLL of the labels under the scaled first option, in log space (no clip needed: the
    other options' log-probability is log(1 - p) without cancellation)."""
    logs = log_scaled(probabilities, temperature)
    first, rest = logs[:, 0], logsumexp(logs[:, 1:], axis=1)
    return float(-np.mean(np.where(labels, first, rest)))


def fit_temperature(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The T in [0.05, 20] that minimises the NLL of ``labels`` (bounded Brent search)."""
    if probabilities.shape[0] == 0 or probabilities.shape[1] < 2:
        raise EvaluationError("a temperature needs at least one measured episode of a probe with two or more options")
    fitted = minimize_scalar(
        lambda t: scaled_nll(probabilities, labels, t), bounds=TEMPERATURE_BOUNDS, method="bounded", options={"xatol": 1e-6}
    )
    return float(fitted.x)
