"""``explorer rl``: flags (made from ``RLConfig``'s fields) -> the config -> ``rl.run.reinforce``
-> a line per round and the summary; ``--dry-run`` sizes a run for a GPU instead.

The rounds, their layout on disk and their resume live in ``rl.run``; this module parses, calls
and prints."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.agent.terminal_text import visible
from paper_explorer.cli.display import ConsoleReporter, print_rl_rounds
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, SplitOfOption, open_corpus, split_of
from paper_explorer.rl.config import RLConfig

console = Console()

# The sampler's speed on the card, for the dry run's time: one 4-bit 8B model decoding one sequence
# reads its ~5.5 GB of weights per token, and an L4 moves 300 GB/s; a third of that is what
# transformers' generate reaches. vLLM batches the group's episodes and is many times faster.
L4_HF_DECODE_TOKENS_PER_SECOND = 18.0


@config_flags(RLConfig, panel="Training")
def rl_command(
    out: Path | None = typer.Option(None, "--out", "-o", help="Directory for the rounds (a rerun of the same command resumes it)."),
    corpus_path: Path | None = CorpusOption,
    split_of_values: list[str] | None = SplitOfOption,
    config_file: Path | None = typer.Option(None, "--config", help="TOML with any RLConfig field (the command line wins)."),
    reward_values: list[str] | None = typer.Option(
        None,
        "--reward",
        metavar="<part=weight>",
        help="PART=WEIGHT: a reward part and its weight (answer_f1, exact_match, sub_exact_match, correct_abstention, or a "
        "detector such as direct_submit, format_errors, ungrounded_answer). Repeatable; given, these replace the default reward.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the estimated peak GPU memory and time of a round on the card; sample and train nothing."
    ),
    sequence_tokens: int = typer.Option(8192, "--sequence-tokens", min=128, help="--dry-run: the longest episode to size for, in tokens."),
    card_gib: float = typer.Option(24.0, "--card-gib", min=1.0, max=100_000.0, help="--dry-run: GPU memory of the card (an L4 has 24 GB)."),
    overrides: dict | None = None,  # the settings given as flags (cli.flags, from RLConfig's fields)
) -> None:
    """Reinforcement learning over live sandboxed episodes (GRPO or RLOO on the adapter).

    Each round samples --group-size episodes for each of --questions-per-round train questions with
    the current adapter, through the same loop and sandbox as explorer eval, rewards them
    (--reward), and updates the adapter on exactly the tokens it sampled, with a clipped ratio to the
    sampler's probabilities and a KL penalty toward the base. Each round is judged by greedy
    validation episodes. A rerun of the same command resumes where it stopped."""
    from paper_explorer.agent.config import load_config

    given = dict(overrides or {})
    given["corpus"] = str(corpus_path) if corpus_path else None
    if reward_values:
        given["reward"] = _parsed_reward(reward_values)
    config = load_config(RLConfig, config_file, given)
    if dry_run:
        dry_run_report(config, sequence_tokens, card_gib)
        return
    if out is None:
        raise UsageError("explorer rl needs --out, the directory for its rounds (e.g. runs/rl)")
    from paper_explorer.evaluation.run import EvaluationFailed, EvaluationInterrupted
    from paper_explorer.rl.run import reinforce

    again = ["explorer", *sys.argv[1:]]
    corpus = open_corpus(Path(config.corpus) if config.corpus else None, splits=split_of(split_of_values))
    try:
        reinforce(
            config, out=out, corpus=corpus, log=lambda line: typer.echo(visible(line)), reporter=ConsoleReporter(Console(stderr=True))
        )
    except EvaluationInterrupted as stop:  # while a round sampled or validated
        typer.echo(
            f"interrupted: {stop.written} of {stop.total} episodes written to {stop.directory}; resume with: {shlex.join(again)}", err=True
        )
        raise typer.Exit(130) from None
    except EvaluationFailed as failure:  # a round's sampling measured nothing: the policy or its server, not a flag
        typer.echo(error_line(str(failure)), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # while a round's rewards, update or record were made: each is kept whole or not at all
        typer.echo(f"interrupted; every stage finished is kept, the one it was in runs again: resume with: {shlex.join(again)}", err=True)
        raise typer.Exit(130) from None
    print_rl_rounds(console, out)


def _parsed_reward(values: list[str]) -> dict[str, float]:
    weights: dict[str, float] = {}
    for value in values:
        part, equals, weight = value.partition("=")
        part = part.strip()
        if part in weights:
            raise UsageError(f"--reward {value!r}: {part} is weighed twice; give each part once")
        try:
            weights[part] = float(weight)
        except ValueError:
            equals = ""
        if not equals or not part:
            raise UsageError(f"--reward {value!r}: write PART=WEIGHT, e.g. --reward answer_f1=1 --reward direct_submit=-1")
    return weights


def dry_run_report(config: RLConfig, sequence_tokens: int, card_gib: float) -> None:
    """Peak GPU memory of the update (one sequence at a time, plus the base's no-grad reference
    pass) and of an in-process sampler, and a round's time, for ``config.policy.model``."""
    from paper_explorer.rl.update import train_model
    from paper_explorer.sft.memory import estimate, model_shape, tokens_per_second

    model = train_model(config)
    shape, source = model_shape(model)
    steps = config.episode.max_steps
    new_tokens = getattr(config.policy, "max_new_tokens", 512)
    share = min(1.0, steps * new_tokens / sequence_tokens)
    quantization = getattr(config.policy, "quantization", "auto")
    quantized = quantization != "none"
    terms = estimate(shape, sequence_tokens, config.lora_r, config.target_modules, quantized, config.gradient_checkpointing, share)
    kv_gib = shape.layers * shape.kv_heads * shape.head_dim * 2 * 2 * sequence_tokens / 2**30  # bf16 keys and values
    sampler_gib = terms["weights"] + kv_gib + terms["cuda_overhead"]
    table = Table("term", "GiB", title=f"explorer rl, estimated peak GPU memory: {model}, {sequence_tokens} tokens, LoRA r={config.lora_r}")
    for name in ("weights", "lora_and_optimizer", "activations", "logits", "cuda_overhead", "total"):
        table.add_row(f"update: {name}", f"{terms[name]:.2f}")
    table.add_row("sampler in this process (hf): weights + KV cache + overhead", f"{sampler_gib:.2f}")
    console.print(table)
    episodes = config.questions_per_round * config.group_size
    generated = episodes * steps * new_tokens
    trained_tokens = episodes * sequence_tokens  # every episode's sequence read once with gradients and once without (the base)
    speed = tokens_per_second(shape)
    update_minutes = trained_tokens * (1 + (1 / 3 if config.kl_beta else 0)) / speed / 60
    sampling_minutes = generated / L4_HF_DECODE_TOKENS_PER_SECOND / 60
    console.print(
        f"architecture from {source}; {'4-bit NF4' if quantized else '16-bit'} base; the update holds one sequence at a time; "
        f"{share:.0%} of a sequence trained ({steps} actions of {new_tokens} tokens)"
    )
    console.print(
        f"a round: {episodes} episodes ({config.questions_per_round} questions x {config.group_size}), at most {generated:,} tokens sampled, "
        f"{trained_tokens:,} tokens through the update"
    )
    console.print(
        f"time on an L4, estimated: update {update_minutes:.1f} min ({speed:,.0f} tokens/s, 6N FLOPs per token at 30% of 121 TFLOPS"
        f"{', plus the base reference pass' if config.kl_beta else ''}); sampling in-process (hf) up to {sampling_minutes:.0f} min "
        f"at {L4_HF_DECODE_TOKENS_PER_SECOND:.0f} tokens/s - sample on a vLLM server (--policy openai --base-url) for scale"
    )
    peak = max(terms["total"], sampler_gib)
    fits = peak <= card_gib * 1e9 / 2**30
    console.print(
        f"[{'green' if fits else 'bold red'}]{'fits' if fits else 'does NOT fit'} a {card_gib:g} GB card[/] (peak {peak:.1f} GiB)"
    )
    if not fits:
        raise typer.Exit(1)
