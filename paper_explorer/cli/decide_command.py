"""``explorer decide``: score a typed decision file with a model into a run directory
(``decisions.run``); this module parses flags and prints the per-kind table.

Question ids and option texts come from the user's file: printed through
``agent.terminal_text.untrusted``, never as rich markup."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.options import CorpusOption

console = Console()


def decide_command(
    decision_file: Path = typer.Argument(..., help="A typed decision file (JSONL; explorer schema decision)."),
    model: str = typer.Option(..., "--model", "-m", help="The model: a directory or hub id (transformers)."),
    out: Path = typer.Option(..., "--out", "-o", help="The run directory to write."),
    adapter: Path | None = typer.Option(None, "--adapter", help="A LoRA adapter directory to load on the model."),
    quantization: str = typer.Option("auto", "--quantization", help="auto (4-bit on CUDA, full on CPU), 4bit or none."),
    corpus_path: Path | None = CorpusOption,
    cut: str = typer.Option(
        "none",
        "--cut",
        help="A document over the context: none (record it not measured), start or end (drop that many tokens there, recorded).",
    ),
    order: str = typer.Option("given", "--order", help="given, or reversed: list and score every question's options last first."),
    mode: str = typer.Option(
        "shared", "--mode", help="shared (the prompt once, the options in one batched pass) or separate (a pass per option)."
    ),
    check_reversed: bool = typer.Option(
        False,
        "--check-reversed",
        help="Read every question a second time with its options in the reverse order (the reversed-options check).",
    ),
    max_context: int | None = typer.Option(
        None, "--max-context", min=16, help="The most tokens of prompt and option (default: the model's)."
    ),
    batch_tokens: int = typer.Option(65_536, "--batch-tokens", min=1, help="Cached and option positions per batched pass (bounds memory)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch's CPU threads (default: half the cores)."),
    resume: bool = typer.Option(False, "--resume", help="Score only the questions OUT lacks, with the settings it was started with."),
    force: bool = typer.Option(False, "--force", help="Replace the decide run in OUT."),
) -> None:
    """Score every typed question of a file: a probability for each option, calibration per kind."""
    from paper_explorer.decisions.prompts import CUTS

    if cut not in CUTS:
        raise UsageError(f"--cut {cut!r}: choose {', '.join(CUTS)}")
    if order not in ("given", "reversed"):
        raise UsageError(f"--order {order!r}: choose given or reversed")
    if mode not in ("shared", "separate"):
        raise UsageError(f"--mode {mode!r}: choose shared or separate")
    if resume and force:
        raise UsageError("--resume and --force contradict each other; give one")
    from paper_explorer.cli.options import open_corpus
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.file import load_decisions
    from paper_explorer.decisions.run import DecideSettings, decide

    corpus = open_corpus(corpus_path) if corpus_path is not None else None
    decisions = load_decisions(decision_file, corpus)
    backend = LocalBackend.load(
        model, adapter=adapter, quantization=quantization, max_context=max_context, threads=threads, batch_tokens=batch_tokens
    )
    pinned = (list(corpus.sources), corpus.sha256) if corpus is not None else None
    settings = DecideSettings(cut=cut, order=order, mode=mode, check_reversed=check_reversed)  # type: ignore[arg-type]
    metrics = decide(
        decisions, backend, out, settings, corpus=pinned, resume=resume, force=force, note=lambda line: typer.echo(line, err=True)
    )
    print_kinds(metrics)
    if metrics.checks is not None:
        from paper_explorer.decisions.checks import check_lines

        for line in check_lines(metrics.checks):
            typer.echo(line)
    typer.echo(f"run written to {out}; explorer inspect {out} shows it")


def print_kinds(metrics) -> None:
    table = Table(title=f"{metrics.measured} of {metrics.questions} questions measured" + (f", {metrics.cut} cut" if metrics.cut else ""))
    for column in ("kind", "n", "labelled", "acc", "ECE", "ECE mass", "Brier", "NLL", "conf"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for figures in metrics.kinds.values():
        table.add_row(
            figures.kind,
            str(figures.measured),
            str(figures.labelled),
            *(
                _number(getattr(figures, name))
                for name in ("accuracy", "ece_equal_width", "ece_equal_mass", "brier", "nll", "mean_confidence")
            ),
        )
    console.print(table)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
