"""Reload re-scoring (``explorer rescore``): the option probabilities a run recorded
(``Trajectory.probes``, ``agent.probes``), recomputed from the model and adapter files on disk.

For every recorded probe with probabilities, the probe's prompt is rebuilt from the trajectory
(``probe_prompt`` over ``Trajectory.messages()``) and checked against the record (the probes
file's SHA-256, the prompt's, the options' tokens) before anything is loaded; then the hf policy
reads it twice: once with no cache at all (compared with the record), and once with a cache warmed
on the conversation before the probe turn (compared with the uncached reading: a flip there is a
cache bug, not a reload one). The check holds when every decision (the likeliest option) agrees
with the record (agreement 1.0000) and the largest |difference| of any option's probability is
within the tolerance; otherwise the first mismatch is named (episode, probe, both values).

The tolerance. On a CPU in float32 (``--quantization none``, what ``auto`` picks on a CPU) the
reload is exact in practice: the same weights and the same prompt give the same logits up to the
order of float32 sums (the tiny model of the tests gives the recorded values back bit for bit,
cached or not: difference 0), so the default 1e-5 only leaves room for another CPU's summation
order, and still catches another model, another adapter or a changed file (another seed of the
tiny model: 0.1). On a GPU with 4-bit weights (NF4, bfloat16 compute) the figure is unmeasured
here: bfloat16 keeps about three significant digits and a cached prefill splits the matrix
products differently from an uncached one, so expect differences well above 1e-5 (of order 1e-3
is plausible) and, for a probability near 0.5, an occasional flipped decision. ``--tolerance`` is
for that case: measure your hardware's figure on a run you trust, then pass it. A run recorded
through an OpenAI-compatible server (``--policy openai``) is rescored with the hf model of the
same weights; a server's log-probabilities come from its own kernels (and, for an option outside
its top-k, a second request), so the same applies and the output says so.

What is protected: a prompt that cannot be rebuilt from the trajectory as it was recorded (a
changed probes file, a changed renderer, an edited log) stops before the model is loaded; a model
whose tokenizer is not the run's, an adapter whose files are not the run's, or an adapter missing
or extra are refused as one ``EvaluationError`` line. What is not: that the probabilities mean
anything (``evaluation.calibration`` measures that), or probes recorded as ``not_measured``
(counted, skipped: there is nothing to compare).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.models import file_hashes, load_renderer
from agent.probes import from_logprobs, load_probes, option_ids, probe_prompt
from agent.served import common_prefix, ids_sha256
from agent.trajectory import ProbeResult, Trajectory
from evaluation.errors import EvaluationError
from evaluation.run_directory import Run

if TYPE_CHECKING:
    from agent.policies.hf import HFPolicy
    from agent.probes import ProbeSet
    from agent.renderer import ChatRenderer

DEFAULT_TOLERANCE = 1e-5  # CPU float32; see the module docstring for a GPU


@dataclass(frozen=True)
class Recorded:
    """One recorded probe that holds probabilities, with its episode."""

    trajectory: Trajectory
    result: ProbeResult

    def where(self) -> str:
        t = self.trajectory
        return f"episode {t.episode_id} (question {t.question_id}, sample {t.sample}), probe {self.result.probe}"


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

    @property
    def difference(self) -> float:
        return largest_difference(self.recorded, self.uncached)

    @property
    def cached_difference(self) -> float:
        return largest_difference(self.cached, self.uncached)

    @property
    def agrees(self) -> bool:
        return decision(self.recorded) == decision(self.uncached)

    @property
    def flips(self) -> bool:
        return decision(self.cached) != decision(self.uncached)

    def mismatch(self, tolerance: float) -> str | None:
        """Why this probe fails the check, naming it and both values; None when it holds."""
        if self.agrees and self.difference <= tolerance:
            return None
        why = "decides otherwise" if not self.agrees else f"differs by {self.difference:.3g} (tolerance {tolerance:g})"
        return (
            f"episode {self.episode_id} (question {self.question_id}, sample {self.sample}), probe {self.probe} {why}: "
            f"recorded {_values(self.recorded)} ({self.options[decision(self.recorded)]}), "
            f"recomputed {_values(self.uncached)} ({self.options[decision(self.uncached)]})"
        )


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
        return max((c.difference for c in self.comparisons), default=0.0)

    @property
    def cached_flips(self) -> int:
        return sum(c.flips for c in self.comparisons)

    @property
    def largest_cached_difference(self) -> float:
        return max((c.cached_difference for c in self.comparisons), default=0.0)

    @property
    def holds(self) -> bool:
        return self.mismatch is None

    def to_json(self) -> str:
        figures = {
            "probes_compared": len(self.comparisons),
            "agreement": self.agreement,
            "largest_difference": self.largest_difference,
            "cached_flips": self.cached_flips,
            "largest_cached_difference": self.largest_cached_difference,
            "holds": self.holds,
        }
        return json.dumps(asdict(self) | figures, indent=2)


def decision(probabilities: list[float]) -> int:
    """The option chosen: the likeliest, the first of equals."""
    return max(range(len(probabilities)), key=probabilities.__getitem__)


def largest_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _values(probabilities: list[float]) -> str:
    return "[" + ", ".join(f"{p:.8f}" for p in probabilities) + "]"


# -- the checks made before the model is loaded -------------------------------------------------


def recorded_probes(run: Run) -> tuple[list[Recorded], int]:
    """The counted episodes' probes that hold probabilities, and how many were not measured; a
    run with none to compare is one EvaluationError line."""
    measured, skipped = [], 0
    for trajectory in run.trajectories:
        for result in trajectory.probes:
            if result.probabilities is None:
                skipped += 1
            else:
                measured.append(Recorded(trajectory, result))
    if not measured:
        what = f"only probes recorded as not measured ({skipped})" if skipped else "no probes"
        raise EvaluationError(f"{run.directory}: {what}, so nothing to rescore; record them with explorer eval --probe answerable")
    return measured, skipped


def check_tokenizer(renderer: ChatRenderer, recorded: list[Recorded], model: str) -> list[str]:
    """A model whose tokenizer is not the run's is refused; a run that did not record its
    tokenizer's digest is said (notes)."""
    unrecorded = 0
    for item in recorded:
        fingerprint = item.trajectory.policy.settings.get("tokenizer_sha256")
        if fingerprint is None:
            unrecorded += 1
        elif fingerprint != renderer.fingerprint:
            raise EvaluationError(
                f"--model {model}: its tokenizer ({renderer.fingerprint[:12]}) is not the one episode "
                f"{item.trajectory.episode_id} was served with ({fingerprint[:12]}); name the run's model"
            )
    return [f"{unrecorded} probes' episodes recorded no tokenizer digest: not checked"] if unrecorded else []


