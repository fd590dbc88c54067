"""``explorer improve``: flags (made from ``ImproveSettings``'s fields) -> the settings ->
``sft.improve.improve`` -> a line per round.

The expert-iteration loop, its layout on disk and its resume live in ``sft.improve``; this module
parses, calls and prints.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console

from paper_explorer.agent.terminal_text import visible
from paper_explorer.cli.display import ConsoleReporter
from paper_explorer.cli.errors import error_line
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, SplitOfOption, open_corpus, split_of
from paper_explorer.sft.config import ImproveSettings


@config_flags(ImproveSettings)
def improve_command(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the rounds (a rerun resumes it)."),
    corpus_path: Path | None = CorpusOption,
    split_of_values: list[str] | None = SplitOfOption,
    config_file: Path | None = typer.Option(None, "--config", help="TOML with any ImproveSettings field (the command line wins)."),
    overrides: dict | None = None,  # the settings given as flags (cli.flags, from ImproveSettings's fields)
) -> None:
    """Expert iteration: sample, keep the best successful attempts, train, judge by behaviour; stop when a round gets worse."""
    from paper_explorer.agent.config import load_config

    settings = load_config(ImproveSettings, config_file, {**(overrides or {}), "corpus": str(corpus_path) if corpus_path else None})
    from paper_explorer.evaluation.run import EvaluationFailed, EvaluationInterrupted
    from paper_explorer.sft.improve import improve
    from paper_explorer.sft.interrupts import TrainingInterrupted, interrupted_message

    again = ["explorer", *sys.argv[1:]]  # the same command resumes the rounds
    corpus = open_corpus(Path(settings.corpus) if settings.corpus else None, splits=split_of(split_of_values))
    try:
        improve(
            settings, out=out, corpus=corpus, log=lambda line: typer.echo(visible(line)), reporter=ConsoleReporter(Console(stderr=True))
        )
    except TrainingInterrupted as stop:  # while a round trained
        message = interrupted_message(stop, again)
        if message is not None:
            typer.echo(message, err=True)
        raise typer.Exit(130) from None
    except EvaluationInterrupted as stop:  # while a round sampled
        typer.echo(
            f"interrupted: {stop.written} of {stop.total} episodes written to {stop.directory}; resume with: {shlex.join(again)}", err=True
        )
        raise typer.Exit(130) from None
    except EvaluationFailed as failure:  # a round's sampling measured nothing: the policy or its server, not a flag
        typer.echo(error_line(str(failure)), err=True)
        raise typer.Exit(1) from None
