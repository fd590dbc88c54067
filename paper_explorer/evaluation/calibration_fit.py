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

The calibration file (JSON) holds the probe, its options, the label definition, the temperature
(and whether the search stopped at its bound), the threshold, the validation run's path, split,
policy and model, the sha256 of its trajectories.jsonl, scores.jsonl and probes file, short digests
of the questions its episodes asked (``question_keys``), the figures before and after, and
``sha256``: the sha256 of the canonical JSON of everything else (keys sorted, no spaces). A file
whose hash does not match its contents - edited or damaged - is refused in one line; so is one
whose values are out of range (a temperature outside the fit's search bounds [0.05, 20], not
finite, or 5e-324; bins outside 2..1000; a threshold, an ECE, a Brier score or an accuracy outside
[0, 1]; a negative NLL or count; fewer than two options; an unknown label; a validation split of
test or all); a preregistration pins a file by that hash.

The probabilities are the trajectories' (``Trajectory.probes``, the record of what the model
said): scores.jsonl's copy is checked against them and a disagreement is refused, naming the
episode, and a row that is not probabilities (NaN, infinity, outside [0, 1], not summing to 1) is
refused before any figure or test is computed from it. The labels are scores.jsonl's (gold
answerability, answer F1), as ``explorer eval`` wrote them and ``Run.load`` checked them
(``evaluation.derived``).

``apply`` writes RUN/calibrated.json: per episode the raw and calibrated probability, the
threshold's decision beside the policy's own (answered or abstained), ECE raw against calibrated,
and exact McNemar tests (``evaluation.compare.mcnemar``) of the policy's decisions against the
threshold's on the same questions - is the decision right (abstain exactly on unanswerable gold),
and did it abstain - over the episodes where the policy made a decision. It refuses the run the
file was fitted on - decided by its episodes, not its bytes: any run that asks a question the
validation run asked (a copy, with a blank line added or an episode changed, or a rerun; a file
that records no questions, from an older version, is refused: bytes are all it could compare) - notes a
run of another policy or model, and with a preregistration checks its [frozen] corpus and
questions hashes against the run's manifest first.

A decide run's file (``decisions.calibration_fit``: a temperature per kind) shares the format and
the hash check, with ``kind: "decisions"``; ``checked_content`` refuses each kind of file where the
other is wanted.

Not protected: a file rewritten whole with a freshly computed hash is accepted (the hash finds
edits, it is not a signature; a preregistration that pins the hash is what fixes a file in advance).
The labels are scores.jsonl's, not recomputed from the gold answers.

Why one module of this size: fitting and applying share the file, its checks and the run's
checked probabilities; split, the check that makes a file trustworthy would sit apart from both
of its readers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Final, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import paper_explorer.corpus.files as files
from paper_explorer.agent.policies.settings import model_of
from paper_explorer.agent.trajectory import DEFAULT_PROBE_MIN_MASS
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.calibration import (
    DEFAULT_BINS,
    TEMPERATURE_BOUNDS,
    Observations,
    ece,
    fit_temperature,
    nll,
    observations,
    parse_label,
    probe_calibration,
    scaled,
)
from paper_explorer.evaluation.calibration import brier as brier_score
from paper_explorer.evaluation.compare import McNemarTest, mcnemar
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.prereg import Preregistered, Rule, check_frozen, ece_check
from paper_explorer.evaluation.records import PreregistrationResult, ProbeCalibration
from paper_explorer.evaluation.run_directory import SCORES, TRAJECTORIES, Run
from paper_explorer.evaluation.scoring import ENDED_BY_POLICY, EpisodeScore, probe_scores

FORMAT: Final = "explorer-calibration/1"
DECISIONS_KIND: Final = "decisions"  # the "kind" of a file fitted on a decide run (decisions.calibration_fit); a probe's has none
CALIBRATED = "calibrated.json"
REFUSED_SPLITS = {
    "test": "a run of the test split",
    None: "a run that names no --split (explorer eval's default is the test split)",
    "all": "a run of --split all (it holds the test split's questions)",
}


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # an ECE, a Brier score, an accuracy


class Figures(Record):
    """A probe's figures on one set of probabilities (raw or calibrated)."""

    ece_equal_width: Share
    ece_equal_mass: Share
    brier: Share
    nll: float = Field(ge=0, allow_inf_nan=False)


