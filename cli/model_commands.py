"""``explorer tiny-model``: build the CPU test model (see ``agent.testing.tiny_model``)."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.errors import UsageError


def tiny_model_command(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    tokenizer: Path = typer.Option(
        None, "--tokenizer", help="Use this directory's tokenizer (e.g. the real Qwen3 one) instead of training a small one."
    ),
) -> None:
    """Build a tiny random-weight Qwen3 model and tokenizer for CPU smoke tests.

    A few seconds, nothing downloaded; then: explorer run --policy hf --model OUT."""
    from agent.policies import require_llm_extra

    require_llm_extra()
    from agent.testing.tiny_model import build_tiny_model

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a directory")
    build_tiny_model(out, seed=seed, force=force, tokenizer_from=tokenizer)
    typer.echo(f"tiny model written to {out} (try: explorer run --policy hf --model {out} --max-new-tokens 32)")
