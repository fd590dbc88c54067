"""Listwise reinforcement learning of a reranker: the arithmetic.

The reranker scores each of a query's K candidate passages with ``s_i``, the log of its
probability of answering "yes" (against "no") to "does this passage help answer the question?"
(``decisions.rerank``'s prompt; ``rl.listwise_train``). A ranking is drawn from the Plackett-Luce distribution of those
scores: the first passage with probability softmax(s), the next from the rest likewise, and so on:

    log P(ranking) = sum_j [ s_{r_j} - logsumexp(s_{r_j}, ..., s_{r_K}) ]

Drawing is the Gumbel trick: the ranking is the order of s_i + Gumbel noise, which has exactly that
distribution. Each of G rankings of a query is rewarded with its NDCG@k against the gold evidence
(``decisions.rerank_gold``); its advantage is its reward minus the mean of the other G-1 (leave-one-out,
``rl.advantages``' ``rloo``), and the loss is

    loss = -mean_g(A_g * log P(ranking_g)) + beta * KL

where KL is the mean over candidates of KL(policy || reference) between the two models' yes / no
distributions, the reference being the model the training started from (the adapter
disabled): it keeps the reranker a decision model while its ranking improves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from paper_explorer.rl.advantages import group_advantages

if TYPE_CHECKING:
    import torch


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
    scores: torch.Tensor, rewards: Sequence[float], rankings: torch.Tensor, beta: float, kl: torch.Tensor | None
) -> tuple[torch.Tensor, list[float]]:
    """(the query's loss, each ranking's advantage) from each ranking's reward."""
    advantages = group_advantages(rewards, "rloo")
    terms = [advantage * plackett_luce_logprob(scores, ranking.to(scores.device)) for advantage, ranking in zip(advantages, rankings)]
    policy = -sum(terms) / len(terms)
    loss = policy + beta * kl if kl is not None and beta else policy
    return loss, advantages  # type: ignore[return-value]


__all__ = ["listwise_loss", "option_kl", "plackett_luce_logprob", "sample_rankings"]