class Threshold(Record):
    """The abstention threshold on calibrated P(answerable) and what it did on the validation run."""

    threshold: float = Field(ge=0, le=1, allow_inf_nan=False)  # abstain when the calibrated probability is below it
    chosen_by: str  # "preregistered bounds (...)" or "highest decision accuracy"
    correct_abstentions: int = Field(ge=0)  # on unanswerable gold
    false_abstentions: int = Field(ge=0)  # on answerable gold
    decision_accuracy: Share
    episodes: int = Field(ge=0)


class ValidationRun(Record):
    run: str
    split: str
    trajectories_sha256: str
    episodes: int = Field(ge=1)  # measured and labelled
    # Older files (before these were recorded) load without them.
    scores_sha256: str | None = None
    # question_keys of the run's episodes: a run that asks any of them is not another run (apply refuses a file without them)
    questions: list[str] | None = None
    probes_sha256: str | None = None  # the probes file the trajectories record for the probe
    policy: str | None = None  # the validation run's manifest: --policy and --model
    model: str | None = None

    @field_validator("split")
    @classmethod
    def _not_the_test_split(cls, split: str) -> str:
        if split in REFUSED_SPLITS:
            raise ValueError(f"{split!r} is {REFUSED_SPLITS[split]}, never a validation run")
        return split


class CalibrationFile(Record):
    format: Literal["explorer-calibration/1"] = FORMAT
    probe: str
    options: list[str] = Field(min_length=2)
    label: str
    bins: int = Field(ge=2, le=1000)
    # what fit_temperature can give: a T outside its search bounds was not fitted (5e-324 turns every probability into 0 or 1)
    temperature: float = Field(ge=TEMPERATURE_BOUNDS[0], le=TEMPERATURE_BOUNDS[1], allow_inf_nan=False)
    at_bound: bool = False  # the NLL search stopped at a bound of TEMPERATURE_BOUNDS
    # the options' least share of the distribution an episode needed to be fitted on (None: a file from before it was recorded)
    min_mass: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    threshold: Threshold | None  # only the answerable probe sets one
    validation: ValidationRun
    before: Figures
    after: Figures
    sha256: str

    @field_validator("label")
    @classmethod
    def _known_label(cls, label: str) -> str:
        try:
            parse_label(label)
        except EvaluationError as error:
            raise ValueError(str(error)) from None
        return label


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
    return validated(CalibrationFile, checked_content(path), path)


def validated(model: type[M], data: dict, path: Path) -> M:
    """``data`` (from ``checked_content``) as ``model``, or one line naming the field that is not."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise EvaluationError(f"{path}: field '{'.'.join(map(str, first['loc']))}': {first['msg']}") from None


def checked_content(path: Path, kind: str | None = None) -> dict:
    """A calibration file's JSON, once its format, its sha256 and its kind are checked; anything
    else is one line. ``kind``: None for an option probe's file, ``DECISIONS_KIND`` for a decide
    run's (``decisions.calibration_fit``), each refused where the other is wanted."""
    data = _hashed_content(path)
    if kind is None and data.get("kind") == DECISIONS_KIND:
        raise EvaluationError(
            f"{path}: calibrates the kinds of a run of explorer decide, not an option probe; apply it to a decide run, "
            "or fit a probe's on an eval run (explorer calibrate fit RUN --probe NAME)"
        )
    if kind is not None and data.get("kind") != kind:
        raise EvaluationError(
            f"{path}: calibrates option probe {data.get('probe')!r} of an eval run, not the kinds of a decide run; "
            "fit one on a decide run of a validation file: explorer calibrate fit DECIDE_RUN --out FILE"
        )
    return data


