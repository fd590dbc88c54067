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
    return run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        url,
        "--model",
        "served",
        "--tokenizer",
        str(tokenizer),
        "--split",
        "all",
        "--limit",
        "6",
        "--retries",
        "0",
        "--out",
        str(out),
        *flags,
    )


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


class ListingServer:
    """/v1/models answers ``body`` (bytes), ``drip`` bytes a second when set."""

    def __init__(self, body: bytes, drip: bool = False):
        import threading

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) * (1000 if drip else 1)))
                self.end_headers()
                try:
                    for byte in body if drip else [body]:
                        self.wfile.write(bytes([byte]) if drip else byte)
                        self.wfile.flush()
                        if drip:
                            time.sleep(0.5)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should: a traceback here would land in its captured stderr

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize(
    "body, drip, said",
    [
        (b'{"data": null}', False, "serves no model"),
        (b'{"object": "list", "data": [{"id": "served"}]}', True, "no server answers"),  # a byte every half second
    ],
)
def test_a_strange_model_listing_is_one_line(tiny_tokenizer, tmp_path, body, drip, said):
    listing = ListingServer(body, drip)
    try:
        done = openai_eval(listing.url, tiny_tokenizer, tmp_path / "run", "--timeout", "2")
    finally:
        listing.server.shutdown()
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written: run it again as is


def test_samples_run_k_seeded_episodes_per_question_resumably_with_pass_at_k(server, tiny_tokenizer, tmp_path):
    run = tmp_path / "run"
    done = openai_eval(server.url, tiny_tokenizer, run, "--samples", "3", "--temperature", "0.8", "--limit", "4")
    assert done.returncode == 0, done.stderr
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert sorted((e["question_id"], e["sample"]) for e in episodes) == sorted(
        (q, k) for q in {e["question_id"] for e in episodes} for k in range(3)
    )
    assert len({e["episode_seed"] for e in episodes}) == 12 and len({e["episode_id"] for e in episodes}) == 12
    assert sorted(r["seed"] for r in server.requests) == sorted(e["episode_seed"] for e in episodes)  # each request its own seed
    sampling = json.loads((run / "metrics.json").read_text())["sampling"]
    assert sampling["samples"] == 3 and sampling["questions"] == 4 and set(sampling["pass_at_k"]) == {"1", "2", "3"}
    assert sampling["agreement"] == 1.0  # the scripted server answers the same every time
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    (run / "trajectories.jsonl").write_text("\n".join(lines[:7]) + "\n")  # as if killed after 7 episodes
    resumed = run_cli("eval", "--out", str(run), "--resume")
    assert resumed.returncode == 0 and "resuming: 7 of 12" in resumed.stderr, resumed.stderr
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 12
    other = openai_eval(server.url, tiny_tokenizer, tmp_path / "other", "--limit", "4")
    assert other.returncode == 0, other.stderr
    compared = run_cli("compare", str(tmp_path / "other"), str(run))
    assert compared.returncode == 0 and "several samples per question" in compared.stderr and "4 paired questions" in compared.stdout


def test_a_log_holding_line_separators_survives_the_rewrite(server, tiny_tokenizer, tmp_path):
    text = '```python\n# a note\u2028and\u2029more\x85\nsubmit("x", evidence=[])\n```'
    server.answers = [(500, {"error": "down"})] * 2 + [(200, FakeServer.completion(text, None))] * 10
    first = openai_eval(server.url, tiny_tokenizer, tmp_path / "run", "--max-consecutive-errors", "2")
    assert first.returncode == 1
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume", "--retry-errors")
    assert resumed.returncode == 0 and "replaced 2 episodes" in resumed.stderr, resumed.stderr
    episodes = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_bytes().split(b"\n") if line]
    assert len(episodes) == 6 and {e["outcome"]["status"] for e in episodes} == {"submitted"}
    assert all("\u2028" in e["steps"][0]["action_text"] for e in episodes)


def seeded_server() -> FakeServer:
    """Answers by the request's seed: abstains on a third of seeds, else submits "x" - so the
    samples of one question disagree, and correctness varies across questions and samples."""

    def respond(body):
        action = 'abstain("not stated")' if body["seed"] % 3 == 0 else 'submit("x", evidence=[])'
        return 200, FakeServer.completion(f"```python\n{action}\n```", None)

    return FakeServer(respond=respond)


def test_pass_at_k_and_majority_vote_match_an_independent_computation(tiny_tokenizer, tmp_path):
    from itertools import combinations
    from statistics import fmean

    seeded = seeded_server()
    try:
        done = openai_eval(seeded.url, tiny_tokenizer, tmp_path / "run", "--samples", "4", "--temperature", "0.7", "--limit", "6")
    finally:
        seeded.server.shutdown()
    assert done.returncode == 0, done.stderr
    scores = [json.loads(line) for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()]
    by_question = {}
    for score in scores:
        by_question.setdefault(score["question_id"], []).append(score)
    assert len(by_question) == 6 and all(len(group) == 4 for group in by_question.values())
    assert len({s["prediction"] for s in scores}) == 2  # the samples disagree somewhere

    def brute_pass(group, k):  # the share of k-subsets of the samples holding a correct one
        subsets = list(combinations(group, k))
        return sum(any(s["exact_match"] >= 1 for s in subset) for subset in subsets) / len(subsets)

    def majority_f1(group):
        ordered = sorted(group, key=lambda s: s["sample"])
        counts = {}
        for s in ordered:
            counts[s["prediction"].lower()] = counts.get(s["prediction"].lower(), 0) + 1
        winner = max(counts, key=lambda p: (counts[p], -[s["prediction"].lower() for s in ordered].index(p)))
        return next(s["answer_f1"] for s in ordered if s["prediction"].lower() == winner), counts[winner] / len(group)

    sampling = json.loads((tmp_path / "run" / "metrics.json").read_text())["sampling"]
    for k in (1, 2, 4):
        assert sampling["pass_at_k"][str(k)] == pytest.approx(fmean(brute_pass(g, k) for g in by_question.values()))
    votes = [majority_f1(group) for group in by_question.values()]
    assert sampling["majority_answer_f1"] == pytest.approx(fmean(f1 for f1, _ in votes))
    assert sampling["agreement"] == pytest.approx(fmean(share for _, share in votes))
    assert sampling["mean_answer_f1"] == pytest.approx(fmean(fmean(s["answer_f1"] for s in g) for g in by_question.values()))


def test_a_run_whose_every_episode_ended_in_policy_error_fails_with_one_line(server, tiny_tokenizer, tmp_path):
    """Fewer episodes than --max-consecutive-errors, all failed (a server that refuses token ids, say):
    not a measurement, so exit 1 with what to do, and --retry-errors mends it."""
    server.answers = [(400, {"error": "prompt must be a string"})] * 3
    done = run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        server.url,
        "--model",
        "served",
        "--tokenizer",
        str(tiny_tokenizer),
        "--split",
        "all",
        "--limit",
        "3",
        "--retries",
        "0",
        "--out",
        str(tmp_path / "run"),
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1 and "every episode (3) ended in policy_error" in errors[0]
    assert "--api chat" in errors[0] and "--retry-errors" in errors[0]
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume", "--retry-errors")
    assert resumed.returncode == 0, resumed.stderr
