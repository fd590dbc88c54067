"""Rewards as data: an episode's reward is a weighted sum of named parts, each read from its line
of ``scores.jsonl`` (``evaluation.scoring.EpisodeScore``), so the reward of any scored episode -
a round's samples, an eval run, a teacher's trajectories - is computed the same way and recorded
with its parts.

The parts:

* every registered answer metric (``evaluation.answer_metrics``: ``answer_f1``, ``exact_match``,
  ``sub_exact_match``, ...), its value in [0, 1]; 0 for an episode without an answer;
* ``correct_abstention``: 1 when the episode abstained on a question the papers cannot answer;
* every detector (``evaluation.detectors``: ``direct_submit``, ``format_errors``,
  ``ungrounded_answer``, ``unobserved_evidence``, ...): 1 when it flagged the episode (give it a
  negative weight to make it a penalty).

The default rewards the answer and makes the direct-submit shortcut unprofitable: a direct submit
loses 1, as much as any answer can win (F1 is at most 1), so an episode that answered at once is
worth at most 0 - never more than one that researched without a format error and answered, however
wrongly, and less than one that researched and answered at all well. A format error costs 0.2,
so writing no action is never a way out. ``tests/rl/test_rewards.py`` checks it for every F1.
"""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from paper_explorer.evaluation.scoring import EpisodeScore

CORRECT_ABSTENTION = "correct_abstention"
DEFAULT_REWARD: dict[str, float] = {"answer_f1": 1.0, "direct_submit": -1.0, "format_errors": -0.2}
# A weight's size is bounded so that a reward, the sum of at most every part's weight, is a finite
# number far from float overflow (two weights of 1e308 add up to inf, and its advantages to NaN).
MAX_WEIGHT = 1e6


def reward_parts() -> list[str]:
    """Every part a reward may weigh, in a stable order: answer metrics, abstention, detectors."""
    from paper_explorer.evaluation.answer_metrics import answer_metrics
    from paper_explorer.evaluation.detectors import DETECTORS

    return [metric.name for metric in answer_metrics()] + [CORRECT_ABSTENTION] + list(DETECTORS)


def check_reward(weights: dict[str, float]) -> dict[str, float]:
    """The weights, if every part exists and they reward something; else a ValueError in one line."""
    parts = reward_parts()
    for name in weights:
        if name not in parts:
            near = difflib.get_close_matches(name, parts, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"reward part {name!r} does not exist{hint}; the parts are {', '.join(parts)}")
        if not math.isfinite(weights[name]) or abs(weights[name]) > MAX_WEIGHT:
            raise ValueError(
                f"reward part {name!r} weighs {weights[name]}: a weight is a number between -{MAX_WEIGHT:g} and {MAX_WEIGHT:g}"
            )
    if not any(weights.values()):
        raise ValueError("the reward weighs nothing: give at least one part a weight other than 0")
    return weights


class Reward(BaseModel):
    """An episode's reward and the value of each weighted part (before its weight)."""

    model_config = ConfigDict(extra="forbid")

    total: float
    parts: dict[str, float]


def part_value(name: str, score: EpisodeScore) -> float:
    from paper_explorer.evaluation.detectors import DETECTORS

    if name == CORRECT_ABSTENTION:
        return float(bool(score.abstained) and score.answerable is False)
    if name in DETECTORS:
        return float(any(flag.detector == name for flag in score.flags))
    value = score.answer_metrics.get(name)
    if value is None and score.scored:  # a metric registered after the line was scored
        raise ValueError(f"episode {score.episode_id} was scored without {name}; rescore the run")
    return value or 0.0


def reward(score: EpisodeScore, weights: dict[str, float]) -> Reward:
    """The reward of one scored episode. A question without gold answers gives its answer parts 0:
    rl samples the train split, whose questions have them."""
    parts = {name: part_value(name, score) for name in weights}
    return Reward(total=sum(weights[name] * value for name, value in parts.items()), parts=parts)
