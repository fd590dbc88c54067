"""``explorer sft teach|build``: the CLI side of sft/ data building (imported lazily)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from agent.terminal_text import untrusted, visible
from cli.errors import UsageError
from cli.options import CorpusOption, QuestionsOption, SplitOfOption, open_corpus, select_questions, split_of

sft_app = typer.Typer(help="Build supervised fine-tuning data from trajectories.", no_args_is_help=True)
console = Console()
EVALUATION_SPLITS = ("train", "validation", "test", "none")


@sft_app.command("teach")
def teach_command(
    out: Path = typer.Option(..., "--out", "-o", help="Trajectories .jsonl to write (appended; a rerun finishes it)."),
    corpus_path: Optional[Path] = CorpusOption,
    questions_path: Optional[Path] = QuestionsOption,
    split: Optional[str] = typer.Option(None, "--split", help="Questions of which split: train, validation, test or all (default train; all when the corpus has no splits)."),
    split_of_values: Optional[List[str]] = SplitOfOption,
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N questions."),
    direct: bool = typer.Option(False, "--direct", help="Submit the gold answer as the first action (reproduces the shortcut)."),
    thinking: bool = typer.Option(False, "--thinking", help="Write each action's reasoning as a Qwen3 think block (thinking-mode data)."),
    max_steps: int = typer.Option(10, "--max-steps", min=1),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Record the prompts this tokenizer's renderer would serve (for check-parity)."),
) -> None:
    """Write gold-guided teacher trajectories for a split's questions (real tool calls, gold answers)."""
    from agent.runner import EpisodeRunner
    from agent.trajectory import EpisodeConfig
    from agent.writer import TrajectoryLog, read_trajectories
    from corpus import BM25Index
    from sft.teacher import Teacher

    if out.is_dir():
        raise UsageError(f"{out}: is a directory; name the trajectories .jsonl file to write")
    corpus = open_corpus(corpus_path, questions_path, split_of(split_of_values))
    questions = select_questions(corpus, split, limit, default="train")
    teacher = Teacher(corpus, direct=direct, thinking=thinking)
    if tokenizer is not None:
        from agent.renderer import ChatRenderer

        teacher.renderer = ChatRenderer.from_directory(tokenizer)
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), teacher, EpisodeConfig(max_steps=max_steps))
    statuses: dict[str, int] = {}
    with TrajectoryLog(out) as log:
        done = {t.question_id for t in read_trajectories(out)}
        todo = [q for q in questions if q.id not in done]
        for question in todo:
            trajectory = runner.run(question.text, question)
            log.append(trajectory)
            statuses[trajectory.outcome.status] = statuses.get(trajectory.outcome.status, 0) + 1
    shown = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "nothing new"
    typer.echo(f"{len(todo)} teacher trajectories written to {out} ({shown}; {len(questions) - len(todo)} were already there)")


