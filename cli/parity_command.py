"""``explorer check-parity``: the tokens served at every step are the tokens trained on."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.parity import check_trajectory
from agent.renderer import ChatRenderer
from agent.writer import read_trajectories


def check_parity_command(
    trajectories: Path = typer.Option(..., "--trajectories", "-t", help="A trajectories .jsonl file."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="A model or tokenizer directory with tokenizer.json (Qwen3)."),
) -> None:
    """Prove train/serve parity: served tokens are a prefix of the training sequence.

    For every step of every trajectory, the prompt plus the action's tokens must equal the start
    of the training sequence, and the tool page must appear exactly once in the prompt. Exits 1
    at the first mismatch, printing where it is and the decoded tokens on both sides."""
    renderer = ChatRenderer.from_directory(tokenizer)
    episodes = read_trajectories(trajectories)
    steps = 0
    for trajectory in episodes:
        mismatch = check_trajectory(trajectory, renderer)
        if mismatch is not None:
            typer.echo(f"parity broken: {mismatch}", err=True)
            raise typer.Exit(1)
        steps += len(trajectory.steps)
    typer.echo(f"parity holds: {len(episodes)} trajectories, {steps} steps ({trajectories})")
