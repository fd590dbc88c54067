"""``explorer rl-rerank``: listwise RL of the model as a reranker of search hits (``rl.listwise``
has the arithmetic).

For each train question with gold evidence, BM25 gives its top ``candidates`` paragraphs (over the
papers its episodes search: its own documents, or the shared papers); a paragraph is relevant when
it is gold evidence of any annotator. A question none of whose candidates is relevant teaches
nothing (every ranking scores 0) and is left out, counted. Each step takes the next
``queries_per_step`` questions (wrapping around), scores each candidate with the adapter being
trained - the log-probability of "yes" among yes / no / unknown to the relevance question
(``relevance_prompt``), each option's whole continuation - draws ``samples`` Plackett-Luce rankings,
and takes one AdamW step on the listwise loss. The reference for the KL term is the model training
starts from (the base, or the base with the supervised ``adapter``): its yes / no / unknown
distributions for every question a step will take are computed once, before the first step.

Validation, before the first step and after the last, ranks the first ``validation_queries``
validation questions' candidates by P(yes) (ties in BM25's order) and reports NDCG@k, R@1 and R@5
beside BM25's own order of the same candidates; recall is over the best annotator's gold
paragraphs, as the run's retrieval figures (``evaluation.retrieval``) count it.

OUT holds listwise.json (the settings, written first), steps.jsonl (one line per step),
validation.json and adapter/ (the trained LoRA adapter, written whole at the end). A run is minutes
on a CPU; an interrupted one is started again (``--force``), not resumed.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from pydantic import Field

import paper_explorer.corpus.files as files
import paper_explorer.corpus.jsonl as jsonl
from paper_explorer.agent.config import Config
from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.decisions.prompts import build, load_prompts
from paper_explorer.decisions.schema import NOUL_OPTIONS
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.retrieval import gold_paragraph_sets
from paper_explorer.rl.listwise import listwise_loss, ndcg, option_kl, recall, sample_rankings

RELEVANCE_QUESTION = 'Does this passage help answer the question "{query}"?'


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
    kl_beta: float = Field(0.05, ge=0, le=100, description="Weight of the KL to the reference's yes/no/unknown distributions.")
    lora_r: int = Field(8, ge=1, description="LoRA rank of a new adapter.")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling numerator of a new adapter.")
    validation_queries: int = Field(20, ge=1, description="Validation questions ranked before and after.")
    quantization: str = Field("auto", description="auto (4-bit on CUDA), 4bit or none.")
    threads: int | None = Field(None, ge=1, description="torch's CPU threads (default: half the cores).")
    seed: int = Field(0, description="Seeds the adapter, the order of questions and the rankings drawn.")


@dataclass(frozen=True)
class Query:
    question_id: str
    text: str
    passages: list[str]  # BM25's top candidates, in its order
    relevance: list[float]  # 1.0: gold evidence of some annotator
    gold: int  # the best annotator's gold paragraphs (recall's denominator)


def queries(corpus: Corpus, split: str, candidates: int) -> tuple[list[Query], int]:
    """(the split's questions whose candidates hold gold evidence, how many with gold evidence had none)."""
    index = BM25Index.build(corpus)
    found, missed = [], 0
    for question in corpus.split(split).questions:  # type: ignore[arg-type]
        golds = gold_paragraph_sets(question)
        if not golds:
            continue
        hits = index.scoped(question.paper_id).search(question.text, k=candidates)
        union = set().union(*golds)
        relevance = [1.0 if hit.text in union else 0.0 for hit in hits]
        if not any(relevance):
            missed += 1
            continue
        found.append(Query(question.id, question.text, [hit.text for hit in hits], relevance, max(len(gold) for gold in golds)))
    return found, missed


def relevance_prompt(renderer: Any, query: str, passage: str, context: int) -> tuple[list[int], list[list[int]]]:
    """The typed noul question about one passage, as ``explorer decide`` asks it; the passage cut at
    its end where it would not fit (a paragraph rarely is that long; the prompt says nothing of a cut
    because a ranking of paragraphs is what is learned)."""
    built = build(
        renderer, load_prompts(), "noul", RELEVANCE_QUESTION.format(query=query), passage, list(NOUL_OPTIONS), context=context, cut="end"
    )
    if built.prompt is None:
        raise EvaluationError(f"the relevance question does not fit the context of {context} tokens: {built.overflow}")
    return built.prompt, built.options


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


def candidate_logprobs(model: Any, renderer: Any, query: Query, context: int):
    """(K, options) log-probabilities of yes / no / unknown per candidate."""
    import torch

    rows = []
    for passage in query.passages:
        prompt, options = relevance_prompt(renderer, query.text, passage, context)
        rows.append(option_logprobs(model, prompt, options))
    return torch.stack(rows)


def ranking_figures(order: list[int], query: Query, k: int) -> dict[str, float]:
    ranked = [query.relevance[i] for i in order]
    return {f"ndcg@{k}": ndcg(ranked, k), "recall@1": recall(ranked, 1, query.gold), "recall@5": recall(ranked, 5, query.gold)}


def validate(model: Any, renderer: Any, validation: list[Query], k: int, context: int) -> dict[str, dict[str, float]]:
    """Mean figures of BM25's order and of the reranker's (P(yes), ties in BM25's order)."""
    import torch

    bm25, reranked = [], []
    with torch.no_grad():
        for query in validation:
            yes = candidate_logprobs(model, renderer, query, context)[:, 0].tolist()
            order = sorted(range(len(yes)), key=lambda i: (-yes[i], i))
            bm25.append(ranking_figures(list(range(len(yes))), query, k))
            reranked.append(ranking_figures(order, query, k))
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

    train, missed_train = queries(corpus, "train", config.candidates)
    validation, missed_validation = queries(corpus, "validation", config.candidates)
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
    before = validate(model, renderer, validation, config.ndcg_k, context)
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
        references = {query.question_id: candidate_logprobs(model, renderer, query, context) for batch in schedule for query in batch}
    with jsonl.AppendOnlyLines(out / "steps.jsonl") as steps:
        for step, batch in enumerate(schedule, 1):
            rewards, greedy, kls, losses = [], [], [], []
            for query in batch:
                logprobs = candidate_logprobs(model, renderer, query, context)
                kl = option_kl(logprobs, references[query.question_id])
                scores = logprobs[:, 0]
                rankings = sample_rankings(scores, config.samples, generator)
                loss, drawn, _ = listwise_loss(scores, query.relevance, rankings, config.ndcg_k, config.kl_beta, kl)
                (loss / len(batch)).backward()
                yes = scores.detach().tolist()
                greedy.append(ndcg([query.relevance[i] for i in sorted(range(len(yes)), key=lambda i: (-yes[i], i))], config.ndcg_k))
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
    after = validate(model, renderer, validation, config.ndcg_k, context)
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


__all__ = ["ListwiseConfig", "Query", "candidate_logprobs", "queries", "relevance_prompt", "train_reranker", "validate"]
