"""The openai policy against a scripted fake server (retries, failures, parity warnings) and for
real against `transformers serve` on the tiny model."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.parity import check_trajectory
from agent.policies import PolicyConfig, make_policy
from agent.renderer import ChatRenderer
from agent.runner import EpisodeRunner
from agent.trajectory import EpisodeConfig
from corpus import BM25Index
from tests.conftest import HANG_SECONDS, run_cli

SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'


class FakeServer:
    """Answers POSTs from a list of (status, body), or with ``respond(body)`` when given, and records
    each request's path, body and headers; /v1/models lists ``models`` (None: no such endpoint)."""

    def __init__(self, models: list[str] | None = None, respond=None):
        self.answers, self.requests, self.headers, self.models = [], [], [], models
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if fake.models is None:
                    self.send_error(501)
                    return
                self.send_json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in fake.models]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, **body})
                fake.headers.append(dict(self.headers))
                if respond is not None:
                    self.send_json(*respond(body))
                    return
                status, answer = fake.answers.pop(0) if fake.answers else (200, fake.completion(SUBMIT, len(body["prompt"])))
                if status == "truncated":  # promise 500 bytes, send 10, hang up
                    self.send_response(200)
                    self.send_header("Content-Length", "500")
                    self.end_headers()
                    self.wfile.write(b'{"choices"')
                    self.close_connection = True
                    return
                self.send_json(status, answer)

            def send_json(self, status, answer):
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def completion(text, prompt_tokens, finish="stop"):
        return {"choices": [{"text": text, "finish_reason": finish}], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 9}}


@pytest.fixture
def server():
    fake = FakeServer()
    yield fake
    fake.server.shutdown()


@pytest.fixture(scope="module")
def index(small_demo):
    return BM25Index.build(small_demo)


def episode(small_demo, index, server, tiny_tokenizer, **options):
    policy = make_policy(PolicyConfig(name="openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer,
                                                 **{"retries": 2, **options}))
    policy.backoff = 0.01
    question = small_demo.questions[0]
    return EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=3)).run(question.text, question)


