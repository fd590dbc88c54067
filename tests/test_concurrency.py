"""eval --concurrency and --workers: many episodes in flight in one process or several, against one server or several replicas."""

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from paper_explorer.agent.engine import EpisodeThreads, raise_descriptor_limit
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.servers import ServerPool
from paper_explorer.agent.renderer import ChatRenderer
from tests.agent.test_openai_policy import FakeServer
from tests.conftest import (
    HANG_SECONDS,
    checkout_environment,
    explorer_command,
    killed_once_logged,
    run_cli,
    run_cli_process,
    with_signals_a_terminal_leaves,
)

SEARCH = '```python\nhits = search("learning rate")\nprint(hits[:2])\n```'
SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'
TIMING = ("seconds", "started_at")


def scripted_server(tiny_tokenizer, latency=0.0, fail=None) -> FakeServer:
    """A search, then a submit, read from the prompt (no state per episode); ``fail(n)`` may turn
    the n-th request into an error answer."""
    im_start = ChatRenderer.from_directory(tiny_tokenizer).tokenizer.token_to_id("<|im_start|>")  # one a turn in its ChatML
    count = [0]
    lock = threading.Lock()

    def respond(body):
        with lock:
            count[0] += 1
            number = count[0]
        time.sleep(latency)
        if fail is not None and fail(number):
            return 503, {"error": "overloaded"}
        text = SEARCH if body["prompt"].count(im_start) <= 3 else SUBMIT
        return 200, FakeServer.completion(text, len(body["prompt"]))

    return FakeServer(models=["served"], respond=respond)


def openai_eval(server_urls, tiny_tokenizer, out, *extra):
    urls = [option for url in server_urls for option in ("--base-url", url)]
    run = run_cli_process if "--workers" in extra else run_cli  # forked episode processes: not from the test process
    return run(
        "eval",
        "--policy",
        "openai",
        *urls,
        "--model",
        "served",
        "--tokenizer",
        str(tiny_tokenizer),
        "--limit",
        "24",
        "--max-steps",
        "4",
        "--retries",
        "3",
        "--out",
        str(out),
        *extra,
    )


def comparable(run) -> dict:
    """Trajectories by episode id, without what differs from run to run (times, which replica answered)."""
    found = {}
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        trajectory = json.loads(line)
        for key in TIMING:
            trajectory.pop(key)
        for step in trajectory["steps"]:
            step.pop("timings")
            for call in step["tool_calls"]:
                call.pop("seconds")
            for key in ("seconds", "replica", "replica_errors", "api_retries"):
                (step.get("generation") or {}).pop(key, None)
        trajectory["policy"]["settings"].pop("replicas", None)
        trajectory["policy"]["settings"].pop("url", None)
        found[trajectory["episode_id"]] = trajectory
    return found


def test_episodes_in_flight_give_the_trajectories_of_one_at_a_time(tiny_tokenizer, tmp_path):
    server = scripted_server(tiny_tokenizer, latency=0.02)
    one = openai_eval([server.url], tiny_tokenizer, tmp_path / "one")
    many = openai_eval([server.url], tiny_tokenizer, tmp_path / "many", "--concurrency", "12")
    assert one.returncode == 0 and many.returncode == 0, one.stderr + many.stderr
    sequential, concurrent = comparable(tmp_path / "one"), comparable(tmp_path / "many")
    assert len(sequential) == 24 and sequential == concurrent
    assert {t["outcome"]["status"] for t in concurrent.values()} == {"submitted"}
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("one", "many")]
    assert metrics[0]["answer_f1"] == metrics[1]["answer_f1"] and metrics[0]["status"] == metrics[1]["status"]
    manifest = json.loads((tmp_path / "many" / "manifest.json").read_text())
    assert manifest["config"]["concurrency"] == 12


def test_scripted_policies_run_in_flight_too(tmp_path):
    one = run_cli("eval", "--limit", "30", "--out", str(tmp_path / "one"))
    many = run_cli("eval", "--limit", "30", "--concurrency", "7", "--out", str(tmp_path / "many"))
    assert one.returncode == 0 and many.returncode == 0, one.stderr + many.stderr
    assert comparable(tmp_path / "one") == comparable(tmp_path / "many")


