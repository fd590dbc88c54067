"""What several commands share: the corpus options and the helpers that read them.

Commands import this module, never each other. The settings of a config (a policy, an episode,
the sandbox limits, training) are not declared here: their flags are made from the config
models' fields (cli.flags).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import typer

from paper_explorer.cli.errors import UsageError
from paper_explorer.corpus import Corpus, DemoConfig, generate, load, selection
from paper_explorer.corpus.loading import with_questions

log = logging.getLogger(__name__)

CORPUS_HELP = (
    "Corpus file or directory (QASPER v0.3 JSON, Hugging Face qasper rows, explorer JSONL, LongBench QA lines, "
    "or MemAgent's HotpotQA eval files). Default: the bundled demo corpus."
)
CorpusOption = typer.Option(None, "--corpus", "-c", envvar="EXPLORER_CORPUS", help=CORPUS_HELP)
QuestionsOption = typer.Option(
    None,
    "--questions",
    help="JSONL of questions that replaces the corpus's own; or a LongBench or MemAgent file, whose contexts "
    "join the corpus as their questions' own documents.",
)
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
SplitOfOption = typer.Option(
    None,
    "--split-of",
    metavar="<file=split>",
    help="FILE=SPLIT: the split of a corpus file's papers when its name does not say "
    "(QASPER's official file names and Hugging Face's train, validation and test files do). Repeatable.",
)


def split_of(values: list[str] | None) -> dict[str, str] | None:
    """--split-of FILE=SPLIT values as {resolved file: split}; None when none were given."""
    from paper_explorer.corpus.splits import parse_split_of

    return parse_split_of(values) if values else None


def open_corpus(path: Path | None, questions: Path | None = None, splits: dict[str, str] | None = None) -> Corpus:
    """The named corpus, or the demo corpus when none is named; load warnings go to stderr."""
    if path is None and splits:
        raise UsageError("--split-of names files of a --corpus; the demo corpus has its own splits")
    corpus = generate(DemoConfig()) if path is None else load(path, questions, splits)
    if path is None and questions is not None:
        corpus = with_questions(corpus, questions)
    counts = corpus.warning_counts()
    if counts:
        shown = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
        log.warning("%d load warnings (%s); first: %s", len(corpus.warnings), shown, corpus.warnings[0])
    return corpus


# The settings of run and eval are flags made from their config's fields (cli.flags); these are
# the options beside them. --config and the flags override the config a field at a time.
ConfigOption = typer.Option(
    None, "--config", help="TOML with any field of the run's config, in its policy and episode tables too; flags win."
)
ReplayOtherCorpusOption = typer.Option(
    False,
    "--replay-other-corpus",
    rich_help_panel="Run",
    help="With --policy replay: replay a recording made on another corpus (its drift is reported).",
)


def say_note(line: str) -> None:
    """A note of the core layer (which split runs, and why) as one line on stderr."""
    typer.echo(f"note: {line}", err=True)


# Moved to corpus.selection (the Python API selects questions too); here bound to print their notes.
resolve_split = partial(selection.resolve_split, note=say_note)
select_questions = partial(selection.select_questions, note=say_note)
