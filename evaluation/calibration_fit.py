"""Calibration fitted and applied: ``explorer calibrate fit`` and ``explorer calibrate apply``.

``fit`` reads a validation run (never one of the test split: a calibration fitted on the questions
it is judged on would flatter itself), fits one temperature for a probe by NLL
(``evaluation.calibration.fit_temperature``) and, for the ``answerable`` probe, chooses an
abstention threshold t on the calibrated P(answerable): "abstain when P < t". With a
preregistration, t is the smallest candidate whose decisions on the validation run meet its
abstention bounds (at least min_correct_abstentions abstentions on unanswerable questions, at most
max_false_abstentions on answerable ones, counted on the validation run); without one, the
smallest that maximises the decisions' accuracy (abstain exactly on the unanswerable). Candidates
are 0, every calibrated probability of the run, and 1.

The calibration file (JSON) holds the probe, its options, the label definition, the temperature,
the threshold, the validation run's path, split and trajectories.jsonl sha256, the figures before
and after, and ``sha256``: the sha256 of the canonical JSON of everything else (keys sorted, no
spaces). A file whose hash does not match its contents - edited or damaged - is refused in one
line; a preregistration pins a file by that hash.

``apply`` writes RUN/calibrated.json: per episode the raw and calibrated probability, the
threshold's decision beside the policy's own (answered or abstained), ECE raw against calibrated,
and exact McNemar tests (``evaluation.compare.mcnemar``) of the policy's decisions against the
threshold's on the same questions - is the decision right (abstain exactly on unanswerable gold),
and did it abstain - over the episodes where the policy made a decision.

Not protected: a file rewritten whole with a freshly computed hash is accepted (the hash finds
edits, it is not a signature; a preregistration that pins the hash is what fixes a file in advance).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from corpus.atomic import atomic_file
from evaluation.calibration import DEFAULT_BINS, Observations, ece, fit_temperature, nll, observations, probe_calibration, scaled
from evaluation.calibration import brier as brier_score
from evaluation.compare import McNemarTest, mcnemar
from evaluation.errors import EvaluationError
from evaluation.prereg import Preregistration, Rule, ece_check
from evaluation.records import PreregistrationResult, ProbeCalibration
from evaluation.run_directory import TRAJECTORIES, Run
from evaluation.scoring import ENDED_BY_POLICY

FORMAT: Final = "explorer-calibration/1"
CALIBRATED = "calibrated.json"
REFUSED_SPLITS = {
    "test": "a run of the test split",
    None: "a run that names no --split (explorer eval's default is the test split)",
    "all": "a run of --split all (it holds the test split's questions)",
}


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Figures(Record):
    """A probe's figures on one set of probabilities (raw or calibrated)."""

    ece_equal_width: float
    ece_equal_mass: float
    brier: float
    nll: float


class Threshold(Record):
    """The abstention threshold on calibrated P(answerable) and what it did on the validation run."""

    threshold: float  # abstain when the calibrated probability is below it
    chosen_by: str  # "preregistered bounds (...)" or "highest decision accuracy"
    correct_abstentions: int  # on unanswerable gold
    false_abstentions: int  # on answerable gold
    decision_accuracy: float
    episodes: int


class ValidationRun(Record):
    run: str
    split: str
    trajectories_sha256: str
    episodes: int  # measured and labelled


class CalibrationFile(Record):
    format: Literal["explorer-calibration/1"] = FORMAT
    probe: str
    options: list[str]
    label: str
    bins: int
    temperature: float
    threshold: Threshold | None  # only the answerable probe sets one
    validation: ValidationRun
    before: Figures
    after: Figures
    sha256: str


# -- the file -----------------------------------------------------------------------------------


def content_sha256(content: dict) -> str:
    """sha256 of the canonical JSON of a calibration file without its ``sha256`` field."""
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_calibration(content: dict, out: Path) -> CalibrationFile:
    calibration = CalibrationFile.model_validate({**content, "sha256": content_sha256(content)})
    with atomic_file(out) as handle:
        handle.write(calibration.model_dump_json(indent=2) + "\n")
    return calibration


