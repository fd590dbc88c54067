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
    model: str = typer.Option(
        ..., "--model", "-m", help="The model: a directory or hub id (hf), or the name the server serves it under (openai)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The run directory to write."),
    backend_name: str = typer.Option(
        "hf", "--backend", help="hf (a local transformers model) or openai (a server returning prompt log-probabilities: vLLM)."
    ),
    base_url: list[str] | None = typer.Option(
        None,
        "--base-url",
        metavar="<url>",
        help="openai: the server's base URL, ending in /v1; repeated: replicas of one model. Key: $OPENAI_API_KEY.",
    ),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="openai: the served model's tokenizer directory (tokenizer.json)."),
    prompt_format: str = typer.Option(
        "ids", "--prompt-format", help="openai: ids (token ids, vLLM) or text (servers that take only text)."
    ),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="openai: seconds per request."),
    retries: int = typer.Option(4, "--retries", min=0, help="openai: retries with backoff on 429/5xx and network errors."),
    chunk: int = typer.Option(32, "--chunk", min=1, max=1024, help="openai: prompt+option pairs per request (shared mode)."),
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
    retry_not_measured: bool = typer.Option(
        False, "--retry-not-measured", help="With --resume: score again the questions recorded not measured (a server down)."
    ),
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
    if backend_name not in ("hf", "openai"):
        raise UsageError(f"--backend {backend_name!r}: choose hf or openai")
    local_only = {"--adapter": adapter is not None, "--quantization": quantization != "auto", "--threads": threads is not None}
    local_only["--batch-tokens"] = batch_tokens != 65_536
    served_only = {"--base-url": bool(base_url), "--tokenizer": tokenizer is not None, "--prompt-format": prompt_format != "ids"}
    misplaced = [flag for flag, given in (local_only if backend_name == "openai" else served_only).items() if given]
    if misplaced:
        raise UsageError(f"{', '.join(misplaced)}: not for --backend {backend_name}; drop it, or choose the other backend")
    if backend_name == "openai" and (not base_url or tokenizer is None):
        raise UsageError("--backend openai needs --base-url (the server) and --tokenizer (the served model's tokenizer directory)")
    if prompt_format not in ("ids", "text"):
        raise UsageError(f"--prompt-format {prompt_format!r}: choose ids or text")
    from paper_explorer.cli.options import open_corpus
    from paper_explorer.decisions.api import decide

    run = decide(
        decision_file,
        model=model,
        out=out,
        backend=backend_name,
        corpus=open_corpus(corpus_path) if corpus_path is not None else None,
        cut=cut,
        order=order,
        mode=mode,
        check_reversed=check_reversed,
        max_context=max_context,
        adapter=adapter,
        quantization=quantization,
        threads=threads,
        batch_tokens=batch_tokens,
        base_url=base_url,
        tokenizer=tokenizer,
        prompt_format=prompt_format,
        timeout=timeout,
        retries=retries,
        chunk=chunk,
        resume=resume,
        force=force,
        retry_not_measured=retry_not_measured,
        note=lambda line: typer.echo(line, err=True),
    )
    metrics = run.metrics
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
