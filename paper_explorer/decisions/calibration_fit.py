"""Temperature scaling of a decide run, per kind: ``explorer calibrate fit|apply`` given a run of
``explorer decide`` (an eval run's probe is ``evaluation.calibration_fit``'s; the command picks by
the run's kind, and both write one file format).

``fit`` fits one temperature per kind (noul, choice, score) by the NLL of the labelled questions'
labels (``decisions.calibration.fit_temperature``: each option's log-probability divided by T and
renormalised over the question's options, rows of any length). A kind is fitted only where its
labelled questions hold both outcomes (some answered right, some wrong): with one outcome the NLL
falls all the way to a bound of the search, which is no estimate. The other kinds are listed as
not fitted, and a run with no kind to fit is refused.

A decide run has no split: which questions are validation is the user's choice of file. Fit on a
validation file's run and apply to a test file's run; ``apply`` refuses the run the file was
fitted on, decided by its questions, not its bytes: a run of the same decision file (its SHA-256),
or one that asks any question the fitted run asked (by document and question id, or by document
and question text), is refused, a rerun as much as a copy.

The file is ``evaluation.calibration_fit``'s format (``explorer-calibration/1``, its ``sha256`` over
the canonical JSON of the rest, checked on every read) with ``kind: "decisions"``: per kind its
temperature, whether the search stopped at a bound, and its figures before and after on the fitted
run; the fitted run's file, its SHA-256, the SHA-256 of its decisions.jsonl, digests of its
questions, and its backend and model.

``apply`` writes RUN/calibrated.json: per kind the figures before and after
(``decisions.calibration.kind_figures`` with the temperature), and per measured question its
predicted option, raw and calibrated p_max. The likeliest option never changes (T > 0 keeps the
order of the options); ``apply`` checks that it did not on every question, and refuses to write
otherwise. A run of another model than the fitted run's is noted, not refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import paper_explorer.corpus.files as files
from paper_explorer.decisions.calibration import fit_temperature, kind_figures, labelled, scaled
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.records import DECISIONS, DecisionRecord, KindFigures
from paper_explorer.decisions.run_reading import DecisionRun
from paper_explorer.decisions.schema import KINDS
from paper_explorer.evaluation.calibration import DEFAULT_BINS, TEMPERATURE_BOUNDS
from paper_explorer.evaluation.calibration_fit import (
    CALIBRATED,
    DECISIONS_KIND,
    FORMAT,
    at_bound,
    checked_content,
    content_sha256,
    file_sha256,
    validated,
)
from paper_explorer.evaluation.errors import EvaluationError


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class KindSummary(Record):
    """One kind's figures on the fitted run, before or after its temperature."""

    labelled: int = Field(ge=1)
    accuracy: Share
    ece_equal_width: Share
    ece_equal_mass: Share
    brier: float = Field(ge=0, le=2, allow_inf_nan=False)  # multi-class: 0 to 2
    nll: float = Field(ge=0, allow_inf_nan=False)


class FittedKind(Record):
    temperature: float = Field(ge=TEMPERATURE_BOUNDS[0], le=TEMPERATURE_BOUNDS[1], allow_inf_nan=False)
    at_bound: bool
    before: KindSummary
    after: KindSummary


class FittedRun(Record):
    """The decide run a calibration was fitted on."""

    run: str
    file: str
    file_sha256: str
    decisions_sha256: str
    questions: list[str]  # question_keys: a run that asks any of them is not another run
    backend: str
    model: str | None


class DecisionCalibrationFile(Record):
    format: Literal["explorer-calibration/1"] = FORMAT
    kind: Literal["decisions"] = DECISIONS_KIND
    bins: int = Field(ge=2, le=1000)
    kinds: dict[Literal["noul", "choice", "score"], FittedKind] = Field(min_length=1)
    not_fitted: dict[str, str] = {}  # kind -> why it has no temperature
    fitted_on: FittedRun
    sha256: str