@sft_app.command("build")
def build_command(
    trajectories: List[Path] = typer.Option(..., "--trajectories", "-t", help="Trajectory files (any policy, or imported)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for train.jsonl, validation.jsonl and build_report.json."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="The model's tokenizer directory (tokenizer.json)."),
    corpus_path: Optional[Path] = CorpusOption,
    questions_path: Optional[Path] = QuestionsOption,
    min_answer_f1: float = typer.Option(0.5, "--min-answer-f1", min=0.0, max=1.0, help="Keep submitted answers at least this good."),
    drop_abstentions: bool = typer.Option(False, "--drop-abstentions", help="Drop correct abstentions too."),
    max_length: int = typer.Option(8192, "--max-length", min=128, help="Longest example in tokens."),
    overflow: str = typer.Option("drop", "--overflow", help="Longer examples: drop, or split (keep the whole turns that fit)."),
    validation_share: float = typer.Option(0.2, "--validation-share", min=0.0, max=0.9, help="Share of papers held out for validation."),
    evaluation_split: str = typer.Option("test", "--evaluation-split", help="Split kept out of training entirely (none to disable)."),
    split_of_values: Optional[List[str]] = SplitOfOption,
    best_of: Optional[int] = typer.Option(None, "--best-of", min=1, help="Keep per question at most N successful attempts, the best (answer F1, then fewer steps, more tool use); never one whose first action ends the episode."),
    train_thinking: bool = typer.Option(False, "--train-thinking", help="Thinking-mode trajectories: train the think blocks too, not only the actions."),
    allow_parity_mismatch: bool = typer.Option(False, "--allow-parity-mismatch", help="Build even when a trajectory fails the parity check (recorded in the report)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing OUT."),
) -> None:
    """Turn trajectories into training examples (assistant-token labels), with a report of what was kept.

    Every trajectory is first checked for train/serve parity against TOKENIZER (as explorer
    check-parity does); a mismatch stops the build, exit 1, nothing written."""
    if overflow not in ("drop", "split"):
        raise UsageError(f"unknown --overflow {overflow!r}; choose drop or split")
    if evaluation_split not in EVALUATION_SPLITS:
        raise UsageError(f"unknown --evaluation-split {evaluation_split!r}; choose one of {', '.join(EVALUATION_SPLITS)}")
    if (out / "build_report.json").exists() and not force:
        raise UsageError(f"{out}: already holds a built dataset; pass --force to rebuild it")
    corpus = open_corpus(corpus_path, questions_path, split_of(split_of_values))
    settings = {"min_answer_f1": min_answer_f1, "keep_correct_abstentions": not drop_abstentions, "max_length": max_length,
                "overflow": overflow, "validation_share": validation_share, "evaluation_split": evaluation_split,
                "train_thinking": train_thinking, "best_of": best_of}
    report = build_dataset(trajectories, out, tokenizer, corpus, settings, allow_parity_mismatch)
    print_build_report(report)
    typer.echo(f"dataset written to {out}")


class NothingToTrain(UsageError):
    """No trajectory survived the build's filters."""


def build_dataset(trajectories: list[Path], out: Path, tokenizer: Path, corpus, settings: dict, allow_parity_mismatch: bool = False):
    """Check, filter, tokenise and write a dataset; the BuildReport it wrote. ``settings`` holds
    build_command's options by name (recorded verbatim in the report)."""
    from agent.renderer import ChatRenderer
    from agent.writer import read_trajectories
    from corpus.collection import questions_sha256
    from sft.dataset import BuildSettings, build, split_check, statistics, write
    from sft.records import BuildReport

    renderer = ChatRenderer.from_directory(tokenizer)
    found = [t for path in trajectories for t in read_trajectories(path)]
    if not found:
        raise UsageError("the trajectory files hold no episodes")
    parity = parity_report(found, renderer, allow_parity_mismatch)
    evaluation_papers = frozenset(p.id for p in corpus.papers if p.split == settings["evaluation_split"])
    evaluation_questions = frozenset(q.id for q in corpus.questions if q.paper_id in evaluation_papers)
    built = build(found, {q.id: q for q in corpus.questions}, renderer, BuildSettings(
        settings["min_answer_f1"], settings["keep_correct_abstentions"], settings["max_length"], settings["overflow"],
        settings["validation_share"], evaluation_papers, settings["train_thinking"], settings["best_of"]))
    check = split_check(built, evaluation_papers, evaluation_questions)
    if not check.passed:
        raise UsageError(f"split check failed, ids shared between sets: {json.dumps(check.overlaps)[:300]}")
    if not built.train:
        raise NothingToTrain(f"no training example survived the filters (dropped: {dict(built.dropped)}); relax --min-answer-f1 or add trajectories")
    tokenizer_file = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    report = BuildReport(
        trajectories_read=len(found), sources=[str(p) for p in trajectories],
        kept={"train": len(built.train), "validation": len(built.validation)},
        dropped=dict(built.dropped), split_at_turn_boundary=built.shortened, settings=settings,
        split_check=check, tokenizer=str(tokenizer_file.resolve()), tokenizer_sha256=renderer.fingerprint,
        corpus=[str(s) for s in corpus.sources], corpus_sha256=corpus.papers_sha256,
        questions_sha256=questions_sha256(corpus.questions),
        statistics={"train": statistics(built.train), "validation": statistics(built.validation)}, parity=parity,
    )
    write(built, out, report)
    return report


