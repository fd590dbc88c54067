"""One episode's host process: it runs the episode's actions on its worker and serves their tool
calls, on clocks that no other episode can stop.

Why a process per episode
-------------------------
The host's work for an action (validating, running and recording its tool calls) is the action's
work, and it is hostile work: an action chooses the arguments. In the process that runs the
policy, that work held the one interpreter lock that every episode in flight needs, so one
episode's searches delayed another's replies past its wall clock, and the latency it caused was a
channel between episodes. Here each episode's tools run in a process of their own (forked from a
server that holds the corpus and its index, pages shared), so:

- an episode's tool work cannot hold another episode's lock or delay another episode's clocks;
- the budgets are enforced *while* the host serves, not only while it waits: a timer signal
  (``ITIMER_REAL`` for the wall deadline and the host's own budget, ``ITIMER_PROF`` for CPU) stops a
  tool call mid-way, as the kernel stops a worker;
- the host's CPU is this process's CPU (``time.process_time``), so it is measured exactly and
  charged to the action beside the worker's.

What stays shared: the machine's CPU cores (the kernel shares them between processes; a hostile
episode can use the CPU its limits allow and so slow the others, and measure that it does), its
memory and its disk. ``bench/interference.py`` measures what that leaves.

The budgets of one action (``tools.limits.Limits``) and the limit each names when it runs out:
``wall_seconds`` -> ``wall_clock`` (the worker's and the host's time together), ``cpu_seconds`` ->
``cpu_time`` (the worker's CPU, read from /proc, plus this process's), ``host_seconds`` ->
``host_time`` (this process's own wall time in the action: everything but its waits on the worker,
so reading and decoding the worker's frames counts, as does serving its calls). Each action's record says what it
used: ``worker_cpu_seconds``, ``host_cpu_seconds``, ``host_seconds``. ``record_bytes`` -> ``records`` and
``episode_record_bytes`` -> ``episode_records``: the tool-call records an action, and an episode, may
add (``tools.paper_tools``: a call whose record would not fit is not run). The action's reply is the
action's work too: encoded within its budgets (a reply that takes the host past one names it), with
time kept for it (``REPLY_SECONDS_PER_BYTE`` per byte recorded, off the action's deadline), and
bounded by its limits (``Limits.reply_cap``); the policy's process charges its own reading of it
(``tools.sandbox``).

Protocol with the policy's process (frames of ``tools.wire``; that process is trusted):
``attach`` (followed by one byte carrying the worker's channel) gives this process a new worker;
``execute`` runs one action and answers ``result`` (the ``ActionResult``, whether the worker must
end, with the limit it hit, and ``spent``: the action's figures and its start on CLOCK_MONOTONIC,
measured after its reply was encoded), or ``stale`` when the worker wrote or died between actions (it
is then replaced and the action sent again); ``reset`` readies the host for another episode
(``tools.process_caches``). The process ends when that channel closes.

Why one module of this size: the host's loop, its clocks and its idle-host pool share one
invariant (a host a budget stopped mid-call is never reused), which is easier to check read together.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import signal
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field, fields
from typing import Any

from paper_explorer.corpus import BM25Index, Corpus, Paper, Section
from paper_explorer.tools import process_caches, registry, wire, worker
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.limits import Limits
from paper_explorer.tools.paper_tools import PaperTools, RecordsFull
from paper_explorer.tools.records import Outcome, ToolCallRecord
from paper_explorer.tools.reranking import RerankClient
from paper_explorer.tools.zygote import Zygote, serve_forks

DEATH_GRACE_SECONDS = 2.0  # how long a worker whose channel closed may take to finish dying
# What an action's reply costs per byte of its records, from the host's encoding to the policy's
# process having read, decoded and validated it: ~15 ns for plain text on a loaded two-core machine,
# but ~145 ns for the worst content measured (escaped backslashes beside a control character: a
# decoder callback every two bytes), which is what a hostile action sends; rounded up. The action's
# deadline comes that much earlier per byte recorded, so that its reply fits in its budget.
REPLY_SECONDS_PER_BYTE = 150e-9
FROM_HOST_CAP = 64 << 20  # frames from the policy's process: an action (at most worker.CODE_CAP) and attach
PR_SET_PDEATHSIG = 1


@dataclass
class ActionResult:
    stdout: str = ""
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    limit_hit: str | None = None
    variables_lost: bool = False
    tool_calls: list[ToolCallRecord] = field(default_factory=list)  # as the host recorded them
    outcome: Outcome | None = None  # set when this action's call ended the episode
    seconds: float = 0.0
    deferred_output_chars: int = 0  # printed by finalizers after the action returned: dropped, counted
    worker_cpu_seconds: float = 0.0  # the worker's CPU during the action, from /proc
    host_cpu_seconds: float = 0.0  # the episode host's CPU during the action (its calls, its frames)
    host_seconds: float = 0.0  # the host's own wall time in the action: reading its frames, serving its calls
    reply_cpu_seconds: float = 0.0  # the policy's process's CPU for the action: sending it, reading and decoding its reply

    def to_json(self) -> dict:
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        data["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        data["outcome"] = self.outcome.model_dump() if self.outcome is not None else None
        return data

    @classmethod
    def from_json(cls, data: dict) -> ActionResult:
        result = cls(**{key: value for key, value in data.items() if key not in ("tool_calls", "outcome")})
        result.tool_calls = [ToolCallRecord.model_validate(call) for call in data["tool_calls"]]
        result.outcome = Outcome.model_validate(data["outcome"]) if data["outcome"] is not None else None
        return result


def without_text(outcome: Outcome) -> Outcome:
    """An outcome as the host's reply carries it: the cited paragraphs by address, without their
    text, which the policy's process holds in its own copy of the corpus (``with_text``): a reply
    never carries corpus text, and an outcome costs it no copy."""
    return outcome.model_copy(update={"evidence": [item.model_copy(update={"text": ""}) for item in outcome.evidence]})


def with_text(outcome: Outcome, corpus) -> Outcome:
    """The outcome with each cited paragraph's text, from ``corpus`` (the host's own, pickled)."""
    evidence = [
        item.model_copy(update={"text": corpus.paper(item.paper_id).sections[item.section].paragraphs[item.paragraph]})
        for item in outcome.evidence
    ]
    return outcome.model_copy(update={"evidence": evidence})


def _past_budget(clocks: ActionClocks) -> str | None:
    """The budget the host's own work after the action (its reply) took it past, if any."""
    if time.monotonic() >= clocks.end:
        return "wall_clock"
    if clocks.cpu_left() <= 0:
        return "cpu_time"
    if clocks.host_busy() >= clocks.limits.host_seconds:
        return "host_time"
    return None


