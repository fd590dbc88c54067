"""``explorer rescore``: a run's recorded option probabilities recomputed from the model and adapter
on disk: an eval run's probes (``evaluation.rescore``) or a decide run's typed decisions
(``decisions.rescore``, told by its manifest); this module parses flags and prints.

Episode ids, probe names and paths come from the run's files or the user: printed through
``agent.terminal_text.visible``, never acted on by the terminal."""

from __future__ import annotations

from pathlib import Path

import typer

from paper_explorer.agent.terminal_text import visible
from paper_explorer.cli.errors import UsageError


def rescore_command(
    run_dir: Path = typer.Argument(
        ..., help="A finished run of explorer eval that recorded probes (--probe), or a run of explorer decide."
    ),
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
    corpus_path: Path | None = typer.Option(
        None, "--corpus", help="A decide run whose documents name papers: the corpus it read them from (its SHA-256 is checked)."
    ),
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
    you measured.

    A run of explorer decide is rescored question by question: each prompt is rebuilt from the
    decision file and checked against the recorded SHA-256, then every option is scored with the
    prompt's cache (its prefix reused as the run reused it) and without any cache (a full pass per
    option), each compared with the record (agreement, largest probability and log-likelihood
    differences); a reversed reading (decide --check-reversed) is rescored too."""
    from paper_explorer.decisions.rescore import is_decide_run

    if is_decide_run(run_dir):
        report, show = _rescore_decisions(run_dir, model, adapter, quantization, tolerance, corpus_path), _print_decisions
    else:
        if corpus_path is not None:
            raise UsageError(f"--corpus {corpus_path}: only a decide run whose documents name papers reads a corpus; {run_dir} is not one")
        from paper_explorer.evaluation.rescore import rescore

        report, show = rescore(run_dir, model, adapter=adapter, quantization=quantization, tolerance=tolerance), _print
    if as_json:
        typer.echo(report.to_json())
    else:
        show(report)
    if report.mismatch is not None:
        typer.echo(f"rescore broken: {visible(report.mismatch)}", err=True)
        raise typer.Exit(1)


def _rescore_decisions(run_dir: Path, model: str, adapter, quantization, tolerance, corpus_path: Path | None):
    from paper_explorer.cli.options import open_corpus
    from paper_explorer.decisions.rescore import rescore_decisions

    corpus = open_corpus(corpus_path) if corpus_path is not None else None
    return rescore_decisions(run_dir, model, adapter=adapter, quantization=quantization, tolerance=tolerance, corpus=corpus)


def _print_decisions(report) -> None:
    for note in report.notes:
        typer.echo(f"note: {visible(note)}")
    for finding in report.findings:
        typer.echo(f"finding: {visible(finding)}")
    questions = len({reading.question_id for reading in report.readings})
    reversed_readings = sum(reading.reversed for reading in report.readings)
    with_adapter = f" with adapter {report.adapter}" if report.adapter else ""
    typer.echo(
        visible(
            f"decide run: questions {questions}, readings {len(report.readings)}"
            + (f" ({reversed_readings} reversed)" if reversed_readings else "")
            + f", rescored with {report.model}{with_adapter} (quantization {report.quantization}); "
            f"not measured {report.not_measured} (their prompt does not fit), findings {len(report.findings)}"
        )
    )
    for which, how in (("cached", "the prompt's cache, its prefix reused as the run did"), ("uncached", "a full pass per option")):
        figures = report.agreement(which)
        typer.echo(
            f"{which} ({how}) vs recorded: agreement {figures.agreement:.4f} ({figures.agreeing} of {figures.readings}), "
            f"largest |dp| {figures.max_probability_difference:.3g}, largest |d log-likelihood| {figures.max_loglikelihood_difference:.3g} "
            f"({figures.max_relative_loglikelihood_difference:.3g} relative to its size; tolerance {report.tolerance:g})"
        )
    if report.holds:
        typer.echo("rescore holds")


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
