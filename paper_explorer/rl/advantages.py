"""Group-relative advantages: each episode's reward against the other episodes of its question in
the same round (the group of ``group_size`` samples).

* ``grpo`` (DeepSeekMath's GRPO): reward minus the group's mean, divided by the group's standard
  deviation (the sample standard deviation, plus 1e-4, as TRL's ``GRPOTrainer`` computes it), or
  not divided with ``scale=False`` (Dr. GRPO).
* ``rloo`` (REINFORCE leave-one-out): reward minus the mean of the group's other rewards.

A group whose rewards are all equal teaches nothing: every advantage is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean

STD_EPSILON = 1e-4  # TRL's: keeps a group of nearly equal rewards from being blown up


def group_advantages(rewards: Sequence[float], method: str = "grpo", scale: bool = True) -> list[float]:
    """The advantage of each reward of one group, in order."""
    size = len(rewards)
    if size < 2:
        raise ValueError(f"a group needs at least 2 episodes to compare, not {size}")
    mean = fmean(rewards)
    if all(reward == rewards[0] for reward in rewards):
        return [0.0] * size
    if method == "rloo":
        total = sum(rewards)
        return [reward - (total - reward) / (size - 1) for reward in rewards]
    if method != "grpo":
        raise ValueError(f"advantage {method!r}: grpo or rloo")
    centred = [reward - mean for reward in rewards]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (size - 1))
    return [c / (std + STD_EPSILON) for c in centred]
