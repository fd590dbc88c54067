"""Reload re-scoring (``explorer rescore``): the option probabilities a run recorded
(``Trajectory.probes``, ``agent.probes``), recomputed from the model and adapter files on disk.

For every recorded probe with probabilities, the probe's prompt is rebuilt from the trajectory
(``probe_prompt`` over ``Trajectory.messages()``) and checked against the record (the probes
file's SHA-256, the prompt's, the options' tokens) before anything is loaded; then the hf policy
reads it twice: once with no cache at all (compared with the record), and once with a cache warmed
on the conversation before the probe turn (compared with the uncached reading: a flip there is a
cache bug, not a reload one). The check holds when every decision (the likeliest option) agrees
with the record (agreement 1.0000), the largest |difference| of any option's probability is
within the tolerance, and so are each option's log-probability (relative to its size: an option
the tiny model gives 1e-5 of the vocabulary's mass would hide any edit as a probability) and the
options' mass; otherwise the first mismatch is named (episode, probe, both values). A
recorded value that is not a number (NaN) is a mismatch and is reported as nan, never as 0.

Before anything is loaded the record is also checked for completeness: every episode holds each
probe the run's config asked for (``episode.probes`` in the manifest; ``correct`` only when the
episode submitted), and each ``prompt_tokens`` is the rebuilt prompt's length, exactly. A probe
recorded as ``not_measured`` is re-checked: the only reason rescore accepts is the context's (its
rebuilt prompt leaves no room for an option in the ``max_context`` the run's policy recorded);
any other is a mismatch, since the model on disk can measure it.

The tolerance, 5e-5 by default, applies to each option's probability and the options' mass, and
to each log-probability relative to its size (``relative_difference``: |a - b| / max(1, |a|)).
Measured on CPU in float32 (``--quantization none``, what ``auto`` picks on a CPU) with the real
SmolLM2-135M-Instruct, 30 validation episodes each probed once, recorded through the episode's KV
cache and recomputed without one (``explorer eval --policy hf --probe answerable --split validation
--limit 30 --max-steps 2`` then ``explorer rescore --json``): the 60 option probabilities moved by
median 7.4e-7, 90th percentile 2.0e-6, at most 2.8e-6; the log-probabilities (-2.7 to -0.56) by
at most 1.2e-5 absolute, 6.3e-6 relative; the mass by at most 3.5e-6; no decision flipped. A
cached and an uncached prefill split the float32 sums differently, and the rounding of a
log-probability grows with its size (issue 37: -13.92620659 recorded, -13.92621899 recomputed,
which an absolute 1e-5 refused). 5e-5 is eight times the largest measured difference and half of
the smallest change in a probability's fourth decimal, which is found. The random-weight tiny model
of the tests reloads bit for bit (difference 0) and another of its seeds differs by 0.1. On a GPU
with 4-bit weights (NF4, bfloat16 compute) the figure is unmeasured here: bfloat16 keeps about
three significant digits, so expect differences of order 1e-3 and, for a probability near 0.5, an
occasional flipped decision. ``--tolerance`` is for that case: measure your hardware's figure on a
run you trust, then pass it. A run recorded through an OpenAI-compatible server (``--policy
openai``) is rescored with the hf model of the same weights; a server's log-probabilities come from
its own kernels (and, for an option outside its top-k, a second request), so the same applies and
the output says so.

What is protected: a prompt that cannot be rebuilt from the trajectory as it was recorded (a
changed probes file, a changed renderer, an edited log) stops before the model is loaded; a model
whose tokenizer is not the run's, an adapter whose files are not the run's, or an adapter missing
or extra are refused as one ``EvaluationError`` line. What is not: that the probabilities mean
anything (``evaluation.calibration`` measures that); a probe an openai run recorded as
``not_measured`` because its server failed is refused (exit 1) rather than trusted, so such a run
does not pass until it is recorded again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.models import load_renderer
from paper_explorer.agent.policies.records import recorded
from paper_explorer.agent.probes import from_logprobs, load_probes
from paper_explorer.agent.served import common_prefix
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.rescore_checks import (
    Recorded,
    check_adapter,
    check_not_measured,
    check_tokenizer,
    missing_probe,
    nothing_to_rescore,
    rebuilt_prompt,
    recorded_probes,
)
from paper_explorer.evaluation.run_directory import MANIFEST, Run

if TYPE_CHECKING:
    from paper_explorer.agent.policies.hf import HFPolicy

DEFAULT_TOLERANCE = 5e-5  # CPU float32, measured: see the module docstring (and for a GPU)


@dataclass(frozen=True)
class Comparison:
    """One probe: the recorded probabilities and the two recomputed ones."""

    episode_id: str
    question_id: str | None
    sample: int
    probe: str
    options: list[str]
    recorded: list[float]
    uncached: list[float]
    cached: list[float]
    cached_tokens: int  # the conversation prefix the warmed cache held
    recorded_logprobs: list[float | None]
    uncached_logprobs: list[float]
    recorded_mass: float | None
    uncached_mass: float

    @property
    def difference(self) -> float:
        return largest_difference(self.recorded, self.uncached)

    @property
    def cached_difference(self) -> float:
        return largest_difference(self.cached, self.uncached)

    @property
    def logprob_difference(self) -> float:
        """Relative to the log-probability's size (``relative_difference``); a missing recorded
        log-probability is nan (a mismatch)."""
        recorded = [math.nan if value is None else value for value in self.recorded_logprobs]
        if len(recorded) != len(self.uncached_logprobs):
            return math.nan
        return largest(relative_difference(x, y) for x, y in zip(recorded, self.uncached_logprobs))

    @property
    def mass_difference(self) -> float:
        return math.nan if self.recorded_mass is None else largest_difference([self.recorded_mass], [self.uncached_mass])

    @property
    def agrees(self) -> bool:
        return decision(self.recorded) == decision(self.uncached)

    @property
    def flips(self) -> bool:
        return decision(self.cached) != decision(self.uncached)

    def mismatch(self, tolerance: float) -> str | None:
        """Why this probe fails the check, naming it and both values; None when it holds.
        Written as ``not <=`` so that a nan (a recorded value that is no number) fails."""
        where = f"episode {self.episode_id} (question {self.question_id}, sample {self.sample}), probe {self.probe}"
        if not self.agrees or not self.difference <= tolerance:
            why = "decides otherwise" if not self.agrees else f"differs by {self.difference:.3g} (tolerance {tolerance:g})"
            return (
                f"{where} {why}: recorded {values_text(self.recorded)} ({self.options[decision(self.recorded)]}), "
                f"recomputed {values_text(self.uncached)} ({self.options[decision(self.uncached)]})"
            )
        if not self.logprob_difference <= tolerance:
            return (
                f"{where}: its log-probabilities differ by {self.logprob_difference:.3g} relative to their size (tolerance {tolerance:g}): "
                f"recorded {values_text(self.recorded_logprobs)}, recomputed {values_text(self.uncached_logprobs)}"
            )
        if not self.mass_difference <= tolerance:
            return (
                f"{where}: its options' mass differs by {self.mass_difference:.3g} (tolerance {tolerance:g}): "
                f"recorded {self.recorded_mass}, recomputed {self.uncached_mass:.8f}"
            )
        return None


@dataclass
class Rescore:
    """What ``rescore`` found; ``mismatch`` is the first failure (None: the check holds)."""

    run: str
    model: str
    adapter: str | None
    quantization: str
    tolerance: float
    recorded_policy: str  # "hf" or "openai": the policy that recorded the probes
    comparisons: list[Comparison] = field(default_factory=list)
    not_measured: int = 0  # recorded probes without probabilities, skipped
    notes: list[str] = field(default_factory=list)
    mismatch: str | None = None

    @property
    def agreement(self) -> float:
        return sum(c.agrees for c in self.comparisons) / len(self.comparisons) if self.comparisons else 0.0

    @property
    def largest_difference(self) -> float:
        return largest(c.difference for c in self.comparisons)

    @property
    def largest_logprob_difference(self) -> float:
        return largest(c.logprob_difference for c in self.comparisons)

    @property
    def largest_mass_difference(self) -> float:
        return largest(c.mass_difference for c in self.comparisons)

    @property
    def cached_flips(self) -> int:
        return sum(c.flips for c in self.comparisons)

    @property
    def largest_cached_difference(self) -> float:
        return largest(c.cached_difference for c in self.comparisons)

    @property
    def holds(self) -> bool:
        return self.mismatch is None

    def to_json(self) -> str:
        figures = {
            "probes_compared": len(self.comparisons),
            "agreement": self.agreement,
            "largest_difference": self.largest_difference,
            "largest_logprob_difference": self.largest_logprob_difference,
            "largest_mass_difference": self.largest_mass_difference,
            "cached_flips": self.cached_flips,
            "largest_cached_difference": self.largest_cached_difference,
            "holds": self.holds,
        }
        return json.dumps(asdict(self) | figures, indent=2)


def decision(probabilities: list[float]) -> int:
    """The option chosen: the likeliest, the first of equals."""
    return max(range(len(probabilities)), key=probabilities.__getitem__)


def largest_difference(a: list[float], b: list[float]) -> float:
    return largest(abs(x - y) for x, y in zip(a, b, strict=True))


def relative_difference(recorded: float, recomputed: float) -> float:
    """|recorded - recomputed| / max(1, |recorded|): a log-probability is a logit minus the log of
    a sum over the vocabulary, both carried in float32 at the size of the value, so two faithful
    readings of -14 differ about 14 times as much as two of -1 (issue 37: -13.92620659 recorded,
    -13.92621899 recomputed, 1.2e-5 apart and 8.9e-7 relative). Below 1 in size it is the
    absolute difference."""
    return abs(recorded - recomputed) / max(1.0, abs(recorded))


def largest(differences) -> float:
    """The largest, nan when any is (max() keeps or drops a nan by its place in the list)."""
    values = list(differences)
    if any(math.isnan(value) for value in values):
        return math.nan
    return max(values, default=0.0)


def values_text(values: Sequence[float | None]) -> str:
    return "[" + ", ".join("None" if v is None else f"{v:.8f}" for v in values) + "]"


# -- the checks made before the model is loaded -------------------------------------------------


def rescore(
    run_dir: str | Path,
    model: str,
    *,
    adapter: Path | None = None,
    quantization: str | None = None,
    tolerance: float | None = None,
) -> Rescore:
    """Recompute every recorded probe of the run in ``run_dir`` with ``model`` (and ``adapter``)
    loaded from disk. ``quantization``: None for what the run recorded (hf), else auto. Bad input
    (no such run, no probes, another tokenizer or adapter) is one EvaluationError line; a failed
    check is the returned ``Rescore``'s ``mismatch``."""
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise EvaluationError(f"{setting('tolerance', tolerance)}: give a finite number of 0 or more")
    run = Run.load(run_dir, check=False)  # reads the manifest and the log alone, never the derived files
    recorded, unmeasured = recorded_probes(run)
    first = (recorded or unmeasured)[0].trajectory.policy
    policy_name, settings = first.name, first.settings
    chosen = quantization or (settings.get("quantization") if policy_name == "hf" else None) or "auto"
    report = Rescore(
        str(run.directory), model, str(adapter) if adapter else None, chosen, tolerance, policy_name, not_measured=len(unmeasured)
    )
    probes_file = run.manifest.config.episode.probes_file
    try:
        probes = load_probes(probes_file)  # the file the run asked its probes from
    except AgentError as error:
        if probes_file is None:
            raise
        raise EvaluationError(
            f"{error}; the run asked its probes from {probes_file} ({run.directory / MANIFEST}): put that file back there to rescore it"
        ) from None
    report.mismatch = missing_probe(run, probes)
    if report.mismatch is not None:
        return report
    renderer = load_renderer(model)
    report.notes += check_tokenizer(renderer, recorded + unmeasured, model)
    check_adapter(adapter, run, recorded + unmeasured)
    report.mismatch = next((why for item in unmeasured if (why := check_not_measured(renderer, probes, item)) is not None), None)
    if report.mismatch is not None:
        return report
    if not recorded:
        raise nothing_to_rescore(run, len(unmeasured))
    if policy_name == "openai":
        report.notes.append(
            f"recorded by {setting('policy.name', 'openai')} (served model {settings.get('model')}): rescored with the hf model {model}, the same "
            "weights; a server's log-probabilities come from its own kernels, so expect differences beyond CPU float32's"
        )
    prompts = []
    for item in recorded:
        prompt, why = rebuilt_prompt(renderer, probes, item)
        if why is not None:
            report.mismatch = why
            return report
        prompts.append(prompt)
    policy = _load(model, adapter, chosen, settings)
    report.notes += setting_notes(policy, settings, policy_name)
    report.comparisons = [_compare(policy, item, prompt) for item, prompt in zip(recorded, prompts, strict=True)]
    report.mismatch = next((why for c in report.comparisons if (why := c.mismatch(tolerance)) is not None), None)
    return report


