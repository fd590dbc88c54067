"""Option probes: closed questions asked of a model policy once its episode has ended, and the
probability of each option, read from the next-token distribution in one forward pass.

The probes are data (``agent/prompts/probes.toml``), hashed byte for byte: every result records
``probes_sha256``. A probe's prompt is the episode's conversation, the probe's text as one more
user turn, then the generation prompt with its empty think block (``probe_prompt``), so an option's
token is the first one the model would write. Each option must be one token of the policy's
tokenizer, checked before a run (``check_probes``: one AgentError line). The policy's ``probe``
returns each option token's log-probability under the whole vocabulary; ``from_logprobs`` turns
them into probabilities renormalised over the options and the mass the options held.

What is protected: a probe whose prompt does not fit the policy's context is recorded as
``not_measured``, never truncated; a probe that fails (a server down, an answer that omits or lies
about its log-probabilities) is recorded as ``not_measured`` with the reason, and the episode is
kept. What is not: the answer is the model's own view of its work; nothing here says it is right
(calibration, ``evaluation.calibration``, measures how far to trust it).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.served import ids_sha256
from paper_explorer.agent.trajectory import ProbeResult
from paper_explorer.corpus.setting_names import setting

if TYPE_CHECKING:
    from paper_explorer.agent.policies.base import Policy, ProbeReading
    from paper_explorer.agent.renderer import ChatRenderer

PROBES_FILE = Path(__file__).parent / "prompts" / "probes.toml"
LOGPROB_SLACK = 1e-4  # a float32 log-softmax may put a near-certain token a rounding error above 0
REASON_CHARS = 300  # a failure's reason, as recorded


@dataclass(frozen=True)
class Probe:
    name: str
    text: str  # the user turn appended to the conversation
    options: tuple[str, ...]  # each one token of the model's tokenizer
    only_if_submitted: bool = False  # asked only when the episode submitted an answer ("correct")


@dataclass(frozen=True)
class ProbeSet:
    """The probes file, parsed, with the SHA-256 of its bytes."""

    probes: dict[str, Probe]
    sha256: str
    path: Path

    def named(self, names: Sequence[str]) -> list[Probe]:
        unknown = [name for name in names if name not in self.probes]
        if unknown:
            raise AgentError(
                f"{setting('episode.probes', [unknown[0]])}: no such probe in {self.path}; choose from {', '.join(self.probes) or 'none: the file names no probe'}"
            )
        return [self.probes[name] for name in names]


def load_probes(path: Path | None = None) -> ProbeSet:
    """The probes of ``path``, read at each call (a few hundred bytes; each result records the
    digest of the file it was asked from); a malformed file is one AgentError line. None: the
    probes this project ships (``PROBES_FILE``)."""
    path = path or PROBES_FILE
    try:
        data = files.read_bytes(path, limit=files.DOCUMENT_BYTES, what="probes .toml")
        table = files.parse_toml(files.decode(data, path), path)
    except FileNotFoundError:
        raise AgentError(f"{path}: no such probes file") from None
    except files.FileRefused as error:
        raise AgentError(f"{error}; not a probes file") from None
    return ProbeSet({name: _probe(path, name, entry) for name, entry in table.items()}, hashlib.sha256(data).hexdigest(), path)


def _probe(path: Path, name: str, entry: Any) -> Probe:
    if not isinstance(entry, dict) or set(entry) - {"text", "options", "only_if_submitted"}:
        raise AgentError(f"{path}: [{name}] must hold text, options and optionally only_if_submitted, nothing else")
    text, options, submitted = entry.get("text"), entry.get("options"), entry.get("only_if_submitted", False)
    if not isinstance(text, str) or not text.strip():
        raise AgentError(f"{path}: [{name}] needs a text (the question asked)")
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o for o in options):
        raise AgentError(f"{path}: [{name}] needs at least two options, each a non-empty string")
    if len(set(options)) != len(options) or not isinstance(submitted, bool):
        raise AgentError(f"{path}: [{name}] has an option twice, or an only_if_submitted that is not true or false")
    return Probe(name, text, tuple(options), submitted)


def option_ids(renderer: ChatRenderer, probe: Probe) -> list[int]:
    """Each option's single token; an option the tokenizer makes more tokens of is one AgentError line."""
    ids = []
    for option in probe.options:
        tokens = renderer.text(option)
        if len(tokens) != 1:
            raise AgentError(
                f"probe {probe.name!r}: option {option!r} is {len(tokens)} tokens of this tokenizer {tokens}; "
                "each option must be one token (edit the probes file)"
            )
        ids.append(tokens[0])
    if len(set(ids)) != len(ids):
        raise AgentError(f"probe {probe.name!r}: two options are the same token of this tokenizer")
    return ids


def probe_prompt(renderer: ChatRenderer, messages: list[dict[str, Any]], probe: Probe) -> list[int]:
    """The conversation, the probe as one more user turn, and the generation prompt with the empty
    think block (whatever the policy's thinking mode): the option is the model's first token."""
    return renderer.prompt([*messages, {"role": "user", "content": probe.text}], thinking=False)


def check_probes(names: Sequence[str], policy: Policy, probes: ProbeSet | None = None, path: Path | None = None) -> list[Probe]:
    """Before a run: the probes asked for exist (in ``probes``, else the file at ``path``, else the
    project's), the policy can answer them, and each option is one token of its tokenizer; else one
    AgentError line. No probes asked: nothing to check (and no file read)."""
    if not names:
        return []
    probes = probes or load_probes(path)
    asked = probes.named(names)
    if len(set(names)) != len(names):
        raise AgentError(f"{setting('episode.probes')}: a probe is named twice")
    refusal = policy.probe_unavailable()
    if refusal is not None or policy.renderer is None:
        raise AgentError(f"{setting('episode.probes')}: {refusal or 'the policy has no tokenizer to render a probe with'}")
    for probe in asked:
        option_ids(policy.renderer, probe)
    return asked


