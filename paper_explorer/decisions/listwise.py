"""Listwise reinforcement learning of the reranker: Plackett-Luce rankings sampled from its scores,
NDCG@5 as the reward, a leave-one-out baseline, and a KL penalty toward the model it started from.

The reranker's score of a passage is its log-odds of "yes" against "no" (``rerank.py``: P(yes) is
their sigmoid, so sorting by it is sorting by P(yes)). For one query and its K BM25 candidates:

1. the scores ``s`` with gradients (the model with its LoRA adapter) and ``s_ref`` without (the
   adapter disabled: the supervised model it started from);
2. G rankings drawn from the Plackett-Luce distribution of ``s`` (Gumbel-perturbed scores sorted:
   ``sample_rankings``), each with its log-probability ``log PL(pi; s)`` (``plackett_luce_logprob``);
3. each ranking's reward, NDCG@5 against the question's gold evidence, and its advantage, the
   reward less the mean of the other G - 1 rewards (``rl.advantages``' rloo);
4. the loss ``mean_g(-A_g * log PL(pi_g; s) + beta * k3_g)``, where ``k3 = exp(d) - d - 1`` and
   ``d = log PL(pi_g; s_ref) - log PL(pi_g; s)``: the k3 estimate of KL(PL(s) || PL(s_ref)) on the
   rankings drawn, as ``explorer rl``'s per-token KL (``rl.loss``).

The rankings are drawn from the weights being trained, for one step, so no importance ratio or
clipping is needed (REINFORCE with a leave-one-out baseline). A query whose K candidates hold no
gold paragraph rewards every ranking 0 and teaches nothing: such questions are left out, and counted.

``train_listwise`` runs ``steps`` AdamW steps over a new LoRA adapter and writes it (``--adapter``
of ``explorer rerank-serve`` loads it) with one line of figures per step; greedy NDCG@5 of the
held-out questions before and after says whether it helped.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from paper_explorer.decisions.rerank import Reranker
from paper_explorer.rl.advantages import group_advantages

if TYPE_CHECKING:
    import torch

    from paper_explorer.corpus import Corpus
    from paper_explorer.corpus.schema import Question

ADAPTER = "adapter"
FIGURES = "steps.jsonl"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class Candidates:
    """One question: its query, BM25's top K paragraph texts in BM25 order, and its gold evidence
    (evaluation/retrieval.py's: one set of paragraph texts per annotator who gave text evidence)."""

    query: str
    passages: list[str]
    golds: list[set[str]]

    def reward(self, order: list[int]) -> float:
        """NDCG@5 of the passages in ``order`` (the best annotator's, as retrieval metrics take it)."""
        return ndcg([self.passages[i] for i in order], self.golds)

    @property
    def learnable(self) -> bool:
        """Some gold paragraph is among the candidates (else every ranking's reward is 0)."""
        return any(text in gold for gold in self.golds for text in self.passages)


def candidates(corpus: Corpus, questions: list[Question], depth: int) -> list[Candidates]:
    """Each question with gold evidence, with the top ``depth`` paragraphs its episode's search finds
    for its text (``BM25Index.scoped``: a question's own documents alone, else the shared papers)."""
    from paper_explorer.corpus import BM25Index
    from paper_explorer.evaluation.retrieval import gold_paragraph_sets

    index = BM25Index.cached(corpus)
    found = []
    for question in questions:
        golds = gold_paragraph_sets(question)
        if golds:
            hits = index.scoped(question.paper_id).search(question.text, k=depth)
            found.append(Candidates(question.text, [hit.text for hit in hits], golds))
    return found


@dataclass(frozen=True)
class ListwiseSettings:
    steps: int = 20
    queries_per_step: int = 2
    samples: int = 8  # G: rankings drawn per query
    beta: float = 0.05  # weight of the KL penalty toward the starting model
    learning_rate: float = 1e-4
    lora_r: int = 8
    lora_alpha: int = 16
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    seed: int = 0


def ndcg(ranked: list[str], golds: list[set[str]], k: int = 5) -> float:
    """NDCG@k of paragraph texts in ranked order, binary gains (DCG over that of every gold paragraph
    first); with several annotators, the best one's."""

    def one(gold: set[str]) -> float:
        dcg = sum(1 / math.log2(rank + 1) for rank, text in enumerate(ranked[:k], 1) if text in gold)
        return dcg / sum(1 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))

    return max(one(gold) for gold in golds)


def plackett_luce_logprob(scores: torch.Tensor, ranking: torch.Tensor) -> torch.Tensor:
    """log PL(ranking; scores) = sum_i [s(pi_i) - logsumexp(s(pi_i), ..., s(pi_K))]."""
    import torch

    ordered = scores[ranking]
    tails = torch.logcumsumexp(ordered.flip(0), dim=0).flip(0)
    return (ordered - tails).sum()


