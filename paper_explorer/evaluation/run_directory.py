"""The run directory of ``explorer eval``: its files, the one rule for which log line counts, and
what a directory of another kind is.

RUN/manifest.json       how the episodes were made (``agent.manifest.RunManifest``); written first, never rewritten
RUN/trajectories.jsonl  one episode per line, appended whole and fsynced (``agent.writer``)
RUN/scores.jsonl        one line per counted episode: its metrics and flags (``evaluation.scoring.EpisodeScore``)
RUN/metrics.json        the run's figures (``evaluation.records.RunMetrics``), rewritten at the end
RUN/merged.json         only in a run ``explorer merge`` joined from shards

What this module owns:

- Which log line counts (``counted``): per (question, sample), the first line that no later line
  supersedes, where a policy_error line is superseded by any later line of its (question,
  sample) (``eval --resume --retry-errors`` appends the retry, then drops the failure). Scoring,
  resuming, merging and reading a run back all ask it; nothing else decides.
- What a directory is (``kind_of``), told by the files it holds: an eval run, the episode log of
  ``explorer run``, an ``sft build`` dataset, a training run or one of its checkpoints, an
  ``improve`` run or round, an exported dataset, a run of ``explorer decide`` (whose reader is
  ``decisions.run_reading``). A command given the wrong kind names what it got and the command
  that takes it, instead of advising one that cannot help.
- Writing the files a run rewrites whole (``write_manifest``, ``settle_log``,
  ``write_metrics``), each atomically (``corpus.files.atomic_file``): whole or absent after a kill.
- Reading a finished run (``Run.load``): every file through its pydantic model, every JSON-lines
  file through ``corpus.jsonl`` (bytes split on ``b"\\n"`` only: an answer holding U+2028 stays
  one line), each problem one ``EvaluationError`` naming the file. Each file is opened by
  ``corpus.files`` as a file of the directory: a link out of it, a FIFO or a device is refused;
  then scores.jsonl and metrics.json are checked against the log they were derived from
  (``evaluation.derived``), whose digest ``write_metrics`` records in metrics.json.

What it does not: stop two processes writing one directory, or check a run against a corpus
(``evaluation.run`` and ``evaluation.report_data`` do that, with the corpus in hand).

Why one module
--------------
A run directory's files are written and read back by the same rules (which file is whole, which is
appended, what a kill leaves, what each check compares): kept together, a change to one side cannot
forget the other.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.agent.environment import git_commit, hardware, versions
from paper_explorer.agent.manifest import RecordedEvalConfig, RunManifest, acting_settings, stranger
from paper_explorer.agent.trajectory import Hashes, Trajectory
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.index import BM25Index
from paper_explorer.corpus.jsonl import JsonLinesError, Record, TornLine, every_line, parse, read_bytes, read_numbered, write_lines
from paper_explorer.evaluation import derived
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import AbstentionTable, RunMetrics
from paper_explorer.evaluation.scoring import EpisodeScore

if TYPE_CHECKING:
    import pandas

    from paper_explorer.evaluation.prereg import Preregistered, Preregistration

MANIFEST = "manifest.json"
TRAJECTORIES = "trajectories.jsonl"
SCORES = "scores.jsonl"
METRICS = "metrics.json"
MERGED = "merged.json"  # only in a run explorer merge joined (evaluation.merge.MergeRecord)
DECISIONS = "decisions.jsonl"  # a run of explorer decide (decisions.records), not of explorer eval
RUN_FILES = (MANIFEST, TRAJECTORIES, SCORES, METRICS)

Key = tuple[str | None, int]  # (question id, sample)


# -- what a directory is ------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of directory our commands write, and what to do with one."""

    what: str  # "the episode log of explorer run"
    evidence: str  # the file that tells it
    use: str  # the command that takes it; {path} is the directory

    def named(self, path: Path) -> str:
        return f"{path}: holds {self.what} ({self.evidence})"

    def taken_by(self, path: Path) -> str:
        return self.use.format(path=path)


