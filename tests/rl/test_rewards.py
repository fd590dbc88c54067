"""Rewards as data: weighted parts read from an episode's scores, refused by name when unknown."""

import math
import re

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.evaluation.detectors import Flag
from paper_explorer.evaluation.scoring import EpisodeScore
from paper_explorer.rl.config import RLConfig
from paper_explorer.rl.rewards import DEFAULT_REWARD, check_reward, reward, reward_parts


def scored(f1: float, *flags: str, status: str = "submitted", answerable: bool = True) -> EpisodeScore:
    return EpisodeScore(
        episode_id="e",
        question_id="q",
        question="?",
        status=status,
        prediction="x",
        steps=2,
        tool_calls=1,
        tool_calls_before_end=1,
        flags=[Flag(name, 0, "") for name in flags],
        answerable=answerable,
        abstained=status == "abstained",
        answer_metrics={"answer_f1": f1, "exact_match": float(f1 == 1.0)},
    )


def test_a_reward_is_the_weighted_sum_of_its_parts_and_records_each():
    got = reward(scored(0.5, "format_errors"), {"answer_f1": 2.0, "format_errors": -0.5, "direct_submit": -1.0})
    assert got.parts == {"answer_f1": 0.5, "format_errors": 1.0, "direct_submit": 0.0}
    assert got.total == pytest.approx(2.0 * 0.5 - 0.5)


def test_correct_abstention_counts_only_an_abstention_on_an_unanswerable_question():
    weights = {"correct_abstention": 1.0}
    assert reward(scored(0.0, status="abstained", answerable=False), weights).total == 1.0
    assert reward(scored(0.0, status="abstained", answerable=True), weights).total == 0.0
    assert reward(scored(0.0, answerable=False), weights).total == 0.0


@pytest.mark.parametrize("f1", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_the_default_makes_the_direct_submit_shortcut_unprofitable(f1):
    """Answering at once never pays more than researching and answering, whatever either's F1."""
    shortcut = reward(scored(f1, "direct_submit", "no_tool_use"), DEFAULT_REWARD).total
    assert shortcut <= 0.0 <= reward(scored(0.0), DEFAULT_REWARD).total
    assert shortcut < reward(scored(min(f1 + 0.01, 1.0)), DEFAULT_REWARD).total
    assert reward(scored(f1, "format_errors"), DEFAULT_REWARD).total < reward(scored(f1), DEFAULT_REWARD).total


def test_every_answer_metric_and_detector_is_a_part_and_nothing_else():
    parts = reward_parts()
    assert {"answer_f1", "exact_match", "sub_exact_match", "correct_abstention", "direct_submit", "ungrounded_answer"} <= set(parts)
    with pytest.raises(ValueError, match=r"reward part 'answer_f2' does not exist \(did you mean 'answer_f1'\?\)"):
        check_reward({"answer_f2": 1.0})
    with pytest.raises(ValueError, match="weighs nothing"):
        check_reward({"answer_f1": 0.0})


def test_the_config_refuses_a_part_that_does_not_exist_and_a_group_of_one():
    from paper_explorer.agent.config import build_config

    with pytest.raises(AgentError, match="reward part 'shortcut' does not exist"):
        build_config(RLConfig, {"reward": {"shortcut": -1.0}}, {}, "rl.toml")
    with pytest.raises(AgentError, match="group_size"):
        build_config(RLConfig, {}, {"group_size": 1}, "command line")
    config = build_config(RLConfig, {}, {"policy.model": "m"}, "command line")
    assert config.policy.name == "hf" and config.policy.temperature == 1.0 and config.reward == DEFAULT_REWARD


@pytest.mark.parametrize("weight", [math.nan, math.inf, -math.inf, 1e308])
def test_a_weight_that_is_not_a_finite_number_of_sane_size_is_refused(weight):
    """NaN or inf would reach the advantages (and the weights) through the group's mean; two weights of
    1e308 add up to inf."""
    from paper_explorer.agent.config import build_config

    with pytest.raises(ValueError, match=re.escape(f"reward part 'answer_f1' weighs {weight}: a weight is a number between")):
        check_reward({"answer_f1": weight, "direct_submit": -1.0})
    with pytest.raises(AgentError, match="weighs"):
        build_config(RLConfig, {"reward": {"answer_f1": weight}}, {}, "rl.toml")


def test_more_minibatches_than_a_round_has_episodes_are_refused():
    from paper_explorer.agent.config import build_config

    with pytest.raises(AgentError, match=r"^command line: minibatches=7 is more than a round's 6 episodes"):
        build_config(RLConfig, {}, {"questions_per_round": 3, "group_size": 2, "minibatches": 7}, "command line")
    assert build_config(RLConfig, {}, {"questions_per_round": 3, "group_size": 2, "minibatches": 6}, "command line").minibatches == 6
