"""``explorer sft teach|build`` and ``explorer train``: flags -> a config -> one call of sft/ -> what it did, printed.

The workflows are ``sft.teach.teach``, ``sft.build.build_dataset`` and ``sft.train.train``; this
module parses, calls and prints."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.agent.terminal_text import untrusted
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, QuestionsOption, SplitOfOption, open_corpus, say_note, split_of
from paper_explorer.sft.config import BuildConfig, TrainConfig
from paper_explorer.sft.teach import TeachConfig

sft_app = typer.Typer(help="Build supervised fine-tuning data from trajectories.", no_args_is_help=True)
console = Console()


@sft_app.command("teach")
@config_flags(TeachConfig)
def teach_command(
    out: Path = typer.Option(..., "--out", "-o", help="Trajectories .jsonl to write (appended; a rerun finishes it)."),
    corpus_path: Path | None = CorpusOption,
    questions_path: Path | None = QuestionsOption,
    split_of_values: list[str] | None = SplitOfOption,
    overrides: dict | None = None,  # the teacher's settings given as flags (cli.flags, from TeachConfig's fields)
) -> None:
    """Write gold-guided teacher trajectories for a split's questions (real tool calls, gold answers)."""
    from paper_explorer.agent.config import load_config
    from paper_explorer.sft.teach import teach

    config = load_config(TeachConfig, None, {**(overrides or {}), "split_of": split_of(split_of_values)})
    report = teach(config, out=out, corpus=corpus_path, questions=questions_path, note=say_note)
    shown = ", ".join(f"{status} {count}" for status, count in report.statuses.items()) or "nothing new"
    typer.echo(f"{report.written} teacher trajectories written to {out} ({shown}; {report.already_written} were already there)")


@sft_app.command("build")
@config_flags(BuildConfig)
def build_command(
    trajectories: list[Path] = typer.Option(..., "--trajectories", "-t", help="Trajectory files (any policy, or imported)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for train.jsonl, validation.jsonl and build_report.json."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="The model's tokenizer directory (tokenizer.json)."),
    corpus_path: Path | None = CorpusOption,
    questions_path: Path | None = QuestionsOption,
    split_of_values: list[str] | None = SplitOfOption,
    config_file: Path | None = typer.Option(None, "--config", help="TOML with any BuildConfig field (the command line wins)."),
    allow_parity_mismatch: bool = typer.Option(
        False,
        "--allow-parity-mismatch",
        rich_help_panel="Checks",
        help="Build even when a trajectory fails the parity check (recorded in the report).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing OUT."),
    overrides: dict | None = None,  # how trajectories become examples, given as flags (cli.flags, from BuildConfig's fields)
) -> None:
    """Turn trajectories into training examples (assistant-token labels), with a report of what was kept.

    Every trajectory is first checked for train/serve parity against TOKENIZER (as explorer
    check-parity does); a mismatch stops the build, exit 1, nothing written."""
    from paper_explorer.agent.config import load_config
    from paper_explorer.sft.build import ParityMismatch, build_dataset

    config = load_config(BuildConfig, config_file, overrides or {})
    corpus = open_corpus(corpus_path, questions_path, split_of(split_of_values))
    try:
        report = build_dataset(
            config,
            trajectories=trajectories,
            tokenizer=tokenizer,
            out=out,
            corpus=corpus,
            allow_parity_mismatch=allow_parity_mismatch,
            force=force,
        )
    except ParityMismatch as error:  # the machine's verdict on the data, not a bad flag: exit 1
        typer.echo(error_line(str(error)), err=True)
        raise typer.Exit(1) from None
    print_build_report(report)
    typer.echo(f"dataset written to {out}")