def load_calibration(path: Path) -> CalibrationFile:
    """A calibration file whose hash matches its contents; anything else is one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvaluationError(f"{path}: no such calibration file (explorer calibrate fit writes one)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EvaluationError(f"{path}: not a calibration file ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("sha256"), str):
        raise EvaluationError(f"{path}: not a calibration file of explorer calibrate fit (format {FORMAT})")
    recorded = data.pop("sha256")
    if content_sha256(data) != recorded:
        raise EvaluationError(
            f"{path}: its contents do not match its sha256 ({recorded[:12]}...): the file was edited or damaged; "
            "fit it again with explorer calibrate fit"
        )
    try:
        return CalibrationFile.model_validate({**data, "sha256": recorded})
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise EvaluationError(f"{path}: field '{'.'.join(map(str, first['loc']))}': {first['msg']}") from None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- fitting ------------------------------------------------------------------------------------


def figures(found: Observations, probabilities: np.ndarray, bins: int) -> Figures:
    p, y = probabilities[:, 0], found.labels
    return Figures(ece_equal_width=ece(p, y, bins), ece_equal_mass=ece(p, y, bins, equal_mass=True), brier=brier_score(p, y), nll=nll(p, y))


def choose_threshold(calibrated: np.ndarray, answerable: np.ndarray, bounds: Rule | None, source: str | None = None) -> Threshold:
    """The smallest t (abstain when P < t) meeting ``bounds``, or the most accurate without them."""
    candidates = sorted({0.0, 1.0, *map(float, calibrated)})
    rows = []
    for t in candidates:
        abstain = calibrated < t
        correct, false = int(np.sum(abstain & ~answerable)), int(np.sum(abstain & answerable))
        rows.append((t, correct, false, float(np.mean(abstain == ~answerable))))
    if bounds is not None:
        chosen = next((r for r in rows if r[1] >= bounds.min_correct_abstentions and r[2] <= bounds.max_false_abstentions), None)
        if chosen is None:
            first = next((r for r in rows if r[1] >= bounds.min_correct_abstentions), None)
            why = (
                f"at most {rows[-1][1]} correct abstentions are possible"
                if first is None
                else f"the smallest threshold with {first[1]} correct abstentions ({first[0]:.4f}) makes {first[2]} false ones"
            )
            raise EvaluationError(
                f"no threshold meets the preregistered bounds (>= {bounds.min_correct_abstentions} correct abstentions, "
                f"<= {bounds.max_false_abstentions} false ones) on the validation run: {why}"
            )
        chosen_by = (
            f"preregistered bounds (>= {bounds.min_correct_abstentions} correct, <= {bounds.max_false_abstentions} false abstentions"
        )
        chosen_by += f", {source})" if source else ")"
    else:
        best = max(r[3] for r in rows)
        chosen = next(r for r in rows if r[3] == best)  # the smallest of the most accurate
        chosen_by = "highest decision accuracy"
    t, correct, false, right = chosen
    return Threshold(
        threshold=t,
        chosen_by=chosen_by,
        correct_abstentions=correct,
        false_abstentions=false,
        decision_accuracy=right,
        episodes=len(calibrated),
    )


def refuse_test_split(run: Run) -> str:
    split = run.manifest.config.split
    if split in REFUSED_SPLITS:
        raise EvaluationError(
            f"{run.directory}: {REFUSED_SPLITS[split]}; fit calibration on a validation run (explorer eval --split validation)"
        )
    return str(split)


def fit(
    run: Run,
    probe: str,
    out: Path,
    label: str | None = None,
    bins: int = DEFAULT_BINS,
    prereg: tuple[Preregistration, Path] | None = None,
) -> CalibrationFile:
    """Fit ``probe``'s temperature on ``run`` (not of the test split) and write the calibration file."""
    split = refuse_test_split(run)
    found = observations(run.scores, probe, label)
    if found.labels.size == 0:
        raise EvaluationError(f"{run.directory}: no scored episode measured probe {probe!r}; run explorer eval with --probe {probe}")
    if found.labels.all() or not found.labels.any():
        raise EvaluationError(
            f"{run.directory}: every one of the {found.labels.size} episodes has label {bool(found.labels[0])} ({found.label}); "
            "a temperature needs both outcomes"
        )
    temperature = fit_temperature(found.probabilities, found.labels)
    calibrated = scaled(found.probabilities, temperature)
    threshold = None
    if probe == "answerable":
        answerable = observations(run.scores, probe, "gold-answerable").labels
        bounds = prereg[0].rule if prereg else None
        threshold = choose_threshold(calibrated[:, 0], answerable, bounds, str(prereg[1]) if prereg else None)
    content = {
        "format": FORMAT,
        "probe": probe,
        "options": found.options,
        "label": found.label,
        "bins": bins,
        "temperature": temperature,
        "threshold": None if threshold is None else threshold.model_dump(),
        "validation": {
            "run": str(run.directory.resolve()),
            "split": split,
            "trajectories_sha256": file_sha256(run.directory / TRAJECTORIES),
            "episodes": int(found.labels.size),
        },
        "before": figures(found, found.probabilities, bins).model_dump(),
        "after": figures(found, calibrated, bins).model_dump(),
    }
    return write_calibration(content, out)


# -- applying -----------------------------------------------------------------------------------


