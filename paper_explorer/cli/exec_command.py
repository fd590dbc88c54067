"""``explorer exec``: run action files in one episode's sandbox and print each result as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.agent.config import load_config
from paper_explorer.agent.terminal_text import json_visible
from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, open_corpus
from paper_explorer.tools.limits import Limits, SandboxSettings
from paper_explorer.tools.modules import DEFAULT_MODULES, VETTED_MODULES


def read_action(path: Path) -> str:
    """The action text of a file (``-`` is standard input), or one clear line saying why not."""
    try:
        if str(path) == "-":
            return files.read_stream(sys.stdin, limit=files.TEXT_BYTES, what="action")
        return files.read_text(path, limit=files.TEXT_BYTES, what="action (.py)")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such action file") from None
    except files.FileRefused as error:
        raise UsageError(str(error)) from None


def json_line(result: dict, pretty: bool = False) -> str:
    """One result as JSON whose strings escape every control, format character, line separator and
    lone surrogate the worker printed (agent.terminal_text.json_visible): safe on a terminal, and one
    result is exactly one line even for readers that split on U+2028 or U+0085."""
    return json_visible(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, allow_nan=False))


def build_limits(settings: SandboxSettings, modules: list[str]) -> Limits:
    try:
        return Limits.from_settings(settings, tuple(modules) if modules else DEFAULT_MODULES)
    except ValidationError as error:  # a module that cannot be allowed
        raise UsageError(error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")) from None


@config_flags(SandboxSettings)
def exec_command(
    files: list[Path] = typer.Argument(..., help="Action files, run in order in one sandbox; '-' reads standard input."),
    corpus_path: Path | None = CorpusOption,
    allow_module: list[str] = typer.Option(
        [],
        "--allow-module",
        metavar="<str>",
        help=f"A module actions may import (repeat; default {', '.join(DEFAULT_MODULES)}; choose from {', '.join(VETTED_MODULES)}).",
    ),
    paper_id: str | None = typer.Option(
        None,
        "--paper-id",
        help="Run as an episode whose question is about this paper: when it holds its questions' own documents "
        "(a LongBench or MemAgent context), the tools see it alone; otherwise, as without it, the corpus's shared papers.",
    ),
    pretty: bool = typer.Option(False, "--pretty", help="Indent each result instead of one JSON object per line."),
    overrides: dict | None = None,  # the sandbox limits given (cli.flags, from tools.limits.SandboxSettings)
) -> None:
    """Run action files in one episode's sandbox; print each result as a JSON line.

    Each result holds stdout, value, error, limit hit, tool calls and outcome, and which documents
    the tools saw. Variables persist from one file to the next, like notebook cells. The exit code
    is 0 when every action ran, even if an action raised: the error is part of its result."""
    from paper_explorer.tools.sandbox import Sandbox

    if sum(1 for path in files if str(path) == "-") > 1:
        raise UsageError("'-' (standard input) can be named only once")
    limits = build_limits(load_config(SandboxSettings, None, overrides or {}), allow_module)
    actions = [(str(path), read_action(path)) for path in files]  # every file read before any runs
    corpus = open_corpus(corpus_path)
    if paper_id is not None and paper_id not in corpus:
        raise UsageError(f"--paper-id: no paper {paper_id!r} in the corpus; `explorer corpus stats` counts its papers")
    own = sum(1 for paper in corpus.papers if paper.own_documents)
    if paper_id is None and own:
        typer.echo(
            f"note: {own} of the corpus's {len(corpus.papers)} papers hold their questions' own documents, which only an episode "
            f"about one of them sees; the tools see the other {len(corpus.papers) - own} (--paper-id ID runs as one about ID)",
            err=True,
        )
    with Sandbox(corpus, limits, paper_id=paper_id) as sandbox:
        for name, code in actions:
            result = {"file": name, **sandbox.execute(code).to_json(), "isolation": sandbox.isolation, "documents": sandbox.documents}
            typer.echo(json_line(result, pretty))