def print_build_report(report) -> None:
    table = Table("", "train", "validation", title="SFT dataset")
    stats = report.statistics
    for name in ("trajectories", "turns_per_trajectory", "tokens", "tokens_per_trajectory", "max_tokens", "trained_tokens"):
        table.add_row(name, *(_shown(getattr(stats[side], name)) for side in ("train", "validation")))
    for kind in ("tool", "final"):
        table.add_row(
            f"trained token share ({kind} turns)",
            *(_shown((stats[side].trained_token_share or {}).get(kind)) for side in ("train", "validation")),
        )
    table.add_row("direct submits", *(_shown(stats[side].first_action_submits_share) for side in ("train", "validation")))
    console.print(table)
    dropped = ", ".join(f"{reason}: {count}" for reason, count in report.dropped.items()) or "nothing"
    console.print(f"read {report.trajectories_read} trajectories; dropped {dropped}")
    if report.parity is not None and report.parity.allowed:
        console.print(
            f"[bold red]warning: {report.parity.mismatches} trajectories fail the parity check; "
            "built anyway (--allow-parity-mismatch)[/bold red]"
        )
    if report.parity is not None:
        parity = report.parity
        console.print(
            f"parity: {parity.trajectories - parity.mismatches} of {parity.trajectories} trajectories hold "
            f"({parity.served_records} of {parity.steps} steps recorded what they were served)"
        )
    if report.split_at_turn_boundary:
        console.print(f"[yellow]{report.split_at_turn_boundary} examples were cut after their last whole turn that fits[/yellow]")
    share = stats["train"].first_action_submits_share or 0
    if share >= 0.25:
        console.print(
            f"[bold red]warning: {share:.0%} of training trajectories submit before any research result (direct submits) - "
            "the data teaches the direct-submit shortcut[/bold red]"
        )


