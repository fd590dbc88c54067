"""The update's ratio denominator when the sampler recorded its log-probabilities at another
temperature than it sampled at (a vLLM server's raw log-probabilities: temperature 1): recomputed
with the round's starting weights, so the ratio is 1 at the first step, while the recorded ones
still measure the trainer against the sampler at their own temperature."""

import random

import pytest

from paper_explorer.rl.sequences import TrainingSequence

torch = pytest.importorskip("torch")

SAMPLED_AT = 0.7


def rl_config(tiny_model):
    from paper_explorer.agent.config import build_config
    from paper_explorer.rl.config import RLConfig

    settings = {"policy.model": str(tiny_model), "policy.threads": 1, "policy.temperature": SAMPLED_AT, "kl_beta": 0.0}
    settings |= {"minibatches": 1, "learning_rate": 0.01, "validation_episodes": 0, "gradient_checkpointing": False}
    return build_config(RLConfig, {}, settings, "test")


def server_sequences(tiny_model, old_logprobs_temperature):
    """Four episodes' sequences with, as old log-probabilities, the base model's at temperature 1
    (what vLLM returns by default), computed apart from the trainer's code."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    vocabulary = model.config.vocab_size
    generator = random.Random(7)
    sequences = []
    for episode in range(4):
        ids = [generator.randrange(vocabulary) for _ in range(24)]
        trained = list(range(18, 24))
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        old = [float(logprobs[position - 1, ids[position]]) for position in trained]
        sequences.append(
            TrainingSequence(
                episode_id=f"e{episode}",
                question_id="q",
                sample=episode,
                conversation="actions",
                steps=[0],
                input_ids=ids,
                trained=trained,
                old_logprobs=old,
                temperature=SAMPLED_AT,
                old_logprobs_temperature=old_logprobs_temperature,
                advantage=1.0 if episode % 2 else -1.0,
            )
        )
    return sequences


def one_update(tiny_model, sequences):
    from paper_explorer.rl.update import load_trainable, make_optimizer, update

    config = rl_config(tiny_model)
    model, _ = load_trainable(config, None)
    return update(model, make_optimizer(model, config, None), sequences, config, seed=1)


def test_log_probabilities_recorded_at_temperature_1_are_recomputed_at_the_sampling_temperature(tiny_model):
    figures = one_update(tiny_model, server_sequences(tiny_model, old_logprobs_temperature=1.0))
    assert figures.old_logprobs_recomputed == 4 and figures.tokens_trained == 24
    assert figures.first_step_ratio_gap_max < 1e-5  # the ratio's denominator is the starting weights' own
    # and the recorded ones, compared at their own temperature, show the trainer's base is the sampler's
    assert figures.sampler_logprob_gap_max < 1e-4


def test_taken_as_they_are_at_the_wrong_temperature_the_ratio_is_far_from_1(tiny_model):
    """What the recompute prevents: the same log-probabilities read as the sampling temperature's."""
    figures = one_update(tiny_model, server_sequences(tiny_model, old_logprobs_temperature=None))
    assert figures.old_logprobs_recomputed == 0
    assert figures.first_step_ratio_gap_max > 1e-2 and figures.sampler_logprob_gap > 1e-2