def parity_report(trajectories, renderer, allow_mismatch: bool):
    """Check every trajectory; refuse the build (exit 1, one line, nothing written) on a mismatch unless allowed."""
    from agent.parity import check_trajectory
    from sft.records import ParityReport

    mismatches = [m for m in (check_trajectory(t, renderer) for t in trajectories) if m is not None]
    report = ParityReport(
        trajectories=len(trajectories), steps=sum(len(t.steps) for t in trajectories),
        served_records=sum(1 for t in trajectories for step in t.steps if step.served is not None),
        mismatches=len(mismatches), first_mismatch=str(mismatches[0]) if mismatches else None, allowed=allow_mismatch and bool(mismatches),
    )
    if mismatches and not allow_mismatch:
        first = visible(str(mismatches[0])).split("\n")[0]  # it quotes the decoded tokens: model text
        typer.echo(f"error: parity check failed on {len(mismatches)} of {len(trajectories)} trajectories, first {first}; "
                   "nothing written (see explorer check-parity; --allow-parity-mismatch builds anyway)", err=True)
        raise typer.Exit(1)
    if mismatches:
        console.print(f"[bold red]warning: {len(mismatches)} trajectories fail the parity check; built anyway (--allow-parity-mismatch)[/bold red]")
    return report


def print_build_report(report) -> None:
    table = Table("", "train", "validation", title="SFT dataset")
    stats = report.statistics
    for name in ("trajectories", "turns_per_trajectory", "tokens", "tokens_per_trajectory", "max_tokens", "trained_tokens"):
        table.add_row(name, *(_shown(getattr(stats[side], name)) for side in ("train", "validation")))
    for kind in ("tool", "final"):
        table.add_row(f"trained token share ({kind} turns)", *(_shown((stats[side].trained_token_share or {}).get(kind)) for side in ("train", "validation")))
    table.add_row("first action submits", *(_shown(stats[side].first_action_submits_share) for side in ("train", "validation")))
    console.print(table)
    dropped = ", ".join(f"{reason}: {count}" for reason, count in report.dropped.items()) or "nothing"
    console.print(f"read {report.trajectories_read} trajectories; dropped {dropped}")
    if report.parity is not None:
        parity = report.parity
        console.print(f"parity: {parity.trajectories - parity.mismatches} of {parity.trajectories} trajectories hold "
                      f"({parity.served_records} of {parity.steps} steps recorded what they were served)")
    if report.split_at_turn_boundary:
        console.print(f"[yellow]{report.split_at_turn_boundary} examples were cut after their last whole turn that fits[/yellow]")
    share = stats["train"].first_action_submits_share or 0
    if share >= 0.25:
        console.print(f"[bold red]warning: {share:.0%} of training trajectories submit in their first action - "
                      "the data teaches the direct-submit shortcut[/bold red]")


