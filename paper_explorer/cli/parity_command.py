"""``explorer check-parity``: the tokens served at every step are the tokens trained on."""

from __future__ import annotations

from pathlib import Path

import typer

from paper_explorer.agent.terminal_text import visible
from paper_explorer.cli.errors import UsageError


def check_parity_command(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (explorer eval or run --out), or their trajectories .jsonl files."
    ),
    trajectory_files: list[Path] | None = typer.Option(
        None, "--trajectories", "-t", help="Trajectories .jsonl files (repeat for several), as RUN takes them."
    ),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="A model or tokenizer directory with tokenizer.json (Qwen3)."),
    data: Path | None = typer.Option(None, "--data", help="Also check a dataset built from these trajectories (explorer sft build)."),
    model: str | None = typer.Option(
        None, "--model", "-m", help="Also check that this model (directory or hub id) has the same tokenizer."
    ),
    require_served: bool = typer.Option(False, "--require-served", help="Fail on any step without a record of what it was served."),
    require_server_ids: bool = typer.Option(
        False, "--require-server-ids", help="Fail on any step whose server did not return the prompt's ids."
    ),
    rl: Path | None = typer.Option(None, "--rl", help="Also check an explorer rl run: every token it trained is one its samples drew."),
) -> None:
    """Prove train/serve parity from what was recorded, not only from what is re-rendered.

    For every step of every trajectory: the prompt plus the model's tokens must be a prefix of
    the training sequence, the tool page must appear once, and the prompt the step recorded it
    was served (digest, length, ids with --record-prompt-ids, tokenizer fingerprint, the
    server's own count and ids) must be that prompt; a recorded parity warning fails. The
    verdict says on how many steps the server's ids, or only its counts, were compared. With
    --data, every example's input_ids and labels must be its trajectory's, token by token. A memory
    reader's prompts are rebuilt from its trajectory (document, pages, memories) and compared.
    Exits 1 at the first mismatch, printing where it is and the decoded tokens on both sides."""
    from paper_explorer.agent.memory_reader.parity import reading_of
    from paper_explorer.agent.models import file_sha256, tokenizer_file
    from paper_explorer.agent.parity import check_trajectory, server_evidence, without_server_ids
    from paper_explorer.agent.renderer import ChatRenderer
    from paper_explorer.agent.writer import read_trajectories

    trajectories = [_log_of(path) for path in [*(runs or []), *(trajectory_files or [])]]
    if rl is not None and not trajectories:
        _check_rl(rl, ChatRenderer.from_directory(tokenizer))
        return
    if not trajectories:
        raise UsageError("name the run to check: explorer check-parity RUN --tokenizer DIR (a run directory, or -t FILE)")
    renderer = ChatRenderer.from_directory(tokenizer)
    files = {path: read_trajectories(path) for path in trajectories}
    episodes = [t for found in files.values() for t in found]
    if not episodes:
        raise UsageError("the trajectory files hold no episodes")
    if model is not None:
        fingerprint = file_sha256(tokenizer_file(model))
        if fingerprint != renderer.fingerprint:
            _broken(f"{model}'s tokenizer ({fingerprint[:12]}) is not {tokenizer}'s ({renderer.fingerprint[:12]})")
    for found in files.values():
        # one run records every step or none: in a file where some did, a step without a record was stripped
        recorded_run = require_served or any(step.served is not None for t in found for step in t.steps)
        for trajectory in found:
            mismatch = check_trajectory(trajectory, renderer, recorded_run)
            if mismatch is None and require_server_ids:
                mismatch = without_server_ids(trajectory)
            if mismatch is not None:
                _broken(str(mismatch))
    steps = sum(len(t.steps) for t in episodes)
    served = sum(1 for t in episodes for step in t.steps if step.served is not None)
    examples = _check_data(data, episodes, renderer) if data is not None else 0
    checked = f", {examples} examples of {data}" if data is not None else ""
    evidence = [server_evidence(step) for t in episodes for step in t.steps]
    compared = (
        f"ids compared on {evidence.count('ids')} steps, counts only on {evidence.count('counts')}, nothing on {evidence.count('nothing')}"
    )
    readings = [reading for t in episodes if (reading := reading_of(t)) is not None]
    rebuilt = sum(len(reading.updates) + (reading.answer is not None) for reading in readings)
    reader = f", {rebuilt} memory-reader prompts rebuilt and matched" if readings else ""
    if rl is not None:
        _check_rl(rl, renderer)
    typer.echo(
        f"parity holds: {len(episodes)} trajectories, {steps} steps ({served} with a record of what was served; "
        f"the server's record: {compared}){reader}{checked}"
    )
    if served == 0 and not readings:
        typer.echo(
            "warning: no step recorded what it was served, so only the re-rendering was checked; "
            "record it with --tokenizer (scripted, replay, sft teach) or a model policy",
            err=True,
        )


