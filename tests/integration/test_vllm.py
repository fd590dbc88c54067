"""eval over real HTTP against a real vLLM (its CPU build) serving the tiny model, as a user runs it.

The model's weights are random, so its actions are nonsense: these tests check what the server
and the run record, never what the model answers. One module, so that `--dist loadscope` starts
the server on one worker only (tests/integration/conftest.py).
"""

import json
import os
import signal
import subprocess
import time

import pytest

from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command, run_cli
from tests.integration.conftest import MAX_MODEL_LEN, SERVED_NAME, free_port, running_vllm

pytestmark = pytest.mark.vllm

QUESTIONS = 3
MAX_STEPS = 2


def eval_against(server, out, *extra):
    return run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        server.url,
        "--model",
        server.model,
        "--tokenizer",
        str(server.model_dir),
        "--limit",
        str(QUESTIONS),
        "--max-steps",
        str(MAX_STEPS),
        "--max-new-tokens",
        "16",
        "--out",
        str(out),
        *extra,
    )


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


def test_eval_with_id_prompts_compares_the_ids_the_server_received_at_every_step(vllm_server, tmp_path):
    run = tmp_path / "ids"
    done = eval_against(vllm_server, run, "--record-prompt-ids")
    assert done.returncode == 0, done.stderr
    found = trajectories(run)
    assert_every_episode_ran_on_the_server(found)
    steps = 0
    for trajectory in found:
        settings = trajectory["policy"]["settings"]
        assert settings["prompt_format"] == "ids" and settings["server_prompt_ids"] is True  # found at preflight
        assert settings["server_max_model_len"] == settings["max_context"] == MAX_MODEL_LEN  # the server's limit is the budget
        for step in trajectory["steps"]:
            generation, served = step["generation"], step["served"]
            # vLLM returned the ids it received: their digest is ours, and no differing ids were kept.
            assert served["server_sha256"] == served["sha256"] and "server_ids" not in served, served
            assert generation["server_prompt_tokens"] == generation["prompt_tokens"] == served["tokens"], step
            assert served["ids"]["append"], served
            steps += 1
    parity = run_cli(
        "check-parity", "--trajectories", str(run / "trajectories.jsonl"), "--tokenizer", str(vllm_server.model_dir), "--require-server-ids"
    )
    assert parity.returncode == 0, parity.stdout + parity.stderr
    assert f"ids compared on {steps} steps, counts only on 0, nothing on 0" in parity.stdout, parity.stdout


def test_a_prompt_over_the_servers_context_ends_as_context_limit(vllm_server, small_demo, tmp_path):
    long_question = "Which learning rate did the authors use? " * 900  # several thousand tokens: over max_model_len
    # Through the CLI: preflight read max_model_len, so the policy stops before sending.
    run = tmp_path / "long"
    done = run_cli(
        "run",
        "--policy",
        "openai",
        "--base-url",
        vllm_server.url,
        "--model",
        vllm_server.model,
        "--tokenizer",
        str(vllm_server.model_dir),
        "--question",
        long_question,
        "--max-steps",
        "1",
        "--out",
        str(run),
    )
    assert done.returncode == 0, done.stderr
    (trajectory,) = trajectories(run)
    assert trajectory["outcome"]["status"] == "context_limit", trajectory["outcome"]
    assert f"the context of {MAX_MODEL_LEN}" in trajectory["outcome"]["reason"]
    # Without preflight (our budget above the server's): the server's HTTP 400 is a context_limit too.
    policy = make_policy(make_config("openai", base_url=vllm_server.url, model=vllm_server.model, tokenizer=vllm_server.model_dir))
    refused = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig(max_steps=1)).run(long_question)
    assert refused.outcome.status == "context_limit", refused.outcome
    assert "maximum context length" in refused.outcome.reason