def _shown(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


TYPICAL_TRAINED_SHARE = 0.25


def model_shape(model: str):
    """The architecture of ``model`` from its config.json; Qwen/Qwen3-8B's published one when offline."""
    from sft.memory import QWEN3_8B, Shape

    local = Path(model) / "config.json"
    if local.exists():
        return Shape.from_config(json.loads(local.read_text())), str(local)
    if model == "Qwen/Qwen3-8B":  # the default: no network needed to plan a run
        return Shape.from_config(QWEN3_8B), "Qwen/Qwen3-8B's published config.json (built in)"
    try:
        from transformers import AutoConfig

        return Shape.from_config(AutoConfig.from_pretrained(model).to_dict()), f"{model} (hub config)"
    except Exception as error:  # offline, or no such repository
        raise UsageError(f"{model}: cannot read its config ({str(error).splitlines()[0]}); name a local model directory") from None


def train_command(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Base model: a directory or hub id (default Qwen/Qwen3-8B)."),
    data: Optional[Path] = typer.Option(None, "--data", help="A dataset directory written by explorer sft build."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory for checkpoints, validation.jsonl and training_summary.json."),
    config_file: Optional[Path] = typer.Option(None, "--config", help="TOML with any TrainConfig field (the command line wins)."),
    corpus_path: Optional[Path] = CorpusOption,
    split_of_values: Optional[List[str]] = SplitOfOption,
    epochs: Optional[float] = typer.Option(None, "--epochs", min=0.01),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1),
    learning_rate: Optional[float] = typer.Option(None, "--learning-rate"),
    lora_r: Optional[int] = typer.Option(None, "--lora-r", min=1),
    lora_alpha: Optional[int] = typer.Option(None, "--lora-alpha", min=1),
    gradient_accumulation_steps: Optional[int] = typer.Option(None, "--gradient-accumulation-steps", min=1),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=128),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="auto (4-bit on CUDA), 4bit or none."),
    eval_steps: Optional[int] = typer.Option(None, "--eval-steps", min=1, help="Also validate every N optimizer steps."),
    save_steps: Optional[int] = typer.Option(None, "--save-steps", min=1, help="Also save (and validate) a checkpoint every N optimizer steps, besides one per epoch."),
    report_to: Optional[str] = typer.Option(None, "--report-to", help="Also send the loss and the validation figures (eval/direct_submit_rate, eval/answer_f1, ...) to tensorboard (OUT/runs), wandb, or none (default). Each needs its package installed."),
    validation_episodes: Optional[int] = typer.Option(None, "--validation-episodes", min=0, help="Greedy validation episodes per checkpoint."),
    max_direct_submit_rate: Optional[float] = typer.Option(None, "--max-direct-submit-rate", min=0.0, max=1.0),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint in OUT, with the same settings and data (only --report-to, --save-steps, --eval-steps and --max-direct-submit-rate may change); from step 0 if a kill left none."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the estimated peak GPU memory and whether it fits; train nothing."),
    card_gib: float = typer.Option(24.0, "--card-gib", min=1.0, help="GPU memory of the card to check against (an L4 has 24 GB)."),
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
    from sft.train import REPORTERS, load_config

    if report_to is not None and report_to not in REPORTERS:
        raise UsageError(f"unknown --report-to {report_to!r}; choose one of {', '.join(REPORTERS)}")

    overrides = {
        "model": model, "epochs": epochs, "max_steps": max_steps, "learning_rate": learning_rate, "lora_r": lora_r,
        "lora_alpha": lora_alpha, "gradient_accumulation_steps": gradient_accumulation_steps, "max_length": max_length,
        "quantization": quantization, "eval_steps": eval_steps, "validation_episodes": validation_episodes,
        "max_direct_submit_rate": max_direct_submit_rate, "save_steps": save_steps, "report_to": report_to,
    }
    config = load_config(config_file, overrides)
    if dry_run:
        dry_run_report(config, data, card_gib)
        return
    if data is None or out is None:
        raise UsageError("explorer train needs --data (from explorer sft build) and --out")
    if not (data / "build_report.json").exists():
        raise UsageError(f"{data}: no build_report.json; build the data with explorer sft build")
    if out.exists() and any(out.iterdir()) and not resume:
        raise UsageError(f"{out}: already holds a training run; pass --resume to continue it or choose another --out")
    if resume and not (out.is_dir() and any(out.iterdir())):
        raise UsageError(f"{out}: no training run to resume; drop --resume to start training")
    from agent.policies import require_llm_extra
    from sft.train import check_reporter

    check_reporter(config, out)
    require_llm_extra()
    from sft.train import TrainingInterrupted, train

    corpus = open_corpus(corpus_path, splits=split_of(split_of_values))
    try:
        summary = train(config, data, out, corpus, log=lambda line: console.print(untrusted(line)), resume=resume)
    except TrainingInterrupted as stop:
        exit_interrupted(stop, ["explorer", *sys.argv[1:]] + ([] if resume else ["--resume"]))
    if summary is not None:  # None on the processes other than the main one (accelerate launch)
        print_training_summary(summary, out)