def question_keys(records: list[DecisionRecord]) -> list[str]:
    """Short digests of the questions a run asked, two per question: its document and id, and its
    document and text (a copy with its ids renamed still asks the same questions). Sorted, unique."""
    keys: set[str] = set()
    for record in records:
        for key in (f"id:{record.document_id}\x00{record.question_id}", f"text:{record.document_id}\x00{record.question}"):
            keys.add(hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16])
    return sorted(keys)


def summary(figures: KindFigures) -> KindSummary:
    return KindSummary.model_validate(
        figures.model_dump(include={"labelled", "accuracy", "ece_equal_width", "ece_equal_mass", "brier", "nll"})
    )


def of_kind(run: DecisionRun, kind: str) -> list[DecisionRecord]:
    return [record for record in run.records if record.kind == kind]


def fit(run: DecisionRun, out: Path, bins: int = DEFAULT_BINS) -> DecisionCalibrationFile:
    """One temperature per kind of ``run`` with both outcomes among its labelled questions; writes ``out``."""
    fitted: dict[str, dict] = {}
    not_fitted: dict[str, str] = {}
    for kind in KINDS:
        records = of_kind(run, kind)
        if not records:
            continue
        rows, labels = labelled(records)
        right = sum(int(np.argmax(row)) == label for row, label in zip(rows, labels))
        if not rows:
            not_fitted[kind] = "no measured question with a label"
            continue
        if right in (0, len(rows)):
            not_fitted[kind] = (
                f"all {len(rows)} labelled questions answered {'right' if right else 'wrong'}: a temperature needs both outcomes"
            )
            continue
        temperature = fit_temperature(rows, labels)
        fitted[kind] = {
            "temperature": temperature,
            "at_bound": at_bound(temperature),
            "before": summary(kind_figures(kind, records, bins)).model_dump(),
            "after": summary(kind_figures(kind, records, bins, temperature=temperature)).model_dump(),
        }
    if not fitted:
        reasons = "; ".join(f"{kind}: {why}" for kind, why in not_fitted.items())
        raise DecisionError(f"{run.directory}: no kind can be fitted ({reasons}); fit on a run of more labelled questions")
    content = {
        "format": FORMAT,
        "kind": DECISIONS_KIND,
        "bins": bins,
        "kinds": fitted,
        "not_fitted": not_fitted,
        "fitted_on": {
            "run": str(run.directory.resolve()),
            "file": run.manifest.file,
            "file_sha256": run.manifest.file_sha256,
            "decisions_sha256": file_sha256(run.directory / DECISIONS),
            "questions": question_keys(run.records),
            "backend": run.manifest.backend,
            "model": run.manifest.model.get("model"),
        },
    }
    calibration = DecisionCalibrationFile.model_validate({**content, "sha256": content_sha256(content)})
    with files.atomic_file(out) as handle:
        handle.write(calibration.model_dump_json(indent=2) + "\n")
    return calibration


def load_calibration(path: Path) -> DecisionCalibrationFile:
    """A decide run's calibration file whose hash matches its contents; anything else is one line."""
    return validated(DecisionCalibrationFile, checked_content(path, DECISIONS_KIND), path)


class CalibratedKind(Record):
    temperature: float | None  # None: the file fitted no temperature for this kind (figures unchanged)
    before: KindFigures
    after: KindFigures


class CalibratedQuestion(Record):
    question_id: str
    kind: str
    predicted: str  # the likeliest option, before and after alike
    label: str | None
    p_max: float
    calibrated_p_max: float


class DecisionsCalibrated(Record):
    """RUN/calibrated.json of a decide run, written by ``explorer calibrate apply``."""

    kind: Literal["decisions"] = DECISIONS_KIND
    run: str
    calibration: str
    calibration_sha256: str
    kinds: dict[str, CalibratedKind]
    notes: list[str] = []
    questions: list[CalibratedQuestion]


