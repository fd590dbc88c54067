"""Preregistration: the pass rule, the comparison and the frozen hashes, fixed before a run.

    [frozen]
    corpus_sha256 = "..."        # the papers (explorer corpus stats --json shows it)
    questions_sha256 = "..."     # the questions this run asks, in order
    questions = 40

    [rule]
    min_correct_abstentions = 7  # of the unanswerable questions, at least this many abstained
    max_false_abstentions = 4    # of the answerable questions, at most this many abstained

    [comparison]                 # optional: Fisher's exact test against another run
    run = "runs/base-model"      # relative to this file
    alpha = 0.05

    [calibration]                # optional: a maximum ECE of an option probe (evaluation.calibration)
    probe = "answerable"
    label = "gold-answerable"    # the label definition (default: the probe's)
    bins = 10
    binning = "equal-width"      # or "equal-mass"
    max_ece = 0.1
    calibration_sha256 = "..."   # optional: judge the probabilities calibrated by this file, not the raw ones

``explorer preregister`` writes one with the current hashes. ``explorer eval --preregistration``
checks the hashes before the first episode and reports the rule after the last. The
``[calibration]`` rule is judged by ``eval`` on the run's raw probabilities (a check that fails
when the run measured no such probe); when it pins a calibration file, by ``explorer calibrate
apply`` with that file (eval lists it under ``pending``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import AbstentionTable, PreregistrationResult
from paper_explorer.evaluation.stats import abstention_fisher

if TYPE_CHECKING:
    from paper_explorer.evaluation.calibration import Observations
    from paper_explorer.evaluation.scoring import EpisodeScore


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Frozen(Strict):
    corpus_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    questions_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    questions: int | None = Field(None, ge=1)


class Rule(Strict):
    min_correct_abstentions: int = Field(ge=0)
    max_false_abstentions: int = Field(ge=0)


class Comparison(Strict):
    run: str
    alpha: float = Field(0.05, gt=0, lt=1)


class CalibrationRule(Strict):
    probe: str = "answerable"
    label: str | None = None  # evaluation.calibration's label definition; None: the probe's default
    bins: int = Field(10, ge=2, le=1000)
    binning: Literal["equal-width", "equal-mass"] = "equal-width"
    max_ece: float = Field(gt=0, le=1)
    calibration_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # the calibration file's own sha256 field

    def label_name(self) -> str:
        from paper_explorer.evaluation.calibration import default_label

        return self.label or default_label(self.probe)

    def describe(self, calibrated: bool) -> str:
        after = " after calibration" if calibrated else ""
        return f"ECE of probe {self.probe}{after} ({self.label_name()}, {self.bins} {self.binning} bins) <= {self.max_ece}"


class Preregistration(Strict):
    frozen: Frozen
    rule: Rule
    comparison: Comparison | None = None
    calibration: CalibrationRule | None = None


class Preregistered(NamedTuple):
    """A preregistration and the file it was read from: the file names it in errors, and a
    comparison run it names by a relative path (older files) lies beside it."""

    prereg: Preregistration
    path: Path

    @classmethod
    def read(cls, path: Path) -> Preregistered:
        return cls(load(path), path)


def load(path: Path) -> Preregistration:
    try:
        data = files.parse_toml(files.read_text(path, limit=files.DOCUMENT_BYTES, what="preregistration .toml"), path)
    except FileNotFoundError:
        raise EvaluationError(f"{path}: no such preregistration file") from None
    except files.FileRefused as error:
        raise EvaluationError(str(error)) from None
    try:
        prereg = Preregistration.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EvaluationError(f"{path}: field '{where}': {first['msg']}") from None
    if prereg.calibration is not None and prereg.calibration.label is not None:
        from paper_explorer.evaluation.calibration import parse_label

        try:
            parse_label(prereg.calibration.label)
        except EvaluationError as error:
            raise EvaluationError(f"{path}: field 'calibration.label': {error}") from None
    return prereg


def check_frozen(prereg: Preregistration, path: Path, corpus_sha256: str, questions_sha256: str, questions: int) -> None:
    """Before the first episode: the run must ask exactly the frozen questions of the frozen corpus."""
    frozen = prereg.frozen
    for name, pinned, actual in (
        ("corpus_sha256", frozen.corpus_sha256, corpus_sha256),
        ("questions_sha256", frozen.questions_sha256, questions_sha256),
    ):
        if pinned != actual:
            raise EvaluationError(
                f"{path}: {name} is pinned to {pinned[:12]}... but this run's is {actual[:12]}...; "
                "run on the preregistered corpus and questions (same --split and --limit)"
            )
    if frozen.questions is not None and frozen.questions != questions:
        raise EvaluationError(f"{path}: {frozen.questions} questions are preregistered but this run asks {questions}")


def comparison_directory(prereg: Preregistration, path: Path) -> Path:
    """The comparison run's directory: absolute as preregister writes it; older files: beside the TOML.
    The run is read by ``run_directory.comparison_run`` (``Run.load``: checked as every run is)."""
    assert prereg.comparison is not None
    return (path.parent / prereg.comparison.run).resolve()


def judge(
    prereg: Preregistration,
    path: Path,
    table: AbstentionTable,
    scores: Sequence[EpisodeScore] | None = None,
    comparison: tuple[Path, AbstentionTable] | None = None,
) -> PreregistrationResult:
    """After the last episode: the rule's verdict and, with a comparison run (``comparison``: its
    directory and abstention table, as ``run_directory.comparison_run`` read them), Fisher's exact
    tests; with a ``[calibration]`` rule, its ECE on the run's raw probabilities (``scores``: the
    run's scored lines), unless the rule pins a calibration file (then it is pending)."""
    correct, false = table.unanswerable.abstained, table.answerable.abstained
    rule = prereg.rule
    checks = [
        {
            "check": f"correct abstentions >= {rule.min_correct_abstentions}",
            "value": correct,
            "pass": correct >= rule.min_correct_abstentions,
        },
        {"check": f"false abstentions <= {rule.max_false_abstentions}", "value": false, "pass": false <= rule.max_false_abstentions},
    ]
    pending = []
    rule_of_calibration = prereg.calibration
    if rule_of_calibration is not None:
        if rule_of_calibration.calibration_sha256 is not None:
            pending.append(
                f"{rule_of_calibration.describe(calibrated=True)}, calibration {rule_of_calibration.calibration_sha256[:12]}...: "
                "judged by explorer calibrate apply RUN --calibration FILE --preregistration PREREG"
            )
        elif scores is None:
            pending.append(f"{rule_of_calibration.describe(calibrated=False)}: not judged (no scores given)")
        else:
            from paper_explorer.evaluation.calibration import observations

            checks.append(ece_check(rule_of_calibration, observations(scores, rule_of_calibration.probe, rule_of_calibration.label)))
    result = {"file": str(path), "pass": all(c["pass"] for c in checks), "checks": checks, "pending": pending or None}
    if prereg.comparison is not None:
        if comparison is None:
            raise EvaluationError(f"{path}: names a comparison run, and none was read to judge the rule with")
        other_dir, other = comparison
        alpha = prereg.comparison.alpha
        tests = [abstention_fisher(table, other, "unanswerable", alpha), abstention_fisher(table, other, "answerable", alpha)]
        result["comparison"] = {"run": str(other_dir), "alpha": prereg.comparison.alpha, "fisher": tests}
    return PreregistrationResult.model_validate(result)


