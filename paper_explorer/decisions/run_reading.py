"""A finished run of ``explorer decide``, read back and checked: ``DecisionRun.load(path)``.

``inspect``, ``report``, ``compare`` and ``calibrate`` read a decide run only through this, as they
read an eval run only through ``evaluation.run_directory.Run``. Each problem is one
``DecisionError`` line naming the file:

- the directory is a decide run (``run_directory.kind_of``); another kind names the command that takes it;
- manifest.json and every line of decisions.jsonl through their pydantic records (bytes split on
  ``\\n`` only; a torn last line says the run was interrupted and how to finish it);
- the run is finished: one line per question the manifest counted, of the kinds it counted;
- each line holds what its own log-likelihoods give (``record_problem``): its probabilities are
  their normalisation, its predicted option, p_max, confidence statistic and correctness follow
  from them, its label is one of its options; a line edited to another answer is refused;
- metrics.json is what ``decisions.run.metrics_of`` computes from the lines now (the same code
  gives the same floats; the bootstrap is seeded), field by field, the consistency checks'
  figures (``checks``) included.

Not protected: decisions.jsonl and metrics.json rewritten together, consistently, are accepted (the
check finds edits, it is not a signature); the lines are not re-scored with the model here
(``explorer rescore`` does that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.likelihood import confidence, normalised
from paper_explorer.decisions.records import DECISIONS, METRICS, DecisionManifest, DecisionMetrics, DecisionRecord
from paper_explorer.decisions.run import metrics_of, read_manifest, read_records
from paper_explorer.evaluation.run_directory import DECIDE_RUN, refuse_unless

TOLERANCE = 1e-9  # a probability written to JSON and read back is the same float; this allows another libm's exp


@dataclass
class DecisionRun:
    """A finished, checked run of ``explorer decide``: its manifest, one record per question (in
    the order they were scored) and its metrics."""

    directory: Path
    manifest: DecisionManifest
    records: list[DecisionRecord]
    metrics: DecisionMetrics

    @classmethod
    def load(cls, path: str | Path) -> DecisionRun:
        directory = Path(path)
        refuse_unless(directory, DECIDE_RUN, DECISIONS, "explorer decide")
        manifest = read_manifest(directory)
        finish = f"explorer decide {manifest.file} --model {manifest.model.get('model', 'MODEL')} --out {directory} --resume"
        records = read_records(directory)
        if len(records) < manifest.questions:
            raise DecisionError(
                f"{directory / DECISIONS}: {len(records)} of the {manifest.questions} questions scored: the run is not finished; {finish} finishes it"
            )
        kinds: dict[str, int] = {}
        for record in records:
            kinds[record.kind] = kinds.get(record.kind, 0) + 1
            problem = record_problem(record)
            if problem is not None:
                raise DecisionError(f"{directory / DECISIONS}: question {record.question_id}: {problem}; the line was edited after the run")
        if len(records) != manifest.questions or kinds != manifest.kinds:
            raise DecisionError(
                f"{directory / DECISIONS}: holds {len(records)} questions of kinds {kinds}; its manifest says "
                f"{manifest.questions} of {manifest.kinds}: not this run's lines"
            )
        metrics = read_metrics(directory, finish)
        difference = first_difference(metrics_of(records, order=manifest.order).model_dump(), metrics.model_dump())
        if difference is not None:
            where, computed, written = difference
            raise DecisionError(
                f"{directory / METRICS}: '{where}' is {written!r}, but {DECISIONS} gives {computed!r}: the figures were edited "
                f"or come from other lines; {finish} writes them again"
            )
        return cls(directory, manifest, records, metrics)

    def by_question(self) -> dict[str, DecisionRecord]:
        return {record.question_id: record for record in self.records}

    @property
    def measured(self) -> list[DecisionRecord]:
        return [record for record in self.records if record.measured]


def read_metrics(directory: Path, finish: str) -> DecisionMetrics:
    try:
        data = files.without_bom(files.read_bytes(directory / METRICS, limit=files.DOCUMENT_BYTES, inside=directory, what="decide metrics"))
        return DecisionMetrics.model_validate_json(data)
    except FileNotFoundError:
        raise DecisionError(f"{directory}: no {METRICS}; is the run finished? ({finish} finishes it)") from None
    except files.FileRefused as error:
        raise DecisionError(str(error)) from None
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"])) or "(the file itself)"
        raise DecisionError(
            f"{directory / METRICS}: not what explorer decide writes (field '{where}': {first['msg']}); {finish} writes it again"
        ) from None


def record_problem(record: DecisionRecord) -> str | None:
    """What in one line disagrees with itself, or None."""
    options = record.options
    if record.label is not None and record.label not in options:
        return f"label {record.label!r} is not one of its options"
    if record.probabilities is None:
        derived = (record.loglikelihoods, record.predicted, record.p_max, record.confidence, record.correct)
        if record.not_measured is None or any(value is not None for value in derived):
            return "a line without probabilities must say why it was not measured, and hold no figure"
        return None
    if record.not_measured is not None:
        return "a measured line says it was not measured"
    if record.loglikelihoods is None or not len(record.loglikelihoods) == len(record.probabilities) == len(options) >= 2:
        return (
            f"{len(options)} options, but {len(record.probabilities)} probabilities and {len(record.loglikelihoods or [])} log-likelihoods"
        )
    if not all(math.isfinite(value) or value == -math.inf for value in record.loglikelihoods):
        return "a log-likelihood is not a number"
    try:
        expected, _ = normalised(record.loglikelihoods)
    except ValueError as error:
        return str(error)
    if not all(math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE) for a, b in zip(expected, record.probabilities)):
        return "its probabilities are not its log-likelihoods normalised over the options"
    best = max(range(len(options)), key=record.probabilities.__getitem__)
    if (
        record.predicted != options[best]
        or record.p_max is None
        or not math.isclose(record.p_max, record.probabilities[best], abs_tol=TOLERANCE)
    ):
        return f"predicted {record.predicted!r} (p_max {record.p_max}), but the likeliest option is {options[best]!r}"
    if record.confidence is None or not math.isclose(record.confidence, confidence(record.probabilities), abs_tol=TOLERANCE):
        return "its confidence is not (K * p_max - 1) / (K - 1)"
    if record.correct != (None if record.label is None else options[best] == record.label):
        return f"correct is {record.correct} for predicted {options[best]!r} and label {record.label!r}"
    return None


def first_difference(computed: Any, written: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first field (dotted path) where two dumped records differ, with both values."""
    if isinstance(computed, dict) and isinstance(written, dict):
        for key in dict.fromkeys([*computed, *written]):
            found = first_difference(computed.get(key), written.get(key), f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    if isinstance(computed, list) and isinstance(written, list) and len(computed) == len(written):
        for index, (a, b) in enumerate(zip(computed, written)):
            found = first_difference(a, b, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    return None if computed == written else (where or "(the file)", computed, written)


__all__ = ["DecisionRun", "first_difference", "record_problem"]