def _load(model: str, adapter: Path | None, quantization: str, settings: dict[str, Any]) -> HFPolicy:
    from paper_explorer.agent.policies.hf import HFPolicy

    context = settings.get("max_context")
    return HFPolicy.load(model, adapter=adapter, quantization=quantization, max_context=context if isinstance(context, int) else 32_768)


def setting_notes(policy: HFPolicy, settings: dict[str, Any], policy_name: str) -> list[str]:
    """Where the reload differs from the recording in what sets the tolerance (device, dtype, quantization)."""
    if policy_name != "hf":
        return []
    now = recorded(policy.settings())
    differing = [key for key in ("device", "dtype", "quantization") if key in settings and settings[key] != now[key]]
    if not differing:
        return []
    then = ", ".join(f"{key} {settings[key]}" for key in differing)
    again = ", ".join(f"{key} {now[key]}" for key in differing)
    return [f"recorded with {then}; rescored with {again}: expect differences beyond CPU float32's"]


def _compare(policy: HFPolicy, item: Recorded, prompt: list[int]) -> Comparison:
    ids = item.result.option_ids
    uncached_logprobs = policy.probe(prompt, ids, use_cache=False).logprobs
    uncached, uncached_mass = _probabilities(uncached_logprobs, item)
    conversation = policy.renderer.render(item.trajectory.messages()).ids
    prefix = min(common_prefix(conversation, prompt), len(prompt) - 1)
    if prefix > 0:
        # complete() feeds the prefix and keeps it in the policy's cache (the one token it chooses
        # is never fed), as an episode's steps leave it; probe() then reuses it and crops back to it
        policy.complete(prompt[:prefix], max_new_tokens=1)
    reading = policy.probe(prompt, ids)
    cached, _ = _probabilities(reading.logprobs, item)
    return Comparison(
        item.trajectory.episode_id,
        item.trajectory.question_id,
        item.trajectory.sample,
        item.result.probe,
        list(item.result.options),
        list(item.result.probabilities or []),
        uncached,
        cached,
        reading.cached_tokens or 0,
        list(item.result.logprobs or []),
        [float(value) for value in uncached_logprobs if value is not None],
        item.result.mass,
        uncached_mass,
    )


def _probabilities(logprobs: list[float | None], item: Recorded) -> tuple[list[float], float]:
    try:
        return from_logprobs(logprobs)
    except ValueError as error:  # not seen with a model in memory; said, not hidden, if it happens
        raise EvaluationError(f"{item.where()}: the reloaded model gives no probabilities ({error})") from None


__all__ = [
    "DEFAULT_TOLERANCE",
    "Comparison",
    "Rescore",
    "decision",
    "largest",
    "relative_difference",
    "rescore",
    "setting_notes",
    "values_text",
]
