"""Reload re-scoring of a decide run (``explorer rescore RUN`` where RUN was written by
``explorer decide``): every recorded reading recomputed from the model on disk, twice.

- **cached**: the options scored as ``decide --mode shared`` scores them, the prompt's KV cache
  computed once and each prompt's longest prefix shared with the one before kept, the readings
  taken in the run's order (each question, then its reversed reading where the run made one), so
  the cache is reused as the run reused it;
- **uncached**: ``--mode separate``, one full forward pass of prompt and option per option, no cache.

Each is compared with the record: agreement (the same option is the likeliest), the largest
|difference| of a probability, and of a log-likelihood (absolute, and relative to its size as
``evaluation.rescore.relative_difference``: an option of 40 tokens sums to -80, and float32 moves
such a sum more than a probability). The check holds when both agree everywhere and every
difference is within the tolerance (``evaluation.rescore.DEFAULT_TOLERANCE``, measured for CPU
float32: see that module for how, and for what to expect on a GPU).

Before any weights are loaded, the run is checked against what it was made from: the decision file
(and corpus) by SHA-256, the tokenizer by its digest, the adapter file by file; each mismatch is one
``DecisionError`` line. Then every reading's prompt is rebuilt from the file and compared with the
recorded ``prompt_sha256`` and option lengths: a reading whose prompt differs is a finding naming
the question, and is not rescored (its numbers would answer another prompt). A reading recorded as
not measured is a finding when its rebuilt prompt fits the context after all.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.models import load_renderer
from paper_explorer.agent.served import ids_sha256
from paper_explorer.corpus.setting_names import setting
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.file import Asked, load_decisions
from paper_explorer.decisions.likelihood import DEFAULT_BATCH_TOKENS, confidence, normalised
from paper_explorer.decisions.prompts import PromptTexts, build, load_prompts
from paper_explorer.decisions.records import DECISIONS, MANIFEST, DecisionManifest, DecisionRecord
from paper_explorer.decisions.run import read_manifest, read_records
from paper_explorer.evaluation.rescore import DEFAULT_TOLERANCE, decision, largest, relative_difference, setting_notes, values_text
from paper_explorer.evaluation.rescore_checks import same_adapter_files

if TYPE_CHECKING:
    from paper_explorer.agent.renderer import ChatRenderer
    from paper_explorer.corpus.collection import Corpus
    from paper_explorer.decisions.backends import LocalBackend


def is_decide_run(path: Path) -> bool:
    """A directory ``explorer decide`` wrote: a manifest that names a decision run version.
    (Told by the manifest, since an eval run has a manifest.json too.)"""
    if not (path.is_dir() and (path / MANIFEST).is_file()):
        return False
    try:
        data = files.parse_json(files.read_bytes(path / MANIFEST, limit=files.DOCUMENT_BYTES, inside=path, what="run manifest"), path)
    except (files.FileRefused, ValueError):
        return False  # not ours to judge: the eval run's reader says what is wrong with it
    return isinstance(data, dict) and "decision_run_version" in data


@dataclass(frozen=True)
class Reading:
    """One recorded reading and its two recomputations, options as listed in its prompt."""

    question_id: str
    reversed: bool  # the second reading of decide --check-reversed
    options: list[str]
    recorded_predicted: str
    recorded: list[float]
    recorded_loglikelihoods: list[float]
    cached: list[float]
    cached_loglikelihoods: list[float]
    uncached: list[float]
    uncached_loglikelihoods: list[float]

    def where(self) -> str:
        return f"question {self.question_id}" + (" (its reversed reading)" if self.reversed else "")


@dataclass(frozen=True)
class Agreement:
    """One recomputation (cached or uncached) against the record, over every reading."""

    readings: int
    agreeing: int
    max_probability_difference: float
    max_loglikelihood_difference: float  # absolute
    max_relative_loglikelihood_difference: float  # |a - b| / max(1, |a|): what the tolerance reads

    @property
    def agreement(self) -> float:
        return self.agreeing / self.readings if self.readings else 0.0


@dataclass
class DecisionRescore:
    """What rescoring a decide run found; ``mismatch`` is the first failure (None: the check holds)."""

    run: str
    model: str
    adapter: str | None
    quantization: str
    tolerance: float
    backend: str  # the backend that recorded the run
    readings: list[Reading] = field(default_factory=list)
    not_measured: int = 0  # readings recorded without probabilities (confirmed: their prompt does not fit)
    findings: list[str] = field(default_factory=list)  # readings whose record is not what the file, model or context give
    notes: list[str] = field(default_factory=list)

    def agreement(self, which: str) -> Agreement:
        """``which``: "cached" or "uncached", against the record."""
        pairs = [(reading, getattr(reading, which), getattr(reading, f"{which}_loglikelihoods")) for reading in self.readings]
        return Agreement(
            readings=len(pairs),
            agreeing=sum(reading.options[decision(values)] == reading.recorded_predicted for reading, values, _ in pairs),
            max_probability_difference=largest(abs(a - b) for reading, values, _ in pairs for a, b in zip(reading.recorded, values)),
            max_loglikelihood_difference=largest(
                abs(a - b) for reading, _, values in pairs for a, b in zip(reading.recorded_loglikelihoods, values)
            ),
            max_relative_loglikelihood_difference=largest(
                relative_difference(a, b) for reading, _, values in pairs for a, b in zip(reading.recorded_loglikelihoods, values)
            ),
        )

    @property
    def mismatch(self) -> str | None:
        if self.findings:
            return self.findings[0]
        for reading in self.readings:
            for which in ("cached", "uncached"):
                why = _disagreement(reading, which, self.tolerance)
                if why is not None:
                    return why
        return None

    @property
    def holds(self) -> bool:
        return self.mismatch is None

    def to_json(self) -> str:
        figures: dict[str, Any] = {"kind": "decide run", "mismatch": self.mismatch, "holds": self.holds}
        for which in ("cached", "uncached"):
            agreement = self.agreement(which)
            figures[which] = asdict(agreement) | {"agreement": agreement.agreement}
        return json.dumps(asdict(self) | figures, indent=2)


def rescore_decisions(
    run_dir: Path,
    model: str,
    *,
    adapter: Path | None = None,
    quantization: str | None = None,
    tolerance: float | None = None,
    corpus: Corpus | None = None,
) -> DecisionRescore:
    """Recompute every reading of the decide run in ``run_dir`` with ``model`` (and ``adapter``),
    cached and uncached. ``quantization``: None for what the run recorded (hf), else auto. Bad input
    is one DecisionError line; a failed check is the returned report's ``mismatch``."""
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise DecisionError(f"{setting('tolerance', tolerance)}: give a finite number of 0 or more")
    manifest = read_manifest(run_dir)
    records = read_records(run_dir)
    if not records:
        raise DecisionError(f"{run_dir}: no question in its {DECISIONS}, so nothing to rescore; explorer decide ... --resume scores them")
    asked = _questions(run_dir, manifest, corpus)
    recorded_settings = manifest.model
    chosen = quantization or (recorded_settings.get("quantization") if manifest.backend == "hf" else None) or "auto"
    report = DecisionRescore(str(run_dir), model, str(adapter) if adapter else None, chosen, tolerance, manifest.backend)
    _check_tokenizer(load_renderer(model), recorded_settings, model, report)
    _check_adapter(adapter, recorded_settings)
    texts = load_prompts()
    if texts.sha256 != manifest.prompts_sha256:
        report.notes.append(
            f"the prompts file is {texts.sha256[:12]} now, the run's was {manifest.prompts_sha256[:12]}: its prompts cannot be rebuilt"
        )
    if manifest.backend != "hf":
        report.notes.append(
            f"recorded by the {manifest.backend} backend: rescored with the hf model {model}, the same weights; a server's "
            "log-probabilities come from its own kernels, so expect differences beyond CPU float32's"
        )
    backend = _load(model, adapter, chosen, manifest)
    report.notes += setting_notes(backend.policy, recorded_settings, manifest.backend)
    prompts: list[tuple[DecisionRecord, bool, list[int], list[list[int]]]] = []
    for record in records:
        for reading, is_reversed in ((record, False), (record.reversed, True)):
            if reading is None:
                continue
            rebuilt = _rebuilt(backend.renderer, texts, manifest, asked.get(record.question_id), reading, is_reversed, report)
            if rebuilt is not None:
                prompts.append((reading, is_reversed, *rebuilt))
    cached = [backend.score(prompt, options, "shared").loglikelihoods for _, _, prompt, options in prompts]
    uncached = [backend.score(prompt, options, "separate").loglikelihoods for _, _, prompt, options in prompts]
    for (reading, is_reversed, _, _), shared, separate in zip(prompts, cached, uncached, strict=True):
        report.readings.append(
            Reading(
                reading.question_id,
                is_reversed,
                list(reading.options),
                reading.predicted or "",
                list(reading.probabilities or []),
                list(reading.loglikelihoods or []),
                normalised(shared)[0],
                shared,
                normalised(separate)[0],
                separate,
            )
        )
    return report