def check_adapter(adapter: Path | None, run: Run, recorded: list[Recorded]) -> None:
    """The adapter given must be the one the run used, file for file (hf: each file's SHA-256 in the
    policy settings; openai: the one digest of the adapter eval loaded into the server)."""
    settings = recorded[0].trajectory.policy.settings
    served = run.manifest.config.policy.served_adapter
    used = settings.get("adapter") or (served.path if served is not None else None) or run.manifest.config.policy.adapter
    if adapter is None:
        if used is not None:
            raise EvaluationError(f"the run's policy used the adapter {used}; pass it as --adapter")
        return
    if used is None:
        raise EvaluationError(f"--adapter {adapter}: the run used no adapter; rescore it without one")
    if not (adapter / "adapter_config.json").is_file():
        raise EvaluationError(f"--adapter {adapter}: not a LoRA adapter directory (no adapter_config.json)")
    hashes = settings.get("adapter_sha256")
    if isinstance(hashes, dict):
        _same_files(adapter, hashes)
    elif served is not None:
        from agent.policies.adapters import adapter_sha256

        now = adapter_sha256(adapter)
        if now != served.sha256:
            raise EvaluationError(f"--adapter {adapter}: its files are not the run's (SHA-256 {now[:12]}, the run's {served.sha256[:12]})")


def _same_files(adapter: Path, recorded: dict[str, str]) -> None:
    now = file_hashes(adapter)
    for name in sorted(set(recorded) | set(now)):
        if name not in now:
            raise EvaluationError(f"--adapter {adapter}: has no {name}, which the run's adapter had")
        if name not in recorded:
            raise EvaluationError(f"--adapter {adapter}: has {name}, which the run's adapter did not")
        if now[name] != recorded[name]:
            raise EvaluationError(
                f"--adapter {adapter}: {name} is not the run's (SHA-256 {now[name][:12]}, the run's {recorded[name][:12]})"
            )


def rebuilt_prompt(renderer: ChatRenderer, probes: ProbeSet, item: Recorded) -> tuple[list[int], str | None]:
    """The probe's prompt rebuilt from the trajectory, and why it is not the recorded one (None: it is)."""
    result = item.result
    if result.probes_sha256 != probes.sha256:
        now = f"{probes.path} is {probes.sha256[:12]} now"
        return [], f"{item.where()}: recorded with a probes file of SHA-256 {result.probes_sha256[:12]}; {now}"
    probe = probes.probes.get(result.probe)
    if probe is None or list(probe.options) != result.options:
        return [], f"{item.where()}: the probes file holds no probe of that name and options {result.options}"
    if option_ids(renderer, probe) != result.option_ids:
        return [], f"{item.where()}: the options' tokens are {option_ids(renderer, probe)}, recorded {result.option_ids}"
    prompt = probe_prompt(renderer, item.trajectory.messages(), probe)
    if ids_sha256(prompt) != result.prompt_sha256:
        return prompt, (
            f"{item.where()}: its prompt rebuilt from the trajectory ({len(prompt)} tokens, SHA-256 "
            f"{ids_sha256(prompt)[:12]}) is not the recorded one ({result.prompt_tokens} tokens, {result.prompt_sha256[:12]})"
        )
    return prompt, None


