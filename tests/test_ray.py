"""explorer eval --ray: the episodes run as Ray tasks on a cluster of nodes started on this machine
at 127.0.0.1 (a head that runs nothing and worker nodes of one CPU each, as ``ray start`` on
separate machines would make them), and the run is byte for byte the run of one process, timings aside: with a
node killed mid-run, and with the driver killed and the run resumed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paper_explorer.agent.trajectory import Trajectory, without_timings
from tests.conftest import (
    HANG_SECONDS,
    checkout_environment,
    explorer_command,
    killed_once_logged,
    run_cli,
    run_cli_process,
    with_signals_a_terminal_leaves,
)

pytestmark = pytest.mark.slow  # a Ray cluster takes seconds to start on a loaded machine

QUESTIONS = ["--limit", "8", "--samples", "3"]  # 24 episodes: enough that a kill lands mid-run
HOW_IT_RAN = {"ray": None, "concurrency": None}  # the config fields that differ from the one-process run's by design


@pytest.fixture(scope="module", autouse=True)
def loopback_only():
    """Ray binds 127.0.0.1, never this machine's outward address: the head, the nodes and every
    driver the tests start (Ray's single-machine mode; it otherwise rewrites 127.0.0.1 to the
    machine's address)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        yield


@contextlib.contextmanager
def ray_cluster(nodes: int, cache: Path) -> Iterator:
    """A Ray head with no CPU of its own (so every episode runs on a worker node) and ``nodes``
    worker nodes of one CPU, their processes started from this checkout's environment."""
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        for name, value in checkout_environment({"EXPLORER_CACHE_DIR": str(cache)}).items():
            patch.setenv(name, value)  # what the nodes' worker processes inherit
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _ok(result) -> None:
    assert result.returncode == 0, result.stderr


def _refused(result, *fragments: str, began: bool = False) -> str:
    """Exit 2 and one line, 'error: ...', holding every fragment (after the run's own notes when it ``began``)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert (began or len(lines) == 1) and lines[-1].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def _trajectories(run: Path) -> list[dict]:
    return [without_timings(Trajectory.model_validate_json(line)) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def assert_same_run(run: Path, reference: Path) -> None:
    """Every episode once, in the one-process run's order, equal but for its timings; the scores'
    bytes and the metrics (which hold no timing field) equal."""
    assert _trajectories(run) == _trajectories(reference)
    assert (run / "scores.jsonl").read_bytes() == (reference / "scores.jsonl").read_bytes()
    assert json.loads((run / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())
    config, expected = (json.loads((directory / "manifest.json").read_text())["config"] for directory in (run, reference))
    assert {**config, **HOW_IT_RAN} == {**expected, **HOW_IT_RAN}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "explorer-cache"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cache) -> Path:
    out = tmp_path_factory.mktemp("ray") / "one"
    _ok(run_cli_process("eval", *QUESTIONS, "--out", str(out), env={"EXPLORER_CACHE_DIR": str(cache)}))
    return out


@pytest.fixture(scope="module")
def two_nodes(cache):
    with ray_cluster(2, cache) as cluster:
        yield cluster


def _eval(*args: str, cache: Path):
    return run_cli_process("eval", *args, env={"EXPLORER_CACHE_DIR": str(cache)})


def _driver_past_its_first_episode(args: tuple[str, ...], log: Path, cache: Path, **popen) -> subprocess.Popen:
    """``explorer eval ARGS`` started in a process of its own, returned once its log holds a line (or it ended)."""
    driver = subprocess.Popen(
        explorer_command("eval", *args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_environment({"EXPLORER_CACHE_DIR": str(cache)}),
        **popen,
    )
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline and driver.poll() is None and (not log.exists() or not log.read_text().count("\n")):
        time.sleep(0.05)
    return driver


def test_a_ray_run_is_the_run_of_one_process(two_nodes, one_process, tmp_path, cache):
    out = tmp_path / "ray"
    result = _eval(*QUESTIONS, "--ray", two_nodes.address, "--concurrency", "2", "--out", str(out), cache=cache)
    _ok(result)
    assert "Traceback" not in result.stderr
    assert_same_run(out, one_process)
    assert json.loads((out / "manifest.json").read_text())["config"]["ray"] == two_nodes.address
    assert two_nodes.address.startswith("127.0.0.1:")


def test_the_driver_killed_and_the_run_resumed_is_the_run_of_one_process(two_nodes, one_process, tmp_path, cache):
    out = tmp_path / "ray"
    command = explorer_command("eval", *QUESTIONS, "--ray", two_nodes.address, "--out", str(out))
    written = killed_once_logged(command, out / "trajectories.jsonl", lines=1, env={"EXPLORER_CACHE_DIR": str(cache)})
    assert 1 <= written < 24, written
    result = _eval("--out", str(out), "--resume", cache=cache)  # the manifest holds the cluster's address
    _ok(result)
    assert f"resuming: {written} of 24 episodes already written" in result.stderr
    assert_same_run(out, one_process)


def test_a_node_killed_mid_run_loses_and_repeats_no_episode(one_process, tmp_path, cache):
    out = tmp_path / "ray"
    log = out / "trajectories.jsonl"
    with ray_cluster(1, cache) as cluster:
        doomed = cluster.list_all_nodes()[-1]
        driver = _driver_past_its_first_episode((*QUESTIONS, "--ray", cluster.address, "--out", str(out)), log, cache)
        cluster.remove_node(doomed, allow_graceful=False)  # its raylet and workers killed, as a lost machine's
        written = log.read_text().count("\n")
        cluster.add_node(num_cpus=1)  # where the lost node's tasks go: until it joins, they wait
        _, stderr = driver.communicate(timeout=HANG_SECONDS)
    assert 1 <= written < 24, written  # killed mid-run, with episodes in flight on it
    assert driver.returncode == 0, stderr
    assert_same_run(out, one_process)


def test_without_a_cluster_at_the_address_nothing_is_written(tmp_path, cache):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    out = tmp_path / "ray"
    _refused(
        _eval("--limit", "2", "--ray", f"127.0.0.1:{port}", "--out", str(out), cache=cache), "no Ray cluster answers", "ray start --head"
    )
    assert not out.exists()
    _refused(_eval("--limit", "2", "--ray", "head-without-port", "--out", str(out), cache=cache), "not a Ray address")
    assert not out.exists()


def test_an_address_where_no_ray_head_answers_is_one_line_not_a_hang(two_nodes, tmp_path, cache):
    """Something that is not a Ray head at the address (a web server, a Ray daemon's other port):
    ray.init would retry for a quarter of an hour; the run says so at once, and writes nothing."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # it would print into the command's stderr, this process's
            pass

    out = tmp_path / "ray"
    with http.server.ThreadingHTTPServer(("", 0), Quiet) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            result = run_cli("eval", "--limit", "2", "--ray", f"127.0.0.1:{web.server_address[1]}", "--out", str(out))
            found = run_cli(  # auto finds what RAY_ADDRESS (or a stale ray start) names
                "eval", "--limit", "2", "--ray", "auto", "--out", str(out), env={"RAY_ADDRESS": f"127.0.0.1:{web.server_address[1]}"}
            )
        finally:
            web.shutdown()
    _refused(result, "not a Ray head", "6379")
    _refused(found, "--ray auto (found ", f":{web.server_address[1]} in RAY_ADDRESS", "not a Ray head")
    raylet = f"{two_nodes.head_node.node_ip_address}:{two_nodes.head_node.node_manager_port}"  # gRPC, but not the head's GCS
    _refused(run_cli("eval", "--limit", "2", "--ray", raylet, "--out", str(out)), "not a Ray head")
    _refused(run_cli("eval", "--limit", "2", "--ray", "127.0.0.1:70000", "--out", str(out)), "not a Ray address")
    assert not out.exists()


def test_the_head_lost_mid_run_is_one_line_and_the_run_resumes(two_nodes, tmp_path, cache):
    """The head machine lost (its GCS and the driver's own Ray daemon with it): one line, exit 2,
    not Ray's traceback; the episodes written stay, and a resume on another cluster finishes the run."""
    many = ("--limit", "8", "--samples", "10")  # 80 episodes: the head goes long before their end
    one_process = tmp_path / "one"
    _ok(_eval(*many, "--out", str(one_process), cache=cache))
    out = tmp_path / "ray"
    log = out / "trajectories.jsonl"
    with ray_cluster(1, cache) as doomed:
        address = doomed.address
        driver = _driver_past_its_first_episode((*many, "--ray", address, "--out", str(out)), log, cache)
        for processes in doomed.head_node.all_processes.values():  # at once, as a machine's power going
            for process in processes:
                process.process.kill()
        _, stderr = driver.communicate(timeout=HANG_SECONDS)
    written = log.read_text().count("\n")
    assert 1 <= written < 80, written
    assert driver.returncode == 2 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith(f"error: --ray {address}: lost the Ray cluster"), stderr
    result = _eval("--out", str(out), "--resume", "--ray", two_nodes.address, cache=cache)
    _ok(result)
    assert f"resuming: {written} of 80 episodes already written" in result.stderr
    assert_same_run(out, one_process)


def test_a_cluster_without_a_cpu_stops_the_run_in_one_line(tmp_path, cache, monkeypatch):
    """No node can run a task (the only worker lost, none joining): Ray would keep the tasks waiting
    forever; the run stops after NO_CPU_SECONDS in one line, its manifest written for the resume."""
    from paper_explorer.evaluation import ray_tasks

    monkeypatch.setattr(ray_tasks, "NO_CPU_SECONDS", 2.0)
    out = tmp_path / "ray"
    with ray_cluster(0, cache) as head_only:
        line = _refused(run_cli("eval", "--limit", "2", "--ray", head_only.address, "--out", str(out)), began=True)
    assert "no node with a CPU for 2 s" in line and "resume" in line, line
    assert (out / "manifest.json").exists() and not (out / "trajectories.jsonl").read_text()


def _jobs_holding(address: str, text: str) -> int:
    """How many of the cluster's jobs keep ``text`` in their runtime_env, in the cluster's job table (as GCS stores it)."""
    import ray
    from ray.core.generated import gcs_pb2

    ray.init(address=address, log_to_driver=False)
    try:
        table = ray._private.state.state._connect_and_get_accessor().get_job_table(
            skip_submission_job_info_field=True, skip_is_running_tasks_field=True
        )
        return sum(text in gcs_pb2.JobTableData.FromString(job).config.runtime_env_info.serialized_runtime_env for job in table)
    finally:
        ray.shutdown()


def test_the_key_goes_to_a_cluster_only_for_a_policy_that_sends_it_and_only_when_named(two_nodes, tiny_tokenizer, tmp_path, monkeypatch):
    """OPENAI_API_KEY reaches the tasks (and so the cluster's job table) only when the policy sends
    it to a server, and a resume sends it only to a cluster its own command names."""
    from tests.agent.test_openai_policy import FakeServer
    from tests.test_eval_failures import openai_eval

    key = "sk-ray-test-key-4242"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    _ok(run_cli("eval", "--limit", "2", "--ray", two_nodes.address, "--out", str(tmp_path / "scripted")))
    assert _jobs_holding(two_nodes.address, key) == 0  # a scripted policy: no server, no key
    server = FakeServer(models=["served"])
    try:
        out = tmp_path / "served"
        result = openai_eval(server.url, tiny_tokenizer, out, "--ray", two_nodes.address)
        _ok(result)
        assert set(server.authorizations) == {f"Bearer {key}"}  # the nodes' requests carried it
        assert _jobs_holding(two_nodes.address, key) == 1
        assert key not in result.stdout + result.stderr
        assert not [path for path in out.iterdir() if key.encode() in path.read_bytes()]
        (out / "trajectories.jsonl").write_text((out / "trajectories.jsonl").read_text().splitlines()[0] + "\n")
        (out / "scores.jsonl").unlink()
        (out / "metrics.json").unlink()
        _refused(
            run_cli("eval", "--out", str(out), "--resume", "--base-url", server.url), f"--ray {two_nodes.address}", "unset OPENAI_API_KEY"
        )
        _ok(run_cli("eval", "--out", str(out), "--resume", "--base-url", server.url, "--ray", two_nodes.address))
    finally:
        server.server.shutdown()


def test_ray_flags_that_cannot_work_are_one_line(tmp_path, monkeypatch):
    out = tmp_path / "ray"
    _refused(run_cli("eval", "--limit", "2", "--ray", "auto", "--workers", "2", "--out", str(out)), "--workers 2", "--ray")
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # Ray not installed: its import fails
    _refused(run_cli("eval", "--limit", "2", "--ray", "auto", "--out", str(out)), "needs Ray", "pip install -e '.[ray]'")
    assert not out.exists()


def test_a_node_unlike_the_manifest_refuses_the_run(two_nodes, tmp_path, cache):
    """A run whose manifest claims another sandbox isolation than the nodes give: the nodes refuse
    it in one line, and the episodes already written stay."""
    out = tmp_path / "run"
    _ok(_eval("--limit", "4", "--out", str(out), cache=cache))
    first = (out / "trajectories.jsonl").read_text().splitlines()[0]
    (out / "trajectories.jsonl").write_text(first + "\n")
    (out / "metrics.json").unlink()
    (out / "scores.jsonl").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["isolation"] = "language-only (another machine)"
    (out / "manifest.json").write_text(json.dumps(manifest))
    line = _refused(
        _eval("--out", str(out), "--resume", "--ray", two_nodes.address, cache=cache), "Ray node", "sandbox isolation", began=True
    )
    assert "language-only (another machine)" in line
    assert (out / "trajectories.jsonl").read_text() == first + "\n"


def test_ctrl_c_stops_the_tasks_and_keeps_what_finished(two_nodes, tmp_path, cache):
    out = tmp_path / "ray"
    driver = _driver_past_its_first_episode(  # 80 episodes: the Ctrl-C lands long before their end
        ("--limit", "8", "--samples", "10", "--ray", two_nodes.address, "--out", str(out)),
        out / "trajectories.jsonl",
        cache,
        start_new_session=True,
        preexec_fn=with_signals_a_terminal_leaves,
    )
    os.killpg(driver.pid, signal.SIGINT)
    _, stderr = driver.communicate(timeout=HANG_SECONDS)
    assert driver.returncode == 130 and "Traceback" not in stderr, stderr
    assert "resume with: explorer eval --out" in stderr


def test_rl_samples_and_validates_its_rounds_on_the_cluster(two_nodes, tiny_model, tmp_path, cache):
    """explorer rl --ray: each round's sampling and validation runs are Ray runs (the nodes load the
    model), and the round trains on them what it trains on one process's: the same episodes,
    rewards and adapter."""
    from paper_explorer.agent.models import file_hashes

    flags = ("--model", str(tiny_model), "--rounds", "1", "--questions-per-round", "2", "--group-size", "2", "--max-new-tokens", "12")
    flags += ("--max-steps", "2", "--threads", "1", "--validation-episodes", "2")
    _ok(run_cli_process("rl", *flags, "--out", str(tmp_path / "one"), env={"EXPLORER_CACHE_DIR": str(cache)}))
    _ok(run_cli_process("rl", *flags, "--ray", two_nodes.address, "--out", str(tmp_path / "ray"), env={"EXPLORER_CACHE_DIR": str(cache)}))
    for run in ("samples", "validation"):
        ray_run = tmp_path / "ray" / "round-1" / run
        assert json.loads((ray_run / "manifest.json").read_text())["config"]["ray"] == two_nodes.address
        as_one = json.loads(json.dumps(_trajectories(ray_run)).replace(str(tmp_path / "ray"), str(tmp_path / "one")))  # the adapter's path
        assert as_one == _trajectories(tmp_path / "one" / "round-1" / run)
    assert (tmp_path / "ray" / "round-1" / "rewards.jsonl").read_bytes() == (tmp_path / "one" / "round-1" / "rewards.jsonl").read_bytes()
    adapter = ("round-1", "update", "adapter")
    assert file_hashes(tmp_path.joinpath("ray", *adapter)) == file_hashes(tmp_path.joinpath("one", *adapter))


def test_a_script_connected_to_ray_keeps_its_connection(two_nodes, one_process, tmp_path):
    """The Python API in a script that called ray.init itself: the run uses that connection and
    leaves it open for the script's own work."""
    import ray

    from paper_explorer import EvalConfig, evaluate

    ray.init(address=two_nodes.address, logging_level="ERROR", log_to_driver=False)
    try:
        run = evaluate(EvalConfig(limit=8, samples=3, ray=two_nodes.address), out=tmp_path / "ray")
        assert ray.is_initialized() and ray.get(ray.put("still connected")) == "still connected"
    finally:
        ray.shutdown()
    assert run.metrics.episodes == 24
    assert_same_run(tmp_path / "ray", one_process)
