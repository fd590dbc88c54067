"""Option probes (agent.probes): the probabilities, the hf policy with and without its cache on a
tiny model with the real Qwen3 vocabulary ("Yes" and "No" one token each), the server path against
a scripted server (token-id labels, the fallback, answers that lie), and the refusals."""

import math

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.probes import ProbeSet, check_probes, from_logprobs, load_probes, measure, option_ids, probe_prompt
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.served import ids_sha256
from paper_explorer.agent.trajectory import EpisodeConfig, Trajectory
from paper_explorer.corpus import BM25Index
from tests.agent.test_openai_policy import SUBMIT, FakeServer

CONVERSATION = [
    {"role": "system", "content": "You answer questions about papers."},
    {"role": "user", "content": "Question: which learning rate did QuantLens use?"},
    {"role": "assistant", "content": '```python\nsubmit("3e-5", evidence=[])\n```'},
    {"role": "user", "content": "Submitted."},
]


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory, qwen3_tokenizer):
    """A tiny random-weight model on the real Qwen3 vocabulary."""
    pytest.importorskip("torch")
    from paper_explorer.agent.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("probe-model") / "model", tokenizer_from=qwen3_tokenizer)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return ChatRenderer.from_directory(qwen3_tokenizer)


def run(small_demo, index, policy, probes, steps=2, probes_file=None):
    question = small_demo.questions[0]
    config = EpisodeConfig(max_steps=steps, probes=probes, probes_file=probes_file)
    return EpisodeRunner(small_demo, index, policy, config).run(question.text, question)


def assert_measured(result):
    assert result.not_measured is None, result.not_measured
    assert math.isclose(sum(result.probabilities), 1.0, abs_tol=1e-12) and all(0 <= p <= 1 for p in result.probabilities)
    assert 0 < result.mass <= 1
    assert result.probes_sha256 == load_probes().sha256


# -- the probabilities ---------------------------------------------------------------------------


def test_probabilities_are_renormalised_over_the_options_and_the_mass_kept():
    probabilities, mass = from_logprobs([math.log(0.3), math.log(0.1)])
    assert probabilities == pytest.approx([0.75, 0.25], abs=1e-12) and mass == pytest.approx(0.4, abs=1e-12)
    probabilities, mass = from_logprobs([-9999.0, math.log(0.5), -math.inf])  # vLLM writes -inf as -9999
    assert probabilities == pytest.approx([0.0, 1.0, 0.0]) and mass == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("logprobs", "said"),
    [
        ([None, -1.0], "not a number"),
        (["-1.0", -1.0], "not a number"),
        ([True, -1.0], "not a number"),
        ([math.nan, -1.0], "not a log-probability"),
        ([0.5, -1.0], "not a log-probability"),
        ([-math.inf, -math.inf], "no probability"),
        ([math.log(0.7), math.log(0.6)], "more than 1"),
    ],
)
def test_what_is_no_log_probability_is_refused(logprobs, said):
    with pytest.raises(ValueError, match=said):
        from_logprobs(logprobs)


# -- the probes file -----------------------------------------------------------------------------


def test_the_probes_file_asks_single_token_options_of_qwen3(qwen3):
    probes = load_probes()
    assert set(probes.probes) == {"answerable", "correct"} and probes.probes["correct"].only_if_submitted
    assert option_ids(qwen3, probes.probes["answerable"]) == [qwen3.text("Yes")[0], qwen3.text("No")[0]]
    prompt = probe_prompt(qwen3, CONVERSATION, probes.probes["answerable"])
    assert prompt[-len(qwen3.generation_prompt()) :] == qwen3.generation_prompt()  # the empty think block: the option comes next


def test_a_probes_file_with_a_two_token_option_is_refused(tmp_path, qwen3):
    path = tmp_path / "probes.toml"
    path.write_text('[sure]\ntext = "Are you sure?"\noptions = ["Yes", "Not at all"]\n')
    (probe,) = load_probes(path).named(["sure"])
    with pytest.raises(AgentError, match=r"option 'Not at all' is 3 tokens of this tokenizer.*must be one token"):
        option_ids(qwen3, probe)
    path.write_text('[sure]\ntext = "Are you sure?"\noptions = ["Yes"]\n')
    with pytest.raises(AgentError, match="at least two options"):
        load_probes(path)


