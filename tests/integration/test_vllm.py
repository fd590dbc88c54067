"""eval over real HTTP against a real vLLM (its CPU build) serving the tiny model, as a user runs it.

The model's weights are random, so its actions are nonsense: these tests check what the server
and the run record, never what the model answers. One module, so that `--dist loadscope` starts
the server on one worker only (tests/integration/conftest.py).
"""

import json

import pytest

from tests.conftest import run_cli
from tests.integration.conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.vllm

QUESTIONS = 3
MAX_STEPS = 2


def eval_against(server, out, *extra):
    return run_cli("eval", "--policy", "openai", "--base-url", server.url, "--model", server.model,
                   "--tokenizer", str(server.model_dir), "--limit", str(QUESTIONS), "--max-steps", str(MAX_STEPS),
                   "--max-new-tokens", "16", "--out", str(out), *extra)


def trajectories(run) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def assert_every_episode_ran_on_the_server(found: list[dict]) -> None:
    assert len(found) == QUESTIONS
    for trajectory in found:
        assert trajectory["outcome"]["status"] != "policy_error", trajectory["outcome"]
        assert 1 <= len(trajectory["steps"]) <= MAX_STEPS
        for step in trajectory["steps"]:
            generation = step["generation"]
            assert generation["generated_tokens"] >= 1 and generation["api_retries"] == 0, generation
            assert generation["finish_reason"] in ("stop", "length"), generation


def test_the_server_lists_the_model_with_its_context_length(vllm_server):
    listed = {model["id"]: model for model in vllm_server.models()["data"]}
    assert listed[vllm_server.model]["max_model_len"] == MAX_MODEL_LEN
    assert listed[vllm_server.model]["root"] == str(vllm_server.model_dir)


def test_eval_with_id_prompts_records_what_the_server_received_at_every_step(vllm_server, tmp_path):
    run = tmp_path / "ids"
    done = eval_against(vllm_server, run, "--record-prompt-ids")
    assert done.returncode == 0, done.stderr
    found = trajectories(run)
    assert_every_episode_ran_on_the_server(found)
    for trajectory in found:
        assert trajectory["policy"]["settings"]["prompt_format"] == "ids"
        for step in trajectory["steps"]:
            generation, served = step["generation"], step["served"]
            # The server counted exactly the ids we sent, and the record holds those ids.
            assert generation["server_prompt_tokens"] == generation["prompt_tokens"] == served["tokens"], step
            assert served["ids"]["append"], served
    parity = run_cli("check-parity", "--trajectories", str(run / "trajectories.jsonl"),
                     "--tokenizer", str(vllm_server.model_dir))
    assert parity.returncode == 0, parity.stdout + parity.stderr


def test_eval_with_the_chat_api_records_every_step(vllm_server, tmp_path):
    run = tmp_path / "chat"
    done = eval_against(vllm_server, run, "--api", "chat")
    assert done.returncode == 0, done.stderr
    found = trajectories(run)
    assert_every_episode_ran_on_the_server(found)
    for trajectory in found:
        assert trajectory["policy"]["settings"]["api"] == "chat"
        for step in trajectory["steps"]:
            assert step["generation"]["api"] == "chat" and step["generation"]["usage_prompt_tokens"] > 0, step
