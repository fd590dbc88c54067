"""scores.jsonl and metrics.json checked against the trajectories they were derived from.

A run's trajectories are its record; scores.jsonl and metrics.json are computed from them (with
the gold questions) by ``run_directory.write_metrics``. A command that reads the derived files
(``compare``, ``inspect``, ``report``, ``calibrate``, ``export``, ``Run.load``) must not believe
one that says something else than its trajectories: a scores.jsonl edited to F1 1.000 and no
direct submit beside trajectories of wrong answers given at once. ``check`` refuses such a run in
one line that names the file, the line and the field, and the command that writes the files again
from the trajectories (``explorer eval --out RUN --resume``).

What is checked, without the corpus:

- the log holds one episode that counts per question and sample the manifest says the run
  selected (a finished run has them all: an episode removed after the run is not a better run),
  each made by the run the manifest describes (``agent.manifest.stranger``: its policy, episode
  settings and hashes; a sample it drew): a manifest copied over another run's files, or another
  run's files under this manifest, is not this run, though each file agrees with the ones derived
  from it.
- a probe's probabilities and mass are what its recorded log-probabilities give
  (``evaluation.calibration.reading_problem``): a mass raised above the minimum is refused.
- scores.jsonl holds one line per episode that counts (``run_directory.counted``), in the log's
  order, and every field the trajectory alone decides is what ``scoring.score_episode`` gives for
  it (status, prediction, steps, tool calls, tokens, probes, and the detector flags; the flags
  that read the gold question are recomputed from the line's own ``answerable``). The gold fields
  agree with each other and are in range (a scored line has them all; ``abstained`` is the status;
  ``evidence_f1_strict`` is 0 for an episode that did not decide).
- metrics.json records (``RunMetrics.derived_from``) a digest of the episodes and of the scores
  it was computed from; both must be those of the files now. A digest is over records, not bytes:
  blank lines, spacing and key order do not change it; order and content do. An episode's digest
  leaves out its wall-clock fields (``agent.trajectory.without_timings``), as the figures do.
- every figure of metrics.json is recomputed from scores.jsonl and the trajectories and must be
  equal (the same code gives the same floats; bootstrap intervals are seeded), but retrieval
  (it needs the corpus's index: in range here, recomputed by ``check_with_corpus``) and the
  preregistration's verdict (its file is not read here: its counts, its pass and its p-values are
  checked against the scores).
- probabilities are probabilities: ``evaluation.calibration.observations`` refuses NaN, infinity,
  a value outside [0, 1] and rows that do not sum to 1.

With the corpus in hand (``explorer report``, ``explorer export``), ``check_with_corpus`` checks that
the episodes ask the questions the manifest selected (their hash), and recomputes every line whole,
gold fields included, and the retrieval figures. An answer metric registered after the run was
scored (``Metric.required`` False) may be absent from a line, as ``Run.load`` reads it; one that
is there must be what the line's trajectory and gold question give.

Not protected: scores.jsonl and metrics.json rewritten together, with gold fields changed
consistently and the digests recomputed, are accepted where the corpus is not at hand (a digest
finds edits; it is not a signature). A run scored by another version of the code (other
detectors, another scipy's bootstrap) differs from what this one computes and is refused the same
way; rescoring it is the fix.

Why one module
--------------
Every check a reader of a run makes before it believes the derived files, with and without the
corpus: split, a reader could take the checks of one file and skip those that tie it to the others.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic_core import to_jsonable_python

from paper_explorer.agent.manifest import RunManifest, acting_settings, stranger
from paper_explorer.agent.trajectory import Trajectory, without_timings
from paper_explorer.corpus.collection import Corpus, questions_sha256
from paper_explorer.corpus.jsonl import Record
from paper_explorer.corpus.schema import Question
from paper_explorer.evaluation.answer_metrics import EVIDENCE_F1, EVIDENCE_F1_STRICT, answer_metrics
from paper_explorer.evaluation.calibration import probability_problem, reading_problem
from paper_explorer.evaluation.detectors import false_abstention, missed_abstention
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import DerivedFrom, RunMetrics
from paper_explorer.evaluation.scoring import ENDED_BY_POLICY, EpisodeScore, model_metrics, run_metrics, score_episode

MANIFEST, SCORES, METRICS, TRAJECTORIES = "manifest.json", "scores.jsonl", "metrics.json", "trajectories.jsonl"  # run_directory's names

# The fields of a line of scores.jsonl that the trajectory alone decides (score_episode without gold).
TRAJECTORY_FIELDS = (
    "episode_id",
    "question_id",
    "question",
    "sample",
    "status",
    "prediction",
    "steps",
    "tool_calls",
    "tool_calls_before_end",
    "model_tokens",
    "document_tokens",
    "unread_tokens",
    "probes",
)
# The fields the gold question decides besides the answer metrics: all set on a scored line, none on
# another (with every answer metric a scored line must hold: gold_fields).
GOLD_FIELDS = ("type", "answerable", "abstained")
# metrics.json's figures that need more than the run's own files: checked apart.
NOT_RECOMPUTED = ("retrieval", "preregistration", "derived_from")


@dataclass(frozen=True)
class _Answerability:
    """What the detectors that read the gold question read of it (false_abstention, missed_abstention)."""

    answerable: bool


# -- digests ------------------------------------------------------------------------------------


def episode_sha256(trajectory: Trajectory) -> str:
    """One episode's digest: its record without wall-clock fields, as canonical JSON (keys sorted)."""
    canonical = json.dumps(without_timings(trajectory), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def episodes_sha256(trajectories: Sequence[Trajectory]) -> str:
    """The digest of episodes in order: their digests, one a line."""
    return hashlib.sha256("".join(episode_sha256(t) + "\n" for t in trajectories).encode()).hexdigest()


def scores_sha256(scores: Sequence[EpisodeScore]) -> str:
    """The digest of scores.jsonl's records in order, each as ``write_metrics`` writes it."""
    digest = hashlib.sha256()
    for score in scores:
        digest.update(score.model_dump_json().encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()


def derived_from(trajectories: Sequence[Trajectory], scores: Sequence[EpisodeScore]) -> DerivedFrom:
    return DerivedFrom(episodes=len(trajectories), episodes_sha256=episodes_sha256(trajectories), scores_sha256=scores_sha256(scores))


# -- the check ----------------------------------------------------------------------------------


class _Check:
    """One run's files, and the one line that refuses them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fix = f"explorer eval --out {directory} --resume scores the run again from its trajectories"

    def refuse(self, where: str, what: str, fix: str | None = None) -> EvaluationError:
        return EvaluationError(f"{self.directory / where}: {what}; {fix or self.fix}")


def check(
    directory: Path,
    manifest: RunManifest,
    episodes: Sequence[Record[Trajectory]],
    log_lines: int,
    scores: Sequence[tuple[int, EpisodeScore]],
    metrics: RunMetrics,
) -> None:
    """Refuse, in one ``EvaluationError`` line, a run whose scores.jsonl (``scores``: (line number,
    line)) or metrics.json say something else than its log (``episodes``: the lines that count, of
    ``log_lines`` whole lines). See the module docstring for what is checked."""
    run = _Check(directory)
    if metrics.derived_from is None:
        raise run.refuse(
            METRICS, "records no digest of the episodes and scores it was computed from (an older version wrote it, or it was edited)"
        )
    selected = manifest.config.questions * manifest.config.samples
    if len(episodes) != selected:  # a finished run holds one counted episode per selected question and sample
        raise run.refuse(
            TRAJECTORIES,
            f"holds {len(episodes)} episodes that count, but the run selected {manifest.config.questions} questions x "
            f"{manifest.config.samples} samples ({MANIFEST}): episodes were removed or added after it ran",
            f"explorer eval --out {directory} --resume runs the missing ones and scores the run again",
        )
    _check_episodes(run, manifest, episodes)
    _check_lines(run, episodes, scores)
    values = [score for _, score in scores]
    trajectories = [record.value for record in episodes]
    recorded = metrics.derived_from
    if recorded.episodes != len(trajectories) or recorded.episodes_sha256 != episodes_sha256(trajectories):
        raise run.refuse(
            METRICS,
            f"was computed from other episodes than {TRAJECTORIES} holds now ({recorded.episodes} episodes, "
            f"digest {_short(recorded.episodes_sha256)}; now {len(trajectories)}, {_short(episodes_sha256(trajectories))}): "
            "the log changed after the run was scored",
        )
    if recorded.scores_sha256 != scores_sha256(values):
        raise run.refuse(
            SCORES,
            f"is not the file {METRICS} was computed with (digest {_short(recorded.scores_sha256)}, now "
            f"{_short(scores_sha256(values))}): it was edited after the run was scored",
        )
    try:
        expected = recomputed(values, trajectories, log_lines)
    except EvaluationError as error:  # probes whose options differ between episodes: no figure can be computed from them
        raise run.refuse(TRAJECTORIES, str(error), "the episodes were edited or damaged: run them again") from None
    written, computed = metrics.model_dump(by_alias=True), expected.model_dump(by_alias=True)
    for name in dict.fromkeys([*written, *computed]):  # as metrics.json holds them: each answer metric under its key
        if name in NOT_RECOMPUTED:
            continue
        if not _same(written.get(name), computed.get(name)):
            raise run.refuse(
                METRICS,
                f"{name} is {_shown(written.get(name))}, but {SCORES} and {TRAJECTORIES} give {_shown(computed.get(name))}",
            )
    _check_retrieval(run, metrics.retrieval)
    _check_preregistration(run, manifest, metrics, expected)


def recomputed(scores: Sequence[EpisodeScore], trajectories: Sequence[Trajectory], log_lines: int) -> RunMetrics:
    """metrics.json as ``write_metrics`` computes it from the scores and the counted episodes, but
    for what needs the corpus or the preregistration file (left empty)."""
    from paper_explorer.evaluation.retrieval import searched_episodes

    return run_metrics(list(scores)).model_copy(
        update={
            **model_metrics(list(trajectories)),
            "duplicate_lines": log_lines - len(trajectories),
            "searched_episodes": searched_episodes(list(trajectories)),
        }
    )


def _check_episodes(run: _Check, manifest: RunManifest, episodes: Sequence[Record[Trajectory]]) -> None:
    """Every episode that counts was made by the run the manifest describes (``agent.manifest.stranger``:
    its policy, episode settings and hashes), and they are its questions x samples: a manifest
    copied from another run, or another run's episodes under this manifest, is not this run."""
    settings = acting_settings(episodes[0].value) if episodes else None
    samples = manifest.config.samples
    for record in episodes:
        trajectory = record.value
        reason = stranger(trajectory, manifest, settings)
        if reason is None and not 0 <= trajectory.sample < samples:
            reason = f"it is sample {trajectory.sample}; the run drew {samples} per question"
        if reason is not None:
            raise run.refuse(
                f"{TRAJECTORIES}:{record.number}",
                f"episode {trajectory.episode_id} is not an episode of the run {MANIFEST} describes: {reason}",
                "the log and the manifest are of different runs: read each run from its own directory",
            )
    asked = len({record.value.question_id for record in episodes})
    if asked != manifest.config.questions:
        raise run.refuse(
            TRAJECTORIES,
            f"its episodes ask {asked} questions, but the run selected {manifest.config.questions} ({MANIFEST})",
            "the log and the manifest are of different runs: read each run from its own directory",
        )


def _check_lines(run: _Check, episodes: Sequence[Record[Trajectory]], scores: Sequence[tuple[int, EpisodeScore]]) -> None:
    """One line of scores per counted episode, in log order, each agreeing with its trajectory."""
    logged = {record.value.episode_id: record.number for record in episodes}
    for position, (number, score) in enumerate(scores):
        if position >= len(episodes):
            where = f"{TRAJECTORIES}:{logged[score.episode_id]}" if score.episode_id in logged else None
            raise run.refuse(
                f"{SCORES}:{number}",
                f"episode {score.episode_id} is scored again, or is not an episode of {TRAJECTORIES} that counts"
                + (f" (it is {where})" if where else ""),
            )
        record = episodes[position]
        if score.episode_id != record.value.episode_id:
            said = (
                f"is out of the log's order or repeated: the log's next counted episode is {record.value.episode_id} ({TRAJECTORIES}:{record.number})"
                if score.episode_id in logged
                else f"is not an episode of {TRAJECTORIES} that counts"
            )
            raise run.refuse(f"{SCORES}:{number}", f"episode {score.episode_id} {said}")
        _check_line(run, number, score, record)
    if len(scores) < len(episodes):
        missing = episodes[len(scores)]
        raise run.refuse(SCORES, f"holds no line for episode {missing.value.episode_id} ({TRAJECTORIES}:{missing.number})")


def _check_line(run: _Check, number: int, score: EpisodeScore, record: Record[Trajectory]) -> None:
    trajectory = record.value
    expected = score_episode(trajectory, None)
    where = f"{SCORES}:{number}"
    source = f"its trajectory ({TRAJECTORIES}:{record.number})"
    final = {result.probe: result for result in trajectory.probes if result.at_step is None}  # what score_episode reads
    for probe in expected.probes or []:
        problem = None if probe.probabilities is None else probability_problem(probe.options, probe.probabilities)
        problem = problem or reading_problem(final[probe.probe])
        if problem is not None:
            raise run.refuse(
                f"{TRAJECTORIES}:{record.number}",
                f"episode {trajectory.episode_id}'s probe {_shown(probe.probe)} recorded {_shown(probe.probabilities)} for options "
                f"{_shown(probe.options)}: {problem}",
                f"the record was edited or damaged: remove that line and run explorer eval --out {run.directory} --resume to run the episode again",
            )
    for name in TRAJECTORY_FIELDS:
        if not _same(getattr(score, name), getattr(expected, name)):
            raise run.refuse(
                where,
                f"episode {score.episode_id}'s {name} is {_shown(getattr(score, name))}, but {source} gives {_shown(getattr(expected, name))}",
            )
    flags = list(expected.flags)
    if score.answerable is not None:  # the detectors that read the gold question, given the line's own gold
        gold = cast(Question, _Answerability(score.answerable))
        flags += false_abstention(trajectory, gold) + missed_abstention(trajectory, gold)
    if sorted(map(_flag, score.flags)) != sorted(map(_flag, flags)):
        theirs, ours = sorted({f.detector for f in score.flags}), sorted({f.detector for f in flags})
        raise run.refuse(where, f"episode {score.episode_id}'s flags are {_shown(theirs)}, but {source} gives {_shown(ours)}")
    scored = {name: getattr(score, name) for name in GOLD_FIELDS} | {m.name: score.metric(m.name) for m in answer_metrics() if m.required}
    given = [name for name, value in scored.items() if value is not None]
    if given and len(given) != len(scored):
        missing = next(name for name, value in scored.items() if value is None)
        raise run.refuse(where, f"episode {score.episode_id} is scored ({given[0]} is set) but has no {missing}")
    if not given:
        return
    if score.abstained != (score.status == "abstained"):
        raise run.refuse(where, f"episode {score.episode_id}'s abstained is {score.abstained}, but its status is {score.status}")
    strict = score.metric(EVIDENCE_F1) if score.status in ENDED_BY_POLICY else 0.0
    if score.metric(EVIDENCE_F1_STRICT) != strict:
        raise run.refuse(
            where,
            f"episode {score.episode_id}'s {EVIDENCE_F1_STRICT} is {score.metric(EVIDENCE_F1_STRICT)}, but its status and "
            f"{EVIDENCE_F1} give {strict}",
        )


def _check_retrieval(run: _Check, retrieval: dict[str, Any]) -> None:
    for name, value in retrieval.items():
        if value is None:
            continue
        top = None if name == "questions" else 1
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= (top if top is not None else value):
            raise run.refuse(
                METRICS, f"retrieval figure {_shown(name)} is {_shown(value)}, not a {'count' if top is None else 'share in [0, 1]'}"
            )


def _check_preregistration(run: _Check, manifest: RunManifest, metrics: RunMetrics, expected: RunMetrics) -> None:
    """The verdict as eval judged it (``evaluation.prereg.judge``), checked against the scores
    without reading the rule's file: its abstention counts, each check's pass against the bound
    its text names, the verdict, and the comparison's p-values."""
    config, result = manifest.config, metrics.preregistration
    judged = config.preregistration is not None and config.shard is None  # a shard leaves it to the merged run
    if (result is not None) != judged:
        raise run.refuse(
            METRICS,
            "holds a preregistration verdict, but the run has no preregistration"
            if result is not None
            else "holds no preregistration verdict",
        )
    if result is None:
        return
    table = expected.abstention
    counts = {"correct abstentions >= ": table.unanswerable.abstained, "false abstentions <= ": table.answerable.abstained}
    for check in result.checks:
        prefix = next((p for p in counts if check.check.startswith(p)), None)
        if prefix is not None:
            bound = check.check.removeprefix(prefix)
            holds = (
                bound.isdigit()
                and check.value == counts[prefix]
                and check.passed == (counts[prefix] >= int(bound) if prefix.startswith("correct") else counts[prefix] <= int(bound))
            )
        else:  # an ECE check: a share, or None when nothing was measured (then it fails)
            holds = check.value is None and not check.passed or isinstance(check.value, float) and 0 <= check.value <= 1
        if not holds:
            raise run.refuse(
                METRICS,
                f"the preregistration check {_shown(check.check)} ({_shown(check.value)}, pass {check.passed}) disagrees with {SCORES}",
            )
    if result.passed != all(check.passed for check in result.checks):
        raise run.refuse(METRICS, f"the preregistration verdict is {'pass' if result.passed else 'fail'}, but its checks say otherwise")
    comparison = result.comparison
    if comparison is None:
        return
    for test in comparison.fisher:
        if not 0 <= test.p_value <= 1 or test.significant != (test.p_value < comparison.alpha):
            raise run.refuse(
                METRICS, f"the preregistered comparison's p-value {_shown(test.p_value)} is not a p-value, or its significance is wrong"
            )


# -- with the corpus ----------------------------------------------------------------------------


def check_with_corpus(
    directory: Path,
    trajectories: Sequence[Trajectory],
    scores: Sequence[EpisodeScore],
    metrics: RunMetrics,
    corpus: Corpus,
    selected_sha256: str | None = None,
) -> None:
    """With the corpus the run was made on (its hashes already checked): the episodes ask the
    questions the manifest selected (``selected_sha256``: their hash, over the corpus's questions
    in corpus order, as ``corpus.selection`` selects them), every line of scores.jsonl recomputed
    whole from its trajectory and gold question, and the retrieval figures."""
    from paper_explorer.corpus.index import BM25Index
    from paper_explorer.evaluation.retrieval import retrieval_metrics

    run = _Check(directory)
    by_id = {question.id: question for question in corpus.questions}
    registered_later = {metric.name for metric in answer_metrics() if not metric.required}
    if selected_sha256 is not None:
        ids = {trajectory.question_id for trajectory in trajectories}
        if questions_sha256([question for question in corpus.questions if question.id in ids]) != selected_sha256:
            raise run.refuse(
                TRAJECTORIES,
                f"its episodes ask other questions of the corpus than the run selected (the hash of their questions is not "
                f"the selected_questions_sha256 of {MANIFEST}): the log and the manifest are of different runs",
                "read each run from its own directory",
            )
    for position, (trajectory, score) in enumerate(zip(trajectories, scores, strict=True), 1):
        question = by_id.get(trajectory.question_id) if trajectory.question_id is not None else None
        if question is None:
            raise run.refuse(
                SCORES, f"episode {trajectory.episode_id} asks question {trajectory.question_id}, which the corpus does not hold"
            )
        written, computed = score.model_dump(), score_episode(trajectory, question).model_dump()
        for name in dict.fromkeys([*written, *computed]):  # as scores.jsonl holds them: each answer metric under its key
            if name in registered_later and name not in written:
                continue  # the line was scored before the metric existed: its figure is None, as Run.load reads it
            if not _same(written.get(name), computed.get(name)):
                raise run.refuse(
                    SCORES,
                    f"episode {score.episode_id} (score {position})'s {name} is {_shown(written.get(name))}, but its trajectory "
                    f"and gold question give {_shown(computed.get(name))}",
                )
    asked = list(dict.fromkeys(t.question_id for t in trajectories if t.question_id is not None))
    retrieval = retrieval_metrics(BM25Index.cached(corpus), [by_id[q] for q in asked])
    if not _same(metrics.retrieval, retrieval):
        raise run.refuse(METRICS, f"retrieval is {_shown(metrics.retrieval)}, but the corpus gives {_shown(retrieval)}")


# -- helpers ------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON (NaN equal to NaN, so that the check that names it can speak; a model as its dump)."""
    return _canonical(a) == _canonical(b)


def _canonical(value: Any) -> str:
    return json.dumps(to_jsonable_python(value), sort_keys=True)  # models and dataclasses as dicts; NaN as NaN


def _flag(flag) -> tuple:
    return (flag.detector, -1 if flag.step is None else flag.step, flag.text)


def _short(digest: str) -> str:
    return digest[:12]


def _shown(value: Any, limit: int = 80) -> str:
    """A value for a one-line message: its JSON, cut."""
    text = _canonical(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
