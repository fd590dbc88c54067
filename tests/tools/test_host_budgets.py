"""The host's work for an action is the action's work: bounded, charged and enforced while the host
serves, in a process of the episode's own (tools.episode_host).

Figures here are CPU seconds or limits hit, never wall-clock speeds: a loaded machine changes how
long things take, not what the clocks charge."""

import dataclasses
import os
import resource
import signal
import socket
import textwrap
import threading
import time

import pytest

from paper_explorer.tools import registry, wire
from paper_explorer.tools.episode_host import _TIMERS, ActionClocks, EpisodeHost, HostLimit, WorkerClock
from paper_explorer.tools.paper_tools import PaperTools
from paper_explorer.tools.sandbox import Limits, Sandbox

# A loop of searches: each call is cheap, so only the sum of the host's work can run out.
SEARCHES = "for i in range(100000):\n    search('learning rate model data training results', k=50)"
HANG_SECONDS = 600  # bounds a hang, never a speed


def run(small_demo, index, code: str, **limits) -> tuple:
    with Sandbox(small_demo, Limits(**{"tool_calls": 10**6, **limits}), index=index) as sandbox:
        result = sandbox.execute(code)
        after = sandbox.execute("6 * 7")
    return result, after


def test_the_host_cpu_of_an_actions_calls_counts_against_its_cpu_limit(small_demo, index):
    result, after = run(small_demo, index, SEARCHES, cpu_seconds=0.5, wall_seconds=HANG_SECONDS, host_seconds=HANG_SECONDS)
    assert result.limit_hit == "cpu_time" and result.variables_lost
    assert result.host_cpu_seconds > result.worker_cpu_seconds  # the host did most of the work, and it was charged
    assert result.host_cpu_seconds + result.worker_cpu_seconds < 0.5 + 0.5  # stopped at the limit (ticks of slack), not at 9.6 s
    assert after.value == "42"


def test_the_hosts_own_budget_stops_the_action_and_names_itself(small_demo, index):
    result, after = run(small_demo, index, SEARCHES, host_seconds=0.3, wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS)
    assert result.limit_hit == "host_time" and result.host_seconds >= 0.3
    assert result.tool_calls and all(call.name == "search" for call in result.tool_calls)
    assert after.value == "42"


def test_the_wall_deadline_holds_while_the_host_serves(small_demo, index):
    result, _ = run(small_demo, index, SEARCHES, wall_seconds=0.5, host_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS)
    assert result.limit_hit == "wall_clock"
    # The timer stopped the call the deadline fell in: the loop's searches would take minutes. The
    # slack is for a loaded machine, which can run the timer's thread late (0.72 s seen on 2 busy cores).
    assert result.host_seconds < 0.5 + 10


def test_an_escaped_worker_pipelining_call_frames_still_meets_the_wall_clock(small_demo, index):
    """Frames written back to back never let the host wait on the channel, where it used to look at
    the clock: the clocks are read between frames and while each call is served."""
    code = textwrap.dedent("""
        import os, json, struct
        call = json.dumps({"op": "call", "tool": "search", "args": ["learning rate model data", 50], "kwargs": {}}).encode()
        frame = struct.pack(">I", len(call)) + call
        def read(size):
            data = b""
            while len(data) < size:
                data += os.read(3, size - len(data))
            return data
        while True:
            os.write(3, frame * 64)  # 64 calls ahead of their replies: the host always has one waiting
            for _ in range(64):
                read(struct.unpack(">I", read(4))[0])
    """)
    limits = Limits(wall_seconds=0.5, cpu_seconds=HANG_SECONDS, host_seconds=HANG_SECONDS, tool_calls=10**6)
    with Sandbox(small_demo, limits, index=index, restricted=False) as sandbox:
        started = time.monotonic()
        result = sandbox.execute(code)
        elapsed = time.monotonic() - started
        assert sandbox.execute("6 * 7").value == "42"
    assert result.limit_hit == "wall_clock" and result.variables_lost
    assert elapsed < HANG_SECONDS