def _questions(run_dir: Path, manifest: DecisionManifest, corpus: Corpus | None) -> dict[str, Asked]:
    """The run's decision file, the one it scored (by SHA-256), by question id."""
    path = Path(manifest.file)
    if manifest.corpus_sha256 is None and corpus is not None:
        raise DecisionError(f"{setting('corpus', ', '.join(corpus.sources))}: the run {run_dir} read no corpus; rescore it without one")
    if manifest.corpus_sha256 is not None and corpus is not None and corpus.sha256 != manifest.corpus_sha256:
        raise DecisionError(
            f"{setting('corpus', ', '.join(corpus.sources))}: not the corpus the run read its papers from (SHA-256 {corpus.sha256[:12]}, "
            f"the run's {manifest.corpus_sha256[:12]}: {', '.join(manifest.corpus or [])})"
        )
    try:
        decisions = load_decisions(path, corpus)
    except DecisionError as error:
        raise DecisionError(f"{error} (the decision file of the run {run_dir}, as its {MANIFEST} records)") from None
    if decisions.sha256 != manifest.file_sha256:
        raise DecisionError(
            f"{path}: not the file the run {run_dir} scored (SHA-256 {decisions.sha256[:12]}, the run's {manifest.file_sha256[:12]}); "
            "put the run's file back there to rescore it"
        )
    return {item.question.id: item for item in decisions.asked}


