"""``explorer merge``: the runs of one evaluation's shards (``eval --shard I/N`` on N machines)
joined into the run that one machine would have written.

What is checked, each refusal one line naming the run and what differs (nothing is written):

- every input is a finished run: a manifest and a log holding as many episodes as its manifest's
  questions x samples, with no torn last line (else: finish it with ``eval --resume``);
- every input is a shard, all of the same N, and each of 1..N is given exactly once (a missing or
  repeated shard is named). Unsharded runs are refused: with one config they ask the same
  questions, so there is nothing to merge;
- the configs agree on everything but ``shard`` (and what the run derived from it); the corpus,
  question and prompt hashes, the sandbox's isolation, the git commit and the package versions
  agree too (one merged manifest claims one code and one corpus). Corpus *paths* may differ
  between machines, so the corpus is compared by its hashes, and against the corpus loaded here;
- each run asked exactly its shard's slice of the unsharded selection (same hash), and every
  (question, sample) of that selection is in exactly one run (a repeat names both runs).

The merged log keeps, per (question, sample), the line that counts (``run_directory.counted``,
the rule scoring uses: a policy_error line superseded by a later line of the same episode is
left out, and counted in merged.json), in the order one unsharded run with ``--workers 1`` writes: the selection's
question order, then the sample. Lines are copied as bytes, exactly as the shards wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from paper_explorer.agent.config import dotted
from paper_explorer.agent.manifest import RecordedEvalConfig, RunManifest, acting_settings
from paper_explorer.agent.trajectory import Hashes, Trajectory
from paper_explorer.corpus.collection import questions_sha256
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.jsonl import Record
from paper_explorer.corpus.setting_names import setting
from paper_explorer.corpus.splits import parse_shard, shard_of
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_directory import (
    EVAL_RUN,
    MANIFEST,
    MERGED,
    TRAJECTORIES,
    counted,
    finish_command,
    first_stranger,
    kind_of,
    not_an_eval_run,
    read_log,
    read_manifest,
)

Key = tuple[str, int]  # (question id, sample): merged runs' episodes all have a question id

# Fields of a manifest's config that differ between the shards of one run by design.
SHARD_FIELDS = {"shard", "questions", "selected_questions_sha256"}
# How a node ran its episodes and reached its server, not which episodes or how they went: nodes may differ
# (each shard's own command and settings stay in merged.json).
EXECUTION_FIELDS = {"workers", "concurrency", "ray", "policy.base_url", "policy.timeout", "policy.retries"}


class MergedRun(BaseModel):
    """One shard's run as merged.json records it: where it came from and what was taken."""

    model_config = ConfigDict(extra="forbid")

    directory: str  # resolved on the merging machine
    shard: str
    episodes: int  # lines carried into the merged log
    lines_left_out: int  # superseded policy_error lines (or repeats) of its log, not carried over
    created_at: str
    command: list[str]
    corpus: list[str]  # as the shard's manifest recorded them (paths on its machine)
    git_commit: str | None
    hardware: dict[str, Any]


class MergeRecord(BaseModel):
    """``merged.json``: which runs a merged run was joined from."""

    model_config = ConfigDict(extra="forbid")

    merged_at: str
    shards: int
    runs: list[MergedRun]  # in shard order


@dataclass
class ShardRun:
    """A finished shard's run, read back: its manifest and the line kept per episode."""

    directory: Path
    manifest: RunManifest
    index: int  # I of I/N
    count: int  # N
    lines: dict[Key, bytes]  # per (question, sample), the log line that counts (run_directory.counted), as written
    left_out: int  # lines of the log not kept (superseded policy_error lines, repeats)
    settings: dict[str, Any] | None = None  # the policy settings its episodes were made with (connection aside)

    @property
    def shard(self) -> str:
        return f"{self.index}/{self.count}"