def test_a_replica_that_is_down_is_taken_out_and_the_run_goes_on(tiny_tokenizer, tmp_path):
    server = scripted_server(tiny_tokenizer)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    done = openai_eval([dead, server.url], tiny_tokenizer, tmp_path / "run", "--concurrency", "6")
    assert done.returncode == 0, done.stderr
    assert f"{dead} does not answer" in done.stderr and "taken out" in done.stderr
    steps = [step for t in comparable_raw(tmp_path / "run") for step in t["steps"]]
    assert {step["generation"]["replica"] for step in steps} == {server.url}
    retried = [step["generation"] for step in steps if step["generation"].get("replica_errors")]
    assert all(error.startswith(dead) for generation in retried for error in generation["replica_errors"])
    assert all(generation["api_retries"] == len(generation["replica_errors"]) for generation in retried)


def test_a_replica_failing_mid_run_sends_its_requests_to_the_other(tiny_tokenizer, tmp_path):
    healthy = scripted_server(tiny_tokenizer, latency=0.01)
    failing = scripted_server(tiny_tokenizer, latency=0.01, fail=lambda number: number > 4)
    done = openai_eval([failing.url, healthy.url], tiny_tokenizer, tmp_path / "run", "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert f"replica {failing.url} taken out (HTTP 503" in done.stderr
    trajectories = comparable_raw(tmp_path / "run")
    assert {t["outcome"]["status"] for t in trajectories} == {"submitted"}
    generations = [step["generation"] for t in trajectories for step in t["steps"]]
    assert {g["replica"] for g in generations} == {failing.url, healthy.url}  # both served before it failed
    failed_over = [g for g in generations if g.get("replica_errors")]
    assert failed_over and all(g["replica"] == healthy.url for g in failed_over)
    assert all("HTTP 503" in error for g in failed_over for error in g["replica_errors"])


def comparable_raw(run) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def test_the_least_busy_replica_gets_the_request_and_a_failed_one_comes_back():
    answers = {"a": 0, "b": 0}
    broken = {"a": True}

    def serve(name):
        def respond(body):
            if broken.get(name):
                return 502, {"error": "bad gateway"}
            answers[name] += 1
            time.sleep(0.05)
            return 200, {"ok": name}

        return FakeServer(respond=respond)

    first, second = serve("a"), serve("b")
    lines = []
    pool = ServerPool([first.url, second.url], "EMPTY", timeout=30, retries=2, backoff=0.01, cooldown=0.2, say=lines.append)
    answer = pool.post("/completions", {})
    assert answer.body == {"ok": "b"} and answer.retries == 1 and answer.failures[0].startswith(first.url + ": HTTP 502")
    assert [event.event for event in pool.events] == ["out"] and "taken out" in lines[0]
    broken["a"] = False
    time.sleep(0.25)  # the cooldown ends: the next request tries it again
    threads = [threading.Thread(target=pool.post, args=("/completions", {})) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_SECONDS)
    assert [event.event for event in pool.events] == ["out", "back"] and "back in use" in lines[-1]
    assert answers["a"] >= 2 and answers["b"] >= 2  # eight at once are spread over both
    summary = {row["replica"]: row for row in pool.summary()}
    assert summary[first.url]["failed"] == 1 and summary[first.url]["served"] + summary[second.url]["served"] == 9


def test_the_same_replica_twice_is_refused():
    with pytest.raises(AgentError, match="given twice"):
        ServerPool(["http://h:1/v1", "http://h:1"], "EMPTY")


def test_threads_return_every_result_and_carry_a_failure_to_the_caller():
    assert sorted(EpisodeThreads(lambda n: n * n, 5).run(range(40))) == [n * n for n in range(40)]

    def fails(n):
        if n == 3:
            raise RuntimeError("a bug")
        return n

    with pytest.raises(RuntimeError, match="a bug"):
        list(EpisodeThreads(fails, 4).run(range(10)))


def test_closing_the_results_stops_new_episodes():
    started = []

    def slow(n):
        started.append(n)
        time.sleep(0.01)
        return n

    results = EpisodeThreads(slow, 2).run(range(1000))
    next(results)
    results.close()
    time.sleep(0.1)
    assert len(started) < 10


def test_too_few_open_files_for_the_concurrency_is_one_clear_error(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda kind: (256, 512))
    with pytest.raises(AgentError, match="concurrency=512 needs about .* open files; this system allows 512 .*; lower concurrency"):
        raise_descriptor_limit(512)


def test_processes_with_episodes_in_flight_give_the_trajectories_of_one_at_a_time(tiny_tokenizer, tmp_path):
    server = scripted_server(tiny_tokenizer, latency=0.02)
    one = openai_eval([server.url], tiny_tokenizer, tmp_path / "one")
    many = openai_eval([server.url], tiny_tokenizer, tmp_path / "many", "--workers", "2", "--concurrency", "4")
    assert one.returncode == 0 and many.returncode == 0, one.stderr + many.stderr
    sequential, concurrent = comparable(tmp_path / "one"), comparable(tmp_path / "many")
    assert len(sequential) == 24 and sequential == concurrent
    assert len((tmp_path / "many" / "trajectories.jsonl").read_text().splitlines()) == 24  # one line per episode
    config = json.loads((tmp_path / "many" / "manifest.json").read_text())["config"]
    assert (config["workers"], config["concurrency"]) == (2, 4)


def test_a_bug_in_an_episode_process_reaches_the_caller():
    from paper_explorer.agent.engine import EpisodeProcesses

    assert sorted(EpisodeProcesses(lambda n: n * n, 3, 4).run(list(range(50)))) == [n * n for n in range(50)]

    def fails(n):
        if n == 7:
            raise RuntimeError("a bug")
        return n

    with pytest.raises(RuntimeError, match="a bug") as raised:
        list(EpisodeProcesses(fails, 2, 3).run(list(range(20))))
    assert "in an episode process" in "".join(raised.value.__notes__)


def test_an_episode_process_that_dies_is_one_clear_error():
    from paper_explorer.agent.engine import EpisodeProcesses

    def dies(n):
        if n == 5:
            os._exit(3)
        return n

    with pytest.raises(AgentError, match="ended without finishing, exit code 3"):
        list(EpisodeProcesses(dies, 2, 2).run(list(range(20))))


def child_pids(pid: int) -> set[int]:
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found |= {int(child) for child in handle.read().split()}
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_in_flight(tiny_tokenizer, server, out, *how) -> subprocess.Popen:
    """An eval against ``server`` in a process of its own, returned once it has written 10 episodes."""
    command = explorer_command(
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
        "60",
        "--max-steps",
        "4",
        *how,
        "--out",
        str(out),
    )
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=checkout_environment(),
        preexec_fn=with_signals_a_terminal_leaves,
    )
    log = out / "trajectories.jsonl"
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 10):
        time.sleep(0.05)
    return process


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads child processes from /proc")
def test_a_killed_run_of_processes_resumes_with_every_episode_once_and_leaves_none_running(tiny_tokenizer, tmp_path):
    server = scripted_server(tiny_tokenizer, latency=0.15)
    out = tmp_path / "run"
    process = start_in_flight(tiny_tokenizer, server, out, "--workers", "2", "--concurrency", "4")
    children = child_pids(process.pid)
    os.kill(process.pid, signal.SIGKILL)  # the writer alone, as an OOM killer would: its episode processes must follow
    process.wait(HANG_SECONDS)
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.05)
    assert children and not any(alive(pid) for pid in children)
    log = out / "trajectories.jsonl"
    written = log.read_text().count("\n")
    assert 10 <= written < 60
    done = run_cli_process("eval", "--out", str(out), "--resume", "--workers", "3", "--concurrency", "2")  # another combination
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["episode_id"] for line in log.read_text().splitlines()]
    assert len(ids) == 60 == len(set(ids))