def _hashed_content(path: Path) -> dict:
    try:
        data = files.parse_json(files.read_text(path, limit=files.DOCUMENT_BYTES, what="calibration"), path)
    except FileNotFoundError:
        raise EvaluationError(f"{path}: no such calibration file (explorer calibrate fit writes one)") from None
    except files.FileRefused as error:
        raise EvaluationError(str(error)) from None
    except json.JSONDecodeError as error:
        raise EvaluationError(
            f"{path}:{error.lineno}: not a calibration file (not valid JSON: {error.msg} at column {error.colno})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("sha256"), str):
        raise EvaluationError(f"{path}: not a calibration file of explorer calibrate fit (format {FORMAT})")
    recorded = data.pop("sha256")
    if content_sha256(data) != recorded:
        raise EvaluationError(
            f"{path}: its contents do not match its sha256 ({recorded[:12]}...): the file was edited or damaged; "
            "fit it again with explorer calibrate fit"
        )
    return {**data, "sha256": recorded}


def file_sha256(path: Path) -> str:
    """The SHA-256 of one of a run's files (``corpus.files.sha256``: a regular file of the run's
    directory, never a link out of it, a FIFO or a device); anything else is one line."""
    try:
        return files.sha256(path, inside=path.parent, what="run")
    except files.FileRefused as error:
        raise EvaluationError(str(error)) from None


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


def checked_scores(run: Run, probe: str) -> list[EpisodeScore]:
    """scores.jsonl's lines, each with ``probe`` as its trajectory recorded it: a line whose copy
    disagrees with the trajectory's (a scores.jsonl edited after the run) is refused, naming the
    episode, and so is a line without a trajectory, and a run that asked ``probe`` from more than one
    probes file."""
    recorded = {trajectory.episode_id: trajectory for trajectory in run.trajectories}
    asked: dict[str, str] = {}  # probes file -> the first episode that asked the probe from it
    for trajectory in run.trajectories:
        for result in trajectory.probes:
            if result.probe == probe and result.at_step is None:
                asked.setdefault(result.probes_sha256, trajectory.episode_id)
    if len(asked) > 1:  # a probes file changed mid-run, or shards asked from other files: two wordings under one name
        (first, one), (second, other) = list(asked.items())[:2]
        raise EvaluationError(
            f"{run.directory / TRAJECTORIES}: probe {probe!r} was asked from {len(asked)} probes files (episode {one}: "
            f"SHA-256 {first[:12]}; episode {other}: {second[:12]}): one temperature of two wordings calibrates neither; "
            "run the episodes of one file again with the other (explorer eval --resume after removing their lines)"
        )
    scores: list[EpisodeScore] = []
    for score in run.scores:
        episode = recorded.get(score.episode_id)
        if episode is None:
            raise EvaluationError(f"{run.directory / SCORES}: episode {score.episode_id} is not in {TRAJECTORIES}; rescore the run")
        truth = probe_scores(episode)
        if _named(score.probes, probe) != _named(truth, probe):
            raise EvaluationError(
                f"{run.directory / SCORES}: episode {score.episode_id}'s probe {probe!r} disagrees with {TRAJECTORIES}; "
                "the scores were edited after the run: rescore it"
            )
        scores.append(score.model_copy(update={"probes": truth}))
    return scores


def _named(probes, probe: str):
    found = next((p for p in probes or [] if p.probe == probe), None)
    return None if found is None else (found.options, found.probabilities, found.mass, found.min_mass)


def question_keys(trajectories) -> list[str]:
    """Short digests of the questions episodes asked, two per question: its id, and its paper with
    its text (so that a copy with its ids renamed still asks the same questions). Sorted, unique."""
    keys: set[str] = set()
    for trajectory in trajectories:
        asked = [f"text:{trajectory.paper_id or ''}\x00{trajectory.question}"]
        if trajectory.question_id is not None:
            asked.append(f"id:{trajectory.question_id}")
        keys.update(hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16] for key in asked)
    return sorted(keys)


def probes_file_sha256(run: Run, probe: str) -> str | None:
    """The probes file the run's trajectories record for ``probe`` (the first; one file per run)."""
    return next((p.probes_sha256 for t in run.trajectories for p in t.probes or [] if p.probe == probe), None)


def at_bound(temperature: float) -> bool:
    """Did the bounded search stop at (within 1e-3 of) an end of TEMPERATURE_BOUNDS?"""
    return any(math.isclose(temperature, bound, abs_tol=1e-3) for bound in TEMPERATURE_BOUNDS)