def test_frames_that_cost_the_host_to_read_are_charged_to_its_budget(small_demo, index):
    """Reading a frame is host work too: call frames cheap to send and costly to decode (and refused
    before any tool runs) still spend the action's host_time, not only its CPU."""
    code = textwrap.dedent("""
        import os, json, struct
        call = json.dumps({"op": "call", "tool": "search", "args": [1, 2, 3, [[1] * 1000] * 19], "kwargs": {}}).encode()
        frame = struct.pack(">I", len(call)) + call
        while True:
            os.write(3, frame)
            size = struct.unpack(">I", os.read(3, 4))[0]
            while size:
                size -= len(os.read(3, size))
    """)
    limits = Limits(wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS, host_seconds=0.3, tool_calls=10**6)
    with Sandbox(small_demo, limits, index=index, restricted=False) as sandbox:
        result = sandbox.execute(code)
    assert result.limit_hit == "host_time" and result.host_seconds >= 0.3
    assert result.tool_calls and all(call.error for call in result.tool_calls)


def test_a_budget_that_runs_out_between_or_during_calls_leaves_every_call_recorded(small_demo, index):
    result, _ = run(small_demo, index, SEARCHES, host_seconds=0.2, wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS)
    assert result.limit_hit == "host_time" and result.tool_calls
    assert all(call.error is None for call in result.tool_calls[:-1])
    last = result.tool_calls[-1]
    assert last.error is None or "host_time" in last.error  # between two calls, or stopped during the last


def never_returns(episode, args):
    """A tool that never returns on its own: only a budget's timer can stop it."""
    while True:
        pass


def SlowTools(corpus, index):
    tools = registry.by_name()
    return PaperTools(corpus, index, tools={**tools, "search": dataclasses.replace(tools["search"], function=never_returns)})


def test_a_call_a_budget_stops_mid_way_is_recorded_as_stopped(small_demo, index):
    host = EpisodeHost(SlowTools(small_demo, index), Limits(host_seconds=0.2, wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS))
    link = socket.socketpair()
    clocks = ActionClocks(host.limits, WorkerClock(None), wire.HostChannel(link[0].fileno()))
    handlers = [signal.signal(number, _TIMERS.on_signal) for number in (signal.SIGALRM, signal.SIGPROF)]
    try:
        with pytest.raises(HostLimit) as stopped:
            host._serve({"op": "call", "tool": "search", "args": ["learning rate"], "kwargs": {}}, clocks)
    finally:
        for number, handler in zip((signal.SIGALRM, signal.SIGPROF), handlers):
            signal.signal(number, handler)
        for end in link:
            end.close()
    assert stopped.value.limit == "host_time"
    (call,) = host.tools.calls
    assert call.name == "search" and "stopped" in call.error and "host_time" in call.error and call.returned is None


def test_host_figures_are_recorded_for_every_action(small_demo, index):
    result, after = run(small_demo, index, "search('learning rate')\nsum(range(10**6))")
    assert result.limit_hit is None and result.host_cpu_seconds > 0 and result.host_seconds > 0
    assert after.tool_calls == [] and 0 <= after.host_seconds


def test_tool_work_runs_outside_the_policys_process(small_demo, index):
    """What one episode's calls cost is paid by its own host process, not by the process (and the
    interpreter lock) every episode in flight shares: the policy's process only waits."""
    with Sandbox(
        small_demo, Limits(tool_calls=10**6, wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS, host_seconds=HANG_SECONDS), index=index
    ) as sandbox:
        assert sandbox.host_pid not in (None, os.getpid())
        before = resource.getrusage(resource.RUSAGE_SELF)
        result = sandbox.execute("for i in range(300):\n    search('learning rate model data training results', k=50)")
        after = resource.getrusage(resource.RUSAGE_SELF)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert result.limit_hit is None and len(result.tool_calls) == 300
    assert ours < result.host_cpu_seconds / 3, (ours, result.host_cpu_seconds)


