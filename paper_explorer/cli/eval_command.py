"""``explorer eval``: parse the flags, make the config, call ``evaluation.run.evaluate``, print.

The run directory, resume, the episodes and the metrics are ``evaluation.run``'s; this module
only says on the terminal what the run says (``cli.display.ConsoleReporter``: notes and a
progress bar on stderr), prints the metrics, and turns how the run ended into an exit code:
0, 1 (it ran but measured nothing, stopped on errors, or failed its preregistered rule), 2 (bad
input, one line) or 130 (Ctrl-C: how far it got and the command that resumes it).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from paper_explorer.agent.config import EvalConfig
from paper_explorer.cli.display import ConsoleReporter
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import ConfigOption, CorpusOption, QuestionsOption, ReplayOtherCorpusOption, SplitOfOption, split_of


@config_flags(EvalConfig, panel="Run")
def eval_command(
    out: Path = typer.Option(..., "--out", "-o", help="Run directory (created; with --resume, finished)."),
    corpus_path: Path | None = CorpusOption,
    questions_path: Path | None = QuestionsOption,
    split_of_values: list[str] | None = SplitOfOption,
    config_file: Path | None = ConfigOption,
    resume: bool = typer.Option(
        False, "--resume", rich_help_panel="Run", help="Finish an interrupted run in OUT, with the config its manifest holds."
    ),
    retry_errors: bool = typer.Option(
        False,
        "--retry-errors",
        rich_help_panel="Run",
        help="With --resume: run again the episodes that ended in policy_error (they are replaced).",
    ),
    replay_other_corpus: bool = ReplayOtherCorpusOption,
    overrides: dict | None = None,  # the run's settings given as flags (cli.flags, from EvalConfig's fields)
) -> None:
    """Run a policy on every question of a split; write trajectories, a manifest and metrics.

    Settings come from --config (TOML), then the flags; `--out RUN --resume` reads them from the
    run's manifest, so nothing needs repeating (a flag that differs from it is refused)."""
    from paper_explorer.evaluation.resume import eval_config, resume_command
    from paper_explorer.evaluation.run import EvaluationFailed, EvaluationInterrupted, evaluate
    from paper_explorer.evaluation.summary import print_summary

    if retry_errors and not resume:
        raise UsageError("--retry-errors re-runs a run's failed episodes; use it with --out RUN --resume")
    overrides = {**(overrides or {}), "split_of": split_of(split_of_values)}
    config = eval_config(out, overrides, config_file, resume)
    again = resume_command(out, questions_path, retry_errors)
    try:
        run = evaluate(
            config,
            out=out,
            corpus=corpus_path,
            questions=questions_path,
            resume=resume,
            retry_errors=retry_errors,
            replay_other_corpus=replay_other_corpus,
            reporter=ConsoleReporter(Console(stderr=True)),
        )
    except EvaluationInterrupted as stop:
        typer.echo(f"interrupted: {stop.written} of {stop.total} episodes written to {out}; resume with: {again}", err=True)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # before the episodes began, or while scoring
        began = (out / "manifest.json").exists()
        typer.echo(
            f"interrupted; resume with: {again}" if began else f"interrupted before the run began; nothing was written to {out}", err=True
        )
        raise typer.Exit(130) from None
    except EvaluationFailed as failure:
        if failure.metrics is not None:
            print_summary(Console(), failure.metrics, out)
        typer.echo(error_line(str(failure)), err=True)
        raise typer.Exit(1) from None
    print_summary(Console(), run.metrics, out)