@pytest.mark.slow
def test_ctrl_c_stops_the_processes_and_keeps_what_finished(tiny_tokenizer, tmp_path):
    # slow enough answers that the 60 episodes cannot all finish while a loaded machine's test
    # process notices the tenth and sends Ctrl-C (at 0.15 s they once did, in 4 s, before it)
    server = scripted_server(tiny_tokenizer, latency=0.5)
    out = tmp_path / "run"
    process = start_in_flight(tiny_tokenizer, server, out, "--workers", "2", "--concurrency", "4")
    os.killpg(process.pid, signal.SIGINT)  # as a terminal sends it: to every process of the foreground group
    _, stderr = process.communicate(timeout=HANG_SECONDS)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr  # as with episodes in flight in one process
    done = run_cli_process("eval", "--out", str(out), "--resume", "--concurrency", "3")  # the recorded 2 workers fork
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["episode_id"] for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(ids) == 60 == len(set(ids))


@pytest.mark.slow
def test_a_killed_run_in_flight_resumes_with_every_episode_once(tiny_tokenizer, tmp_path):
    server = scripted_server(tiny_tokenizer, latency=0.15)
    out = tmp_path / "run"
    command = explorer_command(
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
        "60",
        "--max-steps",
        "4",
        "--concurrency",
        "8",
        "--out",
        str(out),
    )
    log = out / "trajectories.jsonl"
    written = killed_once_logged(command, log, 10)
    assert 10 <= written < 60
    done = run_cli("eval", "--out", str(out), "--resume", "--concurrency", "16")  # how episodes run may change on resume
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["episode_id"] for line in log.read_text().splitlines()]
    assert len(ids) == 60 == len(set(ids))


