"""``explorer run`` (one episode, shown live) and ``explorer show`` (an episode from a log)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from agent.config import RunConfig, load_config
from agent.policies import make_policy
from agent.runner import EpisodeRunner
from agent.writer import TrajectoryLog, read_trajectories
from cli.display import print_episode, print_outcome, print_question, print_step
from cli.errors import UsageError
from cli.options import (
    AdapterOption,
    BaseUrlOption,
    ConfigOption,
    ContextCharsOption,
    CorpusOption,
    CpuSecondsOption,
    MaxContextOption,
    MaxNewTokensOption,
    MaxStepsOption,
    MemoryMbOption,
    ModelOption,
    ObservationCharsOption,
    OutputCharsOption,
    PolicyOption,
    PromptFormatOption,
    QuantizationOption,
    RecordPromptIdsOption,
    ReplayOption,
    RetriesOption,
    SeedOption,
    ThinkingBudgetOption,
    ThinkingOption,
    TimeoutOption,
    TokenizerOption,
    WallSecondsOption,
    episode_overrides,
    freeze_loaded_state,
    open_corpus,
    policy_overrides,
)
from corpus import BM25Index, Corpus
from corpus.schema import Question

console = Console()

def demo_question(corpus: Corpus) -> Question:
    """The first answerable question of the test split (else of the corpus): what a bare ``run`` shows."""
    if not corpus.questions:
        raise UsageError("the corpus has no questions; pass --question TEXT")
    test_papers = {paper.id for paper in corpus.papers if paper.split == "test"}
    answerable = [q for q in corpus.questions if q.answerable]
    pools = ([q for q in answerable if q.paper_id in test_papers], answerable, list(corpus.questions))
    return next(pool[0] for pool in pools if pool)


def find_question(corpus: Corpus, question_id: str) -> Question:
    for question in corpus.questions:
        if question.id == question_id:
            return question
    from tools.paper_tools import _closest

    close = _closest(question_id, [q.id for q in corpus.questions])
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    raise UsageError(f"no question {question_id!r} in the corpus{hint}")


def run_command(
    question_text: Optional[str] = typer.Option(None, "--question", "-q", help="A question of your own (no gold answer)."),
    question_id: Optional[str] = typer.Option(None, "--question-id", help="A question of the corpus, by id."),
    corpus_path: Optional[Path] = CorpusOption,
    config_file: Optional[Path] = ConfigOption,
    policy_name: Optional[str] = PolicyOption,
    max_steps: Optional[int] = MaxStepsOption,
    seed: Optional[int] = SeedOption,
    replay: Optional[Path] = ReplayOption,
    model: Optional[str] = ModelOption,
    adapter: Optional[Path] = AdapterOption,
    quantization: Optional[str] = QuantizationOption,
    max_new_tokens: Optional[int] = MaxNewTokensOption,
    max_context: Optional[int] = MaxContextOption,
    base_url: Optional[str] = BaseUrlOption,
    tokenizer: Optional[Path] = TokenizerOption,
    prompt_format: Optional[str] = PromptFormatOption,
    timeout: Optional[float] = TimeoutOption,
    retries: Optional[int] = RetriesOption,
    thinking: Optional[bool] = ThinkingOption,
    thinking_budget: Optional[int] = ThinkingBudgetOption,
    record_prompt_ids: Optional[bool] = RecordPromptIdsOption,
    observation_chars: Optional[int] = ObservationCharsOption,
    context_chars: Optional[int] = ContextCharsOption,
    wall_seconds: Optional[float] = WallSecondsOption,
    cpu_seconds: Optional[int] = CpuSecondsOption,
    memory_mb: Optional[int] = MemoryMbOption,
    output_chars: Optional[int] = OutputCharsOption,
    out: Path = typer.Option(Path("runs"), "--out", "-o", help="Directory whose trajectories.jsonl the episode is appended to."),
) -> None:
    """Run one episode and show each step live: the code, the tools it called, what it observed."""
    if question_text is not None and question_id is not None:
        raise UsageError("pass --question or --question-id, not both")
    if question_text is not None and not question_text.strip():
        raise UsageError("--question is empty; write the question to ask")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file; --out names a directory")
    overrides = policy_overrides(
        name=policy_name, replay=replay, model=model, adapter=adapter, quantization=quantization, max_new_tokens=max_new_tokens,
        max_context=max_context, base_url=base_url, tokenizer=tokenizer, prompt_format=prompt_format, timeout=timeout, retries=retries,
        thinking=thinking, thinking_budget=thinking_budget,
    ) | episode_overrides(
        max_steps=max_steps, seed=seed, observation_chars=observation_chars, context_chars=context_chars,
        wall_seconds=wall_seconds, cpu_seconds=cpu_seconds, memory_mb=memory_mb, output_chars=output_chars,
        record_prompt_ids=record_prompt_ids,
    )
    config = load_config(RunConfig, config_file, overrides)
    policy = make_policy(config.policy, config.episode.max_steps)
    note = policy.preflight()
    if note:
        typer.echo(f"note: {note}", err=True)
    corpus = open_corpus(corpus_path)
    question = None
    if question_id is not None:
        question = find_question(corpus, question_id)
    elif question_text is None:
        question = demo_question(corpus)
    text = question.text if question else question_text.strip()
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), policy, config.episode)
    freeze_loaded_state()
    print_question(console, text, question.id if question else None, policy.name)
    trajectory = runner.run(text, question, on_step=lambda step: print_step(console, step))
    with TrajectoryLog(out / "trajectories.jsonl") as log:
        log.append(trajectory)
    print_outcome(console, trajectory, written_to=out / "trajectories.jsonl")
    if question is not None:
        gold = "; ".join(a.reference_text for a in question.answers if a.reference_text) or "(none)"
        console.print(f"[dim]gold answer: {gold}[/dim]")


def show_command(
    trajectories: Path = typer.Argument(..., help="A trajectories .jsonl file (from run or eval)."),
    episode: Optional[str] = typer.Option(None, "--episode", "-e", help="Episode id (or question id) to show."),
) -> None:
    """Print an episode the way `run` showed it; without --episode, list the file's episodes."""
    found = read_trajectories(trajectories)
    if not found:
        raise UsageError(f"{trajectories}: holds no episodes")
    if episode is None and len(found) > 1:
        table = Table("episode", "question", "status", "steps", "answer")
        for item in found:
            table.add_row(item.episode_id, item.question[:60], item.outcome.status, str(len(item.steps)), (item.outcome.answer or "")[:30])
        console.print(table)
        console.print(f"[dim]{len(found)} episodes; show one with --episode ID[/dim]")
        return
    if episode is not None:
        matches = [t for t in found if episode in (t.episode_id, t.question_id)]
        if not matches:
            raise UsageError(f"{trajectories}: no episode {episode!r}; run without --episode to list them")
        chosen = matches[-1]
        if len(matches) > 1:
            console.print(f"[dim]{len(matches)} episodes match {episode!r}; showing the latest[/dim]")
    else:
        chosen = found[0]
    print_episode(console, chosen)