def bound_note(temperature: float) -> str:
    """What a temperature at the search's bound means: not an estimate, the end of the search."""
    low, high = TEMPERATURE_BOUNDS
    if temperature >= (low + high) / 2:
        return f"T hit the search bound {high:g}: the probabilities carry almost no information about the label"
    return f"T hit the search bound {low:g}: the probabilities separate the labels so well that the fit would sharpen them further"


def refuse_test_split(run: Run) -> str:
    split = run.manifest.config.split
    if split in REFUSED_SPLITS:
        raise EvaluationError(
            f"{run.directory}: {REFUSED_SPLITS[split]}; fit calibration on a validation run (explorer eval --split validation)"
        )
    return str(split)


def refuse_low_mass(run: Run, found: Observations, doing: str) -> None:
    """A probe whose options held less of the model's distribution than the minimum measured no
    belief: fitting a temperature to it (or judging one on it) squashes noise to the base rate and
    reports a fine ECE. One line, with the figures and the way out."""
    if not found.low_mass:
        return
    raise EvaluationError(
        f"{run.directory}: probe {found.probe!r}'s options held less than {found.min_mass:g} of the model's next-token distribution "
        f"in {found.low_mass} of {found.low_mass + found.labels.size} episodes (see the options' mass in explorer inspect): "
        f"its probabilities there measure no belief, so calibrate will not {doing} on them; reword the probe so the model "
        f"answers with its options (docs/calibration.md, 'Check the mass'), or pass a lower {setting('min_mass')} to include them"
    )