class CpuExceeded(Exception):
    pass


class TooManyCalls(Exception):
    pass


class HostLimit(BaseException):
    """A budget ran out while the host served a call (raised by a timer signal). A BaseException, so
    that no ``except Exception`` in a tool can swallow it."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


class WorkerClock:
    """The worker's CPU time, read from /proc by the host (a clock the action cannot touch)."""

    TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, stat_fd: int | None) -> None:
        self.stat_fd = stat_fd
        self.last = 0.0

    def seconds(self) -> float | None:
        """Its CPU time so far, or None where /proc cannot tell (then the wall clock and RLIMIT_CPU hold)."""
        if self.stat_fd is None:
            return None
        try:
            stat = os.pread(self.stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
            self.last = (int(stat[11]) + int(stat[12])) / self.TICKS
        except (OSError, IndexError, ValueError):
            return None
        return self.last


class ActionClocks:
    """One action's budgets, watched while the host waits on the worker (``watch``, between polls) and
    while it serves a call (``serving``: timer signals that stop the call)."""

    def __init__(self, limits: Limits, worker_clock: WorkerClock, channel: wire.HostChannel) -> None:
        self.limits = limits
        self.worker_clock = worker_clock
        self.channel = channel
        self.started = time.monotonic()
        self.end = self.started + limits.wall_seconds
        self.deadline = self.end  # earlier by what the action's reply will cost (``reserve``)
        self.cpu_started = time.process_time()
        self.worker_started = worker_clock.seconds()
        self.waited_before = channel.waited
        self.armed = False
        # The worker's CPU cannot grow faster than the wall clock (one thread: seccomp refuses clone),
        # so /proc needs no reading until the CPU budget left could have passed in wall time.
        self.next_look = 0.0

    def host_cpu(self) -> float:
        return time.process_time() - self.cpu_started

    def host_busy(self) -> float:
        """The host's own wall time in this action: all of it but its waits on the worker (reading and
        decoding frames, serving calls, encoding replies)."""
        return (time.monotonic() - self.started) - (self.channel.waited - self.waited_before)

    def worker_cpu(self) -> float:
        now = self.worker_clock.seconds()
        if now is None or self.worker_started is None:
            return 0.0
        return max(now - self.worker_started, 0.0)

    def cpu_left(self) -> float:
        return self.limits.cpu_seconds - self.worker_cpu() - self.host_cpu()

    def check(self) -> None:
        """Between frames: raise when a budget has run out (a worker that keeps the host busy with
        frames never lets it wait, so the clocks are read here too, not only in ``watch``)."""
        if time.monotonic() >= self.deadline:
            raise wire.ChannelTimeout()
        if self.cpu_left() <= 0:
            raise CpuExceeded()
        if self.host_busy() >= self.limits.host_seconds:
            raise HostLimit("host_time")

    def watch(self) -> float:
        """The watchdog of a wait: seconds until the next look; raises CpuExceeded when the CPU budget is spent."""
        elapsed = time.monotonic() - self.started
        if elapsed < self.next_look:
            return self.next_look - elapsed
        if self.worker_started is None:  # no /proc: the wall clock and RLIMIT_CPU still hold
            return 3600.0
        left = self.cpu_left()
        if left <= 0:
            raise CpuExceeded()
        self.next_look = elapsed + max(left, 0.01)
        return max(left, 0.01)

    def reserve(self, seconds: float) -> None:
        """Keep ``seconds`` of the wall budget for the action's reply (encoded here, decoded by the
        policy's process): the action's own deadline comes that much earlier."""
        self.deadline = self.end - seconds

    def serving(self) -> _Serving:
        return _Serving(self)

    def expired(self, signum: int) -> str:
        """Which budget a timer signal means."""
        if signum == signal.SIGPROF:
            return "cpu_time"
        return "wall_clock" if time.monotonic() >= self.deadline - 0.001 else "host_time"


class _Serving:
    """Arms the timers for one call: wall (the action's deadline or the host's budget, whichever is
    first) and CPU (what the action has left); disarms them however the call ends."""

    def __init__(self, clocks: ActionClocks) -> None:
        self.clocks = clocks

    def __enter__(self) -> None:
        clocks, now = self.clocks, time.monotonic()
        if now >= clocks.deadline:
            raise HostLimit("wall_clock")
        wall_left = min(clocks.deadline - now, clocks.limits.host_seconds - clocks.host_busy())
        if wall_left <= 0:
            raise HostLimit("host_time")
        cpu_left = clocks.cpu_left()
        if cpu_left <= 0:
            raise HostLimit("cpu_time")
        _TIMERS.clocks = clocks
        clocks.armed = True
        signal.setitimer(signal.ITIMER_REAL, wall_left)
        signal.setitimer(signal.ITIMER_PROF, cpu_left)

    def __exit__(self, *exc_info: Any) -> None:
        clocks = self.clocks
        clocks.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)


