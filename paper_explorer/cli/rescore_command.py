"""``explorer rescore``: a run's recorded option probabilities recomputed from the model and adapter
on disk (``evaluation.rescore``); this module parses flags and prints.

Episode ids, probe names and paths come from the run's files or the user: printed through
``agent.terminal_text.visible``, never acted on by the terminal."""

from __future__ import annotations

from pathlib import Path

import typer

from paper_explorer.agent.terminal_text import visible


def rescore_command(
    run_dir: Path = typer.Argument(..., help="A finished run of explorer eval that recorded probes (--probe)."),
    model: str = typer.Option(..., "--model", "-m", help="The run's model: a directory or hub id (its tokenizer must be the run's)."),
    adapter: Path | None = typer.Option(None, "--adapter", help="The run's LoRA adapter directory (its files must be the run's)."),
    quantization: str | None = typer.Option(
        None, "--quantization", help="auto, 4bit or none (default: what the run recorded for --policy hf, else auto)."
    ),
    tolerance: float | None = typer.Option(
        # no min=: evaluation.rescore refuses inf, 1e400 and a negative number as one line (typer's min lets inf through);
        # None: evaluation.rescore.DEFAULT_TOLERANCE (importing it here would slow every command's start by a second)
        None,
        "--tolerance",
        help="Largest difference allowed: of a probability and the mass, and of a log-probability relative to its size "
        "(default 5e-5: 8x what a faithful CPU float32 reload moved, measured).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures and every probe's values as JSON."),
) -> None:
    """Recompute every recorded probe probability from the files on disk and compare.

    Each probe's prompt is rebuilt from its trajectory and checked against the recorded digests
    first. Then the model reads it without any cache (compared with the record) and with a cache
    warmed on the conversation (compared with the uncached reading: flips are reported). Exits 0
    only when every decision agrees (agreement 1.0000) and the largest probability difference is
    within --tolerance (and so are the options' mass and each option's log-probability, relative
    to its size: |a - b| / max(1, |a|); a recorded nan fails); every probe the run asked for must be there, and one
    recorded as not measured must really overflow the recorded context; exits 1 naming the first
    mismatch (episode, probe, both values). On CPU float32 a reload moves probabilities by about
    1e-6; on a GPU in 4-bit it is unmeasured here: expect larger differences and pass a --tolerance
    you measured."""
    from paper_explorer.evaluation.rescore import rescore

    report = rescore(run_dir, model, adapter=adapter, quantization=quantization, tolerance=tolerance)
    if as_json:
        typer.echo(report.to_json())
    else:
        _print(report)
    if report.mismatch is not None:
        typer.echo(f"rescore broken: {visible(report.mismatch)}", err=True)
        raise typer.Exit(1)


def _print(report) -> None:
    for note in report.notes:
        typer.echo(f"note: {visible(note)}")
    if not report.comparisons:
        return  # a prompt that could not be rebuilt: nothing was recomputed
    episodes = len({c.episode_id for c in report.comparisons})
    with_adapter = f" with adapter {report.adapter}" if report.adapter else ""
    skipped = f"; {report.not_measured} recorded as not measured, skipped" if report.not_measured else ""
    typer.echo(
        visible(
            f"probes compared: {len(report.comparisons)} of {episodes} episodes, rescored with {report.model}{with_adapter} "
            f"(quantization {report.quantization}){skipped}"
        )
    )
    agreeing = sum(c.agrees for c in report.comparisons)
    typer.echo(f"agreement: {report.agreement:.4f} ({agreeing} of {len(report.comparisons)} decisions)")
    typer.echo(
        f"largest difference: {report.largest_difference:.3g} (tolerance {report.tolerance:g}); log-probabilities "
        f"{report.largest_logprob_difference:.3g} (relative to their size), mass {report.largest_mass_difference:.3g}"
    )
    typer.echo(
        f"cached vs uncached: {report.cached_flips} flips, largest difference {report.largest_cached_difference:.3g} "
        "(cache warmed on each conversation before its probe turn)"
    )
    if report.holds:
        typer.echo("rescore holds")