EVAL_RUN = Kind("a run of explorer eval", MANIFEST, "explorer inspect {path} summarises it")
EPISODE_LOG = Kind(
    "the episode log of explorer run", f"{TRAJECTORIES} without {MANIFEST}", "explorer show {path}/trajectories.jsonl lists its episodes"
)
SFT_DATA = Kind("a dataset built by explorer sft build", "build_report.json", "explorer train --data {path} trains on it")
TRAINING_RUN = Kind(
    "a training run of explorer train",
    "checkpoint-N or training_summary.json",
    "explorer train --data DATA --out {path} --resume continues it; explorer eval --adapter {path}/checkpoint-N evaluates a checkpoint",
)
CHECKPOINT = Kind("a checkpoint of explorer train (a LoRA adapter)", "adapter_config.json", "explorer eval --adapter {path} evaluates it")
IMPROVE_RUN = Kind(
    "an explorer improve run",
    "improve.json",
    "the explorer improve command that wrote it resumes it; each round's samples are an eval run: explorer inspect {path}/round-1/samples",
)
IMPROVE_ROUND = Kind(
    "a round of explorer improve", "round.json or samples/", "its samples are an eval run: explorer inspect {path}/samples"
)
RL_RUN = Kind(
    "an explorer rl run",
    "rl.json",
    "the explorer rl command that wrote it resumes it; explorer inspect {path} shows its rounds, and each round's samples and "
    "validation are eval runs: explorer compare {path}/round-0/validation {path}/round-1/validation",
)
RL_ROUND = Kind(
    "a round of explorer rl",
    "batch.jsonl or update/",
    "its samples and validation are eval runs: explorer inspect {path}/samples",
)
DECIDE_RUN = Kind(
    "a run of explorer decide",
    "decisions.jsonl, or a manifest with decision_run_version",
    "explorer inspect {path} summarises it; explorer report, compare and calibrate read it too",
)
EXPORTED_DATASET = Kind(
    "a dataset written by explorer export --to hf", "dataset_dict.json or state.json", "datasets.load_from_disk('{path}') reads it"
)


def not_a_run_but_a_file(path: Path, writer: str = "explorer eval") -> str:
    """What to name instead of a file where a run directory is wanted: the run that holds it, or,
    for the log of ``explorer run`` or any other file, what reads it."""
    if kind_of(path.parent) in (EVAL_RUN, DECIDE_RUN):
        return f"{path}: a file of the run {path.parent}; name the run directory itself: {path.parent}"
    if path.name == TRAJECTORIES:
        return f"{path}: a trajectories file, not a run directory of explorer eval; explorer show {path} prints its episodes"
    return f"{path}: a file, not a run directory; name the directory {writer} --out wrote"


def refuse_unless(path: Path, wanted: Kind, marker: str, writer: str) -> None:
    """One line unless ``path`` is a directory of kind ``wanted`` (told by ``marker``, written by
    ``writer``): a file, a missing directory, an unknown one, or one of another kind that names
    the command taking it."""
    if path.is_file():
        raise EvaluationError(not_a_run_but_a_file(path, writer))
    if not path.is_dir():
        raise EvaluationError(f"{path}: no such run directory")
    kind = kind_of(path)
    if kind is None:
        raise EvaluationError(f"{path}: no {marker}, so not {wanted.what}; name the directory {writer} --out wrote")
    if kind is not wanted:
        raise EvaluationError(f"{kind.named(path)}, not {wanted.what}; {kind.taken_by(path)}")


def kind_of(path: Path) -> Kind | None:
    """The kind of directory ``path`` is, by the files it holds; None for an empty, unknown or missing one.

    Told by file names, so nothing is parsed: an eval run by its manifest (written before any
    episode), the episode log of ``explorer run`` by a log without one. A decide run writes a
    manifest.json too: it is told by its decisions.jsonl, or, before its first question, by the
    field name ``decision_run_version`` in the first bytes of its manifest."""
    if not path.is_dir():
        return None

    def holds(name: str) -> bool:
        return (path / name).exists()

    if holds(DECISIONS) or _names_a_decide_run(path / MANIFEST):
        return DECIDE_RUN
    if holds(MANIFEST):
        return EVAL_RUN
    if holds("improve.json"):
        return IMPROVE_RUN
    if holds("rl.json"):
        return RL_RUN
    if holds("batch.jsonl") or holds("update") or (path / "validation" / MANIFEST).is_file():
        return RL_ROUND
    if holds("round.json") or (path / "samples" / MANIFEST).is_file():
        return IMPROVE_ROUND
    if holds("build_report.json"):
        return SFT_DATA
    if holds("training_summary.json") or any(
        child.is_dir() and child.name.removeprefix("checkpoint-").isdigit() for child in path.glob("checkpoint-*")
    ):
        return TRAINING_RUN
    if holds("adapter_config.json"):
        return CHECKPOINT
    if holds("dataset_dict.json") or holds("state.json"):
        return EXPORTED_DATASET
    if holds(TRAJECTORIES):
        return EPISODE_LOG
    return None