def test_a_hostile_episode_in_flight_cannot_push_an_innocent_one_over_its_limits(small_demo, index):
    """Hostile episodes keep their hosts as busy as their limits allow, beside an innocent one whose
    actions are cheap: the innocent's actions hit no limit and keep their variables."""
    stop = threading.Event()

    def hostile() -> None:
        limits = Limits(tool_calls=10**6, wall_seconds=3, cpu_seconds=3, host_seconds=3)
        with Sandbox(small_demo, limits, index=index) as sandbox:
            while not stop.is_set():
                sandbox.execute(SEARCHES)

    threads = [threading.Thread(target=hostile, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        with Sandbox(small_demo, Limits(wall_seconds=30, cpu_seconds=10), index=index) as innocent:
            innocent.execute("kept = 1")
            for _ in range(20):
                result = innocent.execute("hits = search('learning rate', k=3)\nkept = kept + 1\nkept")
                assert result.limit_hit is None and not result.variables_lost, result
            assert result.value == "21"
    finally:
        stop.set()
        for thread in threads:
            thread.join(HANG_SECONDS)


@pytest.mark.parametrize("budget, limit", [("host_seconds", "host_time"), ("wall_seconds", "wall_clock"), ("cpu_seconds", "cpu_time")])
def test_a_timer_stops_python_work_mid_call_and_names_its_budget(budget, limit):
    """What the episode host does around each call, here in this process: the timers interrupt
    Python code that never returns on its own, and say which budget ran out."""
    values = {"host_seconds": HANG_SECONDS, "wall_seconds": HANG_SECONDS, "cpu_seconds": HANG_SECONDS, budget: 0.2}
    link = socket.socketpair()
    clocks = ActionClocks(Limits(**values), WorkerClock(None), wire.HostChannel(link[0].fileno()))

    handlers = [signal.signal(number, _TIMERS.on_signal) for number in (signal.SIGALRM, signal.SIGPROF)]
    try:
        with pytest.raises(HostLimit) as stopped:
            with clocks.serving():
                while True:
                    pass
        assert stopped.value.limit == limit
    finally:
        for number, handler in zip((signal.SIGALRM, signal.SIGPROF), handlers):
            signal.signal(number, handler)
        for end in link:
            end.close()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)


def test_an_idle_host_serves_the_next_episode_fresh_and_a_stopped_one_never_does(small_demo, index):
    """Episode hosts are kept for the next episode (a reset, not a fork), which starts with nothing
    of the last one: no outcome, no calls, action numbers from 1; a host a budget stopped mid-call
    (its process-wide caches may be half-updated) is never kept."""
    with Sandbox(small_demo, Limits(), index=index) as first:
        first.execute("submit('first', evidence=[])")
        kept = first.host_pid
    with Sandbox(small_demo, Limits(), index=index) as second:
        result = second.execute("search('learning rate', k=1)[0]['paper_id']")
        assert second.host_pid == kept and second.outcome is None and second.actions == 1
        assert [call.name for call in result.tool_calls] == ["search"] and result.outcome is None
        assert second.execute("submit('second', evidence=[])").outcome.answer == "second"

    stopped = Limits(host_seconds=0.05, wall_seconds=HANG_SECONDS, cpu_seconds=HANG_SECONDS, tool_calls=10**6)
    for _ in range(20):  # until a budget stops a call mid-way (it may also run out between two calls)
        with Sandbox(small_demo, stopped, index=index) as sandbox:
            result = sandbox.execute(SEARCHES)
            tainted, pid = any("stopped" in (call.error or "") for call in result.tool_calls), sandbox.host_pid
        if tainted:
            break
    assert tainted
    with Sandbox(small_demo, Limits(), index=index) as after:
        after.execute("1")
        assert after.host_pid != pid