def sample_rankings(scores: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` rankings drawn from PL(scores): sorting scores plus Gumbel noise draws one exactly."""
    import torch

    uniform = torch.rand((count, scores.shape[0]), generator=generator, dtype=torch.float64).clamp_min(1e-12)
    gumbel = -torch.log(-torch.log(uniform))
    return torch.argsort(scores.detach().double().unsqueeze(0) + gumbel, dim=1, descending=True)


def relevance_scores(reranker: Reranker, query: str, passages: list[str]) -> torch.Tensor:
    """Each passage's log-odds of "yes" against "no", with gradients: one forward pass per passage
    over its prompt and both options (right-padded; causal attention never sees the padding)."""
    import torch

    model, device = reranker.backend.scorer.model, reranker.backend.scorer.device  # type: ignore[attr-defined]
    scores = []
    for passage in passages:
        built = reranker.built(query, passage)
        assert built.prompt is not None
        rows = [built.prompt + option for option in built.options]
        width = max(map(len, rows))
        ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for row, tokens in enumerate(rows):
            ids[row, : len(tokens)] = torch.tensor(tokens, device=device)
        logprobs = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float(), dim=-1)
        totals = []
        for row, option in enumerate(built.options):
            start = len(built.prompt)
            positions = torch.arange(start - 1, start - 1 + len(option), device=device)
            totals.append(logprobs[row, positions, torch.tensor(option, device=device)].sum())
        scores.append(totals[0] - totals[1])
    return torch.stack(scores)


def greedy_ndcg(reranker: Reranker, questions: list[Candidates]) -> float:
    """NDCG@5 of the reranker's own order (P(yes), ties by BM25), over ``questions``."""
    from paper_explorer.tools.reranking import reranked_order

    values = []
    for question in questions:
        judged = reranker.judge(question.query, question.passages)
        values.append(question.reward(reranked_order([item.relevance for item in judged])))
    return fmean(values) if values else 0.0


def train_listwise(
    reranker: Reranker, train: list[Candidates], held_out: list[Candidates], settings: ListwiseSettings, out: Path
) -> dict[str, Any]:
    """Train a new LoRA adapter on ``reranker``'s model; write it, the figures of every step and a summary to ``out``."""
    import torch

    from paper_explorer.sft.model import with_new_adapter

    useful = [question for question in train if question.learnable]
    if not useful:
        raise ValueError("no training question has a gold paragraph among its candidates: nothing to learn from")
    torch.manual_seed(settings.seed)
    scorer = reranker.backend.scorer  # type: ignore[attr-defined]
    before = greedy_ndcg(reranker, held_out)
    model = with_new_adapter(scorer.model, settings.lora_r, settings.lora_alpha, 0.0, settings.target_modules)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    generator = torch.Generator().manual_seed(settings.seed)
    order = random.Random(settings.seed)
    out.mkdir(parents=True, exist_ok=True)
    with (out / FIGURES).open("w") as log:
        for step in range(settings.steps):
            batch = order.sample(useful, min(settings.queries_per_step, len(useful)))
            losses, rewards, kls = [], [], []
            model.train()
            for question in batch:
                scores = relevance_scores(reranker, question.query, question.passages)
                with torch.no_grad(), model.disable_adapter():
                    reference = relevance_scores(reranker, question.query, question.passages)
                rankings = sample_rankings(scores, settings.samples, generator)
                drawn = [question.reward(ranking.tolist()) for ranking in rankings]
                advantages = group_advantages(drawn, "rloo")
                logps = torch.stack([plackett_luce_logprob(scores, ranking) for ranking in rankings])
                reference_logps = torch.stack([plackett_luce_logprob(reference, ranking) for ranking in rankings])
                difference = reference_logps - logps
                kl = torch.exp(difference) - difference - 1
                losses.append((-torch.tensor(advantages) * logps + settings.beta * kl).mean())
                rewards.append(fmean(drawn))
                kls.append(float(kl.detach().mean()))
            loss = torch.stack(losses).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.eval()
            log.write(json.dumps({"step": step + 1, "loss": float(loss.detach()), "mean_reward": fmean(rewards), "kl": fmean(kls)}) + "\n")
    scorer.forget()  # the cache was computed with the weights before the last step
    after = greedy_ndcg(reranker, held_out)
    model.save_pretrained(str(out / ADAPTER))
    summary = {
        "settings": asdict(settings),
        "train_questions": len(train),
        "without_gold_in_candidates": len(train) - len(useful),
        "held_out_questions": len(held_out),
        "held_out_ndcg@5_before": before,
        "held_out_ndcg@5_after": after,
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary


__all__ = [
    "Candidates",
    "ListwiseSettings",
    "candidates",
    "ndcg",
    "plackett_luce_logprob",
    "relevance_scores",
    "sample_rankings",
    "train_listwise",
]
