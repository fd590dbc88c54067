"""What a policy records about itself (``policy.settings``): typed records, written with the keys
trajectories have always had, so older trajectories and every reader of those keys still agree."""

from pathlib import Path

import pytest
from pydantic_core import PydanticSerializationError

from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.policies.records import Inline, PolicySettings, SamplingRecord, recorded
from paper_explorer.agent.policies.replay import Replay
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig, Trajectory
from paper_explorer.corpus import BM25Index

# The keys each policy wrote when its settings were a dict (before typed records), in that order
# but for "thinking", which a model policy now writes after its template's keys.
TEMPLATE = ["tokenizer_sha256", "chat_template_sha256", "end_of_turn", "system", "history", "thinking"]
GREEDY = ["decoding", "do_sample", "temperature"]
HF = ["model", "adapter", "adapter_sha256", "quantization", "dtype", "device", "threads", *GREEDY]
HF += ["overridden_generation_config", "max_new_tokens", "max_context", "reuse_cache", *TEMPLATE]
SERVER = ["model", "prompt_format", "tokenizer", *GREEDY, "max_new_tokens", "max_context", "timeout", "retries", *TEMPLATE]
RECIPE = ["scope", "page_tokens", "memory_tokens", "answer_tokens", "passes", "outlines", "outline_sections", "keep_sentinel"]
RECIPE += ["token_budget", "document", "prompts", "answer_from", "outline_fill", "preset", "oracle", "prompts_sha256"]
CHAT = ["api", "url", "model", *GREEDY, "max_new_tokens", "timeout", "retries", "student_tokenizer", "tokenizer_sha256"]
CHAT += ["teacher_tokenization", "server_max_model_len"]
URL, TWO_URLS = ["http://127.0.0.1:9/v1"], ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]


@pytest.mark.parametrize(
    ("name", "keys"),
    [("scripted", ["search_k", "extract_k"]), ("direct-submit", []), ("single-shot-rag", ["k"]), ("read-all", ["memory", "max_steps"])],
)
def test_a_policy_without_a_model_records_the_keys_it_always_did(name, keys):
    assert list(recorded(make_policy(make_config(name)).settings())) == keys


def test_replay_records_its_recording(tmp_path):
    assert recorded(Replay([], source=tmp_path / "x.jsonl").settings()) == {"trajectories": str(tmp_path / "x.jsonl"), "episodes": 0}


def test_the_hf_policy_records_the_keys_it_always_did(tiny_model):
    greedy = recorded(make_policy(make_config("hf", model=str(tiny_model))).settings())
    assert list(greedy) == HF and greedy["temperature"] == 0 and greedy["dtype"] == "float32" and greedy["device"] == "cpu"
    sampled = recorded(make_policy(make_config("hf", model=str(tiny_model), temperature=0.7, top_k=5, thinking=True)).settings())
    at = HF.index("temperature") + 1
    assert list(sampled) == [*HF[:at], "top_p", "top_k", *HF[at:], "thinking_budget"]
    assert sampled["decoding"] == "sampling" and sampled["top_k"] == 5 and sampled["thinking"] is True


def test_the_openai_policies_record_the_keys_they_always_did(tiny_tokenizer):
    one = make_policy(make_config("openai", base_url=URL, model="m", tokenizer=tiny_tokenizer)).settings()
    assert list(recorded(one)) == ["url", *SERVER, "server_max_model_len", "server_prompt_ids"]
    assert recorded(one)["url"] == "http://127.0.0.1:9/v1/completions" and recorded(one)["tokenizer"] == str(tiny_tokenizer)
    two = recorded(make_policy(make_config("openai", base_url=TWO_URLS, model="m", tokenizer=tiny_tokenizer, thinking=True)).settings())
    assert list(two) == ["url", "replicas", *SERVER, "thinking_budget", "server_max_model_len", "server_prompt_ids"]
    chat = recorded(make_policy(make_config("openai", api="chat", base_url=URL, model="m")).settings())
    assert list(chat) == CHAT and chat["api"] == "chat" and chat["student_tokenizer"] is None


def test_the_memory_reader_records_its_backends_keys_then_its_recipe(tiny_tokenizer):
    config = make_config("memory-reader", backend="openai", base_url=URL, model="m", tokenizer=tiny_tokenizer, scope="paper", passes=2)
    settings = recorded(make_policy(config).settings())
    assert list(settings) == ["backend", "url", *SERVER, "server_max_model_len", "server_prompt_ids", *RECIPE]
    assert settings["backend"] == "openai" and settings["passes"] == 2 and settings["oracle"] is True


def test_an_episode_records_the_policys_settings_and_its_trajectory_reads_back(small_demo):
    question = small_demo.questions[0]
    runner = EpisodeRunner(small_demo, BM25Index.build(small_demo), make_policy(make_config("read-all"), 4), EpisodeConfig(max_steps=4))
    trajectory = runner.run(question.text, question)
    assert trajectory.policy.settings == {"memory": 6, "max_steps": 4}
    assert Trajectory.model_validate_json(trajectory.model_dump_json()).policy == trajectory.policy


def test_a_config_recorded_as_the_settings_leaves_its_name_to_the_trajectory():
    assert recorded(make_config("scripted", tokenizer=Path("tok"))) == {"tokenizer": "tok"}


def test_a_record_that_would_write_a_key_twice_is_refused():
    class Twice(PolicySettings):
        decoding: str
        sampling: Inline[SamplingRecord]

    with pytest.raises(PydanticSerializationError, match="records 'decoding' twice"):
        recorded(Twice(decoding="mine", sampling=SamplingRecord(decoding="greedy", do_sample=False, temperature=0)))