def _check_data(data: Path, episodes, renderer) -> int:
    from pydantic import ValidationError

    from paper_explorer.sft.dataset import load_examples, load_report
    from paper_explorer.sft.parity import check_example, check_report

    if not (data / "build_report.json").exists():
        raise UsageError(f"{data}: no build_report.json; name a directory written by explorer sft build")
    try:
        report = load_report(data)
        split = {name: load_examples(data / f"{name}.jsonl") for name in ("train", "validation")}
    except (ValidationError, FileNotFoundError) as error:
        raise UsageError(f"{data}: not a built dataset ({str(error).splitlines()[0]}); rebuild it with explorer sft build") from None
    mismatch = check_report(report, renderer, str(data))
    if mismatch is not None:
        _broken(str(mismatch))
    found = {name: len(examples) for name, examples in split.items()}
    if found != {name: report.kept.get(name, 0) for name in found}:
        _broken(f"{data}: holds {found} examples; its build report says {report.kept}")
    by_id: dict[str, list] = {}
    for trajectory in episodes:
        by_id.setdefault(trajectory.episode_id, []).append(trajectory)
    train_thinking = bool(report.settings.get("train_thinking"))
    seen = set()
    examples = [example for examples in split.values() for example in examples]
    for example in examples:
        key = (example.episode_id, tuple(example.input_ids))
        if key in seen:
            _broken(f"example {example.episode_id}: appears twice in the data")
        seen.add(key)
        mismatch = check_example(example, by_id.get(example.episode_id, []), renderer, train_thinking)
        if mismatch is not None:
            _broken(str(mismatch))
    return len(examples)


def _log_of(path: Path) -> Path:
    """The trajectories file a RUN names: a run directory's log, or the file itself."""
    if not path.is_dir():
        return path
    if not (path / "trajectories.jsonl").is_file():
        raise UsageError(f"{path}: no trajectories.jsonl; name a run directory of explorer eval or run, or a trajectories file")
    return path / "trajectories.jsonl"


def _broken(message: str) -> None:
    typer.echo(f"parity broken: {visible(message)}", err=True)  # it quotes decoded tokens: model text
    raise typer.Exit(1)


def _check_rl(out: Path, renderer) -> None:
    """An rl run's trained sequences against its samples' recorded ids (``rl.parity``)."""
    from paper_explorer.evaluation.run_directory import RL_RUN, kind_of
    from paper_explorer.rl.parity import check_rl_run

    if kind_of(out) is not RL_RUN:
        raise UsageError(f"{out}: not an explorer rl run (no rl.json); --rl names the directory explorer rl --out wrote")
    mismatch, counted = check_rl_run(out, renderer)
    if mismatch is not None:
        _broken(str(mismatch))
    if not counted["rounds"]:
        raise UsageError(f"{out}: no round has trained yet; nothing to check")
    typer.echo(
        f"rl parity holds: {counted['rounds']} rounds, {counted['sequences']} sequences and {counted['tokens']:,} trained tokens are "
        f"the ids sampled; {counted['draws']} draws decode to the text acted on"
    )