# -- servers that lie: each fails one replica or one episode, never the run ----------------------------


def answering(body_or_status, tiny_tokenizer=None) -> FakeServer:
    """A server whose every completion is ``body_or_status`` (status, body)."""
    return FakeServer(models=["served"], respond=lambda body: body_or_status)


def test_malformed_answers_go_to_another_replica_and_wrong_types_are_not_recorded(tiny_tokenizer, tmp_path):
    healthy = scripted_server(tiny_tokenizer)
    not_an_answer = answering((200, [1, 2, 3]))
    redirecting = answering((302, {}))
    done = openai_eval(
        [not_an_answer.url, redirecting.url, healthy.url], tiny_tokenizer, tmp_path / "run", "--concurrency", "4", "--limit", "6"
    )
    assert done.returncode == 0, done.stderr
    trajectories = comparable_raw(tmp_path / "run")
    assert {t["outcome"]["status"] for t in trajectories} == {"submitted"}
    errors = [e for t in trajectories for s in t["steps"] for e in s["generation"].get("replica_errors") or []]
    assert any(e.startswith(not_an_answer.url + ": an answer without choices[0].text") for e in errors)
    assert any(e.startswith(redirecting.url + ": HTTP 302") for e in errors)

    typed = answering(
        (200, {"choices": [{"text": SUBMIT, "finish_reason": 5}], "usage": {"completion_tokens": "lots", "prompt_tokens": -3}})
    )
    done = openai_eval([typed.url], tiny_tokenizer, tmp_path / "typed", "--limit", "2")
    assert done.returncode == 0, done.stderr
    generation = comparable_raw(tmp_path / "typed")[0]["steps"][0]["generation"]
    assert "generated_tokens" not in generation and "finish_reason" not in generation and "server_prompt_tokens" not in generation


def test_a_lone_surrogate_or_an_echoed_key_never_reaches_the_log(tiny_tokenizer, tmp_path):
    key = "sk-SECRETSECRETSECRET123456"
    surrogate = answering((200, {"choices": [{"text": '```python\nsubmit("\ud800", evidence=[])\n```', "finish_reason": "stop"}]}))
    done = openai_eval(
        [surrogate.url], tiny_tokenizer, tmp_path / "surrogate", "--limit", "2", "--retries", "0", "--max-consecutive-errors", "5"
    )
    assert done.returncode == 1 and "every episode (2) ended in policy_error" in done.stderr, done.stderr  # nothing measured
    (first, _) = comparable_raw(tmp_path / "surrogate")
    assert first["outcome"]["status"] == "policy_error" and "lone surrogate" in first["outcome"]["reason"]

    echoed = answering((200, {"choices": [{"text": f"```python\nsubmit('{key}', evidence=[])\n```", "finish_reason": "stop"}]}))
    cut = answering((500, {"error": "x" * 149 + f"Bearer {key}"}))  # the key across the 200-character cut of an error
    for server, name in ((echoed, "echoed"), (cut, "cut")):
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
            "--limit",
            "1",
            "--retries",
            "0",
            "--out",
            str(tmp_path / name),
            env={"OPENAI_API_KEY": key},
        )
        assert done.returncode in (0, 1), done.stderr
        written = (tmp_path / name / "trajectories.jsonl").read_text() + done.stderr + done.stdout
        assert "SECRET" not in written and "[OPENAI_API_KEY]" in written