def _check_tokenizer(renderer: ChatRenderer, recorded: dict[str, Any], model: str, report: DecisionRescore) -> None:
    fingerprint = recorded.get("tokenizer_sha256")
    if fingerprint is None:
        report.notes.append("the run recorded no tokenizer digest: not checked")
    elif fingerprint != renderer.fingerprint:
        raise DecisionError(
            f"{setting('model', model)}: its tokenizer ({renderer.fingerprint[:12]}) is not the one the run was scored with "
            f"({str(fingerprint)[:12]}); name the run's model"
        )


def _check_adapter(adapter: Path | None, recorded: dict[str, Any]) -> None:
    used, hashes = recorded.get("adapter"), recorded.get("adapter_sha256")
    if adapter is None:
        if used is not None:
            raise DecisionError(f"the run was scored with the adapter {used}; pass it as {setting('adapter')}")
        return
    if used is None:
        raise DecisionError(f"{setting('adapter', adapter)}: the run used no adapter; rescore it without one")
    if not (adapter / "adapter_config.json").is_file():
        raise DecisionError(f"{setting('adapter', adapter)}: not a LoRA adapter directory (no adapter_config.json)")
    if isinstance(hashes, dict):
        same_adapter_files(adapter, hashes)


def _load(model: str, adapter: Path | None, quantization: str, manifest: DecisionManifest) -> LocalBackend:
    from paper_explorer.decisions.backends import LocalBackend

    batch_tokens = manifest.model.get("batch_tokens")
    return LocalBackend.load(
        model,
        adapter=adapter,
        quantization=quantization,
        max_context=manifest.context,
        batch_tokens=batch_tokens if isinstance(batch_tokens, int) and batch_tokens > 0 else DEFAULT_BATCH_TOKENS,
    )