def read_run(directory: Path) -> ShardRun:
    """A finished shard's run directory (read through ``run_directory``), or one line saying why it cannot be merged."""
    if not directory.is_dir():
        raise EvaluationError(f"{directory}: no such run directory")
    kind = kind_of(directory)
    if kind is not None and kind is not EVAL_RUN:
        raise EvaluationError(not_an_eval_run(directory, kind))
    try:
        manifest = read_manifest(directory, "rerun the shard with this version of explorer")
    except FileNotFoundError:
        raise EvaluationError(f"{directory}: no manifest.json; name the run directories that explorer eval --shard wrote") from None
    if manifest.config.shard is None:
        raise EvaluationError(
            f"{directory}: not a shard (its config has no shard); explorer merge joins the runs of explorer eval --shard I/N, one per shard"
        )
    index, count = parse_shard(manifest.config.shard)
    resume = f"finish it with {finish_command(directory)}"
    try:
        numbered, torn = read_log(directory)  # each line with its bytes, from one read: copied exactly as written
    except FileNotFoundError:
        raise EvaluationError(f"{directory}: unfinished: no trajectories.jsonl yet; {resume}") from None
    if torn is not None:
        raise EvaluationError(f"{directory / TRAJECTORIES}:{torn.number}: unfinished: a torn last line (the run was interrupted); {resume}")
    for record in numbered:
        _episode_key(directory, record)
    stranger = first_stranger(numbered, manifest)
    if stranger is not None:  # a line copied in from another run would change the merged metrics unseen
        raise EvaluationError(f"{directory / TRAJECTORIES}:{stranger[0]}: not an episode of this run: {stranger[1]}; rerun the shard")
    lines = {_episode_key(directory, record): record.data + b"\n" for record in counted(numbered)}
    expected = manifest.config.questions * manifest.config.samples
    if len(lines) < expected:
        raise EvaluationError(
            f"{directory}: unfinished: {len(lines)} of {expected} episodes ({manifest.config.questions} "
            f"questions x {manifest.config.samples} samples); {resume}"
        )
    settings = acting_settings(numbered[0].value) if numbered else None
    return ShardRun(directory, manifest, index, count, lines, len(numbered) - len(lines), settings)


def _episode_key(directory: Path, record: Record[Trajectory]) -> Key:
    """The episode a log line holds, (question id, sample): what the shards are joined by."""
    if record.value.question_id is None:
        raise EvaluationError(
            f"{directory / TRAJECTORIES}:{record.number}: an episode without a question id is not one explorer eval writes"
        )
    return record.value.question_id, record.value.sample


def check_agreement(runs: list[ShardRun]) -> None:
    """The runs' manifests agree on all but the shard: config, hashes, isolation, code."""
    first = runs[0]
    base = dotted(first.manifest.config.model_dump(mode="json", exclude=SHARD_FIELDS), whole=("split_of",))
    for run in runs[1:]:
        if run.settings != first.settings:
            changed = sorted(
                key
                for key in set(run.settings or {}) | set(first.settings or {})
                if (run.settings or {}).get(key) != (first.settings or {}).get(key)
            )
            raise EvaluationError(
                f"{run.directory}: its episodes were made with other policy settings than {first.directory}'s "
                f"({', '.join(changed)}); rerun this shard with the same policy"
            )
        config = dotted(run.manifest.config.model_dump(mode="json", exclude=SHARD_FIELDS), whole=("split_of",))
        changed = sorted(key for key in set(base) | set(config) if base.get(key) != config.get(key) and key not in EXECUTION_FIELDS)
        if changed:
            shown = ", ".join(f"{key} {config.get(key)!r} vs {base.get(key)!r}" for key in changed)
            raise EvaluationError(
                f"{run.directory}: its config differs from {first.directory}'s ({shown}); the shards of one "
                "run take the same settings except --shard: rerun this shard with them"
            )
        theirs, ours = run.manifest.hashes.model_dump(), first.manifest.hashes.model_dump()
        changed = sorted(key for key in ours if ours[key] != theirs[key])
        if changed:
            raise EvaluationError(
                f"{run.directory}: its {', '.join(changed)} differs from {first.directory}'s: the shards ran on "
                "another corpus, questions or prompt; rerun this shard on the same ones"
            )
        for name, mine, other in (
            ("isolation", run.manifest.isolation, first.manifest.isolation),
            ("git commit", run.manifest.git_commit, first.manifest.git_commit),
        ):
            if mine != other:
                raise EvaluationError(
                    f"{run.directory}: its {name} is {mine!r} but {first.directory}'s is {other!r}; the shards "
                    "of one run must run the same code in the same sandbox: rerun this shard so"
                )
        versions, first_versions = run.manifest.versions, first.manifest.versions
        changed = sorted(key for key in set(versions) | set(first_versions) if versions.get(key) != first_versions.get(key))
        if changed:
            shown = ", ".join(f"{key} {versions.get(key)} vs {first_versions.get(key)}" for key in changed)
            raise EvaluationError(
                f"{run.directory}: its package versions differ from {first.directory}'s ({shown}); the shards "
                "of one run must run the same code: rerun this shard with the same packages"
            )


def check_shards(runs: list[ShardRun]) -> int:
    """All of one N, each of 1..N exactly once; returns N."""
    first = runs[0]
    for run in runs[1:]:
        if run.count != first.count:
            raise EvaluationError(
                f"{run.directory}: shard {run.shard}, but {first.directory} is shard {first.shard}; "
                "merge the runs of one split into N shards"
            )
    seen: dict[int, ShardRun] = {}
    for run in runs:
        if run.index in seen:
            raise EvaluationError(
                f"shard {run.shard} is given twice: {seen[run.index].directory} and {run.directory}; name each shard's run once"
            )
        seen[run.index] = run
    missing = [f"{index}/{first.count}" for index in range(1, first.count + 1) if index not in seen]
    if missing:
        raise EvaluationError(
            f"{'shards' if len(missing) > 1 else 'shard'} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} missing (given: "
            f"{', '.join(run.shard for run in sorted(runs, key=lambda r: r.index))}); run it with "
            f"explorer eval --shard {missing[0]} and the same settings, then merge every shard"
        )
    return first.count


