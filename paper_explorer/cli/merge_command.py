"""``explorer merge``: join the runs of ``explorer eval --shard I/N`` into the run one machine would have written.

The checks are evaluation.merge's; this module finds the corpus and the unsharded selection
exactly as ``explorer eval`` does, builds the merged run in a temporary directory beside --out
and renames it into place, so a merge that fails leaves no half-made run.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

import paper_explorer.corpus.files as files
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.options import open_corpus, select_questions

if TYPE_CHECKING:
    from paper_explorer.agent.manifest import RecordedEvalConfig
    from paper_explorer.corpus import Corpus, Question
    from paper_explorer.evaluation.merge import ShardRun
    from paper_explorer.evaluation.prereg import Preregistered


def merge_command(
    runs: list[Path] = typer.Argument(..., help="The run directories of every shard (explorer eval --shard I/N), each once."),
    out: Path = typer.Option(..., "--out", "-o", help="The merged run directory (must not exist, or be empty)."),
    corpus_path: Path | None = typer.Option(
        None,
        "--corpus",
        "-c",
        help="The corpus the shards ran on (default: the one the first run's manifest recorded; its hash is checked).",
    ),
    questions_path: Path | None = typer.Option(
        None, "--questions", help="The questions file the shards were given, if any (its hash is checked)."
    ),
) -> None:
    """Merge sharded runs: check that their manifests agree and every episode is there once, then
    write the run one unsharded explorer eval would have written (its metrics recomputed) and
    merged.json (where each shard came from)."""
    from paper_explorer.agent.loop import corpus_hashes
    from paper_explorer.corpus import BM25Index
    from paper_explorer.evaluation.merge import (
        check_agreement,
        check_corpus,
        check_shards,
        merge_record,
        merged_lines,
        merged_manifest,
        read_run,
        write_merged,
    )
    from paper_explorer.evaluation.resume import recorded_corpus
    from paper_explorer.evaluation.run import write_metrics
    from paper_explorer.evaluation.run_directory import MERGED

    _check_out(out)
    shards = [read_run(directory) for directory in runs]
    check_agreement(shards)
    check_shards(shards)
    config = shards[0].manifest.config
    corpus = open_corpus(corpus_path or recorded_corpus(shards[0].manifest), questions_path, config.split_of or None)
    check_corpus(
        shards,
        corpus_hashes(corpus, config.policy.name, getattr(config.policy, "prompts", "explorer")),
        corpus_path or "the corpus the first run recorded",
    )
    questions = select_questions(corpus, config.split, config.limit, _replayed_questions(config))
    lines = merged_lines(shards, questions, config.samples)
    prereg = _preregistration(config, corpus, questions)
    manifest = merged_manifest(
        shards, questions, sys.argv[1:], [str(Path(s).resolve()) if Path(s).exists() else str(s) for s in corpus.sources]
    )
    index = BM25Index.cached(corpus)
    with _building(out) as building:
        write_merged(building, manifest, lines, merge_record(shards))
        metrics = write_metrics(building, questions, index, prereg)
    from paper_explorer.evaluation.summary import print_summary

    print_summary(Console(), metrics, out)
    typer.echo(f"merged {len(shards)} shards ({len(lines)} episodes) into {out}; {out / MERGED} says where they came from")
    _say_left_out(shards)
    if metrics.preregistration is not None and not metrics.preregistration.passed:
        failed = ", ".join(f"{c.check} = {c.value}" for c in metrics.preregistration.checks if not c.passed)
        typer.echo(
            error_line(f"the preregistered rule of {config.preregistration} FAILED ({failed}); see {out / 'metrics.json'}"), err=True
        )
        raise typer.Exit(1)


def _check_out(out: Path) -> None:
    """Like eval's --out, but the merged run is new: the directory must not exist, or be empty."""
    if out == Path("."):
        raise UsageError("--out names the merged run directory to write; give one other than the current directory")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names the merged run directory")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{out}: already exists and is not empty; choose another --out (merge writes a new run)")


def _replayed_questions(config: RecordedEvalConfig) -> list[str] | None:
    """--policy replay selects the questions its recording holds, as in explorer eval."""
    if config.policy.name != "replay":
        return None
    from paper_explorer.agent.policies import make_policy
    from paper_explorer.agent.policies.replay import Replay

    policy = make_policy(config.policy, config.episode.max_steps)
    assert isinstance(policy, Replay)  # what the policy named replay makes
    return policy.questions()


def _preregistration(config: RecordedEvalConfig, corpus: Corpus, questions: list[Question]) -> Preregistered | None:
    """The runs' preregistration, checked against the unsharded selection and judged as one run's would be."""
    if config.preregistration is None:
        return None
    from paper_explorer.corpus.collection import questions_sha256
    from paper_explorer.evaluation import prereg as preregistering

    preregistered = preregistering.Preregistered.read(config.preregistration)
    preregistering.check_frozen(*preregistered, corpus.papers_sha256, questions_sha256(questions), len(questions))
    return preregistered


@contextlib.contextmanager
def _building(out: Path):
    """A temporary directory beside ``out``, renamed to it when the body succeeds and removed when it does not."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{out.name}.merging-", dir=out.parent))
    except OSError as error:
        raise UsageError(f"{out}: cannot create the merged run beside it ({error.strerror}); choose another --out") from None
    try:
        yield building
        try:
            files.publish_directory(building)  # mkdtemp makes 0700; the run gets the mode mkdir would give
        except files.FileRefused as error:
            raise UsageError(f"{error}; choose another --out") from None
        try:
            building.rename(out)  # replaces an empty directory, refuses a non-empty one
        except OSError as error:
            raise UsageError(f"{out}: cannot be replaced by the merged run ({error.strerror}); choose another --out") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _say_left_out(shards: list[ShardRun]) -> None:
    for shard in shards:
        if shard.left_out:
            typer.echo(
                f"note: {shard.directory}: left out {shard.left_out} of its log's lines: policy_error lines superseded "
                "by a later line of the same episode (or repeats), which its own scoring leaves out too",
                err=True,
            )
