"""``explorer improve``: flags -> ``ImproveSettings`` -> ``sft.improve.improve`` -> a line per round.

The expert-iteration loop, its layout on disk and its resume live in ``sft.improve``; this module
parses, calls and prints.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console

from paper_explorer.agent.terminal_text import visible
from paper_explorer.agent.trajectory import MAX_STEPS
from paper_explorer.cli.display import ConsoleReporter
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.options import CorpusOption, SplitOfOption, open_corpus, split_of


def improve_command(
    model: str = typer.Option(..., "--model", "-m", help="The base model: a directory or hub id."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the rounds (a rerun resumes it)."),
    adapter: Path | None = typer.Option(None, "--adapter", help="A LoRA adapter to sample round 1 with (default: the base model)."),
    corpus_path: Path | None = CorpusOption,
    split_of_values: list[str] | None = SplitOfOption,
    rounds: int = typer.Option(2, "--rounds", min=1, help="Rounds of sample -> filter -> build -> train -> validate."),
    samples: int = typer.Option(4, "--samples", min=1, help="Attempts per question per round."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.01, help="Sampling temperature."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N train questions each round."),
    best_of: int = typer.Option(1, "--best-of", min=1, help="Successful attempts kept per question."),
    seed_data: list[Path] | None = typer.Option(None, "--seed-data", help="Trajectories added to every round's data (e.g. sft teach's)."),
    max_steps: int = typer.Option(10, "--max-steps", min=1, max=MAX_STEPS, help="Actions per episode."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=1),
    train_max_steps: int | None = typer.Option(
        None, "--train-max-steps", min=1, help="Optimizer steps per round (default: the recipe's epochs)."
    ),
    validation_episodes: int = typer.Option(
        16,
        "--validation-episodes",
        min=0,
        metavar="<int>",
        rich_help_panel="Validation",
        help="Greedy validation episodes per checkpoint (>= 0).",
    ),
    quantization: str = typer.Option("auto", "--quantization", help="auto, 4bit or none (as explorer train)."),
    base_url: str | None = typer.Option(
        None, "--base-url", help="Sample on a vLLM server with runtime LoRA loading instead of in-process."
    ),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Expert iteration: sample, keep the best successful attempts, train, judge by behaviour; stop when a round gets worse."""
    from paper_explorer.sft.improve import ImproveSettings

    try:
        settings = ImproveSettings(
            model=model,
            adapter=str(adapter) if adapter else None,
            corpus=str(corpus_path) if corpus_path else None,
            rounds=rounds,
            samples=samples,
            temperature=temperature,
            limit=limit,
            best_of=best_of,
            seed_data=[str(p) for p in seed_data or []],
            max_steps=max_steps,
            max_new_tokens=max_new_tokens,
            train_max_steps=train_max_steps,
            validation_episodes=validation_episodes,
            quantization=quantization,
            base_url=base_url,
            seed=seed,
        )
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise UsageError(f"--{'-'.join(str(first['loc'][0]).split('_'))}: {first['msg'].removeprefix('Value error, ')}") from None
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {base_url!r} must start with http:// or https://")
    from paper_explorer.evaluation.run import EvaluationFailed, EvaluationInterrupted
    from paper_explorer.sft.improve import improve
    from paper_explorer.sft.interrupts import TrainingInterrupted, interrupted_message

    again = ["explorer", *sys.argv[1:]]  # the same command resumes the rounds
    corpus = open_corpus(corpus_path, splits=split_of(split_of_values))
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