def from_logprobs(logprobs: Sequence[float | None]) -> tuple[list[float], float]:
    """(probabilities renormalised over the options, the options' mass before) from each option's
    log-probability under the whole vocabulary. ValueError says why they are no measurement: one
    missing, one that is not a log-probability, or options that together hold none or more than all."""
    values = []
    for position, value in enumerate(logprobs):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"option {position + 1}'s log-probability is {value!r}, not a number")
        if math.isnan(value) or value > LOGPROB_SLACK:
            raise ValueError(f"option {position + 1}'s log-probability is {value!r}, not a log-probability")
        values.append(min(float(value), 0.0))
    top = max(values)
    if top == -math.inf:
        raise ValueError("the options hold no probability at all")
    weights = [math.exp(value - top) for value in values]
    total = sum(weights)
    mass = math.exp(top) * total
    if mass > 1 + LOGPROB_SLACK * len(values):
        raise ValueError(f"the options' probabilities sum to {mass:.6f}, more than 1")
    return [weight / total for weight in weights], min(mass, 1.0)


def measure(
    policy: Policy,
    messages: list[dict[str, Any]],
    names: Sequence[str],
    renderer: ChatRenderer,
    context: int,
    *,
    probes: ProbeSet | None = None,
) -> list[ProbeResult]:
    """One result per probe named: its options' probabilities, or why there are none (a prompt
    that leaves no room in ``context`` for the option, or a probe that failed)."""
    probes = probes or load_probes()
    return [_measure_one(policy, messages, probe, renderer, context, probes.sha256) for probe in probes.named(names)]


def _measure_one(
    policy: Policy, messages: list[dict[str, Any]], probe: Probe, renderer: ChatRenderer, context: int, probes_sha256: str
) -> ProbeResult:
    ids = option_ids(renderer, probe)
    failed: str | None = None
    try:
        prompt = probe_prompt(renderer, messages, probe)
    except AgentError as error:  # text no tokenizer reads (a lone surrogate): the policy could not have been served it either
        prompt, failed = [], f"the probe's prompt cannot be rendered: {error}"
    record = {
        "probe": probe.name,
        "options": list(probe.options),
        "option_ids": ids,
        "prompt_tokens": len(prompt),
        "prompt_sha256": ids_sha256(prompt),
        "probes_sha256": probes_sha256,
    }
    if failed is None and len(prompt) + 1 > context:
        failed = f"the probe's prompt of {len(prompt)} tokens leaves no room for an option in the context of {context}"
    if failed is not None:
        return ProbeResult(**record, not_measured=failed)
    try:
        reading = policy.probe(prompt, ids)
    except Exception as error:  # a probe about the episode must not lose the episode
        return ProbeResult(**record, not_measured=f"{type(error).__name__}: {error}"[:REASON_CHARS])
    return result_of(reading, probe, record)


def result_of(reading: ProbeReading, probe: Probe, record: dict[str, Any]) -> ProbeResult:
    """The record of one reading: probabilities from its log-probabilities, or why there are none."""
    measured = {
        "logprobs": _recordable(reading.logprobs),
        "source": reading.source,
        "fallback_options": [probe.options[position] for position in reading.fallback] or None,
        "cached_tokens": reading.cached_tokens,
    }
    if reading.not_measured is not None:
        return ProbeResult(**record, **measured, not_measured=reading.not_measured[:REASON_CHARS])
    if len(reading.logprobs) != len(probe.options):
        return ProbeResult(**record, **measured, not_measured=f"{len(reading.logprobs)} log-probabilities for {len(probe.options)} options")
    try:
        probabilities, mass = from_logprobs(reading.logprobs)
    except ValueError as error:
        return ProbeResult(**record, **measured, not_measured=str(error)[:REASON_CHARS])
    return ProbeResult(**record, **measured, probabilities=probabilities, mass=mass)


def _recordable(values: Sequence[Any]) -> list[float | None] | None:
    """The log-probabilities as a record holds them: a number each, None for what is not one
    (missing, or what a lying server sent instead); None when there is no number at all."""
    numbers = [
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None
        for value in values
    ]
    return numbers if any(number is not None for number in numbers) else None


def after_episode(
    policy: Policy, messages: list[dict[str, Any]], names: Sequence[str], *, submitted: bool, path: Path | None = None
) -> list[ProbeResult]:
    """The probes an episode asked for (from ``path``, default ``PROBES_FILE``), on its whole
    conversation: those asked only after a submit are left out when it did not submit. Each failure
    is its result's ``not_measured``."""
    probes = load_probes(path or PROBES_FILE)
    asked = [probe.name for probe in probes.named(names) if submitted or not probe.only_if_submitted]
    context = getattr(policy, "max_context", None)
    if policy.renderer is None or not isinstance(context, int):
        raise AgentError(f"{setting('episode.probes')}: the {policy.name} policy has no tokenizer or context length to probe with")
    return measure(policy, messages, asked, policy.renderer, context, probes=probes)


__all__ = [
    "PROBES_FILE",
    "Probe",
    "ProbeSet",
    "after_episode",
    "check_probes",
    "from_logprobs",
    "load_probes",
    "measure",
    "option_ids",
    "probe_prompt",
    "result_of",
]
