"""The policy-gradient loss on sampled tokens: PPO's clipped surrogate with a group-relative
advantage (GRPO) and the k3 estimate of the KL divergence toward the frozen base, per token.

For a trained token with log-probability ``logp`` under the weights being trained, ``old`` under
the sampler (recorded when it was drawn, ``agent.trajectory.Sampled``), ``ref`` under the base with
the adapter disabled, and its episode's advantage ``A``::

    ratio = exp(logp - old)
    loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * (exp(ref - logp) - (ref - logp) - 1)

which is TRL's ``GRPOTrainer`` loss (``loss_type="dapo"`` for ``token`` normalisation, ``"grpo"``
for ``episode``), written out here because the tokens come from our own episodes: see ``rl.update``.
The tokens' weights (``token_weights``) make the sum over a minibatch its mean loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where the loss is computed: importing this module loads nothing heavy
    import torch


@dataclass
class TokenLosses:
    loss: torch.Tensor  # one value per token
    ratio: torch.Tensor
    clipped: torch.Tensor  # bool: the clipped branch was taken (no gradient reaches the weights through the ratio)
    kl: torch.Tensor | None


def token_losses(logps, old_logps, advantage: float, epsilon: float, beta: float, ref_logps=None) -> TokenLosses:
    """Each token's loss (tensors of one sequence's trained tokens)."""
    import torch

    ratio = torch.exp(logps - old_logps)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    unclipped, clipped = ratio * advantage, clipped_ratio * advantage
    loss = -torch.minimum(unclipped, clipped)
    taken = clipped < unclipped  # the min took the clipped term: no gradient reaches the weights through it
    kl = None
    if beta:
        if ref_logps is None:
            raise ValueError("a KL penalty needs the reference log-probabilities")
        difference = ref_logps - logps
        kl = torch.exp(difference) - difference - 1
        loss = loss + beta * kl
    return TokenLosses(loss, ratio, taken, kl)


def token_weights(tokens_by_episode: dict[str, int], normalization: str) -> dict[str, float]:
    """Per episode, the weight of each of its trained tokens, so that the weighted sum over a
    minibatch is its mean loss: ``token`` - every token of the minibatch alike (1 / all tokens);
    ``episode`` - each episode's tokens averaged, then the episodes (1 / (its tokens * episodes)).
    An episode with no trained token weighs nothing."""
    if normalization not in ("token", "episode"):
        raise ValueError(f"loss normalization {normalization!r}: token or episode")
    total = sum(tokens_by_episode.values())
    episodes = sum(1 for tokens in tokens_by_episode.values() if tokens)
    return {
        episode: 0.0 if not tokens else 1 / total if normalization == "token" else 1 / (tokens * episodes)
        for episode, tokens in tokens_by_episode.items()
    }