# -- recomputing --------------------------------------------------------------------------------


def rescore(
    run_dir: str | Path,
    model: str,
    *,
    adapter: Path | None = None,
    quantization: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Rescore:
    """Recompute every recorded probe of the run in ``run_dir`` with ``model`` (and ``adapter``)
    loaded from disk. ``quantization``: None for what the run recorded (hf), else auto. Bad input
    (no such run, no probes, another tokenizer or adapter) is one EvaluationError line; a failed
    check is the returned ``Rescore``'s ``mismatch``."""
    if not tolerance >= 0:
        raise EvaluationError(f"--tolerance {tolerance}: give a number of 0 or more")
    run = Run.load(run_dir)
    recorded, skipped = recorded_probes(run)
    policy_name = recorded[0].trajectory.policy.name
    settings = recorded[0].trajectory.policy.settings
    chosen = quantization or (settings.get("quantization") if policy_name == "hf" else None) or "auto"
    renderer = load_renderer(model)
    report = Rescore(str(run.directory), model, str(adapter) if adapter else None, chosen, tolerance, policy_name, not_measured=skipped)
    report.notes += check_tokenizer(renderer, recorded, model)
    check_adapter(adapter, run, recorded)
    if policy_name == "openai":
        report.notes.append(
            f"recorded by --policy openai (served model {settings.get('model')}): rescored with the hf model {model}, the same "
            "weights; a server's log-probabilities come from its own kernels, so expect differences beyond CPU float32's"
        )
    probes = load_probes()
    prompts = []
    for item in recorded:
        prompt, why = rebuilt_prompt(renderer, probes, item)
        if why is not None:
            report.mismatch = why
            return report
        prompts.append(prompt)
    policy = _load(model, adapter, chosen, settings)
    report.notes += _setting_notes(policy, settings, policy_name)
    report.comparisons = [_compare(policy, item, prompt) for item, prompt in zip(recorded, prompts, strict=True)]
    report.mismatch = next((why for c in report.comparisons if (why := c.mismatch(tolerance)) is not None), None)
    return report


def _load(model: str, adapter: Path | None, quantization: str, settings: dict[str, Any]) -> HFPolicy:
    from agent.policies.hf import HFPolicy

    context = settings.get("max_context")
    return HFPolicy.load(model, adapter=adapter, quantization=quantization, max_context=context if isinstance(context, int) else 32_768)


def _setting_notes(policy: HFPolicy, settings: dict[str, Any], policy_name: str) -> list[str]:
    """Where the reload differs from the recording in what sets the tolerance (device, dtype, quantization)."""
    if policy_name != "hf":
        return []
    now = policy.settings()
    differing = [key for key in ("device", "dtype", "quantization") if key in settings and settings[key] != now[key]]
    if not differing:
        return []
    then = ", ".join(f"{key} {settings[key]}" for key in differing)
    again = ", ".join(f"{key} {now[key]}" for key in differing)
    return [f"recorded with {then}; rescored with {again}: expect differences beyond CPU float32's"]


def _compare(policy: HFPolicy, item: Recorded, prompt: list[int]) -> Comparison:
    ids = item.result.option_ids
    uncached = _probabilities(policy.probe(prompt, ids, use_cache=False).logprobs, item)
    conversation = policy.renderer.render(item.trajectory.messages()).ids
    prefix = min(common_prefix(conversation, prompt), len(prompt) - 1)
    if prefix > 0:
        # complete() feeds the prefix and keeps it in the policy's cache (the one token it chooses
        # is never fed), as an episode's steps leave it; probe() then reuses it and crops back to it
        policy.complete(prompt[:prefix], max_new_tokens=1)
    reading = policy.probe(prompt, ids)
    cached = _probabilities(reading.logprobs, item)
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
    )


def _probabilities(logprobs: list[float | None], item: Recorded) -> list[float]:
    try:
        return from_logprobs(logprobs)[0]
    except ValueError as error:  # not seen with a model in memory; said, not hidden, if it happens
        raise EvaluationError(f"{item.where()}: the reloaded model gives no probabilities ({error})") from None


__all__ = ["DEFAULT_TOLERANCE", "Comparison", "Rescore", "decision", "rescore"]