def test_unknown_probes_and_policies_without_a_model_are_refused(qwen3_tokenizer, small_demo, index):
    scripted = make_policy(make_config("scripted"))
    with pytest.raises(AgentError, match="episode.probes: the scripted policy has no model to probe"):
        check_probes(["answerable"], scripted)
    with pytest.raises(AgentError, match=r"episode\.probes=\['sure'\]: no such probe"):
        run(small_demo, index, scripted, ["sure"])
    chat = make_policy(make_config("openai", api="chat", base_url="http://127.0.0.1:9/v1", model="m", tokenizer=qwen3_tokenizer))
    with pytest.raises(AgentError, match="chat API returns no log-probabilities"):
        check_probes(["answerable"], chat)


# -- hf: one forward pass, with and without the episode's cache ----------------------------------


@pytest.fixture(scope="module")
def hf_episode(qwen3_model, small_demo, index):
    from paper_explorer.agent.policies.hf import HFPolicy

    policy = HFPolicy.load(str(qwen3_model), max_new_tokens=8)
    return policy, run(small_demo, index, policy, ["answerable", "correct"], steps=3)


def test_an_hf_episode_records_its_probe(hf_episode):
    policy, trajectory = hf_episode
    assert trajectory.outcome.status != "submitted"  # random weights: so "correct" is not asked
    (result,) = trajectory.probes
    assert_measured(result)
    assert result.probe == "answerable" and result.source == "hf" and result.options == ["Yes", "No"]
    assert 0 < result.cached_tokens < result.prompt_tokens  # the episode's cache was reused
    probe = load_probes().probes["answerable"]
    prompt = probe_prompt(policy.renderer, trajectory.messages(), probe)  # the record rebuilds the prompt
    assert result.prompt_sha256 == ids_sha256(prompt) and result.prompt_tokens == len(prompt)
    assert Trajectory.model_validate_json(trajectory.model_dump_json()).probes == trajectory.probes


def test_hf_probabilities_with_and_without_the_cache_are_the_same(hf_episode):
    policy, trajectory = hf_episode
    (recorded,) = trajectory.probes
    prompt = probe_prompt(policy.renderer, trajectory.messages(), load_probes().probes["answerable"])
    again = policy.probe(prompt, recorded.option_ids)
    uncached = policy.probe(prompt, recorded.option_ids, use_cache=False)
    assert again.cached_tokens == recorded.cached_tokens and uncached.cached_tokens == 0  # the first probe left the cache reusable
    cached_p, _ = from_logprobs(again.logprobs)
    fresh_p, _ = from_logprobs(uncached.logprobs)
    largest = max(abs(a - b) for a, b in zip(cached_p + recorded.probabilities, fresh_p * 2, strict=True))
    print(f"largest cached-vs-uncached probability difference: {largest:.3g}")
    assert largest <= 1e-5
    assert max(range(2), key=cached_p.__getitem__) == max(range(2), key=fresh_p.__getitem__)


def test_a_probe_over_the_context_is_recorded_not_truncated(hf_episode):
    policy, trajectory = hf_episode
    prompt = probe_prompt(policy.renderer, trajectory.messages(), load_probes().probes["answerable"])
    (result,) = measure(policy, trajectory.messages(), ["answerable"], policy.renderer, len(prompt))
    assert result.probabilities is None and result.prompt_tokens == len(prompt)
    assert result.not_measured == f"the probe's prompt of {len(prompt)} tokens leaves no room for an option in the context of {len(prompt)}"


# -- openai: the server's top log-probabilities, the fallback, and answers that lie ---------------


