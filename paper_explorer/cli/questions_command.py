"""``explorer questions init|check``: write your own questions about a corpus's papers.

The file format, its templates and its checks are ``corpus.questions_file``'s; this module
parses flags and prints. Question text and paper ids come from files: shown through
``agent.terminal_text`` (controls escaped), never as rich markup.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.agent.terminal_text import json_visible, untrusted
from paper_explorer.cli.options import CorpusOption, JsonOption, open_corpus
from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.corpus.loading import load, with_questions
from paper_explorer.corpus.questions_file import check_questions, write_template

questions_app = typer.Typer(
    help="Write and check your own questions about a corpus's papers (explorer schema question).", no_args_is_help=True
)
console = Console()


@questions_app.command("init")
def init_command(
    out: Path = typer.Option(..., "--out", "-o", help="Questions file to start (JSONL); never overwritten."),
    corpus_path: Path | None = CorpusOption,
) -> None:
    """Start a questions file: one template line per paper of the corpus, to fill in.

    Each line holds the paper's id and title, a question and an answer to fill in (the
    <<FILL IN ...>> placeholders) and an example of each answer kind; a line still holding a
    placeholder is refused when loaded. Delete the lines of papers you ask nothing about."""
    corpus = open_corpus(corpus_path)
    written = write_template(corpus, out)
    console.print(untrusted(f"wrote {written} question templates (one per paper) to {out}"))
    if corpus.questions:
        typer.echo(f"note: the corpus has {len(corpus.questions)} questions of its own; --questions {out} replaces them", err=True)
    corpus_flag = f" --corpus {corpus_path}" if corpus_path is not None else ""
    typer.echo(f"next: fill in {out}, then explorer questions check {out}{corpus_flag}", err=True)


@questions_app.command("check")
def check_command(
    file: Path = typer.Argument(..., help="The questions file (JSONL, one question per line)."),
    corpus_path: Path | None = CorpusOption,
    as_json: bool = JsonOption,
) -> None:
    """Check a questions file against the corpus's papers: the first problem as one line, else a summary.

    Stricter than a load: evidence must be a whole paragraph of the paper, and every answer
    must have a kind."""
    corpus = with_questions(generate(DemoConfig()), file) if corpus_path is None else load(corpus_path, questions=file)
    summary = check_questions(corpus)
    if as_json:
        typer.echo(json_visible(json.dumps({"file": str(file), **summary.model_dump(mode="json")}, indent=2, ensure_ascii=False)))
        return
    kinds = ", ".join(f"{kind}: {n}" for kind, n in summary.answer_kinds.items()) or "-"
    console.print(
        untrusted(
            f"{file}: {summary.questions} questions about {summary.papers_with_questions} of {summary.papers} papers "
            f"({summary.answerable_questions} answerable, {summary.unanswerable_questions} unanswerable); "
            f"answers by kind: {kinds}"
        )
    )
    table = Table(title="questions per paper", title_justify="left")
    table.add_column("paper", overflow="fold")
    table.add_column("questions", justify="right", no_wrap=True)
    for paper_id, count in summary.questions_per_paper.items():
        table.add_row(untrusted(paper_id), str(count))
    console.print(table)
    corpus_flag = f" --corpus {corpus_path}" if corpus_path is not None else ""
    typer.echo(f"next: explorer eval{corpus_flag} --questions {file} --out runs/my-questions", err=True)
