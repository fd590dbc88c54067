"""Sampling for the model policies: reproducible from the run's seed, the question and the sample
number; recorded in the trajectory; greedy stays the default."""

import pytest

from paper_explorer.agent.loop import episode_seed
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.policies.base import Sampling
from paper_explorer.agent.policies.hf import HFPolicy
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig, without_timings
from paper_explorer.corpus import BM25Index

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


def sampled(tiny_model, small_demo, index, sample=0, seed=0, **sampling):
    policy = HFPolicy.load(str(tiny_model), max_new_tokens=12, sampling=Sampling(**sampling))
    question = small_demo.questions[1]
    runner = EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=2, seed=seed))
    return runner.run(question.text, question, sample=sample)


def actions(trajectory):
    return [step.action_text for step in trajectory.steps]


def test_the_same_config_gives_the_same_samples_and_other_samples_differ(tiny_model, small_demo, index):
    first = sampled(tiny_model, small_demo, index, temperature=1.5)
    again = sampled(tiny_model, small_demo, index, temperature=1.5)
    assert without_timings(first) == without_timings(again)
    others = [actions(sampled(tiny_model, small_demo, index, sample=k, temperature=1.5)) for k in (1, 2)]
    assert any(other != actions(first) for other in others)
    assert first.episode_seed == episode_seed(0, small_demo.questions[1].id, 0) and first.sample == 0
    assert first.policy.settings["decoding"] == "sampling" and first.policy.settings["temperature"] == 1.5


def test_greedy_is_the_default_and_ignores_the_sample_number(tiny_model, small_demo, index):
    greedy = [actions(sampled(tiny_model, small_demo, index, sample=k)) for k in (0, 1)]
    assert greedy[0] == greedy[1]
    assert sampled(tiny_model, small_demo, index).policy.settings["decoding"] == "greedy"


def test_top_k_one_is_greedy_and_top_p_keeps_the_likeliest(tiny_model, small_demo, index):
    greedy = actions(sampled(tiny_model, small_demo, index))
    assert actions(sampled(tiny_model, small_demo, index, temperature=2.0, top_k=1)) == greedy
    assert actions(sampled(tiny_model, small_demo, index, temperature=2.0, top_p=1e-6)) == greedy


def test_sampling_is_refused_for_deterministic_policies():
    from paper_explorer.agent.errors import AgentError

    with pytest.raises(AgentError, match="deterministic"):
        make_policy(make_config("scripted", temperature=0.7))


def test_recorded_samples_are_the_generated_ids_with_the_sampler_log_probabilities(tiny_model, small_demo, index):
    """record_sampled keeps, per step, exactly the ids the model drew (decoding to the action) and
    each one's log-probability under logits / temperature, as a fresh full forward pass computes it."""
    from paper_explorer.agent.served import served_prompts

    policy = HFPolicy.load(str(tiny_model), max_new_tokens=12, sampling=Sampling(temperature=1.5))
    question = small_demo.questions[1]
    config = EpisodeConfig(max_steps=2, seed=3, record_prompt_ids=True, record_sampled=True)
    trajectory = EpisodeRunner(small_demo, index, policy, config).run(question.text, question)
    prompts = served_prompts(trajectory.steps)
    for step, prompt in zip(trajectory.steps, prompts):
        sampled = step.served.sampled
        assert sampled is not None and sampled.temperature == 1.5 and sampled.source == "hf"
        assert len(sampled.ids) == step.generation.generated_tokens
        stop = sampled.ids[-1] in policy.stop_ids
        assert policy.renderer.decode(sampled.ids[:-1] if stop else sampled.ids) == step.action_text
        with torch.inference_mode():
            logits = policy.model(input_ids=torch.tensor([prompt + sampled.ids])).logits[0].float() / 1.5
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1).gather(1, torch.tensor(sampled.ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(sampled.logprobs), expected, atol=1e-4)
    unrecorded = EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=1, seed=3)).run(question.text, question)
    assert unrecorded.steps[0].served.sampled is None and "record_sampled" not in unrecorded.config.model_dump()