class CalibratedEpisode(Record):
    episode_id: str
    question_id: str | None
    label: bool  # the calibration's label definition
    answerable: bool | None  # gold
    raw: float  # the first option's probability as recorded
    calibrated: float
    threshold_abstains: bool | None  # calibrated < threshold; None without a threshold
    policy_status: str
    policy_abstained: bool


class Calibrated(Record):
    """RUN/calibrated.json, written by ``explorer calibrate apply``."""

    run: str
    calibration: str
    calibration_sha256: str
    probe: str
    label: str
    temperature: float
    threshold: float | None
    raw: ProbeCalibration
    calibrated: ProbeCalibration
    decided: int  # episodes where the policy answered or abstained: the McNemar pairs
    mcnemar: list[McNemarTest]  # A: the policy's own decision; B: the threshold's
    preregistration: PreregistrationResult | None = None
    episodes: list[CalibratedEpisode]


def apply(run: Run, path: Path, prereg: tuple[Preregistration, Path] | None = None) -> Calibrated:
    """Apply the calibration file at ``path`` to ``run`` and write RUN/calibrated.json."""
    calibration = load_calibration(path)
    found = observations(run.scores, calibration.probe, calibration.label)
    if found.labels.size == 0:
        raise EvaluationError(f"{run.directory}: no scored episode measured probe {calibration.probe!r}, which {path} calibrates")
    if found.options != calibration.options:
        raise EvaluationError(
            f"{run.directory}: probe {calibration.probe!r} has options {found.options}; {path} was fitted on {calibration.options}"
        )
    calibrated = scaled(found.probabilities, calibration.temperature)
    after = Observations(found.probe, found.label, found.options, calibrated, found.labels, found.episode_ids, found.not_measured)
    by_id = {score.episode_id: score for score in run.scores}
    t = None if calibration.threshold is None else calibration.threshold.threshold
    episodes = []
    for index, episode_id in enumerate(found.episode_ids):
        score = by_id[episode_id]
        episodes.append(
            CalibratedEpisode(
                episode_id=episode_id,
                question_id=score.question_id,
                label=bool(found.labels[index]),
                answerable=score.answerable,
                raw=float(found.confidence[index]),
                calibrated=float(calibrated[index, 0]),
                threshold_abstains=None if t is None else bool(calibrated[index, 0] < t),
                policy_status=score.status,
                policy_abstained=score.status == "abstained",
            )
        )
    decided = [e for e in episodes if e.policy_status in ENDED_BY_POLICY and e.answerable is not None]
    tests = []
    if t is not None:
        tests = [
            mcnemar(
                "abstention decision right (abstain exactly on unanswerable gold)",
                [e.policy_abstained != e.answerable for e in decided],
                [e.threshold_abstains != e.answerable for e in decided],
            ),
            mcnemar("abstained", [e.policy_abstained for e in decided], [bool(e.threshold_abstains) for e in decided]),
        ]
    result = Calibrated(
        run=str(run.directory),
        calibration=str(path),
        calibration_sha256=calibration.sha256,
        probe=calibration.probe,
        label=calibration.label,
        temperature=calibration.temperature,
        threshold=t,
        raw=probe_calibration(found, calibration.bins),
        calibrated=probe_calibration(after, calibration.bins),
        decided=len(decided),
        mcnemar=tests,
        preregistration=None if prereg is None else judge_calibrated(prereg, calibration, after),
        episodes=episodes,
    )
    with atomic_file(run.directory / CALIBRATED) as handle:
        handle.write(result.model_dump_json(indent=2, by_alias=True) + "\n")
    return result


def judge_calibrated(prereg: tuple[Preregistration, Path], calibration: CalibrationFile, after: Observations) -> PreregistrationResult:
    """The preregistration's [calibration] rule on the calibrated probabilities: the file is the
    pinned one (when it pins one), the probe and label are the rule's, and the ECE is within bounds."""
    rule, path = prereg[0].calibration, prereg[1]
    if rule is None:
        raise EvaluationError(f"{path}: has no [calibration] rule to judge")
    checks = []
    if rule.calibration_sha256 is not None:
        checks.append(
            {
                "check": f"calibration file sha256 is the preregistered {rule.calibration_sha256[:12]}...",
                "value": None,
                "pass": calibration.sha256 == rule.calibration_sha256,
            }
        )
    checks.append(
        {
            "check": f"calibration of probe {rule.probe} with label {rule.label_name()}",
            "value": None,
            "pass": (calibration.probe, calibration.label) == (rule.probe, rule.label_name()),
        }
    )
    checks.append(ece_check(rule, after, calibrated=True))
    return PreregistrationResult.model_validate({"file": str(path), "pass": all(c["pass"] for c in checks), "checks": checks})
