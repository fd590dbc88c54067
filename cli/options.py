"""What several commands share: the corpus, policy and episode options, and the helpers that read them.

Commands import this module, never each other.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from agent.policies import POLICY_NAMES
from agent.trajectory import EpisodeConfig
from cli.errors import UsageError
from corpus import Corpus, DemoConfig, generate, load
from corpus.loading import with_questions

log = logging.getLogger(__name__)

CORPUS_HELP = "Corpus file or directory (QASPER v0.3 JSON, Hugging Face qasper rows, or explorer JSONL). Default: the bundled demo corpus."
CorpusOption = typer.Option(None, "--corpus", "-c", envvar="EXPLORER_CORPUS", help=CORPUS_HELP)
QuestionsOption = typer.Option(None, "--questions", help="JSONL of questions that replaces the corpus's own.")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def open_corpus(path: Optional[Path], questions: Optional[Path] = None) -> Corpus:
    """The named corpus, or the demo corpus when none is named; load warnings go to stderr."""
    corpus = generate(DemoConfig()) if path is None else load(path, questions)
    if path is None and questions is not None:
        corpus = with_questions(corpus, questions)
    counts = corpus.warning_counts()
    if counts:
        shown = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
        log.warning("%d load warnings (%s); first: %s", len(corpus.warnings), shown, corpus.warnings[0])
    return corpus


PolicyOption = typer.Option("scripted", "--policy", "-p", help=f"One of: {', '.join(POLICY_NAMES)}.")
MaxStepsOption = typer.Option(10, "--max-steps", min=1, help="Actions before the episode ends with step_limit.")
ReplayOption = typer.Option(None, "--replay", help="Trajectories whose actions --policy replay re-runs.")
SeedOption = typer.Option(0, "--seed", help="Seed passed to the policy (every built-in policy is deterministic given it).")
ModelOption = typer.Option(None, "--model", "-m", help="hf: model directory or hub id; openai: the served model's name.")
AdapterOption = typer.Option(None, "--adapter", help="hf: a LoRA adapter directory to load on the model.")
QuantizationOption = typer.Option("auto", "--quantization", help="hf: auto (4bit on CUDA, none on CPU), 4bit (NF4, double quantization) or none.")
MaxNewTokensOption = typer.Option(512, "--max-new-tokens", min=1, help="hf/openai: tokens per action before it is cut (recorded as hit_cap).")
MaxContextOption = typer.Option(32_768, "--max-context", min=256, help="hf/openai: prompt plus new tokens allowed, else context_limit.")
BaseUrlOption = typer.Option(None, "--base-url", help="openai: the server, e.g. http://localhost:8000/v1.")
TokenizerOption = typer.Option(None, "--tokenizer", help="openai: directory with the served model's tokenizer.json.")
PromptFormatOption = typer.Option("ids", "--prompt-format", help="openai: ids (token ids, vLLM) or text (servers that take only text).")
TimeoutOption = typer.Option(120.0, "--timeout", min=1, help="openai: seconds per request.")
RetriesOption = typer.Option(4, "--retries", min=0, help="openai: retries with backoff on 429/5xx and network errors.")


def episode_config(max_steps: int, seed: int) -> EpisodeConfig:
    return EpisodeConfig(max_steps=max_steps, seed=seed)


SPLITS = ("train", "validation", "test", "all")

def select_questions(corpus, split: str, limit: int | None, recorded: list[str] | None = None) -> list:
    """The questions a run asks, in corpus order: a split, those a replay recording holds, the first N."""
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    questions = list((corpus if split == "all" else corpus.split(split)).questions)
    if recorded is not None:
        wanted = set(recorded)
        questions = [q for q in questions if q.id in wanted]
    if limit is not None:
        questions = questions[:limit]
    if not questions:
        raise UsageError(f"no questions to run in split {split!r}; choose another --split or --questions file")
    return questions