class _Timers:
    """The one place a timer signal is turned into HostLimit (only while a call is being served)."""

    clocks: ActionClocks | None = None

    def on_signal(self, signum: int, frame: Any) -> None:
        clocks = self.clocks
        if clocks is not None and clocks.armed:
            clocks.armed = False  # once: the handler of the exception must not be interrupted again
            raise HostLimit(clocks.expired(signum))


_TIMERS = _Timers()


class EpisodeHost:
    """One episode's tools and the action loop around them (runs in the episode's host process).

    ``tools`` are the episode's (``PaperTools.for_question``: the shared papers, or the question's
    own documents alone); ``shared``, the index of the corpus's shared papers, from which a reset
    makes the next episode's (``tools.index`` when not given)."""

    def __init__(self, tools, limits: Limits, shared: BM25Index | None = None) -> None:
        self.tools = tools
        tools.reranker = reranker_of(limits)
        self.shared = shared if shared is not None else tools.index
        self.limits = limits
        self.actions = 0  # numbers each action, so a done frame is matched to the action it answers
        self.channel: wire.HostChannel | None = None
        self.tainted = False  # a budget stopped a tool mid-way: its process-wide caches may be half-updated
        self.records_left = limits.episode_record_bytes  # of the episode's budget for tool-call records
        self._socket: socket.socket | None = None
        self._worker_clock = WorkerClock(None)

    def reset(self, limits: Limits, paper_id: str | None = None) -> None:
        """Serve a new episode, about a question on ``paper_id``: no worker, fresh limits, the
        process's caches as a fresh host has them (``tools.process_caches``: what the last episode left
        in them would tell the next one something by its timing, and keep its memory), then fresh
        tools over the documents its question sees (``PaperTools.for_question``)."""
        self.detach()
        self.tools = None  # the last episode's tools, and the own documents' indexes they hold, go before the collection
        self.limits, self.actions, self.records_left = limits, 0, limits.episode_record_bytes
        _TIMERS.clocks = None  # the last action's clocks, and through them its channel and limits
        process_caches.reset(self.shared.corpus)
        self.tools = PaperTools.for_question(self.shared, paper_id)
        self.tools.reranker = reranker_of(limits)

    def attach(self, channel: socket.socket, pid: int) -> None:
        """A new worker (the first, or one after a breach): its channel, and its CPU clock in /proc."""
        self.detach()
        self._socket, self.channel = channel, wire.HostChannel(channel.fileno())
        try:
            stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /proc: the wall clock and the worker's RLIMIT_CPU still hold
            stat_fd = None
        self._worker_clock = WorkerClock(stat_fd)

    def detach(self) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._worker_clock.stat_fd is not None:
            os.close(self._worker_clock.stat_fd)
        self._socket, self.channel, self._worker_clock = None, None, WorkerClock(None)

    def execute(self, code: str) -> bytes:
        """Run one action; the reply frame for the policy's process, encoded within the action's
        budgets (a reply that took the host past one names it) and bounded by them (``Limits.reply_cap``)."""
        if self.channel is None:
            return wire.encode({"op": "stale", "spoke": False})
        assert self._socket is not None
        if self.channel.pending():  # it wrote, or died, between actions: replaced before this one runs
            try:
                spoke = bool(self._socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except OSError:  # reset: it died with bytes of ours unread
                spoke = False
            self.detach()
            return wire.encode({"op": "stale", "spoke": spoke})
        result = ActionResult()
        calls_before, ended_before = len(self.tools.calls), self.tools.outcome is not None
        self.actions += 1
        allowance = min(self.limits.record_bytes, self.records_left)
        self.tools.start_action(allowance, "records" if allowance == self.limits.record_bytes else "episode_records")
        clocks = ActionClocks(self.limits, self._worker_clock, self.channel)
        limit, grace = self._run(wire.encode({"op": "run", "action": self.actions, "code": code}), result, clocks)
        self.records_left -= self.tools.record_bytes
        result.tool_calls = self.tools.calls[calls_before:]
        if self.tools.outcome is not None and not ended_before:
            result.outcome = without_text(self.tools.outcome)
        encoded = wire.dumps(result.to_json())
        limit = limit or _past_budget(clocks)  # encoding the reply is the action's work too
        spent = {
            "started": clocks.started,  # CLOCK_MONOTONIC, which the policy's process on this machine reads too
            "worker_cpu_seconds": round(clocks.worker_cpu(), 6),
            "host_cpu_seconds": round(clocks.host_cpu(), 6),
            "host_seconds": round(clocks.host_busy(), 6),
        }
        if limit is not None:
            self.detach()
        return wire.encode_around(
            {"op": "result", "limit": limit, "grace": grace, "tainted": self.tainted, "spent": spent}, "result", encoded
        )

    def _run(self, request: bytes, result: ActionResult, clocks: ActionClocks) -> tuple[str | None, float]:
        assert self.channel is not None
        channel, cap = self.channel, self.limits.frame_cap()
        limit, grace, calls = None, 0.0, 0
        try:
            channel.send(request, clocks.deadline, clocks.watch)
            while True:
                frame = channel.receive(cap, clocks.deadline, clocks.watch, wire.marker_hook)
                clocks.check()
                if frame.get("op") == "call":
                    calls += 1
                    if calls > self.limits.tool_calls:
                        raise TooManyCalls()
                    channel.send(self._serve(frame, clocks), clocks.deadline, clocks.watch)
                    clocks.reserve(REPLY_SECONDS_PER_BYTE * self.tools.record_bytes)
                elif frame.get("op") == "done":
                    limit = self._accept(frame, result)
                    break
                else:
                    raise wire.FrameMalformed(f"unexpected frame {str(frame.get('op'))[:40]!r}")
        except HostLimit as stop:
            limit = stop.limit
        except wire.ChannelTimeout:
            limit = "wall_clock"
        except CpuExceeded:
            limit = "cpu_time"
        except TooManyCalls:
            limit = "tool_calls"
        except RecordsFull as full:
            limit = full.limit
        except wire.FrameTooLarge:
            limit = "output"
        except wire.FrameMalformed:
            limit = "protocol"
        except wire.ChannelClosed:
            limit, grace = "crash", DEATH_GRACE_SECONDS
        return limit, grace

    def _serve(self, frame: dict, clocks: ActionClocks) -> bytes:
        """One tool call, executed and recorded here under the action's clocks; the reply frame."""
        name = frame.get("tool")
        if not isinstance(name, str) or name not in self.tools.tool_names:
            raise wire.FrameMalformed("a call of no tool")
        if "oversize" in frame:
            size = frame["oversize"] if type(frame["oversize"]) is int else -1
            reason = f"arguments of {size:,} bytes exceed the cap of {worker.REQUEST_CAP:,}; pass fewer and shorter values"
            self.tools.refuse(name, reason)
            return wire.encode({"error": f"{name}(): {reason}"})
        args, kwargs = frame.get("args"), frame.get("kwargs")
        if set(frame) != {"op", "tool", "args", "kwargs"}:
            raise wire.FrameMalformed("a call frame needs exactly tool, args and kwargs")
        unsent = next((part for part in (args, kwargs) if isinstance(part, wire.Marker)), None)
        if unsent is not None:  # the worker could not send its arguments as they were: a refused call, recorded
            self.tools.refuse(name, unsent.message())
            return wire.encode({"error": f"{name}(): {unsent.message()}"})
        if type(args) is not list or type(kwargs) is not dict:
            raise wire.FrameMalformed("a call frame's args must be a list and its kwargs an object")
        calls_before = len(self.tools.calls)
        try:
            with clocks.serving():
                try:
                    reply = wire.encode({"result": self.tools.call(name, args, kwargs)})
                except ToolError as error:
                    reply = wire.encode({"error": str(error)})
                except ValueError as error:  # a result that is not strict JSON (a non-finite number): a bug of ours
                    self._unreturned(f"internal error: the result is not JSON ({error})"[:500])
                    reply = wire.encode({"error": f"{name}() failed inside the tool (its result is not JSON); this is not your fault"})
                if len(reply) > worker.RESULT_CAP:
                    self._unreturned(f"result of {len(reply):,} bytes over the cap of {worker.RESULT_CAP:,}")
                    reply = wire.encode({"error": f"{name}(): the result is too large to return; ask for less (a smaller k or a page)"})
        except HostLimit as stop:  # the call is recorded as stopped, whether or not the tool had recorded it yet
            self.tainted = True
            note = f"stopped: the action's {stop.limit} limit ran out during this call"
            if len(self.tools.calls) > calls_before:
                self._unreturned(self.tools.calls[-1].error or note)
            else:
                self.tools.stopped(name, note)
            raise
        return reply

    def _unreturned(self, error: str) -> None:
        """The last call's result never reached the action: recorded as an error, with no result kept."""
        self.tools.calls[-1].error = error
        self.tools.calls[-1].returned = None

    def _accept(self, frame: dict, result: ActionResult) -> str | None:
        """Copy a done frame's claims into ``result``, bounded; returns a limit if the output overflowed."""
        expected: dict[str, type | tuple[type, ...]] = {
            "op": str,
            "action": int,
            "stdout": str,
            "value": (str, type(None)),
            "error": (str, type(None)),
            "traceback": (str, type(None)),
            "deferred_output_chars": int,
        }
        if set(frame) != set(expected) or not all(isinstance(frame[key], kind) for key, kind in expected.items()):
            raise wire.FrameMalformed("a done frame with other fields")
        if frame["action"] != self.actions:  # a late answer to an earlier action (after a forged one)
            raise wire.FrameMalformed("a done frame for another action")
        cap = self.limits.output_chars
        result.stdout = frame["stdout"][:cap]
        result.value = None if frame["value"] is None else worker.bounded(frame["value"], cap, "repr")
        result.error = None if frame["error"] is None else worker.bounded(frame["error"], worker.ERROR_CHARS, "error")
        result.traceback = None if frame["traceback"] is None else worker.bounded(frame["traceback"], worker.TRACEBACK_CHARS, "traceback")
        result.deferred_output_chars = max(frame["deferred_output_chars"], 0)
        return "output" if len(frame["stdout"]) > cap else None

    def serve(self, link: socket.socket) -> None:
        """Answer the policy's process until it closes the link."""
        signal.signal(signal.SIGALRM, _TIMERS.on_signal)
        signal.signal(signal.SIGPROF, _TIMERS.on_signal)
        fd = link.fileno()
        while True:
            request = wire.receive_blocking(fd, FROM_HOST_CAP)
            if request is None:
                return
            if request["op"] == "attach":
                _, fds, _, _ = socket.recv_fds(link, 1, 1)
                if not fds:
                    raise RuntimeError("an attach without the worker's channel")
                self.attach(socket.socket(fileno=fds[0]), request["pid"])
                continue
            if request["op"] == "reset":
                self.reset(Limits.model_validate(request["limits"]), question_paper(request))
                wire.send_blocking(fd, wire.encode({"op": "ready"}))
                continue
            wire.send_blocking(fd, self.execute(request["code"]))


# -- the fork server that episode hosts come from --------------------------------------------------


def main(control_fd: int, kernel_fence: bool, payload_fd: int, host: type[EpisodeHost] | None = None) -> None:
    """The episode hosts' fork server: reads the corpus and its index once, then forks one host per
    episode (an ``EpisodeHost``, or ``host``: the census test's, which can also report its caches)."""
    control = socket.socket(fileno=control_fd)
    try:
        corpus, index, tool_modules, tool_names = pickle.loads(_read_all(payload_fd))
        os.close(payload_fd)
        if any(paper.own_documents for paper in index.corpus.papers):
            raise ValueError("the index covers papers that hold a question's own documents; index a corpus's shared papers")
        registry.load_external(tool_modules, tool_names)  # tools registered from modules of the policy's process's own
        os.chdir("/")
        _touch(index)  # what a host's first calls import or compile lazily, imported before the fork
        process_caches.reset(index.corpus)  # every host starts from these caches, and a reset returns to them
    except BaseException as error:
        control.send(json.dumps({"op": "hello", "error": f"{type(error).__name__}: {error}"}).encode())
        os._exit(1)
    control.send(json.dumps({"op": "hello", "pid": os.getpid(), "seccomp_missing": None, "netns_missing": None}).encode())
    serve_forks(
        control,
        lambda request, fds: _episode(
            control,
            fds[0],
            (host or EpisodeHost)(
                PaperTools.for_question(index, question_paper(request)), Limits.model_validate(request["limits"]), shared=index
            ),
        ),
        prepare_spare=lambda: _warm(index),
    )


def reranker_of(limits: Limits) -> RerankClient | None:
    """The client of the run's reranking service (search's rerank), as the policy's process set it."""
    return RerankClient(limits.rerank_url) if limits.rerank_url is not None else None


def question_paper(request: dict) -> str | None:
    """The paper of the episode's question, as the policy's process (trusted) names it when it starts
    the episode; never anything a worker sent (a worker's frames reach only ``EpisodeHost._run``)."""
    paper_id = request.get("paper_id")
    if paper_id is not None and type(paper_id) is not str:
        raise ValueError("an episode's paper_id is a string or null")
    return paper_id


def _warm(index) -> None:
    """What every episode host touches first, touched by the spare before its episode comes: the
    copy-on-write faults of a fresh fork are paid while the previous episode runs. The same for every
    episode, and the caches settled after it as a reset leaves them, so a fresh host and a reused one
    start alike and nothing of one episode is in the next one's process."""
    if sys.platform.startswith("linux"):  # never outlive the fork server (it kills us when the host goes)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _touch(index)
    process_caches.reset(index.corpus)


# A question's own documents, made up: every episode host takes the paths of an episode over its
# question's own documents once (making its tools included), whatever papers the corpus holds.
WARM_CONTEXT = "Warm words for a warm paper. Warm again."
WARM_PAPER = Paper(id="warm", title="warm", sections=(Section(name="warm", paragraphs=(WARM_CONTEXT,)),), context=WARM_CONTEXT)


def _touch(index) -> None:
    """Every tool's paths once, errors included, over the shared papers and over a question's own
    documents: in the fork server, what they load or compile lazily; in a spare, the code and data
    pages they map. Otherwise the first episode to take a path on a host would leave it faster for
    the next episode there, which could tell it was taken."""
    wire.decode(wire.encode({"op": "result", "result": ActionResult().to_json(), "limit": None, "grace": 0.0})[4:])
    own = PaperTools.for_question(BM25Index.build(Corpus(papers=(WARM_PAPER,))), WARM_PAPER.id)
    for tools in (own, PaperTools(index.corpus, index)) if index.corpus.papers else (own,):
        _touch_tools(tools)


def _touch_tools(warm: PaperTools) -> None:
    first = warm.corpus.paper_ids[0]
    calls: tuple[tuple[str, list, dict], ...] = (
        ("search", ["warm"], {"k": 1}),
        ("search", ["warm"], {"paper_id": first}),
        ("read", [first], {}),
        ("read", [first], {"section": 0}),
        ("read", [first], {"section": "warm"}),
        ("read", [first + "~"], {}),  # did you mean
        ("extract", [first, "warm"], {"k": 1}),
        ("extract", [first, "warm|[a-z]{2}"], {"regex": True}),
        ("extract", [first, "("], {"regex": True}),
        ("submit", ["warm"], {"evidence": [[first, 0, 0], "a quote of warm words", {"paper_id": first}]}),
        ("submit", ["warm"], {"evidence": [[first, 0, 0]]}),
        ("abstain", ["warm"], {}),
        ("search", [], {"k": "warm"}),
    )
    for name, args, kwargs in calls:
        try:
            warm.call(name, args, kwargs)
        except ToolError:
            pass


def _read_all(fd: int) -> bytes:
    size, chunks, offset = os.fstat(fd).st_size, [], 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _episode(control: socket.socket, link_fd: int, host: EpisodeHost) -> None:
    if control.fileno() != -1:
        control.close()
    if sys.platform.startswith("linux"):  # never outlive the fork server (it kills us when the host goes)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    host.serve(socket.socket(fileno=link_fd))
    os._exit(0)


# -- the policy's process: one fork server per corpus and index ------------------------------------

_servers: dict[tuple[int, int, int], tuple[Zygote, IdleHosts]] = {}
# Re-entrant: a server's finalizer (``_close_server``) takes it, and the garbage collector may run
# one, for a corpus or index collected meanwhile, in the thread that holds it (pickling a payload
# allocates); a plain lock deadlocked there.
_servers_lock = threading.RLock()


def host_server(corpus, index) -> tuple[Zygote, IdleHosts]:
    """The fork server of episode hosts for this corpus and index, and its idle hosts (started on
    first use, closed when either is collected; a forked child of this process gets its own)."""
    key = (id(corpus), id(index), registry.generation)  # a tool registered since needs a server that loads it
    with _servers_lock:
        entry = _servers.get(key)
        if entry is None or entry[0].owner_pid != os.getpid():
            payload = pickle.dumps((corpus, index, registry.external_modules(), registry.names()), protocol=pickle.HIGHEST_PROTOCOL)
            server = Zygote(kernel_fence=False, entry=__name__, payload=payload)
            entry = _servers[key] = (server, IdleHosts(server))
            weakref.finalize(corpus, _close_server, key, server)
            weakref.finalize(index, _close_server, key, server)
        return entry


def _close_server(key: tuple[int, int, int], server: Zygote) -> None:
    with _servers_lock:
        if key in _servers and _servers[key][0] is server:
            del _servers[key]
    if server.owner_pid == os.getpid():
        server.close()


def _forget_servers_in_child() -> None:
    global _servers_lock
    _servers_lock = threading.RLock()
    for server, _ in _servers.values():  # the idle hosts are the parent's: never asked from here
        server.forget()
    _servers.clear()


os.register_at_fork(after_in_child=_forget_servers_in_child)


# -- idle episode hosts, kept for the next episode ------------------------------------------------

IDLE_HOSTS = 256  # per fork server; more than the episodes in flight is never needed at once


class IdleHosts:
    """Episode hosts whose episode has ended, each reset before it serves another: starting an
    episode then costs one round trip instead of a fork and its copy-on-write faults. A host a budget
    stopped mid-call is never kept (``EpisodeHost.tainted``). Thread-safe."""

    def __init__(self, server: Zygote) -> None:
        self.server = server
        self._hosts: list[tuple[int, socket.socket]] = []
        self._lock = threading.Lock()

    def take(self) -> tuple[int, socket.socket] | None:
        with self._lock:
            return self._hosts.pop() if self._hosts else None

    def keep(self, pid: int, link: socket.socket) -> None:
        with self._lock:
            if len(self._hosts) < IDLE_HOSTS:
                self._hosts.append((pid, link))
                return
        self.server.release(pid)
        link.close()