def test_token_ids_are_sent_and_the_answer_runs(server, small_demo, index, tiny_tokenizer):
    trajectory = episode(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "submitted" and trajectory.outcome.answer == "3e-5"
    (request,) = server.requests
    assert request["path"] == "/v1/completions" and request["temperature"] == 0 and request["stop"] == ["<|im_end|>"]
    assert isinstance(request["prompt"], list) and all(isinstance(i, int) for i in request["prompt"])
    generation = trajectory.steps[0].generation
    assert generation.prompt_tokens == len(request["prompt"]) and generation.parity_warning is None
    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    assert request["prompt"] == renderer.prompt(trajectory.messages(upto=0))  # the served ids are the trained ones
    assert check_trajectory(trajectory, renderer) is None


def test_server_errors_are_retried_with_backoff_and_counted(server, small_demo, index, tiny_tokenizer):
    server.answers = [(503, {"error": "busy"}), (429, {"error": "slow down"})]
    trajectory = episode(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "submitted" and trajectory.steps[0].generation.api_retries == 2


def test_a_truncated_answer_is_retried(server, small_demo, index, tiny_tokenizer):
    server.answers = [("truncated", None)]
    trajectory = episode(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "submitted" and trajectory.steps[0].generation.api_retries == 1


def test_a_request_that_keeps_failing_ends_the_episode_as_policy_error(server, small_demo, index, tiny_tokenizer):
    server.answers = [(500, {"error": "down"})] * 3
    trajectory = episode(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "policy_error" and "after 3 attempt(s)" in trajectory.outcome.reason
    assert trajectory.failed_request_retries == 2  # counted in the run's api_retries, not lost with the step
    server.answers, server.requests = [(400, {"error": "bad request"})], []
    refused = episode(small_demo, index, server, tiny_tokenizer)
    assert refused.outcome.status == "policy_error" and len(server.requests) == 1  # a 400 is not retried


def test_text_prompts_record_a_parity_warning_when_the_server_counts_otherwise(server, small_demo, index, tiny_tokenizer):
    server.answers = [(200, FakeServer.completion(SUBMIT, 3))]
    trajectory = episode(small_demo, index, server, tiny_tokenizer, prompt_format="text")
    assert isinstance(server.requests[0]["prompt"], str) and server.requests[0]["prompt"].startswith("<|im_start|>system\n")
    assert "the server counted 3 prompt tokens" in trajectory.steps[0].generation.parity_warning


def test_an_unreachable_server_is_a_policy_error_not_a_crash(small_demo, index, tiny_tokenizer):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = make_policy(PolicyConfig(name="openai", base_url=f"http://127.0.0.1:{port}/v1", model="m", tokenizer=tiny_tokenizer, retries=1))
    policy.backoff = 0.01
    question = small_demo.questions[0]
    trajectory = EpisodeRunner(small_demo, index, policy, EpisodeConfig()).run(question.text, question)
    assert trajectory.outcome.status == "policy_error" and "Connection refused" in trajectory.outcome.reason


@pytest.fixture(scope="module")
def transformers_server(tiny_model):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).parent / "transformers"), "serve", str(tiny_model), "--host", "127.0.0.1", "--port", str(port)]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            if process.poll() is not None:
                pytest.fail("transformers serve exited at start")
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail(f"transformers serve did not come up within {HANG_SECONDS} s")
    yield url + "/v1"
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.mark.slow
def test_eval_against_transformers_serve_with_episodes_in_flight(transformers_server, tiny_model, tmp_path):
    out = tmp_path / "run"
    done = run_cli("eval", "--policy", "openai", "--base-url", transformers_server, "--model", str(tiny_model),
                   "--tokenizer", str(tiny_model), "--prompt-format", "text", "--max-new-tokens", "8", "--max-steps", "2",
                   "--limit", "4", "--workers", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert trajectory["outcome"]["status"] == "step_limit", trajectory["outcome"]
        for step in trajectory["steps"]:
            generation = step["generation"]
            assert generation["server_prompt_tokens"] > 0 and generation["api_retries"] == 0
            assert ("parity_warning" in generation) == (generation["server_prompt_tokens"] != generation["prompt_tokens"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == {"step_limit": 4} and metrics["api_retries"] == 0


def test_sampling_settings_and_the_episode_seed_reach_the_server(server, small_demo, index, tiny_tokenizer):
    trajectory = episode(small_demo, index, server, tiny_tokenizer, temperature=0.7, top_p=0.9, top_k=20)
    (request,) = server.requests
    assert (request["temperature"], request["top_p"], request["top_k"]) == (0.7, 0.9, 20)
    assert request["seed"] == trajectory.episode_seed and trajectory.policy.settings["decoding"] == "sampling"
    server.requests = []
    greedy = episode(small_demo, index, server, tiny_tokenizer)
    assert server.requests[0]["temperature"] == 0 and "top_p" not in server.requests[0]
    assert greedy.policy.settings["decoding"] == "greedy"


def test_a_key_a_server_echoes_back_is_never_recorded(server, small_demo, index, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    server.answers = [(500, {"error": "bad key Bearer sk-very-secret"})] * 3
    trajectory = episode(small_demo, index, server, tiny_tokenizer)
    assert trajectory.outcome.status == "policy_error" and "sk-very-secret" not in trajectory.model_dump_json()
    assert "[OPENAI_API_KEY]" in trajectory.outcome.reason


def test_a_lone_surrogate_in_any_server_field_never_costs_the_log(small_demo, index, tiny_tokenizer):
    """finish_reason (or any other field a server fills) holding a lone surrogate: the step is
    recorded with U+FFFD, and the episode and its log line are written."""
    def respond(body):
        answer = FakeServer.completion(SUBMIT, len(body["prompt"]), finish="stop\ud800")
        return 200, answer

    fake = FakeServer(respond=respond)
    try:
        trajectory = episode(small_demo, index, fake, tiny_tokenizer)
    finally:
        fake.server.shutdown()
    assert trajectory.outcome.status == "submitted" and trajectory.steps[0].generation.finish_reason == "stop\ufffd"
    trajectory.model_dump_json()  # what the log writes