def exit_interrupted(stop, again: list[str]) -> None:
    """After a Ctrl-C that saved a checkpoint: where it is and the command that resumes it (main
    process only), exit 130."""
    if stop.main:
        judged = "validated" if stop.validated else "not validated"
        typer.echo(f"interrupted at step {stop.step} of {stop.max_steps}: checkpoint saved to {stop.checkpoint} "
                   f"({judged}); resume with: {shlex.join(again)}", err=True)
    raise typer.Exit(130)


def dry_run_report(config, data: Optional[Path], card_gib: float) -> None:
    from sft.memory import estimate, tokens_per_second

    shape, source = model_shape(config.model)
    share, note = TYPICAL_TRAINED_SHARE, (f"assuming {TYPICAL_TRAINED_SHARE:.0%} of an example's tokens are trained, as is typical of "
                                         "multi-turn agent data; pass --data for your data's own share")
    if data is not None and (data / "train.jsonl").exists():
        from sft.dataset import load_examples

        examples = load_examples(data / "train.jsonl")
        share = max(sum(t.end - t.start for t in e.turns) / len(e.input_ids) for e in examples)
        note = f"at most {share:.0%} of an example's tokens are trained (from {data})"
    quantized = config.quantization != "none"
    terms = estimate(shape, config.max_length, config.lora_r, config.target_modules, quantized, config.gradient_checkpointing,
                     share, config.batch_size)
    table = Table("term", "GiB", title=f"estimated peak GPU memory: {config.model}, {config.max_length} tokens, LoRA r={config.lora_r}")
    for name in ("weights", "lora_and_optimizer", "activations", "logits", "cuda_overhead", "total"):
        table.add_row(name, f"{terms[name]:.2f}")
    console.print(table)
    console.print(f"architecture from {source}; {'4-bit NF4' if quantized else '16-bit'} base, "
                  f"{'with' if config.gradient_checkpointing else 'without'} gradient checkpointing; {note}")
    console.print(f"LoRA parameters: {terms['lora_parameters']:,}")
    speed = tokens_per_second(shape)
    console.print(f"throughput on an L4, estimated: {speed:,.0f} tokens/s (6N FLOPs per token at 30% of 121 TFLOPS)")
    if data is not None and (data / "build_report.json").exists():
        from sft.dataset import load_report

        tokens = load_report(data).statistics["train"].tokens or 0
        console.print(f"one epoch of {tokens:,} tokens: about {tokens / speed / 60:.1f} minutes on an L4")
    fits = terms["total"] <= card_gib * 1e9 / 2**30
    verdict = "fits" if fits else "does NOT fit"
    console.print(f"[{'green' if fits else 'bold red'}]{verdict} a {card_gib:g} GB card[/]")
    if not fits:
        raise typer.Exit(1)


def print_training_summary(summary, out: Path) -> None:
    table = Table("checkpoint", "step", "val loss", "P(first action ends)", "direct-submit", "tool calls before submit", "answer F1",
                  title="checkpoints")
    for record in summary.checkpoints:
        tf, seen = record.teacher_forced, record.behaviour
        table.add_row(untrusted(record.checkpoint), str(record.step), _shown(tf.loss_all), _shown(tf.first_action_end_probability),
                      _shown(seen.direct_submit_rate), _shown(seen.tool_calls_before_submit), _shown(seen.answer_f1))
    console.print(table)
    for warning in summary.warnings:
        console.print(untrusted(f"WARNING: {warning}", style="bold red"))
    console.print(f"selection ({summary.criterion}): {summary.best_checkpoint or 'none'}")
    session = f"steps {summary.resumed_from_step + 1}-{summary.steps} in {summary.seconds} s (resumed)" if summary.resumed_from_step else f"{summary.seconds} s"
    console.print(f"{summary.steps} steps, mean loss {summary.train_loss:.4f}, {session}; written to {out} (validation.jsonl, training_summary.json)")