def _rebuilt(
    renderer: ChatRenderer,
    texts: PromptTexts,
    manifest: DecisionManifest,
    asked: Asked | None,
    reading: DecisionRecord,
    is_reversed: bool,
    report: DecisionRescore,
) -> tuple[list[int], list[list[int]]] | None:
    """The reading's prompt and option ids rebuilt from the file, when they are the recorded ones
    and it was measured; otherwise None, with a finding where the record is not what they give."""
    where = f"question {reading.question_id}" + (" (its reversed reading)" if is_reversed else "")
    if asked is None:
        report.findings.append(f"{where}: not in the run's decision file")
        return None
    question = asked.question
    if sorted(reading.options) != sorted(question.choices) or reading.question != question.text:
        report.findings.append(f"{where}: its recorded question or options are not the file's")
        return None
    recorded = {"kind": reading.kind, "label": reading.label, "ordered": reading.ordered, "negation_of": reading.negation_of}
    given = {"kind": question.kind, "label": question.label, "ordered": question.is_ordered, "negation_of": question.negation_of}
    recorded["document_id"], given["document_id"] = reading.document_id, asked.document_id
    if recorded != given:  # calibration and the checks read these from the record
        changed = ", ".join(f"{name} {recorded[name]!r} (the file's: {given[name]!r})" for name in given if recorded[name] != given[name])
        report.findings.append(f"{where}: its recorded {changed} is not the file's")
        return None
    built = build(
        renderer, texts, question.kind, question.text, asked.document, list(reading.options), context=manifest.context, cut=manifest.cut
    )
    if not reading.measured:
        if built.prompt is None:
            report.not_measured += 1
        else:
            report.findings.append(
                f"{where}: recorded as not measured ({reading.not_measured}), but its prompt of {len(built.prompt)} tokens fits the "
                f"run's context of {manifest.context}"
            )
        return None
    derived = _underived(reading)
    if derived is not None:
        report.findings.append(f"{where}: its recorded {derived}")
        return None
    if built.prompt is None:
        report.findings.append(f"{where}: its prompt rebuilt from the file does not fit the run's context ({built.overflow})")
        return None
    if ids_sha256(built.prompt) != reading.prompt_sha256 or len(built.prompt) != reading.prompt_tokens:
        report.findings.append(
            f"{where}: its prompt rebuilt from the file ({len(built.prompt)} tokens, SHA-256 {ids_sha256(built.prompt)[:12]}) is not "
            f"the recorded one ({reading.prompt_tokens} tokens, {(reading.prompt_sha256 or '')[:12]})"
        )
        return None
    lengths = [len(option) for option in built.options]
    if lengths != reading.option_tokens:
        report.findings.append(f"{where}: its options are {lengths} tokens long rebuilt, recorded {reading.option_tokens}")
        return None
    return built.prompt, built.options


def _underived(reading: DecisionRecord) -> str | None:
    """Which of a measured reading's figures is not what its own probabilities and label give
    (calibration reads p_max and correct, the checks the confidence): None when all are."""
    probabilities = reading.probabilities or []
    best = decision(probabilities)
    figures = {
        "p_max": (reading.p_max, probabilities[best]),
        "confidence": (reading.confidence, confidence(probabilities)),
        "correct": (reading.correct, None if reading.label is None else reading.options[best] == reading.label),
    }
    for name, (recorded, derived) in figures.items():
        same = (
            recorded == derived
            if isinstance(derived, bool) or derived is None
            else recorded is not None and abs(recorded - derived) <= 1e-12
        )
        if not same:
            return f"{name} {recorded!r} is not what its probabilities and label give ({derived!r})"
    return None


def _disagreement(reading: Reading, which: str, tolerance: float) -> str | None:
    """Why one recomputation fails the check, naming the question and both values; None when it
    holds. Written as ``not <=`` so that a nan (a recorded value that is no number) fails."""
    values, logs = getattr(reading, which), getattr(reading, f"{which}_loglikelihoods")
    chosen = reading.options[decision(values)]
    what = f"{reading.where()}, {which}"
    if chosen != reading.recorded_predicted:
        return f"{what}: the likeliest option is {chosen!r} ({values_text(values)}), recorded {reading.recorded_predicted!r} ({values_text(reading.recorded)})"
    if len(reading.recorded) != len(values) or not largest(abs(a - b) for a, b in zip(reading.recorded, values)) <= tolerance:
        return (
            f"{what}: probabilities differ beyond {tolerance:g}: recorded {values_text(reading.recorded)}, recomputed {values_text(values)}"
        )
    relative = largest(relative_difference(a, b) for a, b in zip(reading.recorded_loglikelihoods, logs))
    if len(reading.recorded_loglikelihoods) != len(logs) or not relative <= tolerance:
        return (
            f"{what}: log-likelihoods differ by {relative:.3g} relative to their size (tolerance {tolerance:g}): "
            f"recorded {values_text(reading.recorded_loglikelihoods)}, recomputed {values_text(logs)}"
        )
    return None


__all__ = ["Agreement", "DecisionRescore", "Reading", "is_decide_run", "rescore_decisions"]