def fit(
    run: Run,
    probe: str,
    out: Path,
    label: str | None = None,
    bins: int = DEFAULT_BINS,
    prereg: Preregistered | None = None,
    min_mass: float | None = None,
) -> CalibrationFile:
    """Fit ``probe``'s temperature on ``run`` (not of the test split) and write the calibration file.
    ``min_mass``: the options' least share of the distribution (None: the run's own setting); a
    run with an episode under it is refused (``refuse_low_mass``)."""
    split = refuse_test_split(run)
    scores = checked_scores(run, probe)
    floor = min_mass if min_mass is not None else run_min_mass(scores, probe)
    found = observations(scores, probe, label, floor)
    refuse_low_mass(run, found, "fit")
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
        answerable = observations(scores, probe, "gold-answerable", floor).labels
        bounds = prereg.prereg.rule if prereg else None
        threshold = choose_threshold(calibrated[:, 0], answerable, bounds, str(prereg.path) if prereg else None)
    content = {
        "format": FORMAT,
        "probe": probe,
        "options": found.options,
        "label": found.label,
        "bins": bins,
        "temperature": temperature,
        "at_bound": at_bound(temperature),
        "min_mass": floor,
        "threshold": None if threshold is None else threshold.model_dump(),
        "validation": {
            "run": str(run.directory.resolve()),
            "split": split,
            "trajectories_sha256": file_sha256(run.directory / TRAJECTORIES),
            "episodes": int(found.labels.size),
            "scores_sha256": file_sha256(run.directory / SCORES),
            "probes_sha256": probes_file_sha256(run, probe),
            "questions": question_keys(run.trajectories),
            "policy": run.manifest.config.policy.name,
            "model": model_of(run.manifest.config.policy),
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
    notes: list[str] = []  # e.g. the run was made by another policy or model than the validation run
    episodes: list[CalibratedEpisode]


def run_min_mass(scores: list, probe: str) -> float:
    """The minimum mass the run's episodes recorded for ``probe`` (the default for runs from before)."""
    recorded = [p.min_mass for score in scores for p in score.probes or [] if p.probe == probe and p.min_mass is not None]
    return max(recorded, default=DEFAULT_PROBE_MIN_MASS)


def apply(run: Run, path: Path, prereg: Preregistered | None = None, min_mass: float | None = None) -> Calibrated:
    """Apply the calibration file at ``path`` to ``run`` and write RUN/calibrated.json; an episode
    whose options held less than ``min_mass`` (None: the run's own setting, or the file's when it is
    higher) is refused as in ``fit``."""
    calibration = load_calibration(path)
    refuse_the_fitted_run(run, calibration, path)
    if prereg is not None:
        config = run.manifest.config
        check_frozen(*prereg, run.manifest.hashes.corpus_sha256, config.selected_questions_sha256, config.questions)
    scores = checked_scores(run, calibration.probe)
    # by default the stricter of the run's minimum and the fit's: a temperature fitted only on
    # episodes whose options held 0.3 of the distribution says nothing of one that held 0.15
    floor = min_mass if min_mass is not None else max(run_min_mass(scores, calibration.probe), calibration.min_mass or 0.0)
    found = observations(scores, calibration.probe, calibration.label, floor)
    refuse_low_mass(run, found, "judge a calibration")
    if found.labels.size == 0:
        raise EvaluationError(f"{run.directory}: no scored episode measured probe {calibration.probe!r}, which {path} calibrates")
    if found.options != calibration.options:
        raise EvaluationError(
            f"{run.directory}: probe {calibration.probe!r} has options {found.options}; {path} was fitted on {calibration.options}"
        )
    calibrated = scaled(found.probabilities, calibration.temperature)
    after = dataclasses.replace(found, probabilities=calibrated)
    by_id = {score.episode_id: score for score in scores}
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
                "decision right",  # abstain exactly on unanswerable gold (short: the table fits 80 columns)
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
        notes=other_policy_notes(run, calibration, path),
        episodes=episodes,
    )
    with atomic_file(run.directory / CALIBRATED) as handle:
        handle.write(result.model_dump_json(indent=2, by_alias=True) + "\n")
    return result


def refuse_the_fitted_run(run: Run, calibration: CalibrationFile, path: Path) -> None:
    """Applying a calibration to the run it was fitted on measures the fit, not calibration. Which
    run is another is decided by its episodes, not its bytes: a run that asks any question the
    validation run asked (by id, or by paper and text) is refused - a copy of it, with a blank line
    added or one episode changed, as much as a rerun on the same questions. A file that records no
    questions (an older one) is refused: its log's bytes are all it could compare."""
    fitted = calibration.validation
    if str(run.directory.resolve()) == fitted.run:
        raise EvaluationError(f"{path}: was fitted on {run.directory} itself; apply it to another run (e.g. of the test split)")
    if fitted.questions is None:  # a file from before they were recorded: the log's bytes would be all it has
        raise EvaluationError(
            f"{path}: records no questions of the run it was fitted on (an older explorer calibrate fit wrote it), so which "
            f"runs ask them cannot be told: a copy of that run with a blank line added would pass; fit it again with explorer "
            f"calibrate fit {fitted.run}"
        )
    fitted_on = set(fitted.questions)
    shared = [t for t in run.trajectories if fitted_on.intersection(question_keys([t]))]
    if shared:
        raise EvaluationError(
            f"{path}: was fitted on run {fitted.run}, and {len(shared)} of the {len(run.trajectories)} episodes of {run.directory} "
            f"ask its questions (first: episode {shared[0].episode_id}); a calibration judged on the questions it was fitted on "
            "flatters itself: apply it to a run of other questions (e.g. of the test split)"
        )


def other_policy_notes(run: Run, calibration: CalibrationFile, path: Path) -> list[str]:
    """A note when the run was made by another policy or model than the validation run (a
    temperature fitted on one model's probabilities need not fit another's): noted, not refused."""
    fitted, policy = calibration.validation, run.manifest.config.policy
    notes: list[str] = []
    if fitted.policy is None:  # a file from before they were recorded
        return notes
    for what, then, now in (("policy", fitted.policy, policy.name), ("model", fitted.model, model_of(policy))):
        if then != now:
            notes.append(f"{path} was fitted on a run of {what} {then or 'none'}; this run's {what} is {now or 'none'}")
    return notes


def judge_calibrated(prereg: Preregistered, calibration: CalibrationFile, after: Observations) -> PreregistrationResult:
    """The preregistration's [calibration] rule on the calibrated probabilities: the file is the
    pinned one (when it pins one), the probe and label are the rule's, and the ECE is within bounds."""
    rule, path = prereg.prereg.calibration, prereg.path
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
    if rule.probe != calibration.probe:  # the temperature is another probe's: this one was not measured calibrated
        after = Observations(rule.probe, rule.label_name(), [], np.empty((0, 0)), np.empty(0, dtype=bool), [], 0)
    checks.append(ece_check(rule, after, calibrated=True))
    return PreregistrationResult.model_validate({"file": str(path), "pass": all(c["pass"] for c in checks), "checks": checks})
