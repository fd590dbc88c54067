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

from paper_explorer.agent.parity import check_trajectory
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from tests.conftest import HANG_SECONDS, run_cli, run_cli_process

SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'


class FakeServer:
    """Answers POSTs from a list of (status, body), or with ``respond(body)`` when given, and records
    each request's path, body and headers; /v1/models lists ``models`` (None: no such endpoint; a
    dict: the entry as it is, vLLM's root and parent), with ``max_model_len`` when given.

    ``authorizations``: the Authorization header of every request it got, of any method and path.
    Preflight's test prompt (one token asked for, a prompt of a few) is answered as vLLM would and
    kept in ``probes``, not in ``requests``. ``return_ids``: the prompt's ids come back when a
    request asks (vLLM's ``return_token_ids``); ``refuse_ids``: a token-id prompt is refused with
    HTTP 400 (``transformers serve``); ``max_model_len``: a longer prompt is refused with vLLM's
    HTTP 400; ``top_logprobs(body)``: a short prompt asking for log-probabilities (how the policy
    finds which ones the server returns) is answered with these top ones, by token id."""

    def __init__(
        self, models: list[str] | None = None, respond=None, return_ids=False, refuse_ids=False, max_model_len=None, top_logprobs=None
    ):
        self.answers, self.requests, self.headers, self.models, self.probes = [], [], [], models, []
        self.authorizations: list[str | None] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def parse_request(self):
                parsed = super().parse_request()
                if parsed:
                    fake.authorizations.append(self.headers.get("Authorization"))
                return parsed

            def do_GET(self):
                if fake.models is None:
                    self.send_error(501)
                    return
                limit = {"max_model_len": max_model_len} if max_model_len else {}
                listed = [
                    {"id": m, "object": "model", **limit} if isinstance(m, str) else {"object": "model", **limit, **m} for m in fake.models
                ]
                self.send_json(200, {"object": "list", "data": listed})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body.get("prompt")
                if refuse_ids and isinstance(prompt, list):
                    self.send_json(400, {"error": "prompt must be a string"})
                    return
                if max_model_len and isinstance(prompt, list) and len(prompt) > max_model_len:
                    self.send_json(
                        400,
                        {
                            "error": {
                                "message": f"This model's maximum context length is {max_model_len} tokens. However, "
                                f"your prompt contains {len(prompt)} input tokens.",
                                "param": "input_tokens",
                                "code": 400,
                            }
                        },
                    )
                    return
                if (
                    body.get("max_tokens") == 1 and prompt is not None and len(prompt) < 16 and "prompt_logprobs" not in body
                ):  # preflight's test prompt
                    fake.probes.append(body)
                    answer = fake.completion("", len(prompt))
                    if top_logprobs is not None and body.get("logprobs"):
                        tops = {f"token_id:{token}": value for token, value in top_logprobs(body).items()}
                        answer["choices"][0]["logprobs"] = {"top_logprobs": [tops]}
                    self.send_json(200, fake.with_ids(body, answer))
                    return
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
                self.send_json(status, fake.with_ids(body, answer) if status == 200 else answer)

            def send_json(self, status, answer):
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.return_ids = return_ids
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def with_ids(self, body, answer):
        """``answer`` with the prompt's ids as vLLM returns them, when this server does and the request asked."""
        if self.return_ids and body.get("return_token_ids") and isinstance(body.get("prompt"), list) and "choices" in answer:
            answer = {**answer, "choices": [{**answer["choices"][0], "prompt_token_ids": body["prompt"]}]}
        return answer

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
    policy = make_policy(make_config("openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer, **{"retries": 2, **options}))
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
    policy = make_policy(make_config("openai", base_url=f"http://127.0.0.1:{port}/v1", model="m", tokenizer=tiny_tokenizer, retries=1))
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
    # --workers forks episode processes from the caller: a process of its own, not the test process
    done = run_cli_process(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        transformers_server,
        "--model",
        str(tiny_model),
        "--tokenizer",
        str(tiny_model),
        "--prompt-format",
        "text",
        "--max-new-tokens",
        "8",
        "--max-steps",
        "2",
        "--limit",
        "4",
        "--workers",
        "2",
        "--out",
        str(out),
    )
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


@pytest.mark.parametrize("key", ["sk-very-secret-0123\r", "sk-very-secret-0123\n", "sk-very\nsecret-0123"])
def test_a_key_a_header_cannot_carry_is_refused_in_one_line_that_never_shows_it(server, tiny_tokenizer, tmp_path, key):
    """A key file saved with Windows line ends leaves a carriage return in OPENAI_API_KEY:
    http.client refuses the header with the whole key in its message, which was printed (and would
    be recorded as an episode's failure). Refused before any request, naming its place only."""
    out = tmp_path / "run"
    done = run_cli(
        "eval", "--policy", "openai", "--base-url", server.url, "--model", "served", "--tokenizer", str(tiny_tokenizer),
        "--limit", "1", "--out", str(out), env={"OPENAI_API_KEY": key},
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "OPENAI_API_KEY holds the control character" in done.stderr and "secret" not in done.stderr + done.stdout, done.stderr
    assert server.requests == [] and server.authorizations == []


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


def preflighted(server, tiny_tokenizer, **options):
    policy = make_policy(make_config("openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer, **{"retries": 1, **options}))
    policy.backoff = 0.01
    return policy, policy.preflight()


def run_episode(small_demo, index, policy, question=None, max_steps=3):
    question = question or small_demo.questions[0]
    return EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=max_steps)).run(question.text, question)


def eval_flags(server, tiny_tokenizer, out, *extra):
    return (
        "eval",
        "--policy",
        "openai",
        "--base-url",
        server.url,
        "--model",
        "served",
        "--tokenizer",
        str(tiny_tokenizer),
        "--limit",
        "2",
        "--max-steps",
        "2",
        "--out",
        str(out),
        *extra,
    )


def test_a_server_that_returns_the_prompts_ids_is_asked_for_them_and_check_parity_compares_them(tiny_tokenizer, tmp_path):
    fake = FakeServer(models=["served"], return_ids=True)
    try:
        run = tmp_path / "ids"
        done = run_cli(*eval_flags(fake, tiny_tokenizer, run, "--record-prompt-ids"))
        assert done.returncode == 0, done.stderr
        assert fake.probes and all(request["return_token_ids"] is True for request in fake.requests)
    finally:
        fake.server.shutdown()
    found = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    steps = [step for t in found for step in t["steps"]]
    assert all(t["policy"]["settings"]["server_prompt_ids"] is True for t in found)
    assert all(step["served"]["server_sha256"] == step["served"]["sha256"] for step in steps)
    held = run_cli("check-parity", "-t", str(run / "trajectories.jsonl"), "--tokenizer", str(tiny_tokenizer), "--require-server-ids")
    assert held.returncode == 0, held.stderr
    assert f"ids compared on {len(steps)} steps, counts only on 0, nothing on 0" in held.stdout


def test_without_ids_from_the_server_the_verdict_says_counts_only_and_require_server_ids_fails(server, tiny_tokenizer, tmp_path):
    server.models = ["served"]
    run = tmp_path / "counts"
    done = run_cli(*eval_flags(server, tiny_tokenizer, run))
    assert done.returncode == 0, done.stderr
    assert "does not return the prompt's token ids" in " ".join((done.stdout + done.stderr).split())  # said at preflight
    assert server.probes and not any("return_token_ids" in request for request in server.requests)  # not asked of it
    steps = sum(len(json.loads(line)["steps"]) for line in (run / "trajectories.jsonl").read_text().splitlines())
    held = run_cli("check-parity", "-t", str(run / "trajectories.jsonl"), "--tokenizer", str(tiny_tokenizer))
    assert held.returncode == 0 and f"ids compared on 0 steps, counts only on {steps}, nothing on 0" in held.stdout, held.stdout
    required = run_cli("check-parity", "-t", str(run / "trajectories.jsonl"), "--tokenizer", str(tiny_tokenizer), "--require-server-ids")
    assert required.returncode == 1 and "no prompt ids from the server were recorded" in required.stderr


def test_ids_the_server_received_otherwise_are_kept_and_fail_parity_where_they_differ(small_demo, index, tiny_tokenizer, tmp_path):
    def respond(body):
        answer = FakeServer.completion(SUBMIT, len(body["prompt"]))
        answer["choices"][0]["prompt_token_ids"] = body["prompt"][:5] + [7] + body["prompt"][6:]
        return 200, answer

    fake = FakeServer(models=["served"], return_ids=True, respond=respond)
    try:
        policy, _ = preflighted(fake, tiny_tokenizer)
        question = small_demo.questions[0]
        trajectory = EpisodeRunner(small_demo, index, policy, EpisodeConfig(max_steps=3, record_prompt_ids=True)).run(
            question.text, question
        )
    finally:
        fake.server.shutdown()
    served = trajectory.steps[0].served
    assert served.server_ids is not None and served.server_ids[5] == 7
    mismatch = check_trajectory(trajectory, ChatRenderer.from_directory(tiny_tokenizer))
    assert mismatch is not None and mismatch.position == 5  # the first differing token, shown on both sides


def test_a_server_that_refuses_token_id_prompts_is_one_line_naming_the_chat_api_before_anything_is_written(tiny_tokenizer, tmp_path):
    fake = FakeServer(models=["served"], refuse_ids=True)
    try:
        run = tmp_path / "refused"
        done = run_cli(*eval_flags(fake, tiny_tokenizer, run))
    finally:
        fake.server.shutdown()
    assert done.returncode == 2 and "--api chat" in done.stderr and "prompt must be a string" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not run.exists() and not fake.requests


def test_the_servers_max_model_len_is_the_budget_and_a_larger_max_context_is_refused(tiny_tokenizer, tmp_path):
    fake = FakeServer(models=["served"], max_model_len=2048)
    try:
        policy, _ = preflighted(fake, tiny_tokenizer)
        assert policy.max_context == 2048 and policy.settings().server_max_model_len == 2048
        run = tmp_path / "too-long"
        done = run_cli(*eval_flags(fake, tiny_tokenizer, run, "--max-context", "8192"))
        assert done.returncode == 2 and "--max-context 8192 is more than the server's max_model_len of 2048" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not run.exists()
        smaller, _ = preflighted(fake, tiny_tokenizer, max_context=1024)
        assert smaller.max_context == 1024  # a budget under the server's is the user's to choose
        default = run_cli(*eval_flags(fake, tiny_tokenizer, tmp_path / "default-given", "--max-context", "32768"))
        assert default.returncode == 2 and "--max-context 32768 is more than" in default.stderr  # given, even at the old default
    finally:
        fake.server.shutdown()


def test_a_prompt_over_the_servers_limit_is_context_limit_before_sending_or_from_its_400(small_demo, index, tiny_tokenizer):
    fake = FakeServer(models=["served"], max_model_len=300)
    try:
        policy, _ = preflighted(fake, tiny_tokenizer)
        stopped = run_episode(small_demo, index, policy)
        assert stopped.outcome.status == "context_limit" and not fake.requests  # ours: nothing sent
        unchecked = make_policy(make_config("openai", base_url=fake.url, model="served", tokenizer=tiny_tokenizer, retries=1))
        refused = run_episode(small_demo, index, unchecked)  # no preflight: the server's HTTP 400 says it
        assert refused.outcome.status == "context_limit" and "maximum context length is 300" in refused.outcome.reason
    finally:
        fake.server.shutdown()


def test_new_tokens_beyond_the_room_left_are_clamped_and_not_the_policys_cap(small_demo, index, tiny_tokenizer):
    fake = FakeServer(models=["served"], max_model_len=2048)
    fake.answers = [(200, FakeServer.completion("no code here", None, finish="length"))]
    try:
        policy, _ = preflighted(fake, tiny_tokenizer, max_new_tokens=4000)
        trajectory = run_episode(small_demo, index, policy, max_steps=1)
    finally:
        fake.server.shutdown()
    generation = trajectory.steps[0].generation
    (request,) = fake.requests
    assert request["max_tokens"] == 2048 - generation.prompt_tokens == generation.clamped_max_tokens
    assert generation.finish_reason == "length" and generation.hit_cap is False


def test_a_server_that_shortens_the_request_itself_is_not_the_policys_cap(server, small_demo, index, tiny_tokenizer):
    answer = FakeServer.completion("no code here", None, finish="length")
    answer["usage"]["completion_tokens"] = 3  # fewer than the 16 asked for: the server cut it, not our cap
    server.answers = [(200, answer), (200, {**answer, "usage": {"completion_tokens": 16}})]
    trajectory = run_episode(
        small_demo,
        index,
        make_policy(make_config("openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer, max_new_tokens=16)),
        max_steps=2,
    )
    assert [step.generation.hit_cap for step in trajectory.steps] == [False, True]


THOUGHT_THEN_SUBMIT = '<think>\nThe answer is in the abstract.\n```python\nsubmit("3e-5", evidence=[])\n```'


def test_a_turn_ended_without_closing_its_think_block_is_its_whole_text_and_renders_back_exactly(small_demo, index, tiny_tokenizer):
    fake = FakeServer(
        models=["served"], return_ids=True, respond=lambda body: (200, FakeServer.completion(THOUGHT_THEN_SUBMIT, len(body["prompt"])))
    )
    try:
        policy, _ = preflighted(fake, tiny_tokenizer, thinking=True)
        trajectory = run_episode(small_demo, index, policy)
    finally:
        fake.server.shutdown()
    step = trajectory.steps[0]
    assert step.generation.thinking_unclosed is True and step.generation.thinking_budget_hit is False
    assert step.reasoning is None and step.action_text == THOUGHT_THEN_SUBMIT  # Qwen3's template: no </think>, all content
    assert trajectory.outcome.status == "submitted"  # its action ran
    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    assert fake.requests[0]["prompt"] == renderer.prompt(trajectory.messages(upto=0), thinking=True)
    assert check_trajectory(trajectory, renderer) is None
    trained = renderer.render(trajectory.messages()).ids
    written = [renderer.think, *renderer.text(THOUGHT_THEN_SUBMIT.removeprefix("<think>")), renderer.end_of_turn]
    start = len(fake.requests[0]["prompt"])
    assert trained[start : start + len(written)] == written  # the <think> it opened is the control token, as generated


def test_a_think_block_still_open_at_the_token_limit_is_a_budget_hit(server, small_demo, index, tiny_tokenizer):
    server.answers = [(200, FakeServer.completion("<think>\nstill thinking", None, finish="length"))]
    trajectory = run_episode(
        small_demo,
        index,
        make_policy(make_config("openai", base_url=server.url, model="served", tokenizer=tiny_tokenizer, thinking=True)),
        max_steps=1,
    )
    generation = trajectory.steps[0].generation
    assert generation.thinking_budget_hit is True and not generation.thinking_unclosed and trajectory.steps[0].action_text == ""


# --- recorded draws (episode.record_sampled: what explorer rl trains on) ------------------------

LOGITS = [2.0, 1.0, 0.5, -1.0, -3.0]  # the fake model's next-token logits, of token ids 5 to 9


def log_softmax(values: list[float]) -> list[float]:
    import math

    top = max(values)
    total = math.log(sum(math.exp(v - top) for v in values)) + top
    return [v - total for v in values]


def logprobs_as(mode: str):
    """The top log-probabilities a vLLM in ``mode`` returns for the fake model: raw ones are of the
    logits whatever the temperature; processed ones of the logits over the request's temperature."""

    def top(body):
        scale = body["temperature"] if mode == "processed" else 1.0
        return dict(zip(range(5, 10), log_softmax([v / scale for v in LOGITS])))

    return top


def drawing(renderer, text=SUBMIT, omit=(), ids_of=None):
    """A vLLM that drew ``text`` then the end of turn, returning their ids (but ``ids_of(ids)``) and
    log-probabilities when asked, less the fields named in ``omit``."""

    def respond(body):
        answer = FakeServer.completion(text, len(body["prompt"]))
        ids = [*renderer.text(text), renderer.end_of_turn]
        ids = ids_of(ids) if ids_of else ids
        choice = answer["choices"][0]
        if body.get("return_token_ids") and "token_ids" not in omit:
            choice["token_ids"] = ids
        if body.get("logprobs") is not None and "logprobs" not in omit:
            choice["logprobs"] = {"token_logprobs": [-0.25] * len(ids), "tokens": [f"token_id:{i}" for i in ids]}
        return 200, answer

    return respond


def sampled_episode(small_demo, index, fake, tiny_tokenizer, record=True, **options):
    policy = make_policy(make_config("openai", base_url=fake.url, model="served", tokenizer=tiny_tokenizer, **{"retries": 0, **options}))
    question = small_demo.questions[0]
    config = EpisodeConfig(max_steps=1, record_prompt_ids=record, record_sampled=record)
    return EpisodeRunner(small_demo, index, policy, config).run(question.text, question)


@pytest.mark.parametrize("mode, temperature, recorded", [("raw", 0.7, 1.0), ("processed", 0.7, 0.7), ("raw", 1.0, 1.0)])
def test_a_recorded_draw_holds_the_servers_ids_and_logprobs_at_the_temperature_they_are_at(
    small_demo, index, tiny_tokenizer, mode, temperature, recorded
):
    from paper_explorer.rl.sequences import sequences_of

    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    fake = FakeServer(models=["served"], respond=drawing(renderer), top_logprobs=logprobs_as(mode))
    try:
        trajectory = sampled_episode(small_demo, index, fake, tiny_tokenizer, temperature=temperature)
    finally:
        fake.server.shutdown()
    assert trajectory.outcome.status == "submitted", trajectory.outcome.reason
    (request,) = fake.requests
    # the ids and their log-probabilities asked for; stopped on the stop tokens, as the hf policy stops; nothing of the model's generation_config
    assert request["return_token_ids"] is True and request["logprobs"] == 0 and request["skip_special_tokens"] is False
    assert "stop" not in request and request["stop_token_ids"] == sorted(renderer.stop_ids)
    assert (request["top_p"], request["top_k"], request["min_p"], request["repetition_penalty"]) == (1.0, 0, 0.0, 1.0)
    sampled = trajectory.steps[0].served.sampled
    assert sampled.ids == [*renderer.text(SUBMIT), renderer.end_of_turn] and sampled.logprobs == [-0.25] * len(sampled.ids)
    assert sampled.source == "server" and sampled.temperature == recorded
    # which log-probabilities the server returns was asked only where it matters: at a temperature other than 1
    asked = [probe["temperature"] for probe in fake.probes if probe.get("logprobs")]
    assert asked == ([0.5, 1.0] if temperature != 1 else [])
    (sequence,) = sequences_of(trajectory)  # what rl trains: at the sampling temperature, the recorded ones kept as they are
    assert sequence.temperature == temperature and sequence.old_logprobs == sampled.logprobs
    assert sequence.old_logprobs_temperature == (None if recorded == temperature else recorded)


def test_without_record_sampled_nothing_of_a_draw_is_asked(small_demo, index, tiny_tokenizer):
    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    fake = FakeServer(models=["served"], respond=drawing(renderer), top_logprobs=logprobs_as("raw"))
    try:
        trajectory = sampled_episode(small_demo, index, fake, tiny_tokenizer, record=False, temperature=0.7)
    finally:
        fake.server.shutdown()
    (request,) = fake.requests
    assert trajectory.outcome.status == "submitted" and trajectory.steps[0].served.sampled is None
    assert "logprobs" not in request and "token_ids" not in request and request["stop"] == ["<|im_end|>"]
    assert not [probe for probe in fake.probes if probe.get("logprobs")]


@pytest.mark.parametrize(
    "omit, ids_of, said",
    [
        (("token_ids",), None, "returned no completion token ids of this tokenizer (choices[0].token_ids: none)"),
        (("logprobs",), None, "returned no log-probabilities (choices[0].logprobs.token_logprobs) for"),
        ((), lambda ids: ids[1:], "returned completion ids that decode to other text than it wrote"),
        ((), lambda ids: [*ids[:-1], 10**9], "returned no completion token ids of this tokenizer"),
    ],
)
def test_a_server_that_omits_its_draw_or_whose_ids_are_not_its_text_is_a_policy_error_naming_it(
    small_demo, index, tiny_tokenizer, omit, ids_of, said
):
    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    fake = FakeServer(models=["served"], respond=drawing(renderer, omit=omit, ids_of=ids_of))
    try:
        trajectory = sampled_episode(small_demo, index, fake, tiny_tokenizer, temperature=1.0)
    finally:
        fake.server.shutdown()
    reason = trajectory.outcome.reason
    assert trajectory.outcome.status == "policy_error" and reason.startswith(f"{fake.url}/completions {said}"), reason
    assert "\n" not in reason and reason.endswith("so its draws cannot be recorded (explorer rl trains on them)")


def test_processed_logprobs_cut_by_top_p_are_refused_and_logits_are_no_logprobs(small_demo, index, tiny_tokenizer):
    renderer = ChatRenderer.from_directory(tiny_tokenizer)
    fake = FakeServer(models=["served"], respond=drawing(renderer), top_logprobs=logprobs_as("processed"))
    logits = FakeServer(models=["served"], respond=drawing(renderer), top_logprobs=lambda body: dict(zip(range(5, 10), LOGITS)))
    try:
        cut = sampled_episode(small_demo, index, fake, tiny_tokenizer, temperature=0.7, top_p=0.9)
        raw_logits = sampled_episode(small_demo, index, logits, tiny_tokenizer, temperature=0.7)
    finally:
        fake.server.shutdown()
        logits.server.shutdown()
    assert cut.outcome.status == "policy_error" and "after the top-p/top-k cut" in cut.outcome.reason and not fake.requests
    assert raw_logits.outcome.status == "policy_error" and "no log-probabilities" in raw_logits.outcome.reason