def apply(run: DecisionRun, path: Path) -> DecisionsCalibrated:
    """Apply the file at ``path`` to ``run`` (not the run it was fitted on); writes RUN/calibrated.json."""
    calibration = load_calibration(path)
    refuse_the_fitted_run(run, calibration, path)
    bins = calibration.bins
    kinds: dict[str, CalibratedKind] = {}
    notes: list[str] = []
    for kind in KINDS:
        records = of_kind(run, kind)
        if not records:
            continue
        fitted = next((figures for name, figures in calibration.kinds.items() if name == kind), None)
        temperature = None if fitted is None else fitted.temperature
        if fitted is None:
            notes.append(
                f"{kind}: {path} has no temperature for it ({calibration.not_fitted.get(kind, 'the fitted run had none')}); unchanged"
            )
        before = kind_figures(kind, records, bins)
        after = before if temperature is None else kind_figures(kind, records, bins, temperature=temperature)
        kinds[kind] = CalibratedKind(temperature=temperature, before=before, after=after)
    questions = [calibrated_question(record, kinds[record.kind].temperature) for record in run.measured]
    model = run.manifest.model.get("model")
    if model != calibration.fitted_on.model or run.manifest.backend != calibration.fitted_on.backend:
        notes.append(
            f"{path} was fitted on a run of {calibration.fitted_on.backend} {calibration.fitted_on.model}; this run's model is "
            f"{run.manifest.backend} {model}: a temperature fitted on one model's probabilities need not fit another's"
        )
    result = DecisionsCalibrated(
        run=str(run.directory),
        calibration=str(path),
        calibration_sha256=calibration.sha256,
        kinds=kinds,
        notes=notes,
        questions=questions,
    )
    with files.atomic_file(run.directory / CALIBRATED) as handle:
        handle.write(result.model_dump_json(indent=2) + "\n")
    return result


def calibrated_question(record: DecisionRecord, temperature: float | None) -> CalibratedQuestion:
    """One measured question's p_max before and after; its likeliest option must stay the likeliest."""
    raw = np.asarray(record.probabilities, dtype=float)
    after = raw if temperature is None else scaled(raw, temperature)
    if int(np.argmax(after)) != int(np.argmax(raw)):  # cannot happen for T > 0: a broken invariant is not a figure
        raise EvaluationError(f"question {record.question_id}: temperature {temperature} changed the likeliest option; not written")
    return CalibratedQuestion(
        question_id=record.question_id,
        kind=record.kind,
        predicted=record.predicted or "",
        label=record.label,
        p_max=float(raw.max()),
        calibrated_p_max=float(after.max()),
    )


def refuse_the_fitted_run(run: DecisionRun, calibration: DecisionCalibrationFile, path: Path) -> None:
    """A calibration judged on the questions it was fitted on measures the fit: the run itself, a
    run of the same decision file, and any run asking one of its questions are refused."""
    fitted = calibration.fitted_on
    if str(run.directory.resolve()) == fitted.run:
        raise DecisionError(f"{path}: was fitted on {run.directory} itself; apply it to a run of another decision file (the test file)")
    if run.manifest.file_sha256 == fitted.file_sha256:
        raise DecisionError(
            f"{path}: was fitted on a run of the decision file {fitted.file}, and {run.directory} is a run of the same file "
            f"(SHA-256 {fitted.file_sha256[:12]}); a calibration judged on the questions it was fitted on flatters itself: "
            "apply it to a run of another file (the test file)"
        )
    fitted_on = set(fitted.questions)
    shared = [record for record in run.records if fitted_on.intersection(question_keys([record]))]
    if shared:
        raise DecisionError(
            f"{path}: was fitted on run {fitted.run}, and {len(shared)} of the {len(run.records)} questions of {run.directory} "
            f"are its questions (same document and id, or same document and text; first: {shared[0].question_id}); a calibration "
            "judged on the questions it was fitted on flatters itself: apply it to a run of other questions"
        )


__all__ = ["DecisionCalibrationFile", "DecisionsCalibrated", "apply", "fit", "load_calibration", "question_keys"]
