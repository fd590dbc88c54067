"""Listwise reinforcement learning of a reranker: the arithmetic.

The reranker scores each of a query's K candidate passages with ``s_i``, the log of its
probability of answering "yes" to "does this passage help answer the question?" (a typed ``noul``
decision, ``rl.listwise_train``). A ranking is drawn from the Plackett-Luce distribution of those
scores: the first passage with probability softmax(s), the next from the rest likewise, and so on:

    log P(ranking) = sum_j [ s_{r_j} - logsumexp(s_{r_j}, ..., s_{r_K}) ]

Drawing is the Gumbel trick: the ranking is the order of s_i + Gumbel noise, which has exactly that
distribution. Each of G rankings of a query is rewarded with its NDCG@k against the gold evidence
(``ndcg``); its advantage is its reward minus the mean of the other G-1 (leave-one-out,
``rl.advantages``' ``rloo``), and the loss is

    loss = -mean_g(A_g * log P(ranking_g)) + beta * KL

where KL is the mean over candidates of KL(policy || reference) between the two models' yes / no /
unknown distributions, the reference being the model the training started from (the adapter
disabled): it keeps the reranker a decision model while its ranking improves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from paper_explorer.rl.advantages import group_advantages

if TYPE_CHECKING:
    import torch


def dcg(relevance: Sequence[float], k: int) -> float:
    return sum(gain / math.log2(position + 2) for position, gain in enumerate(relevance[:k]))


def ndcg(ranked_relevance: Sequence[float], k: int) -> float:
    """NDCG@k of a ranking (the relevance of each ranked item, in rank order) against the best
    order of the same items; 0 when none is relevant."""
    ideal = dcg(sorted(ranked_relevance, reverse=True), k)
    return dcg(ranked_relevance, k) / ideal if ideal > 0 else 0.0


def recall(ranked_relevance: Sequence[float], k: int, relevant: int) -> float:
    """The share of the ``relevant`` gold items within the first k (0 when there are none)."""
    return sum(1 for gain in ranked_relevance[:k] if gain > 0) / relevant if relevant else 0.0


def plackett_luce_logprob(scores: torch.Tensor, ranking: torch.Tensor) -> torch.Tensor:
    """log P(ranking) under Plackett-Luce with these scores (differentiable in the scores)."""
    import torch

    ordered = scores[ranking]
    # logsumexp of each suffix: flip, cumulative logsumexp, flip back
    suffix = torch.logcumsumexp(ordered.flip(0), dim=0).flip(0)
    return (ordered - suffix).sum()


def sample_rankings(scores: torch.Tensor, samples: int, generator: torch.Generator) -> torch.Tensor:
    """``samples`` rankings drawn from Plackett-Luce (Gumbel-perturbed scores, sorted), one per row."""
    import torch

    uniform = torch.rand((samples, scores.numel()), generator=generator, dtype=torch.float64).clamp_min(1e-300)
    gumbel = -torch.log(-torch.log(uniform))
    return torch.argsort(scores.detach().double().cpu() + gumbel, dim=1, descending=True)


def option_kl(logprobs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean over rows (candidates) of KL(p || q) between two option distributions given as logs."""
    return (logprobs.exp() * (logprobs - reference)).sum(dim=-1).mean()


def listwise_loss(
    scores: torch.Tensor, relevance: Sequence[float], rankings: torch.Tensor, k: int, beta: float, kl: torch.Tensor | None
) -> tuple[torch.Tensor, list[float], list[float]]:
    """(the query's loss, each ranking's reward, each ranking's advantage)."""
    rewards = [ndcg([relevance[int(i)] for i in ranking], k) for ranking in rankings]
    advantages = group_advantages(rewards, "rloo")
    terms = [advantage * plackett_luce_logprob(scores, ranking.to(scores.device)) for advantage, ranking in zip(advantages, rankings)]
    policy = -sum(terms) / len(terms)
    loss = policy + beta * kl if kl is not None and beta else policy
    return loss, rewards, advantages  # type: ignore[return-value]


__all__ = ["dcg", "listwise_loss", "ndcg", "option_kl", "plackett_luce_logprob", "recall", "sample_rankings"]
