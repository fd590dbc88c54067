"""``explorer rl-rerank``: listwise RL of the model as a reranker of search hits (``rl.listwise``
has the arithmetic).

For each train question with gold evidence, BM25 gives its top ``candidates`` paragraphs and the
gold is its annotators' evidence (``decisions.rerank_gold``: the search its episodes run, the best
annotator's NDCG). A question none of whose candidates is gold teaches nothing (every ranking
scores 0) and is left out, counted. Each step takes the next ``queries_per_step`` questions
(wrapping around), scores each candidate with the adapter being trained - the log-probability of
"yes" among yes / no to the reranker's own relevance prompt (``decisions.rerank.relevance_built``,
each option's whole continuation), so the adapter is one ``explorer rerank-serve --adapter``
serves - draws ``samples`` Plackett-Luce rankings, and takes one AdamW step on the listwise loss. The reference for the KL term is the model training
starts from (the base, or the base with the supervised ``adapter``): its yes / no distributions for every question a step will take are computed once, before the first step.

Validation, before the first step and after the last, ranks the first ``validation_queries``
validation questions' candidates by P(yes) (ties in BM25's order, as the reranker orders them) and
reports NDCG@k, R@1 and R@5 beside BM25's own order of the same candidates.

OUT holds listwise.json (the settings, written first), steps.jsonl (one line per step),
validation.json and adapter/ (the trained LoRA adapter, written whole at the end). A run is minutes
on a CPU; an interrupted one is started again (``--force``), not resumed.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from typing import Any

from pydantic import Field

import paper_explorer.corpus.files as files
import paper_explorer.corpus.jsonl as jsonl
from paper_explorer.agent.config import Config
from paper_explorer.corpus import Corpus
from paper_explorer.decisions.rerank import RelevancePrompt, load_relevance_prompt, relevance_built
from paper_explorer.decisions.rerank_gold import Candidates, candidates
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.rl.listwise import listwise_loss, option_kl, sample_rankings
from paper_explorer.tools.reranking import reranked_order


class ListwiseConfig(Config):
    """Listwise RL of a reranker: Plackett-Luce rankings, NDCG@k reward, leave-one-out baseline."""

    model: str = Field(..., description="The model (a directory or hub id) whose LoRA adapter is trained.")
    adapter: str | None = Field(None, description="A supervised LoRA adapter to start from (then the KL reference).")
    corpus: str | None = Field(None, description="The corpus with gold evidence (default: the demo corpus).")
    candidates: int = Field(8, ge=2, le=100, description="BM25 hits reranked per question (K).")
    samples: int = Field(8, ge=2, le=256, description="Plackett-Luce rankings drawn per question (G).")
    ndcg_k: int = Field(5, ge=1, le=100, description="The cut-off of the NDCG reward.")
    steps: int = Field(20, ge=1, le=100_000, description="AdamW steps.")
    queries_per_step: int = Field(4, ge=1, le=1024, description="Train questions per step.")
    learning_rate: float = Field(1e-4, gt=0, le=1, description="AdamW's learning rate.")
    kl_beta: float = Field(0.05, ge=0, le=100, description="Weight of the KL to the reference's yes/no distributions.")
    lora_r: int = Field(8, ge=1, description="LoRA rank of a new adapter.")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling numerator of a new adapter.")
    validation_queries: int = Field(20, ge=1, description="Validation questions ranked before and after.")
    quantization: str = Field("auto", description="auto (4-bit on CUDA), 4bit or none.")
    threads: int | None = Field(None, ge=1, description="torch's CPU threads (default: half the cores).")
    seed: int = Field(0, description="Seeds the adapter, the order of questions and the rankings drawn.")


def questions(corpus: Corpus, split: str, depth: int) -> tuple[list[Candidates], int]:
    """(the split's questions whose candidates hold gold evidence, how many with gold evidence had none)."""
    found = candidates(corpus, list(corpus.split(split).questions), depth)  # type: ignore[arg-type]
    learnable = [question for question in found if question.learnable]
    return learnable, len(found) - len(learnable)


def option_logprobs(model: Any, prompt: list[int], options: list[list[int]]):
    """log P(option) normalised over the options for one prompt (differentiable): one forward pass
    of the options' sequences, right-padded, the logits kept only where option tokens are read."""
    import torch

    width = max(map(len, options))
    rows = torch.zeros((len(options), len(prompt) + width), dtype=torch.long)
    for row, option in enumerate(options):
        rows[row, : len(prompt) + len(option)] = torch.tensor(prompt + option)
    device = next(model.parameters()).device
    logits = model(input_ids=rows.to(device), use_cache=False, logits_to_keep=width + 1).logits  # positions len(prompt)-1 ...
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    totals = []
    for row, option in enumerate(options):
        target = torch.tensor(option, device=logprobs.device)
        totals.append(logprobs[row, torch.arange(len(option), device=logprobs.device), target].sum())
    return torch.log_softmax(torch.stack(totals), dim=0)


def candidate_logprobs(model: Any, renderer: Any, prompt: RelevancePrompt, question: Candidates, context: int):
    """(K, 2) log-probabilities of yes / no per candidate."""
    import torch

    rows = []
    for passage in question.passages:
        built = relevance_built(renderer, context, prompt, question.query, passage)
        assert built.prompt is not None
        rows.append(option_logprobs(model, built.prompt, built.options))
    return torch.stack(rows)


def ranking_figures(order: list[int], question: Candidates, k: int) -> dict[str, float]:
    return {f"ndcg@{k}": question.reward(order, k), "recall@1": question.recall(order, 1), "recall@5": question.recall(order, 5)}


def validate(
    model: Any, renderer: Any, prompt: RelevancePrompt, validation: list[Candidates], k: int, context: int
) -> dict[str, dict[str, float]]:
    """Mean figures of BM25's order and of the reranker's (P(yes), ties in BM25's order)."""
    import torch

    bm25, reranked = [], []
    with torch.no_grad():
        for question in validation:
            yes = candidate_logprobs(model, renderer, prompt, question, context)[:, 0].tolist()
            bm25.append(ranking_figures(list(range(len(yes))), question, k))
            reranked.append(ranking_figures(reranked_order(yes), question, k))
    mean = lambda rows: {name: fmean(row[name] for row in rows) for name in rows[0]}  # noqa: E731
    return {"questions": {"count": float(len(validation))}, "bm25": mean(bm25), "reranked": mean(reranked)}


def train_reranker(
    config: ListwiseConfig, corpus: Corpus, out: Path, *, force: bool = False, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train, validate before and after, write OUT; returns validation.json's content."""
    from paper_explorer.agent.policies import require_llm_extra
    from paper_explorer.sft.known_warnings import known_warnings_silenced

    require_llm_extra()
    with known_warnings_silenced():
        return _train(config, corpus, out, force=force, log=log)


def _train(config: ListwiseConfig, corpus: Corpus, out: Path, *, force: bool, log: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from paper_explorer.agent.models import load_causal_lm, load_renderer, resolve_model
    from paper_explorer.agent.policies.hf import model_context
    from paper_explorer.sft.model import made_trainable, with_new_adapter

    train, missed_train = questions(corpus, "train", config.candidates)
    validation, missed_validation = questions(corpus, "validation", config.candidates)
    validation = validation[: config.validation_queries]
    if not train or not validation:
        raise EvaluationError(
            f"the corpus has {len(train)} train and {len(validation)} validation questions whose top {config.candidates} BM25 hits hold gold "
            "evidence; listwise training needs both (raise --candidates, or give a corpus with evidence)"
        )
    _prepare(out, force)
    (out / "listwise.json").write_text(json.dumps({"config": config.model_dump(mode="json"), "train_questions": len(train),
        "train_without_gold_in_candidates": missed_train, "validation_questions": len(validation),
        "validation_without_gold_in_candidates": missed_validation}, indent=2))  # fmt: skip
    renderer = load_renderer(resolve_model(config.model))
    prompt = load_relevance_prompt()
    loaded = load_causal_lm(config.model, config.quantization, threads=config.threads)
    torch.manual_seed(config.seed)
    model = made_trainable(loaded.model, loaded.quantization == "4bit", False)
    if config.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, config.adapter, is_trainable=True)
    else:
        model = with_new_adapter(model, config.lora_r, config.lora_alpha, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj"])
    context = model_context(model)
    model.eval()  # no dropout: the scores that draw a ranking are the ones differentiated
    before = validate(model, renderer, prompt, validation, config.ndcg_k, context)
    log(
        f"before: BM25 ndcg@{config.ndcg_k} {before['bm25'][f'ndcg@{config.ndcg_k}']:.3f}, reranked {before['reranked'][f'ndcg@{config.ndcg_k}']:.3f}"
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    generator = torch.Generator().manual_seed(config.seed)
    order = list(range(len(train)))
    random.Random(config.seed).shuffle(order)
    schedule = [
        [train[order[(step * config.queries_per_step + i) % len(order)]] for i in range(config.queries_per_step)]
        for step in range(config.steps)
    ]
    with torch.no_grad():
        references = {
            id(question): candidate_logprobs(model, renderer, prompt, question, context) for batch in schedule for question in batch
        }
    with jsonl.AppendOnlyLines(out / "steps.jsonl") as steps:
        for step, batch in enumerate(schedule, 1):
            rewards, greedy, kls, losses = [], [], [], []
            for question in batch:
                logprobs = candidate_logprobs(model, renderer, prompt, question, context)
                kl = option_kl(logprobs, references[id(question)])
                scores = logprobs[:, 0]
                rankings = sample_rankings(scores, config.samples, generator)
                drawn = [question.reward(ranking.tolist(), config.ndcg_k) for ranking in rankings]
                loss, _ = listwise_loss(scores, drawn, rankings, config.kl_beta, kl)
                (loss / len(batch)).backward()
                greedy.append(question.reward(reranked_order(scores.detach().tolist()), config.ndcg_k))
                rewards.append(fmean(drawn))
                kls.append(float(kl.detach()))
                losses.append(float(loss.detach()))
            grad_norm = float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            figures = {
                "step": step,
                "loss": fmean(losses),
                "reward": fmean(rewards),
                "greedy_ndcg": fmean(greedy),
                "kl": fmean(kls),
                "grad_norm": grad_norm,
            }
            steps.append(figures)
            log(
                f"step {step}: reward {figures['reward']:.3f}, greedy ndcg@{config.ndcg_k} {figures['greedy_ndcg']:.3f}, kl {figures['kl']:.4f}"
            )
    after = validate(model, renderer, prompt, validation, config.ndcg_k, context)
    log(
        f"after: BM25 ndcg@{config.ndcg_k} {after['bm25'][f'ndcg@{config.ndcg_k}']:.3f}, reranked {after['reranked'][f'ndcg@{config.ndcg_k}']:.3f}"
    )
    _save_adapter(model, out / "adapter")
    result = {"before": before, "after": after}
    with files.atomic_file(out / "validation.json") as handle:
        handle.write(json.dumps(result, indent=2))
    return result


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise EvaluationError(f"{out}: not empty; pass --force to train again there, or choose another --out")
        if not (out / "listwise.json").exists():
            raise EvaluationError(f"{out}: --force replaces only an rl-rerank run, and this directory holds something else")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _save_adapter(model: Any, target: Path) -> None:
    """The adapter whole or not at all: saved beside, then renamed."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    partial.rename(target)


__all__ = ["ListwiseConfig", "candidate_logprobs", "questions", "train_reranker", "validate"]