def ece_check(rule: CalibrationRule, found: Observations, calibrated: bool = False) -> dict:
    """The [calibration] rule's check on a probe's observations: fails when none was measured."""
    from paper_explorer.evaluation.calibration import ece

    value = ece(found.confidence, found.labels, rule.bins, equal_mass=rule.binning == "equal-mass") if found.labels.size else None
    unmeasured = f" (no episode measured probe {rule.probe}" + (
        f"; {found.low_mass} held less than the minimum mass and measured no belief)" if found.low_mass else ")"
    )
    described = rule.describe(calibrated) + ("" if value is not None else unmeasured)
    return {"check": described, "value": None if value is None else round(value, 6), "pass": value is not None and value <= rule.max_ece}


def template(
    corpus_sha256: str, questions_sha256: str, questions: int, min_correct: int, max_false: int, comparison: str | None, alpha: float
) -> str:
    lines = [
        "# explorer preregistration: fixed before the run, checked by explorer eval --preregistration",
        "[frozen]",
        f'corpus_sha256 = "{corpus_sha256}"',
        f'questions_sha256 = "{questions_sha256}"',
        f"questions = {questions}",
        "",
        "[rule]",
        f"min_correct_abstentions = {min_correct}",
        f"max_false_abstentions = {max_false}",
    ]
    if comparison:
        lines += ["", "[comparison]", f"run = {json.dumps(comparison)}", f"alpha = {alpha}"]
    return "\n".join(lines) + "\n"
