"""The advantage and loss math of explorer rl against groups worked by hand."""

import math

import pytest

from paper_explorer.rl.advantages import STD_EPSILON, group_advantages
from paper_explorer.rl.loss import token_losses, token_weights

torch = pytest.importorskip("torch")


def test_grpo_centres_on_the_group_mean_and_divides_by_its_sample_std():
    # mean 0.5; sample std sqrt(4 * 0.25 / 3) = sqrt(1/3), as TRL's rewards.std() computes it
    std = math.sqrt(1 / 3)
    expected = [0.5 / (std + STD_EPSILON), -0.5 / (std + STD_EPSILON), -0.5 / (std + STD_EPSILON), 0.5 / (std + STD_EPSILON)]
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx(expected)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale=False) == pytest.approx([0.5, -0.5, -0.5, 0.5])  # Dr. GRPO


def test_rloo_subtracts_the_mean_of_the_others():
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "rloo") == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert group_advantages([0.9, 0.3], "rloo") == pytest.approx([0.6, -0.6])


def test_a_group_of_equal_rewards_teaches_nothing_and_one_episode_is_no_group():
    assert group_advantages([-0.2, -0.2, -0.2]) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0, 1.0], "rloo") == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0])


def test_the_clipped_surrogate_per_token_by_hand():
    logps, old = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.5])  # ratios 1 and e^0.5 = 1.6487
    positive = token_losses(logps, old, advantage=1.0, epsilon=0.2, beta=0.0)
    assert positive.ratio.tolist() == pytest.approx([1.0, math.exp(0.5)])
    assert positive.loss.tolist() == pytest.approx([-1.0, -1.2])  # the second is clipped at 1 + 0.2
    assert positive.clipped.tolist() == [False, True]
    negative = token_losses(logps, old, advantage=-1.0, epsilon=0.2, beta=0.0)
    assert negative.loss.tolist() == pytest.approx([1.0, math.exp(0.5)])  # a bad token's rise is never clipped away
    assert negative.clipped.tolist() == [False, False]


def test_the_kl_penalty_is_the_k3_estimate_toward_the_reference():
    logps, reference = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    losses = token_losses(logps, logps.clone(), advantage=0.0, epsilon=0.2, beta=0.1, ref_logps=reference)
    k3 = math.exp(-0.5) + 0.5 - 1  # exp(ref - logp) - (ref - logp) - 1
    assert losses.kl.tolist() == pytest.approx([k3, 0.0])
    assert losses.loss.tolist() == pytest.approx([0.1 * k3, 0.0])
    with pytest.raises(ValueError, match="reference"):
        token_losses(logps, logps, 1.0, 0.2, 0.1)


def test_descending_the_loss_raises_a_rewarded_token_and_lowers_a_punished_one():
    """The sign: a gradient step on the loss must make a positive-advantage token likelier."""
    for advantage, direction in ((1.0, 1), (-1.0, -1)):
        logps = torch.tensor([-1.0], requires_grad=True)
        token_losses(logps, torch.tensor([-1.0]), advantage, 0.2, 0.0).loss.sum().backward()
        assert -logps.grad.item() * direction > 0


def test_token_weights_make_the_weighted_sum_a_mean():
    tokens = {"a": 3, "b": 1, "c": 0}
    assert token_weights(tokens, "token") == {"a": 0.25, "b": 0.25, "c": 0.0}  # every token alike
    # each episode's tokens averaged, then the two episodes that trained anything
    assert token_weights(tokens, "episode") == pytest.approx({"a": 1 / 6, "b": 1 / 2, "c": 0.0})
    with pytest.raises(ValueError):
        token_weights(tokens, "sequence")