def test_new_tokens_beyond_the_room_left_are_clamped_and_recorded_as_clamped(vllm_server, tmp_path):
    run = tmp_path / "clamped"
    done = run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        vllm_server.url,
        "--model",
        vllm_server.model,
        "--tokenizer",
        str(vllm_server.model_dir),
        "--limit",
        "1",
        "--max-steps",
        "1",
        "--max-new-tokens",
        str(MAX_MODEL_LEN),
        "--out",
        str(run),
    )
    assert done.returncode == 0, done.stderr
    (trajectory,) = trajectories(run)
    (step,) = trajectory["steps"]
    generation = step["generation"]
    assert generation["clamped_max_tokens"] == MAX_MODEL_LEN - generation["prompt_tokens"], generation
    assert generation["hit_cap"] is False, generation  # not the policy's cap, whatever the server did
    assert generation["generated_tokens"] <= generation["clamped_max_tokens"]


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


def test_chat_requests_render_the_prompt_our_renderer_serves(vllm_server, tmp_path):
    """With chat_template_kwargs enable_thinking false, the server's template and our renderer agree on the first step's
    prompt (without it, the server renders the thinking-mode generation prompt: fewer tokens). Later steps are not compared:
    the template drops the empty think block of each earlier assistant turn (Qwen3's does the same), which our renderer
    keeps so that every prompt is a prefix of the training sequence, and it reads the model's text as a whole."""
    run = tmp_path / "chat-counts"
    done = eval_against(vllm_server, run, "--api", "chat")
    assert done.returncode == 0, done.stderr
    for trajectory in trajectories(run):
        first = trajectory["steps"][0]
        assert first["generation"]["usage_prompt_tokens"] == first["served"]["tokens"], first


