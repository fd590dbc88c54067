"""A run against a server that is down, wrong, or failing: one line before any episode, an early
stop after consecutive errors, and --resume --retry-errors that replaces the failed episodes."""

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.agent.test_openai_policy import FakeServer
from tests.conftest import run_cli



@pytest.fixture
def server():
    fake = FakeServer(models=["served"])
    yield fake
    fake.server.shutdown()


def openai_eval(url, tokenizer, out, *flags):
    return run_cli("eval", "--policy", "openai", "--base-url", url, "--model", "served", "--tokenizer", str(tokenizer),
                   "--split", "all", "--limit", "6", "--retries", "0", "--out", str(out), *flags)


def test_a_dead_server_is_one_line_before_any_episode(tiny_tokenizer, tmp_path):
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # a port nobody listens on once this closes
    started = time.monotonic()
    done = openai_eval(f"http://127.0.0.1:{port}/v1", tiny_tokenizer, tmp_path / "run")
    assert done.returncode == 2 and "no server answers" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()
    assert time.monotonic() - started < 600  # bounds a hang only: no retries or backoff before the check


def test_a_server_of_another_model_is_named(server, tiny_tokenizer, tmp_path):
    server.models = ["Qwen/Qwen3-8B"]
    done = openai_eval(server.url, tiny_tokenizer, tmp_path / "run")
    assert done.returncode == 2 and "serves Qwen/Qwen3-8B" in done.stderr and not server.requests


def test_consecutive_errors_stop_the_run_and_retry_errors_replaces_them(server, tiny_tokenizer, tmp_path):
    server.answers = [(400, {"error": "bad request"})] * 2
    stopped = openai_eval(server.url, tiny_tokenizer, tmp_path / "run", "--max-consecutive-errors", "2")
    assert stopped.returncode == 1 and "stopped after 2 consecutive episodes ended in policy_error" in stopped.stderr
    assert len(server.requests) == 2
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["outcome"]["status"] for line in lines] == ["policy_error", "policy_error"]
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume", "--retry-errors")
    assert resumed.returncode == 0, resumed.stderr
    assert "replaced 2 episodes" in resumed.stderr
    episodes = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and len({e["question_id"] for e in episodes}) == 6
    assert {e["outcome"]["status"] for e in episodes} == {"submitted"}
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == {"submitted": 6} and metrics["duplicate_lines"] == 0


def test_episodes_that_never_answered_are_their_own_columns_and_earn_no_evidence(tmp_path):
    done = run_cli("eval", "--policy", "read-all", "--max-steps", "1", "--split", "all", "--limit", "8", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    table = metrics["abstention"]
    assert sum(row["step_limit"] for row in table.values()) == 8 and all(row["answered"] == 0 for row in table.values())
    assert metrics["evidence_f1_strict"] == 0 and metrics["detector_rates"]["no_answer"] == 1.0
    assert "step_limit" in done.stdout and "evidence_f1_strict" in done.stdout
