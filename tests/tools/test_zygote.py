"""The zygote: shared by threads, replaced when killed, never shared across a fork, gone with its host."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from paper_explorer.corpus import BM25Index
from paper_explorer.tools import episode_host
from paper_explorer.tools.sandbox import Limits, Sandbox, SandboxError
from paper_explorer.tools.zygote import Zygote, shared_zygote
from tests.tools.conftest import CollectingIndex, process_running

LIMITS = Limits(wall_seconds=30.0, cpu_seconds=10, memory_mb=512)


def test_threads_share_one_zygote_without_mixing_episodes(small_demo, index):
    answers, errors = {}, []

    def episodes(thread: int) -> None:
        try:
            for episode in range(4):
                with Sandbox(small_demo, LIMITS, index=index) as sandbox:
                    if episode == 1:  # a replaced worker in the middle of the others' traffic
                        assert sandbox.execute("print('x' * 10**6)").limit_hit == "output"
                    sandbox.execute(f"mine = 'thread {thread} episode {episode}'")
                    sandbox.execute("hits = search('learning rate', k=2)")
                    sandbox.execute("submit(mine, evidence=[hits[0]])")
                    answers[(thread, episode)] = sandbox.outcome.answer
        except Exception as error:  # noqa: BLE001 - reported below, with its thread
            errors.append((thread, repr(error)))

    threads = [threading.Thread(target=episodes, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors
    assert answers == {(t, e): f"thread {t} episode {e}" for t in range(4) for e in range(4)}


def test_a_killed_zygote_is_replaced_and_the_next_episode_runs(small_demo, index):
    zygote = Zygote()
    try:
        with Sandbox(small_demo, LIMITS, index=index, zygote=zygote) as sandbox:
            assert sandbox.execute("1 + 1").value == "2"
            os.kill(zygote.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while process_running(sandbox.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            result = sandbox.execute("2 + 2")  # its worker died with it (parent-death signal): a new one runs it
            assert result.value == "4" and result.variables_lost and sandbox.refused_frames == 0
            assert sandbox.execute("3 + 3").value == "6"
    finally:
        zygote.close()


def test_a_forked_host_gets_its_own_zygote(small_demo, index):
    parent = shared_zygote()
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        assert sandbox.execute("1").value == "1"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a forked host (eval's worker pool): must not talk on its parent's control socket
        try:
            mine = shared_zygote()
            with Sandbox(small_demo, LIMITS, index=index) as sandbox:
                ok = sandbox.execute("40 + 2").value == "42" and mine is not parent and mine.pid != parent.pid
            os.write(write_end, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 2) == b"ok"
    os.waitpid(child, 0)
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:  # the parent's zygote is untouched
        assert sandbox.execute("7").value == "7" and shared_zygote() is parent


def test_workers_and_zygote_die_with_a_killed_host(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from paper_explorer.corpus import BM25Index, DemoConfig, generate
        from paper_explorer.tools.sandbox import Sandbox
        corpus = generate(DemoConfig(papers=5, seed=1))
        sandbox = Sandbox(corpus, index=BM25Index.build(corpus))
        sandbox.start()
        print(sandbox.zygote.pid, sandbox.pid, sandbox._host_server.pid, sandbox.host_pid, flush=True)
        time.sleep(600)
    """)
    host = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "EXPLORER_CACHE_DIR": str(tmp_path)}
    )
    pids = list(map(int, host.stdout.readline().split()))  # zygote, worker, episode hosts' server, episode host
    host.kill()
    host.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(process_running(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(process_running(pid) for pid in pids)


def test_a_killed_episode_host_is_one_clear_error_and_the_next_episode_runs(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        assert sandbox.execute("1 + 1").value == "2"
        os.kill(sandbox.host_pid, signal.SIGKILL)
        with pytest.raises(SandboxError, match="host process stopped answering"):
            sandbox.execute("2 + 2")
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        assert sandbox.execute("3 + 3").value == "6"


def test_a_killed_server_of_episode_hosts_is_replaced_for_the_next_episode(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        assert sandbox.execute("search('learning rate', k=1)[0]['paper_id']").error is None
        server = sandbox._host_server.pid
        os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while process_running(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:  # the server is started again from the kept corpus
        result = sandbox.execute("search('learning rate', k=1)[0]['paper_id']")
        assert result.error is None and sandbox._host_server.pid != server


def live_children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def test_spares_and_idle_hosts_killed_from_outside_cost_no_episode(small_demo, index):
    """The processes forked ahead (a spare worker, a spare episode host) and the idle episode hosts
    may be killed from outside (the kernel's OOM killer): the next episodes start anyway."""
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        sandbox.execute("1")
        servers = [sandbox.zygote.pid, sandbox._host_server.pid]
    for _ in range(3):
        for server in servers:
            for child in live_children(server):
                os.kill(child, signal.SIGKILL)
        with Sandbox(small_demo, LIMITS, index=index) as sandbox:
            assert sandbox.execute("40 + 2").value == "42"


def test_a_server_whose_corpus_the_collector_frees_while_another_is_made_closes_without_a_deadlock(small_demo):
    """A server's finalizer takes the lock of the servers' registry; the garbage collector can run it
    in the thread that holds that lock, while it pickles another server's payload. A plain lock
    deadlocked there (an eval hung before its first episode)."""
    cyclic = BM25Index.build(small_demo)
    cyclic.itself = cyclic  # freed only by the garbage collector
    with Sandbox(small_demo, Limits(), index=cyclic) as sandbox:
        assert sandbox.execute("6 * 7").value == "42"
        old = sandbox._host_server
    del cyclic, sandbox
    answers = []

    def another() -> None:
        with Sandbox(small_demo, Limits(), index=CollectingIndex.build(small_demo)) as sandbox:
            answers.append(sandbox.execute("6 * 7").value)

    thread = threading.Thread(target=another, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "deadlocked: the registry's lock was taken again by a finalizer in its own thread"
    assert answers == ["42"] and all(server is not old for server, _ in episode_host._servers.values())