def probe_answer(top, logprobs=True):
    """A vLLM completions answer of one token with ``top`` as the first position's top log-probabilities."""
    choice = {"text": "x", "finish_reason": "length"}
    if logprobs:
        choice["logprobs"] = {"tokens": ["token_id:1"], "token_logprobs": [-0.1], "top_logprobs": [top], "text_offset": [0]}
    return {"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}


def fallback_answer(body, entry):
    """vLLM's prompt_logprobs: None for the first prompt token, then one dict keyed by token id each."""
    return {"choices": [{"text": "x", "finish_reason": "length", "prompt_logprobs": [None] * (len(body["prompt"]) - 1) + [entry]}]}


def scripted_server(probe=None, fallback=None):
    """Answers actions with a submit, probes with ``probe(body)`` and fallbacks with ``fallback(body)``."""

    def respond(body):
        if "prompt_logprobs" in body:
            return fallback(body)
        if "logprobs" in body:
            return probe(body)
        return 200, FakeServer.completion(SUBMIT, len(body["prompt"]))

    return FakeServer(models=["served"], respond=respond)


def openai_policy(server, tokenizer):
    policy = make_policy(make_config("openai", base_url=server.url, model="served", tokenizer=tokenizer, retries=1))
    policy.backoff = 0.01
    return policy


def test_the_server_path_reads_token_id_labels_and_asks_both_probes_after_a_submit(qwen3, qwen3_tokenizer, small_demo, index):
    yes, no = qwen3.text("Yes")[0], qwen3.text("No")[0]
    server = scripted_server(probe=lambda body: (200, probe_answer({f"token_id:{yes}": math.log(0.6), f"token_id:{no}": math.log(0.2)})))
    try:
        trajectory = run(small_demo, index, openai_policy(server, qwen3_tokenizer), ["answerable", "correct"])
    finally:
        server.server.shutdown()
    assert trajectory.outcome.status == "submitted"
    assert [result.probe for result in trajectory.probes] == ["answerable", "correct"]
    for result in trajectory.probes:
        assert_measured(result)
        assert result.source == "server" and result.fallback_options is None and result.cached_tokens is None
        assert result.probabilities == pytest.approx([0.75, 0.25]) and result.mass == pytest.approx(0.8)
    probes = [request for request in server.requests if "logprobs" in request]
    assert len(probes) == 2 and all(p["max_tokens"] == 1 and p["temperature"] == 0 and p["logprobs"] == 20 for p in probes)
    assert all(p["return_tokens_as_token_ids"] is True for p in probes)
    assert ids_sha256(probes[0]["prompt"]) == trajectory.probes[0].prompt_sha256


def test_an_option_outside_the_top_logprobs_is_read_by_the_fallback(qwen3, qwen3_tokenizer):
    yes, no = qwen3.text("Yes")[0], qwen3.text("No")[0]
    server = scripted_server(
        probe=lambda body: (200, probe_answer({f"token_id:{yes}": math.log(0.3), "token_id:17": math.log(0.5)})),
        fallback=lambda body: (200, fallback_answer(body, {str(no): {"logprob": math.log(0.1), "rank": 30, "decoded_token": "No"}})),
    )
    try:
        (result,) = measure(openai_policy(server, qwen3_tokenizer), CONVERSATION, ["answerable"], qwen3, 4096)
    finally:
        server.server.shutdown()
    assert_measured(result)
    assert result.source == "server+fallback" and result.fallback_options == ["No"]
    assert result.probabilities == pytest.approx([0.75, 0.25]) and result.mass == pytest.approx(0.4)
    probe, fallback = server.requests
    assert fallback["prompt"] == [*probe["prompt"], no] and fallback["prompt_logprobs"] == 1 and fallback["max_tokens"] == 1


def yes_no(qwen3):
    return qwen3.text("Yes")[0], qwen3.text("No")[0]


LIES = {
    "no logprobs": (lambda yes, no: (200, probe_answer({}, logprobs=False)), None, "no top log-probabilities"),
    "text labels": (lambda yes, no: (200, probe_answer({"Yes": -0.5, "No": -1.0})), None, "not token_id:N"),
    "a lone surrogate": (lambda yes, no: (200, probe_answer({"\ud800": "\udfff"})), None, "labelled a token '\ufffd'"),
    "no answer": (lambda yes, no: (200, {"choices": []}), None, "the probe's request failed"),
    "not a number": (lambda yes, no: (200, probe_answer({f"token_id:{yes}": "high", f"token_id:{no}": -1.0})), None, "not a number"),
    "above zero": (lambda yes, no: (200, probe_answer({f"token_id:{yes}": 2.0, f"token_id:{no}": -1.0})), None, "not a log-probability"),
    "more than all": (lambda yes, no: (200, probe_answer({f"token_id:{yes}": -0.1, f"token_id:{no}": -0.2})), None, "more than 1"),
    "refused": (lambda yes, no: (500, {"error": "boom"}), None, "the probe's request failed"),
    "short fallback": (
        lambda yes, no: (200, probe_answer({f"token_id:{yes}": -0.5})),
        lambda body: (200, {"choices": [{"text": "x", "prompt_logprobs": [None]}]}),
        "prompt log-probabilities for a prompt of",
    ),
    "a fallback above the top k": (  # outside the top 20, yet likelier than one inside it
        lambda yes, no: (200, probe_answer({f"token_id:{no}": -3.0, "token_id:17": -0.1})),
        lambda body: (200, fallback_answer(body, {str(body["prompt"][-1]): {"logprob": -1.0}})),
        "the answers contradict",
    ),
    "an integer past a float": (
        lambda yes, no: (200, probe_answer({f"token_id:{yes}": -(10**400), f"token_id:{no}": -1.0})),
        None,
        "not a number",
    ),
    "fallback without the token": (
        lambda yes, no: (200, probe_answer({f"token_id:{yes}": -0.5})),
        lambda body: (200, fallback_answer(body, {"5": {"logprob": -1.0}})),
        "no number for token",
    ),
}


@pytest.mark.parametrize("lie", LIES)
def test_a_server_that_omits_or_lies_gives_not_measured(lie, qwen3, qwen3_tokenizer):
    probe, fallback, said = LIES[lie]
    yes, no = yes_no(qwen3)
    server = scripted_server(probe=lambda body: probe(yes, no), fallback=fallback)
    try:
        (result,) = measure(openai_policy(server, qwen3_tokenizer), CONVERSATION, ["answerable"], qwen3, 4096)
    finally:
        server.server.shutdown()
    assert result.probabilities is None and result.mass is None
    assert said in result.not_measured, result.not_measured
    assert type(result).model_validate_json(result.model_dump_json()) == result


def test_a_lying_server_never_loses_the_episode(qwen3, qwen3_tokenizer, small_demo, index):
    server = scripted_server(probe=lambda body: (200, probe_answer({"Yes": "sure"})))
    try:
        trajectory = run(small_demo, index, openai_policy(server, qwen3_tokenizer), ["answerable", "correct"])
    finally:
        server.server.shutdown()
    assert trajectory.outcome.status == "submitted" and len(trajectory.probes) == 2
    assert all("not token_id:N" in result.not_measured for result in trajectory.probes)


def test_a_custom_probes_file_is_hashed(tmp_path, qwen3, qwen3_tokenizer):
    path = tmp_path / "probes.toml"
    path.write_text('[sure]\ntext = "Sure?"\noptions = ["Yes", "No"]\n')
    probes = load_probes(path)
    assert isinstance(probes, ProbeSet) and len(probes.sha256) == 64 and probes.sha256 != load_probes().sha256
    yes, no = yes_no(qwen3)
    server = scripted_server(probe=lambda body: (200, probe_answer({f"token_id:{yes}": -1.0, f"token_id:{no}": -1.0})))
    try:
        (result,) = measure(openai_policy(server, qwen3_tokenizer), CONVERSATION, ["sure"], qwen3, 4096, probes=probes)
    finally:
        server.server.shutdown()
    assert result.probes_sha256 == probes.sha256 and result.probabilities == pytest.approx([0.5, 0.5])


def test_an_episode_asks_its_probes_from_the_file_its_config_names(tmp_path, qwen3, qwen3_tokenizer, small_demo, index):
    path = tmp_path / "probes.toml"
    path.write_text('[sure]\ntext = "Sure?"\noptions = ["Yes", "No"]\n')
    yes, no = yes_no(qwen3)
    server = scripted_server(probe=lambda body: (200, probe_answer({f"token_id:{yes}": -0.5, f"token_id:{no}": -3.0})))
    try:
        trajectory = run(small_demo, index, openai_policy(server, qwen3_tokenizer), ["sure"], probes_file=path)
    finally:
        server.server.shutdown()
    (result,) = trajectory.probes
    assert result.probe == "sure" and result.probes_sha256 == load_probes(path).sha256
    assert trajectory.config.probes_file == path and result.mass == pytest.approx(math.exp(-0.5) + math.exp(-3.0))


def test_the_probes_file_and_minimum_mass_are_recorded_only_with_probes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = EpisodeConfig().model_dump(mode="json")
    assert "probes_file" not in plain and "probe_min_mass" not in plain  # configs of runs without probes read as before
    asked = EpisodeConfig(probes=["answerable"], probes_file="mine.toml").model_dump(mode="json")
    assert asked["probe_min_mass"] == 0.1 and asked["probes_file"] == str(tmp_path / "mine.toml")  # absolute: a resume elsewhere
    with pytest.raises(ValueError, match="probe_min_mass"):
        EpisodeConfig(probes=["answerable"], probe_min_mass=1.5)