def _shown(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


TYPICAL_TRAINED_SHARE = 0.25


@config_flags(TrainConfig, panel="Training")
def train_command(
    data: Path | None = typer.Option(None, "--data", help="A dataset directory written by explorer sft build."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Directory for checkpoints, validation.jsonl and training_summary.json."),
    config_file: Path | None = typer.Option(None, "--config", help="TOML with any TrainConfig field (the command line wins)."),
    corpus_path: Path | None = CorpusOption,
    split_of_values: list[str] | None = SplitOfOption,
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue from the newest complete checkpoint in OUT, with the same settings and data (only --report-to, --save-steps, --eval-steps and --max-direct-submit-rate may change); from step 0 if a kill left none.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the estimated peak GPU memory and whether it fits; train nothing."),
    card_gib: float = typer.Option(24.0, "--card-gib", min=1.0, help="GPU memory of the card to check against (an L4 has 24 GB)."),
    overrides: dict | None = None,  # the recipe's settings given as flags (cli.flags, from TrainConfig's fields)
) -> None:
    """Train a QLoRA adapter on assistant tokens; choose the checkpoint by behaviour.

    The defaults are the reference recipe for Qwen3-8B on one 24 GB L4: a checkpoint per epoch,
    each validated by loss and by greedy episodes.

    Progress goes to stderr: a bar on a terminal, else one line per step, with the loss, input
    tokens per second (every token of the sequences read, padding left out, all processes
    together; only about a quarter of them are trained) and the time left. Ctrl-C saves a
    checkpoint at the end of the current step and exits with code 130 (resume with --resume);
    a second Ctrl-C exits at once. Under accelerate launch / torchrun, set
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT (seconds, default 30) above a step plus a save, or the
    launcher kills the processes before the checkpoint is written."""
    from paper_explorer.sft.config import load_config

    config = load_config(config_file, overrides or {})
    if dry_run:
        dry_run_report(config, data, card_gib)
        return
    if data is None or out is None:
        raise UsageError("explorer train needs --data (from explorer sft build) and --out")
    from paper_explorer.sft.interrupts import TrainingInterrupted
    from paper_explorer.sft.train import train

    corpus = open_corpus(corpus_path, splits=split_of(split_of_values))
    try:
        summary = train(config, data=data, out=out, corpus=corpus, log=lambda line: console.print(untrusted(line)), resume=resume)
    except TrainingInterrupted as stop:
        exit_interrupted(stop, ["explorer", *sys.argv[1:]] + ([] if resume else ["--resume"]))
    if summary is not None:  # None on the processes other than the main one (accelerate launch)
        print_training_summary(summary, out)


def exit_interrupted(stop, again: list[str]) -> None:
    """After a Ctrl-C that saved a checkpoint: where it is and the command that resumes it (main
    process only), exit 130."""
    from paper_explorer.sft.interrupts import interrupted_message

    message = interrupted_message(stop, again)
    if message is not None:
        typer.echo(message, err=True)
    raise typer.Exit(130)


def dry_run_report(config, data: Path | None, card_gib: float) -> None:
    from paper_explorer.sft.memory import estimate, model_shape, tokens_per_second

    shape, source = model_shape(config.model)
    share, note = (
        TYPICAL_TRAINED_SHARE,
        (
            f"assuming {TYPICAL_TRAINED_SHARE:.0%} of an example's tokens are trained, as is typical of "
            "multi-turn agent data; pass --data for your data's own share"
        ),
    )
    if data is not None and (data / "train.jsonl").exists():
        from paper_explorer.sft.dataset import load_examples

        examples = [e for e in load_examples(data / "train.jsonl") if e.input_ids]
        if examples:  # none: the typical share stands
            share = max(sum(t.end - t.start for t in e.turns) / len(e.input_ids) for e in examples)
            note = f"at most {share:.0%} of an example's tokens are trained (from {data})"
    quantized = config.quantization != "none"
    terms = estimate(
        shape, config.max_length, config.lora_r, config.target_modules, quantized, config.gradient_checkpointing, share, config.batch_size
    )
    table = Table("term", "GiB", title=f"estimated peak GPU memory: {config.model}, {config.max_length} tokens, LoRA r={config.lora_r}")
    for name in ("weights", "lora_and_optimizer", "activations", "logits", "cuda_overhead", "total"):
        table.add_row(name, f"{terms[name]:.2f}")
    console.print(table)
    console.print(
        f"architecture from {source}; {'4-bit NF4' if quantized else '16-bit'} base, "
        f"{'with' if config.gradient_checkpointing else 'without'} gradient checkpointing; {note}"
    )
    console.print(f"LoRA parameters: {terms['lora_parameters']:,}")
    speed = tokens_per_second(shape)
    console.print(f"throughput on an L4, estimated: {speed:,.0f} tokens/s (6N FLOPs per token at 30% of 121 TFLOPS)")
    if data is not None and (data / "build_report.json").exists():
        from pydantic import ValidationError

        from paper_explorer.sft.dataset import load_report

        try:
            tokens = load_report(data).statistics["train"].tokens or 0
        except (ValidationError, KeyError) as error:
            message = error.errors(include_url=False)[0]["msg"] if isinstance(error, ValidationError) else f"no {error} split"
            raise UsageError(f"{data / 'build_report.json'}: not a build report ({message}); rebuild it with explorer sft build") from None
        console.print(f"one epoch of {tokens:,} tokens: about {tokens / speed / 60:.1f} minutes on an L4")
    fits = terms["total"] <= card_gib * 1e9 / 2**30
    verdict = "fits" if fits else "does NOT fit"
    console.print(f"[{'green' if fits else 'bold red'}]{verdict} a {card_gib:g} GB card[/]")
    if not fits:
        raise typer.Exit(1)


def print_training_summary(summary, out: Path) -> None:
    table = Table(
        "checkpoint",
        "step",
        "val loss",
        "P(first action ends)",
        "direct-submit",
        "tool calls before submit",
        "answer F1",
        title="checkpoints",
    )
    for record in summary.checkpoints:
        tf, seen = record.teacher_forced, record.behaviour
        table.add_row(
            untrusted(record.checkpoint),
            str(record.step),
            _shown(tf.loss_all),
            _shown(tf.first_action_end_probability),
            _shown(seen.direct_submit_rate),
            _shown(seen.tool_calls_before_submit),
            _shown(seen.answer_f1),
        )
    console.print(table)
    for warning in summary.warnings:
        console.print(untrusted(f"WARNING: {warning}", style="bold red"))
    console.print(f"selection ({summary.criterion}): {summary.best_checkpoint or 'none'}")
    session = (
        f"steps {summary.resumed_from_step + 1}-{summary.steps} in {summary.seconds} s (resumed)"
        if summary.resumed_from_step
        else f"{summary.seconds} s"
    )
    console.print(
        f"{summary.steps} steps, mean loss {summary.train_loss:.4f}, {session}; written to {out} (validation.jsonl, training_summary.json)"
    )