def _names_a_decide_run(manifest: Path) -> bool:
    """Whether a manifest.json is a decide run's: its field name, looked for in the file's first
    bytes (opened as a regular file of the directory; one that cannot be read is left to the
    eval run's reader, which says why)."""
    try:
        with files.open_regular(manifest, limit=files.DOCUMENT_BYTES, inside=manifest.parent, what="run manifest") as handle:
            return b'"decision_run_version"' in handle.read(4096)
    except (files.FileRefused, OSError):
        return False


def not_an_eval_run(path: Path, kind: Kind) -> str:
    """'PATH: holds X (its file), not a run of explorer eval; the command that takes it'."""
    return f"{kind.named(path)}, not a run of explorer eval; {kind.taken_by(path)}"


# -- which line counts --------------------------------------------------------------------------


def episode_key(trajectory: Trajectory) -> Key:
    return trajectory.question_id, trajectory.sample


def superseded(records: Sequence[Record[Trajectory]]) -> set[int]:
    """Line numbers of the policy_error lines a later line of the same (question, sample) replaced."""
    last = {episode_key(record.value): record.number for record in records}
    return {
        record.number
        for record in records
        if record.value.outcome.status == "policy_error" and last[episode_key(record.value)] > record.number
    }


def counted(records: Sequence[Record[Trajectory]]) -> list[Record[Trajectory]]:
    """The lines that count, in log order: per (question, sample), the first line that no later
    line supersedes. A crash between a retry's append and the rewrite that drops the failure
    leaves both lines; this keeps the retry all the same. A line repeated by hand counts once."""
    dropped = superseded(records)
    seen: set[Key] = set()
    kept = []
    for record in records:
        key = episode_key(record.value)
        if record.number not in dropped and key not in seen:
            seen.add(key)
            kept.append(record)
    return kept


def first_stranger(records: Sequence[Record[Trajectory]], manifest: RunManifest) -> tuple[int, str] | None:
    """The first line not made by the run ``manifest`` describes, with why (``agent.manifest.stranger``);
    its policy settings are compared with the log's first line's. None when every line is the run's."""
    settings = acting_settings(records[0].value) if records else None
    for record in records:
        reason = stranger(record.value, manifest, settings)
        if reason is not None:
            return record.number, reason
    return None


# -- reading ------------------------------------------------------------------------------------