def test_a_server_that_drips_its_headers_is_cut_off_at_the_timeout(tiny_tokenizer, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))

    def drip():
        while True:
            connection, _ = listener.accept()
            threading.Thread(target=send_slowly, args=(connection,), daemon=True).start()

    def send_slowly(connection):
        request = connection.recv(1 << 20)
        models = b"GET /v1/models" in request
        head = b'HTTP/1.1 200 OK\r\nContent-Length: 46\r\n\r\n{"object": "list", "data": [{"id": "served"}]}'
        try:
            if models:
                connection.sendall(head)
                connection.recv(1 << 20)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                connection.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            connection.close()

    threading.Thread(target=drip, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    done = openai_eval([url], tiny_tokenizer, tmp_path / "run", "--limit", "1", "--retries", "0", "--timeout", "2")
    assert done.returncode == 1 and "every episode (1) ended in policy_error" in done.stderr, done.stderr  # nothing measured
    (trajectory,) = comparable_raw(tmp_path / "run")
    assert trajectory["outcome"]["status"] == "policy_error" and "within the timeout of 2 s" in trajectory["outcome"]["reason"]


@pytest.mark.parametrize(
    "url, said",
    [
        ("http://[::1", "is not a URL"),
        ("http://localhost:8000/v1?x=1", "without ?query"),
        ("http://user:pw@localhost:8000/v1", "no user or password"),
        ("ftp://localhost/v1", "must start with http"),
    ],
)
def test_a_bad_base_url_is_one_line(tiny_tokenizer, tmp_path, url, said):
    done = openai_eval([url], tiny_tokenizer, tmp_path / "run")
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists()


def test_an_ipv6_replica_is_reached(tiny_tokenizer, tmp_path):
    from http.server import ThreadingHTTPServer

    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    server = scripted_server(tiny_tokenizer)
    handler = server.server.RequestHandlerClass

    class Six(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    six = Six(("::1", 0), handler)
    threading.Thread(target=six.serve_forever, daemon=True).start()
    done = openai_eval([f"http://[::1]:{six.server_address[1]}/v1"], tiny_tokenizer, tmp_path / "run", "--limit", "2")
    six.shutdown()
    assert done.returncode == 0, done.stderr
    assert {t["outcome"]["status"] for t in comparable_raw(tmp_path / "run")} == {"submitted"}


def test_every_failed_attempt_is_named_when_all_replicas_fail(tiny_tokenizer, tmp_path):
    first, second = answering((503, {"error": "one"})), answering((503, {"error": "two"}))
    done = openai_eval([first.url, second.url], tiny_tokenizer, tmp_path / "run", "--limit", "1", "--retries", "1")
    assert done.returncode == 1 and "every episode (1) ended in policy_error" in done.stderr, done.stderr  # nothing measured
    reason = comparable_raw(tmp_path / "run")[0]["outcome"]["reason"]
    assert first.url in reason and second.url in reason and "after 2 attempt(s)" in reason


def test_resuming_changes_how_episodes_run_and_a_finished_run_needs_no_server(tiny_tokenizer, tmp_path):
    out = tmp_path / "run"
    assert run_cli("eval", "--limit", "8", "--concurrency", "4", "--out", str(out)).returncode == 0
    log = out / "trajectories.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))
    done = run_cli_process("eval", "--out", str(out), "--resume", "--workers", "2")  # 2 processes, the recorded 4 in flight in each
    assert done.returncode == 0, done.stderr
    assert len(log.read_text().splitlines()) == 8

    server = scripted_server(tiny_tokenizer)
    served = tmp_path / "served"
    assert openai_eval([server.url], tiny_tokenizer, served, "--limit", "2").returncode == 0
    server.server.shutdown()
    server.server.server_close()
    done = run_cli("eval", "--out", str(served), "--resume")
    assert done.returncode == 0 and "the policy's server is not asked" in done.stderr, done.stderr


def test_a_line_from_another_run_is_refused_on_resume(tmp_path):
    assert run_cli("eval", "--limit", "4", "--out", str(tmp_path / "mine")).returncode == 0
    assert run_cli("eval", "--limit", "4", "--policy", "direct-submit", "--out", str(tmp_path / "other")).returncode == 0
    mine, other = tmp_path / "mine" / "trajectories.jsonl", tmp_path / "other" / "trajectories.jsonl"
    mine.write_text("".join(mine.read_text().splitlines(keepends=True)[:2] + other.read_text().splitlines(keepends=True)[2:3]))
    done = run_cli("eval", "--out", str(tmp_path / "mine"), "--resume")
    assert done.returncode == 2 and "trajectories.jsonl:3: not an episode of this run: it was made by policy 'direct-submit'" in done.stderr
