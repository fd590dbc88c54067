"""What several commands share: the corpus, policy and episode options, and the helpers that read them.

Commands import this module, never each other.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Optional

import typer

from agent.config import POLICY_NAMES, SPLITS
from cli.errors import UsageError
from corpus import Corpus, DemoConfig, generate, load
from corpus.loading import with_questions
from corpus.splits import parse_shard, shard_of

log = logging.getLogger(__name__)

CORPUS_HELP = "Corpus file or directory (QASPER v0.3 JSON, Hugging Face qasper rows, or explorer JSONL). Default: the bundled demo corpus."
CorpusOption = typer.Option(None, "--corpus", "-c", envvar="EXPLORER_CORPUS", help=CORPUS_HELP)
QuestionsOption = typer.Option(None, "--questions", help="JSONL of questions that replaces the corpus's own.")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
SplitOfOption = typer.Option(None, "--split-of", help="FILE=SPLIT: the split of a corpus file's papers when its name does not say "
                             "(QASPER's qasper-{train,dev,test}-v0.3.json and Hugging Face's train/validation/test files do). Repeatable.")


def split_of(values: Optional[list[str]]) -> Optional[dict[str, str]]:
    """--split-of FILE=SPLIT values as {resolved file: split}; None when none were given."""
    from corpus.splits import parse_split_of

    return parse_split_of(values) if values else None


def open_corpus(path: Optional[Path], questions: Optional[Path] = None, splits: Optional[dict[str, str]] = None) -> Corpus:
    """The named corpus, or the demo corpus when none is named; load warnings go to stderr."""
    if path is None and splits:
        raise UsageError("--split-of names files of a --corpus; the demo corpus has its own splits")
    corpus = generate(DemoConfig()) if path is None else load(path, questions, splits)
    if path is None and questions is not None:
        corpus = with_questions(corpus, questions)
    counts = corpus.warning_counts()
    if counts:
        shown = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
        log.warning("%d load warnings (%s); first: %s", len(corpus.warnings), shown, corpus.warnings[0])
    return corpus


# Run and eval flags default to None, so that only the flags a user gives override the config
# (a --config file, or on --resume the run's manifest); the defaults are agent.config's.
ConfigOption = typer.Option(None, "--config", help="TOML with any field of the run's config, in its policy and episode tables too; flags win.")
PolicyOption = typer.Option(None, "--policy", "-p", help=f"One of: {', '.join(POLICY_NAMES)} (default scripted).")
MaxStepsOption = typer.Option(None, "--max-steps", min=1, help="Actions before the episode ends with step_limit (default 10).")
ReplayOption = typer.Option(None, "--replay", help="Trajectories whose actions --policy replay re-runs.")
SeedOption = typer.Option(None, "--seed", help="Seed passed to the policy (every built-in policy is deterministic given it; default 0).")
ModelOption = typer.Option(None, "--model", "-m", help="hf: model directory or hub id; openai: the served model's name.")
AdapterOption = typer.Option(None, "--adapter", help="hf: a LoRA adapter directory to load on the model; openai (eval): loaded into the vLLM server at runtime under a name of the run's, sampled, unloaded at the end.")
QuantizationOption = typer.Option(None, "--quantization", help="hf: auto (4bit on CUDA, none on CPU; the default), 4bit (NF4, double quantization) or none.")
MaxNewTokensOption = typer.Option(None, "--max-new-tokens", min=1, help="hf/openai: tokens per action before it is cut (recorded as hit_cap; default 512).")
MaxContextOption = typer.Option(None, "--max-context", min=256, help="hf/openai: prompt plus new tokens allowed, else context_limit (default: the server's max_model_len for openai, else 32768; above the server's, refused).")
BaseUrlOption = typer.Option(None, "--base-url", help="openai: the server, e.g. http://localhost:8000/v1; repeat it for replicas of one model (each request goes to the least busy).")
TokenizerOption = typer.Option(None, "--tokenizer", help="openai: directory with the served model's tokenizer.json; other policies: record the prompts it would serve.")
ApiOption = typer.Option(None, "--api", help="openai: completions (our renderer's prompt; the default) or chat (messages to /v1/chat/completions: a teacher).")
TemperatureOption = typer.Option(None, "--temperature", min=0.0, max=10.0, help="hf/openai: sampling temperature (default 0: greedy).")
TopPOption = typer.Option(None, "--top-p", min=0.0, max=1.0, help="hf/openai: nucleus sampling (default 1: off).")
TopKOption = typer.Option(None, "--top-k", min=0, help="hf/openai: sample among the k likeliest tokens (default 0: off).")
ThinkingOption = typer.Option(None, "--thinking/--no-thinking", help="hf/openai: Qwen3 thinking mode; the think blocks are kept (default off).")
ThinkingBudgetOption = typer.Option(None, "--thinking-budget", min=1, help="hf/openai: tokens a think block may take (default 1024; hitting it is recorded).")
RecordPromptIdsOption = typer.Option(None, "--record-prompt-ids/--no-record-prompt-ids", help="Keep each served prompt's ids in the trajectory, not only their digest (default off).")
PromptFormatOption = typer.Option(None, "--prompt-format", help="openai: ids (token ids, vLLM; the default) or text (servers that take only text).")
TimeoutOption = typer.Option(None, "--timeout", min=1, help="openai: seconds per request (default 120).")
RetriesOption = typer.Option(None, "--retries", min=0, help="openai: retries with backoff on 429/5xx and network errors (default 4).")
ObservationCharsOption = typer.Option(None, "--observation-chars", min=200, help="An observation longer than this is cut, and says so (default 4000).")
ContextCharsOption = typer.Option(None, "--context-chars", min=1000, help="A conversation longer than this ends with context_limit (default 100000).")
WallSecondsOption = typer.Option(None, "--wall-seconds", min=0.1, help="Sandbox: wall-clock limit per action (default 10).")
CpuSecondsOption = typer.Option(None, "--cpu-seconds", min=1, help="Sandbox: CPU-time limit per action, the worker's and the host's for its tool calls (default 10).")
HostSecondsOption = typer.Option(None, "--host-seconds", min=0.01, help="Sandbox: time the host may spend serving one action's tool calls (default 5).")
MemoryMbOption = typer.Option(None, "--memory-mb", min=64, help="Sandbox: memory an action may add, in MiB (default 2048).")
OutputCharsOption = typer.Option(None, "--output-chars", min=100, help="Sandbox: printed characters per action (default 20000).")


def policy_overrides(*, name, replay, model, adapter, quantization, max_new_tokens, max_context, base_url, tokenizer,
                     prompt_format, timeout, retries, thinking, thinking_budget, api=None, temperature=None, top_p=None,
                     top_k=None) -> dict:
    """The policy flags a user gave, as ``policy.FIELD`` overrides of a config."""
    given = dict(name=name, replay=replay, model=model, adapter=adapter, quantization=quantization, max_new_tokens=max_new_tokens,
                 max_context=max_context, base_url=list(base_url) or None if base_url is not None else None, tokenizer=tokenizer, prompt_format=prompt_format, timeout=timeout,
                 retries=retries, thinking=thinking, thinking_budget=thinking_budget, api=api, temperature=temperature,
                 top_p=top_p, top_k=top_k)
    return {f"policy.{key}": value for key, value in given.items()}


def episode_overrides(*, max_steps, seed, observation_chars, context_chars, wall_seconds, cpu_seconds, memory_mb,
                      output_chars, record_prompt_ids, host_seconds=None) -> dict:
    """The episode and sandbox flags a user gave, as ``episode.FIELD`` overrides of a config."""
    given = dict(max_steps=max_steps, seed=seed, observation_chars=observation_chars, context_chars=context_chars,
                 wall_seconds=wall_seconds, cpu_seconds=cpu_seconds, host_seconds=host_seconds, memory_mb=memory_mb,
                 output_chars=output_chars, record_prompt_ids=record_prompt_ids)
    return {f"episode.{key}": value for key, value in given.items()}


def freeze_loaded_state() -> None:
    """The corpus and index live as long as the command: freezing them keeps the host's garbage
    collections, which run during tool calls, from walking them again and again."""
    gc.freeze()


def resolve_split(corpus, split: str | None, default: str) -> str:
    """The split a command runs: the one given, else ``default`` - or all questions, said on
    stderr, when no paper of the corpus says which split it belongs to."""
    has_splits = any(paper.split is not None for paper in corpus.papers)
    if split is None:
        if has_splits:
            return default
        typer.echo(f"note: no paper of the corpus says which split it belongs to, so all {len(corpus.questions)} questions "
                   "are used; state splits with --split-of FILE=SPLIT (QASPER's official file names need none)", err=True)
        return "all"
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if split != "all" and not has_splits:
        raise UsageError(f"--split {split}: no paper of the corpus says which split it belongs to; use --split all, or state "
                         "splits with --split-of FILE=SPLIT (QASPER's official qasper-{train,dev,test}-v0.3.json names need none)")
    unsplit = sum(1 for paper in corpus.papers if paper.split is None)
    if split != "all" and unsplit:
        typer.echo(f"note: {unsplit} papers of the corpus say no split, so their questions are in no split's; "
                   "state theirs with --split-of FILE=SPLIT", err=True)
    return split


def select_questions(corpus, split: str | None, limit: int | None, recorded: list[str] | None = None, default: str = "test",
                     shard: str | None = None) -> list:
    """The questions a run asks, in corpus order: a split (``resolve_split``), those a replay
    recording holds, the first N, then those of one shard (``I/N``)."""
    split = resolve_split(corpus, split, default)
    questions = list((corpus if split == "all" else corpus.split(split)).questions)
    if recorded is not None:
        wanted = set(recorded)
        questions = [q for q in questions if q.id in wanted]
    if limit is not None:
        questions = questions[:limit]
    if shard is not None and questions:
        index, count = parse_shard(shard)
        selected = len(questions)
        questions = [q for q in questions if shard_of(q.id, count) == index]
        if not questions:
            raise UsageError(f"shard {shard} holds none of the {selected} questions selected; use fewer shards")
    if not questions:
        raise UsageError(f"no questions to run in split {split!r}; choose another --split or --questions file")
    return questions