def test_a_server_killed_mid_run_ends_episodes_as_policy_error_and_resume_finishes(vllm_server, tmp_path):
    port, log, run = free_port(), tmp_path / "private.log", tmp_path / "killed"
    flags = [
        "eval",
        "--policy",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(vllm_server.model_dir),
        "--limit",
        "32",  # enough that, however slow the machine, most episodes are still to run when the server dies
        "--max-steps",
        "2",
        "--max-new-tokens",
        "16",
        "--concurrency",
        "4",
        "--timeout",
        "60",
        "--retries",
        "1",
        "--max-consecutive-errors",
        "2",
        "--out",
        str(run),
    ]
    with running_vllm(vllm_server.model_dir, log, port=port) as server:
        evaluating = subprocess.Popen(
            explorer_command(*flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=checkout_environment()
        )
        written = run / "trajectories.jsonl"
        deadline = time.monotonic() + HANG_SECONDS
        while not (written.exists() and written.read_text().count("\n") >= 1) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(server.process.pid, signal.SIGKILL)  # the API server, its engine core and its workers, at once
        stdout, stderr = evaluating.communicate(timeout=HANG_SECONDS)
    assert evaluating.returncode == 1, stdout + stderr
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "--resume --retry-errors" in said[0], stderr
    found = trajectories(run)
    failed = [t for t in found if t["outcome"]["status"] == "policy_error"]
    assert failed, [t["outcome"] for t in found]
    for trajectory in failed:
        assert "request failed" in trajectory["outcome"]["reason"], trajectory["outcome"]
    with running_vllm(vllm_server.model_dir, log, port=port):
        resumed = run_cli("eval", "--out", str(run), "--resume", "--retry-errors")
    assert resumed.returncode == 0, resumed.stderr
    finished = trajectories(run)
    assert len(finished) == 32 and all(t["outcome"]["status"] != "policy_error" for t in finished), [t["outcome"] for t in finished]


def test_the_memory_reader_sends_the_server_the_ids_check_parity_rebuilds(vllm_server, tmp_path):
    run = tmp_path / "reader"
    done = run_cli(
        "eval", "--policy", "memory-reader", "--backend", "openai", "--base-url", vllm_server.url, "--model", vllm_server.model,
        "--tokenizer", str(vllm_server.model_dir), "--scope", "paper", "--page-tokens", "256", "--memory-tokens", "16",
        "--answer-tokens", "8", "--limit", "1", "--out", str(run),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (trajectory,) = trajectories(run)
    assert trajectory["outcome"]["status"] in ("submitted", "no_answer"), trajectory["outcome"]
    reading = trajectory["steps"][-1]["policy_info"]["reading"]
    calls = [*reading["updates"], reading["answer"]]
    assert len(reading["updates"]) == reading["pages"] > 1
    for call in calls:
        served, generation = call["served"], call["generation"]
        # vLLM returned the ids it received: their digest is ours, counted as ours.
        assert served["server_sha256"] == served["sha256"] and generation["server_prompt_tokens"] == served["tokens"], call
        assert 1 <= generation["generated_tokens"] <= 16 and generation["api_retries"] == 0, generation
    assert all(update["memory_tokens_out"] <= 16 for update in reading["updates"])
    parity = run_cli("check-parity", "--trajectories", str(run / "trajectories.jsonl"), "--tokenizer", str(vllm_server.model_dir))
    assert parity.returncode == 0, parity.stdout + parity.stderr
    assert f"{len(calls)} memory-reader prompts rebuilt and matched" in parity.stdout, parity.stdout


def test_an_episode_probe_reads_the_servers_log_probabilities(vllm_server, small_demo, tmp_path):
    """One episode with an option probe against the real server: its top log-probabilities labelled
    by token id, or the prompt_logprobs fallback for an option outside them, give the probabilities
    one hf forward pass of the same prompt gives. The served tiny model's tokenizer (trained on the
    demo corpus) makes two tokens of "Yes", so the probe is asked from a file whose options are one
    token of it (--probes-file)."""
    import torch

    from paper_explorer.agent import probes
    from paper_explorer.agent.policies.hf import HFPolicy

    probes_file = tmp_path / "probes.toml"
    probes_file.write_text('[answerable]\ntext = "Can the papers answer the question? Reply A (yes) or B (no)."\noptions = ["A", "B"]\n')
    policy = make_policy(
        make_config("openai", base_url=vllm_server.url, model=vllm_server.model, tokenizer=vllm_server.model_dir, max_new_tokens=16)
    )
    policy.preflight()
    question = small_demo.questions[0]
    config = EpisodeConfig(max_steps=1, probes=["answerable"], probes_file=probes_file)
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, config).run(question.text, question)
    assert trajectory.outcome.status != "policy_error", trajectory.outcome
    (result,) = trajectory.probes
    assert result.not_measured is None and result.source in ("server", "server+fallback"), result
    assert abs(sum(result.probabilities) - 1) < 1e-9 and 0 < result.mass <= 1
    assert (result.fallback_options is not None) == (result.source == "server+fallback")
    local = HFPolicy.load(str(vllm_server.model_dir))
    prompt = probes.probe_prompt(local.renderer, trajectory.messages(), probes.load_probes(probes_file).probes["answerable"])
    assert probes.ids_sha256(prompt) == result.prompt_sha256
    hf_probabilities, _ = probes.from_logprobs(local.probe(prompt, result.option_ids, use_cache=False).logprobs)
    assert max(abs(a - b) for a, b in zip(hf_probabilities, result.probabilities, strict=True)) < 1e-3, (hf_probabilities, result)
    # The likeliest token is in the top log-probabilities: read from its "token_id:N" label, with no fallback.
    with torch.inference_mode():
        logits = local.model(input_ids=torch.tensor([prompt]), use_cache=False, logits_to_keep=1).logits[0, -1]
    likeliest = int(logits.argmax())
    reading = policy.probe(prompt, [likeliest])
    assert reading.not_measured is None and reading.source == "server" and reading.fallback == (), reading
    assert abs(reading.logprobs[0] - float(torch.log_softmax(logits.float(), dim=-1)[likeliest])) < 1e-3, reading