def check_corpus(runs: list[ShardRun], loaded: Hashes, where: str | Path) -> None:
    """The corpus loaded here is the one the shards ran on (checked by hash: paths differ between machines)."""
    recorded = runs[0].manifest.hashes.model_dump()
    now = loaded.model_dump()
    changed = sorted(key for key in recorded if recorded[key] != now[key])
    if changed:
        raise EvaluationError(
            f"{where}: its {', '.join(changed)} differs from the shards' (as {runs[0].directory} records it); "
            f"pass {setting('corpus')} (and {setting('questions')}) with what the shards ran on, from this checkout's code"
        )


def merged_lines(runs: list[ShardRun], questions: list, samples: int) -> list[bytes]:
    """The merged log: every (question, sample) of the unsharded selection once, in its order."""
    count = runs[0].count
    for run in runs:
        mine = [question for question in questions if shard_of(question.id, count) == run.index]
        if questions_sha256(mine) != run.manifest.config.selected_questions_sha256:
            raise EvaluationError(
                f"{run.directory}: its selected questions are not shard {run.shard} of the selection that "
                f"split {run.manifest.config.split!r} and limit {run.manifest.config.limit} make of this corpus"
            )
    owner: dict[Key, ShardRun] = {}
    for run in sorted(runs, key=lambda r: r.index):
        for key in run.lines:
            if key in owner:
                raise EvaluationError(
                    f"question {key[0]} sample {key[1]} is in both {owner[key].directory} and {run.directory}; "
                    "each episode must be in one shard's run only"
                )
            owner[key] = run
    units = [(question.id, sample) for question in questions for sample in range(samples)]
    extra = set(owner) - set(units)
    if extra:
        key = min(extra)
        raise EvaluationError(
            f"{owner[key].directory}: holds question {key[0]} sample {key[1]}, which the selection does not "
            "ask; is it the log of another run?"
        )
    for key in units:
        if key not in owner:
            run = next(r for r in runs if r.index == shard_of(key[0], count))
            raise EvaluationError(
                f"{run.directory}: has no episode of question {key[0]} sample {key[1]}; "
                f"finish it with explorer eval --out {run.directory} --resume"
            )
    return [owner[key].lines[key] for key in units]


def merged_manifest(runs: list[ShardRun], questions: list, command: list[str], corpus_sources: list[str]) -> RunManifest:
    """The manifest one unsharded run would record (its config, questions and hashes), the code
    the shards agree on, and each shard's hardware under ``merged_runs``."""
    first = runs[0].manifest
    config = RecordedEvalConfig.model_validate(
        first.config.model_dump()
        | {
            "shard": None,
            "questions": len(questions),
            "selected_questions_sha256": questions_sha256(questions),
        }
    )
    return RunManifest(
        created_at=_now(),
        command=command,
        corpus=corpus_sources,
        file_sha256=first.file_sha256,
        config=config,
        hashes=first.hashes,
        isolation=first.isolation,
        versions=first.versions,
        git_commit=first.git_commit,
        hardware={"merged_runs": [run.manifest.hardware for run in sorted(runs, key=lambda r: r.index)]},
    )


def merge_record(runs: list[ShardRun]) -> MergeRecord:
    ordered = sorted(runs, key=lambda r: r.index)
    return MergeRecord(
        merged_at=_now(),
        shards=ordered[0].count,
        runs=[
            MergedRun(
                directory=str(run.directory.resolve()),
                shard=run.shard,
                episodes=len(run.lines),
                lines_left_out=run.left_out,
                created_at=run.manifest.created_at,
                command=run.manifest.command,
                corpus=run.manifest.corpus,
                git_commit=run.manifest.git_commit,
                hardware=run.manifest.hardware,
            )
            for run in ordered
        ],
    )


def write_merged(directory: Path, manifest: RunManifest, lines: list[bytes], record: MergeRecord) -> None:
    """manifest.json, trajectories.jsonl and merged.json of the merged run (metrics come after, from the log)."""
    with atomic_file(directory / MANIFEST) as handle:
        handle.write(manifest.model_dump_json(indent=2))
    with atomic_file(directory / TRAJECTORIES, binary=True) as handle:
        handle.writelines(lines)
    with atomic_file(directory / MERGED) as handle:
        handle.write(record.model_dump_json(indent=2))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