def read_manifest(directory: Path, advice: str = "start a new run with another --out") -> RunManifest:
    """The run's manifest, checked against its schema (``advice`` ends the error of one that is not
    valid). A missing one raises FileNotFoundError: only the caller knows what its absence means
    (nothing to resume, not a shard, not a run)."""
    path = directory / MANIFEST
    data = read_file(directory, MANIFEST, "run manifest")
    try:
        return RunManifest.model_validate_json(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "manifest"
        raise EvaluationError(f"{path}: not a run manifest this version can read (field '{where}': {first['msg']}); {advice}") from None


def read_log(directory: Path) -> tuple[list[Record[Trajectory]], TornLine | None]:
    """Every whole line of the run's log (each with its bytes as written) and its torn last line,
    if a kill left one; a missing log raises FileNotFoundError."""
    try:
        return read_numbered(directory / TRAJECTORIES, Trajectory, what="trajectory", inside=directory)
    except JsonLinesError as error:
        raise EvaluationError(str(error)) from None


def read_file(directory: Path, name: str, what: str) -> bytes:
    """The bytes of one of the run's JSON files (``corpus.files``: a regular file of the directory,
    not a link out of it, bounded; a UTF-8 byte order mark dropped); a missing one raises
    FileNotFoundError, anything else is one line."""
    try:
        return files.without_bom(files.read_bytes(directory / name, limit=files.DOCUMENT_BYTES, inside=directory, what=what))
    except files.FileRefused as error:
        raise EvaluationError(str(error)) from None


def finish_command(directory: Path) -> str:
    return f"explorer eval --out {directory} --resume"


@dataclass
class Run:
    """A finished run of ``explorer eval``, read back: ``Run.load(path)``.

    ``manifest``, ``metrics``, ``scores`` and (to check the last two against them) ``trajectories``
    are read when it is loaded. ``trajectories`` holds the episodes that count (one per question
    and sample, ``counted``), as ``scores`` does, in log order."""

    directory: Path
    manifest: RunManifest
    metrics: RunMetrics
    scores: list[EpisodeScore]

    @classmethod
    def load(cls, path: str | Path, check: bool = True) -> Run:
        """A finished run, or one ``EvaluationError`` line saying what the directory is instead or what is missing.

        ``check`` (the default): scores.jsonl and metrics.json are checked against the trajectories
        they were derived from (``evaluation.derived``), which reads the log now; a run whose files
        disagree is refused in one line. False only for a reader of the manifest and the log alone
        (``explorer rescore``), which believes neither derived file."""
        directory = Path(path)
        refuse_unless(directory, EVAL_RUN, MANIFEST, "explorer eval")
        manifest = read_manifest(directory, "it was written by another version of explorer eval")
        finish = f"is the run finished? ({finish_command(directory)} finishes it)"
        try:
            metrics = RunMetrics.model_validate_json(read_file(directory, METRICS, "run metrics"))
            numbered = read_scores(directory / SCORES, inside=directory)
        except FileNotFoundError as error:
            raise EvaluationError(f"{directory}: no {Path(error.filename).name}; {finish}") from None
        except (ValidationError, JsonLinesError) as error:
            raise EvaluationError(f"{_unreadable(directory, error)}; {finish_command(directory)} writes it again") from None
        run = cls(directory, manifest, metrics, [score for _, score in numbered])
        if check:
            records = run._log()
            episodes = counted(records)
            derived.check(directory, manifest, episodes, len(records), numbered, metrics)
            run.__dict__["trajectories"] = [record.value for record in episodes]  # read once: the cached property's value
        return run

    @property
    def config(self) -> RecordedEvalConfig:
        """The run's config, as its manifest records it (with what it selected: questions, their hash)."""
        return self.manifest.config

    @cached_property
    def trajectories(self) -> list[Trajectory]:
        """The episodes that count, in log order (read when the run is checked, else on first use)."""
        return [record.value for record in counted(self._log())]

    def _log(self) -> list[Record[Trajectory]]:
        """Every whole line of the log of a finished run (a torn last line says it is not)."""
        try:
            records, torn = read_log(self.directory)
        except FileNotFoundError:
            raise EvaluationError(f"{self.directory}: no {TRAJECTORIES}; the run's episodes are gone") from None
        if torn is not None:
            raise EvaluationError(
                f"{self.directory / TRAJECTORIES}:{torn.number}: torn last line (an interrupted run); "
                f"{finish_command(self.directory)} mends it"
            )
        return records

    def by_question(self) -> dict[str | None, EpisodeScore]:
        return {score.question_id: score for score in self.scores}

    def to_pandas(self) -> pandas.DataFrame:
        """One row per counted episode: its line of scores.jsonl (``flags`` as the detectors' names),
        with the episode's paper, end reason, seconds and policy, and the run's directory
        name (``run``), so that the frames of several runs concatenate. Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise EvaluationError(
                "Run.to_pandas needs the pandas package (a dependency of paper-explorer) and it is missing: pip install 'pandas>=2.1,<4'"
            ) from None
        episodes = {trajectory.episode_id: trajectory for trajectory in self.trajectories}
        return pandas.DataFrame([self._row(score, episodes.get(score.episode_id)) for score in self.scores])

    def _row(self, score: EpisodeScore, trajectory: Trajectory | None) -> dict[str, Any]:
        row: dict[str, Any] = {"run": self.directory.name}
        row |= score.fields()
        row["flags"] = sorted({flag.detector for flag in score.flags})
        row |= {
            "paper_id": trajectory.paper_id if trajectory else None,
            "reason": trajectory.outcome.reason if trajectory else None,
            "seconds": trajectory.seconds if trajectory else None,
            "policy": self.manifest.config.policy.name,
        }
        return row


def read_scores(path: Path, inside: Path | None = None) -> list[tuple[int, EpisodeScore]]:
    """scores.jsonl's lines with their numbers (bytes split on \\n only; blank lines are no lines);
    ``inside``: the run directory, which a link may not leave (``corpus.files``)."""
    return [
        (line.number, parse(path, line, EpisodeScore, "episode score")) for line in every_line(read_bytes(path, "episode score", inside))
    ]


def _unreadable(directory: Path, error: ValidationError | JsonLinesError) -> str:
    """What is wrong with a run file, as one line naming it."""
    if isinstance(error, JsonLinesError):
        return str(error)  # names the file and the line
    first = error.errors(include_url=False)[0]  # metrics.json: invalid JSON is a validation error too
    where = ".".join(map(str, first["loc"])) or "(the file itself)"
    return f"{directory / METRICS}: does not hold what explorer eval writes (field '{where}': {first['msg']})"


# -- writing ------------------------------------------------------------------------------------


def write_manifest(path: Path, corpus: Corpus, config: RecordedEvalConfig, hashes: Hashes, isolation: str) -> None:
    """The manifest of a new run, before its first episode: its config (with what it selected), the
    corpus files, hashes, sandbox isolation, code versions, git commit and hardware."""
    manifest = RunManifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        command=sys.argv[1:],
        corpus=[str(Path(s).resolve()) if Path(s).exists() else str(s) for s in corpus.sources],
        file_sha256={str(Path(file).resolve()): digest for file, digest in corpus.file_sha256.items()},
        config=config,
        hashes=hashes,
        isolation=isolation,
        versions=versions(),
        git_commit=git_commit(),
        hardware=hardware(),
    )
    with atomic_file(path) as handle:
        handle.write(manifest.model_dump_json(indent=2))


def settle_log(out: Path, units: Sequence[Key] | None = None) -> int:
    """Once the episodes have run: rewrite the run's log (whole, atomically, at most once) without the policy_error episodes
    that a later line of the same question and sample replaced (``run_directory.superseded``), and
    returns how many were dropped. A crash before this leaves both lines, and the scoring keeps the
    later one all the same. Lines are copied as the bytes they were read as, from one read of the file.

    With ``units`` (the run's (question, sample) pairs in the selection's order: the questions, then
    the sample), a log that holds exactly one line for each is also put in that order, the order
    one process running them one at a time writes (and ``explorer merge`` joins shards in).
    Episodes that ran in parallel (threads, processes, Ray tasks) were logged as they finished; in
    this order the run's bytes, scores and hashes are the one-process run's, timings aside. A log
    missing some (an interrupted or stopped run) keeps its order."""
    logged, torn = read_log(out)
    dropped = superseded(logged)
    kept = [record for record in logged if record.number not in dropped]
    keys = [episode_key(record.value) for record in kept]
    reorder = units is not None and torn is None and keys != list(units) and len(keys) == len(units) and set(keys) == set(units)
    if reorder:
        position = {key: number for number, key in enumerate(units or ())}
        kept.sort(key=lambda record: position[episode_key(record.value)])
    if dropped or reorder:
        write_lines(out / TRAJECTORIES, (record.data for record in kept))
    return len(dropped)


def write_metrics(out: Path, questions: list, index: BM25Index, preregistered: Preregistered | None) -> RunMetrics:
    """scores.jsonl (one line per counted episode of the selected questions: metrics and flags)
    and metrics.json, both written whole; ``preregistered``: the rule the run is judged by, if any."""
    from paper_explorer.evaluation.retrieval import retrieval_metrics, searched_episodes
    from paper_explorer.evaluation.scoring import model_metrics, run_metrics, score_episode

    records, torn = read_log(out)
    if torn is not None:
        raise EvaluationError(
            f"{out / TRAJECTORIES}:{torn.number}: torn last line (an interrupted run); explorer eval --out {out} --resume mends it"
        )
    by_id = {q.id: q for q in questions}
    unique = [record.value for record in counted(records) if record.value.question_id in by_id]
    scores = [score_episode(t, by_id[t.question_id]) for t in unique]
    metrics = run_metrics(scores).model_copy(
        update={
            **model_metrics(unique),
            "duplicate_lines": len(records) - len(unique),
            "retrieval": retrieval_metrics(index, questions),
            "searched_episodes": searched_episodes(unique),
            "derived_from": derived.derived_from(unique, scores),
        }
    )
    if preregistered is not None:
        from paper_explorer.evaluation.prereg import judge

        prereg, path = preregistered
        verdict = judge(prereg, path, metrics.abstention, scores, comparison_run(prereg, path))
        metrics = metrics.model_copy(update={"preregistration": verdict})
    with atomic_file(out / SCORES) as handle:
        handle.writelines(score.model_dump_json() + "\n" for score in scores)
    with atomic_file(out / METRICS) as handle:
        handle.write(metrics.to_json())
    return metrics


def comparison_run(prereg: Preregistration, path: Path) -> tuple[Path, AbstentionTable] | None:
    """A preregistration's comparison run (its directory and abstention table), read as every run
    is (``Run.load``: its metrics.json checked against its trajectories): an edited comparison's
    table would otherwise set the Fisher tests of the verdict. None when the rule names none."""
    from paper_explorer.evaluation.prereg import comparison_directory

    if prereg.comparison is None:
        return None
    directory = comparison_directory(prereg, path)
    try:
        return directory, Run.load(directory).metrics.abstention
    except EvaluationError as error:
        raise EvaluationError(f"{path}: its comparison run cannot be used: {error}") from None
