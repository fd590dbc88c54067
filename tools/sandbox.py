"""The sandbox that runs model-written actions: the host side, which alone holds authority.

Model-written code is hostile until proven otherwise, and every layer below assumes the one
above it has failed.

The layers
----------
1. **Language** (``tools.worker``): RestrictedPython compiles the action; no names or attributes
   starting with ``_`` (so no dunders), ``safer_getattr`` refuses ``str.format``/``format_map``
   and frame, code, generator and traceback attributes, ``mro`` is refused, builtins are a safe
   set (no ``open``, ``exec``, ``eval``, ``compile``, ``globals``, ``vars``, ``type``), and
   ``import`` yields a read-only view of exactly the names ``tools.modules.MODULE_EXPORTS`` lists,
   audited function by function.
2. **Authority stays here**: the worker holds no corpus, index, log or outcome. Its tools are
   stubs; each call is one request frame, which this host validates, executes
   (``tools.paper_tools``), times and records. The host alone decides the outcome (the first
   valid ``submit``/``abstain``, recorded the moment it is called: nothing printed, returned or
   raised afterwards can create, change or erase it) and which limit was hit (from what it
   observed: its clocks, the worker's CPU clock in ``/proc``, frame sizes, the worker's exit
   status read by the zygote - never from an exception name an action can raise). Every frame
   in both directions has a size cap checked before its body is read (``tools.wire``); a frame
   over the cap is a recorded ``output`` limit hit, not host memory; a malformed one is a
   ``protocol`` limit hit, and so is a result that names another action than the one running.
   Data a worker writes outside an action is refused and the worker replaced.
3. **Kernel fence** (``tools.zygote``, ``tools.fence``; Linux): workers fork from a zygote - a
   fresh interpreter with none of the host's state - close every descriptor but their channel,
   drop to ``nobody`` when started as root, lose every capability, and run under no-new-privs and a seccomp filter that
   fails open, socket, exec, fork, kill, ptrace, setrlimit and everything else Python does not
   need to compute. The zygote's network namespace is a new, empty one where the kernel allows it.
   The host reads ``/proc/PID/status`` to verify the fence and records what held as
   ``isolation`` (``"seccomp"``, plus ``+netns`` and ``+uid-drop`` when they hold); where the
   fence cannot be built it records ``"language-only"`` and prints one warning.
4. **Limits the host enforces**, without any capability: wall clock per action (SIGKILL), CPU per
   action by reading the worker's CPU clock, a CPU budget for the worker's whole life
   (RLIMIT_CPU, set once), address space (RLIMIT_AS: allocations past it fail with
   MemoryError, the action's own error; a worker that cannot allocate for itself exits, and the
   host records ``memory`` when the kernel's peak resident size backs that), printed output (the
   host cuts it and records ``output``), tool calls per action (``tool_calls``; each call is
   recorded, with long arguments cut, so a trajectory stays bounded), frame sizes, and
   deadlines on both directions of the channel. After any breach the worker is replaced and the
   result says the variables were lost.

What is still not protected
---------------------------
* An escaped action can use the CPU, memory and wall time it is allowed, read its own memory
  (which holds nothing but its own episode), and send the host any well-formed frames on its one
  channel: it can lie about what it printed, but not about tool calls (a call it writes by hand
  is a call, which the host validates, runs and records), outcomes or limits.
* Tool arguments and results are plain JSON; the host's tools are only as correct as
  ``tools.paper_tools`` (a bug there is recorded as ``internal error``, not hidden).
* Without seccomp (not Linux, no libseccomp) the walls are the language layer, closed
  descriptors, rlimits (no new descriptor numbers, no processes for non-root) and privilege
  dropping; the trajectory says ``language-only``. Run hostile workloads in a container or VM too.
* Timing: an action can measure time and so learn how long the host's tools take.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
import weakref
from dataclasses import dataclass, field, fields
from typing import Any

from corpus import BM25Index, Corpus
from tools import wire, worker
from tools.errors import ToolError
from tools.modules import DEFAULT_MODULES, VETTED_MODULES, check_allowed
from tools.paper_tools import TOOLS, PaperTools
from tools.records import Outcome, ToolCallRecord
from tools.zygote import Zygote, ZygoteError, shared_zygote

MAX_MEMORY_BYTES = 2**40
READY_SECONDS = 120.0  # a worker's start, generous for a loaded machine (normally a few ms)
DEATH_GRACE_SECONDS = 2.0  # how long a worker whose channel closed may take to finish dying
LANGUAGE_ONLY = "language-only"
_warned_language_only = False


class SandboxError(Exception):
    """The sandbox could not start a worker (the zygote failed, or the worker died at once)."""


@dataclass(frozen=True)
class Limits:
    """Per-action limits, and the worker's CPU budget for its whole life. Every breach replaces the
    worker (the episode's variables are lost)."""

    wall_seconds: float = 10.0
    cpu_seconds: float = 10
    memory_bytes: int = 2 * 2**30
    output_chars: int = 20_000
    allowed_modules: tuple[str, ...] = DEFAULT_MODULES
    episode_cpu_seconds: int = 600
    tool_calls: int = 500  # per action: each is recorded, so the trajectory stays bounded

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_bytes", "output_chars", "episode_cpu_seconds", "tool_calls"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"sandbox limit {name} must be a positive finite number, got {value!r}")
        if self.memory_bytes > MAX_MEMORY_BYTES:
            raise ValueError(f"sandbox limit memory_bytes can be at most {MAX_MEMORY_BYTES:,} (1 TiB), got {self.memory_bytes:,}")
        check_allowed(self.allowed_modules)

    def frame_cap(self) -> int:
        """The largest frame a worker may send: a result with stdout and value at their caps, every
        character escaped (12 bytes for an astral one), plus error and traceback."""
        text = 2 * (self.output_chars + 200) + worker.ERROR_CHARS + worker.TRACEBACK_CHARS + 200
        return max(12 * text + (64 << 10), worker.REQUEST_CAP)


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

    def to_json(self) -> dict:
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        data["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        data["outcome"] = self.outcome.model_dump() if self.outcome is not None else None
        return data


class CpuExceeded(Exception):
    pass


class TooManyCalls(Exception):
    pass


class CpuClock:
    """The worker's CPU time during one action, read from /proc by the host (a clock the action cannot touch).

    A worker has one thread (seccomp refuses clone), so its CPU time cannot grow faster than the
    wall clock: nothing needs reading until the remaining budget has passed in wall time."""

    TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, stat_fd: int | None, budget: float) -> None:
        self.stat_fd = stat_fd
        self.budget = budget
        self.started = time.monotonic()
        self.start = self._read()
        self.next_check = budget

    def _read(self) -> float | None:
        if self.stat_fd is None:
            return None
        try:
            fields = os.pread(self.stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / self.TICKS

    def watch(self) -> float:
        """Seconds until the next look; raises CpuExceeded once the action has used its budget."""
        elapsed = time.monotonic() - self.started
        if elapsed < self.next_check:
            return self.next_check - elapsed
        now = self._read()
        if self.start is None or now is None:  # no /proc: the wall clock and RLIMIT_CPU still hold
            return 3600.0
        left = self.budget - (now - self.start)
        if left <= 0:
            raise CpuExceeded()
        self.next_check = elapsed + max(left, 0.01)
        return max(left, 0.01)


def observe_isolation(pid: int) -> str:
    """What the host can see of a worker's fence in /proc: ``seccomp[+netns][+uid-drop]`` or ``language-only``."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    except OSError:
        return LANGUAGE_ONLY
    if status.get("Seccomp", "").strip() != "2" or status.get("NoNewPrivs", "").strip() != "1":
        return LANGUAGE_ONLY
    layers = ["seccomp"]
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            layers.append("netns")
    except OSError:
        pass
    if os.geteuid() == 0 and int(status.get("Uid", "0").split()[0]) != 0:
        layers.append("uid-drop")
    return "+".join(layers)


class Sandbox:
    """One episode's sandbox: ``with Sandbox(corpus) as sb: result = sb.execute(code)``.

    ``zygote`` defaults to this process's shared one; ``restricted=False`` runs plain Python in the
    worker (the kernel-fence tests use it to play an action that has escaped the language layer)."""

    def __init__(self, corpus: Corpus, limits: Limits = Limits(), index: BM25Index | None = None, *,
                 zygote: Zygote | None = None, restricted: bool = True) -> None:
        self.corpus = corpus
        self.limits = limits
        self.index = index if index is not None else BM25Index.cached(corpus)
        self.tools = PaperTools(corpus, self.index)
        self.zygote = zygote if zygote is not None else shared_zygote()
        self.restricted = restricted
        self.pid: int | None = None
        self.isolation: str | None = None
        self.start_seconds = 0.0
        self.replacements = 0
        self.refused_frames = 0  # data a worker wrote outside an action
        self.actions = 0  # numbers each action, so a done frame is matched to the action it answers
        self._socket = None
        self._stat_fd: int | None = None  # the worker's /proc/PID/stat, kept open: its CPU clock
        self._channel: wire.HostChannel | None = None
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- workers -------------------------------------------------------------------------------

    def start(self) -> None:
        started = time.perf_counter()
        settings = {
            "memory_bytes": self.limits.memory_bytes, "episode_cpu_seconds": self.limits.episode_cpu_seconds,
            "output_chars": self.limits.output_chars, "allowed_modules": list(self.limits.allowed_modules),
            "restricted": self.restricted,
        }
        try:
            pid, sock = self.zygote.spawn(settings)
        except (ZygoteError, OSError) as error:
            raise SandboxError(f"could not start a sandbox worker: {error}") from None
        self.pid, self._socket, self._channel = pid, sock, wire.HostChannel(sock.fileno())
        try:
            self._stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /proc: the wall clock and the worker's RLIMIT_CPU still hold
            self._stat_fd = None
        self._finalizer = weakref.finalize(self, _reap_quietly, self.zygote, pid, sock, self._stat_fd)
        try:
            ready = self._channel.receive(1 << 16, time.monotonic() + READY_SECONDS)
            if ready.get("op") != "ready":
                raise wire.FrameMalformed("expected the ready frame")
        except (wire.ChannelClosed, wire.ChannelTimeout, wire.FrameTooLarge, wire.FrameMalformed) as error:
            status = self._end_worker(0.0)
            raise SandboxError(f"the sandbox worker did not start ({type(error).__name__}; exit status {status})") from None
        self.isolation = observe_isolation(pid)
        if self.isolation == LANGUAGE_ONLY:
            _warn_language_only(self.zygote.seccomp_missing)
        self.start_seconds = time.perf_counter() - started

    def _end_worker(self, grace: float | None) -> dict:
        """Close the channel, make sure the worker is gone, and return how it ended (``grace``
        None: kill it without asking how it ended, as a normal close does)."""
        assert self.pid is not None
        if self._finalizer is not None:
            self._finalizer.detach()
        if grace is None:
            self.zygote.release(self.pid)
            status = {}
        else:
            status = self.zygote.reap(self.pid, grace)
        self._socket.close()
        if self._stat_fd is not None:
            os.close(self._stat_fd)
            self._stat_fd = None
        self.pid, self._socket, self._channel = None, None, None
        return status

    def _replace(self, result: ActionResult) -> None:
        self.replacements += 1
        result.variables_lost = True
        self.start()

    def close(self) -> None:
        if self.pid is not None:
            self._end_worker(None)

    # -- actions -------------------------------------------------------------------------------

    @property
    def outcome(self):
        """The episode's outcome as the host recorded it (``tools.paper_tools.Outcome``), or None."""
        return self.tools.outcome

    def execute(self, code: str) -> ActionResult:
        started = time.perf_counter()
        result = ActionResult()
        if self.pid is None:
            self.start()
        elif self._channel.pending():  # it wrote, or died, between actions: replaced before this one runs
            try:
                spoke = bool(self._socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except OSError:  # reset: it died with bytes of ours unread
                spoke = False
            if spoke:
                self.refused_frames += 1  # nothing a worker says outside an action counts
            self._end_worker(DEATH_GRACE_SECONDS)
            self._replace(result)
        calls_before, ended_before = len(self.tools.calls), self.tools.outcome is not None
        self.actions += 1
        request = wire.encode({"op": "run", "action": self.actions, "code": code})
        if len(request) > worker.CODE_CAP:
            result.error = f"ActionTooLong: the action is {len(request):,} bytes; the sandbox takes at most {worker.CODE_CAP:,}"
        else:
            self._run(request, result)
        result.tool_calls = [call.model_copy() for call in self.tools.calls[calls_before:]]
        if self.tools.outcome is not None and not ended_before:
            result.outcome = self.tools.outcome.model_copy(deep=True)
        result.seconds = time.perf_counter() - started
        return result

    def _run(self, request: bytes, result: ActionResult) -> None:
        deadline = time.monotonic() + self.limits.wall_seconds
        clock = CpuClock(self._stat_fd, self.limits.cpu_seconds)
        channel, cap = self._channel, self.limits.frame_cap()
        limit, grace, calls = None, 0.0, 0
        try:
            channel.send(request, deadline, clock.watch)
            while True:
                frame = channel.receive(cap, deadline, clock.watch, wire.marker_hook)
                if frame.get("op") == "call":
                    calls += 1
                    if calls > self.limits.tool_calls:
                        raise TooManyCalls()
                    channel.send(self._serve(frame), deadline, clock.watch)
                elif frame.get("op") == "done":
                    limit = self._accept(frame, result)
                    break
                else:
                    raise wire.FrameMalformed(f"unexpected frame {str(frame.get('op'))[:40]!r}")
        except wire.ChannelTimeout:
            limit = "wall_clock"
        except CpuExceeded:
            limit = "cpu_time"
        except TooManyCalls:
            limit = "tool_calls"
        except wire.FrameTooLarge:
            limit = "output"
        except wire.FrameMalformed:
            limit = "protocol"
        except wire.ChannelClosed:
            limit, grace = "crash", DEATH_GRACE_SECONDS
        if limit is None:
            return
        status = self._end_worker(grace)
        if limit == "crash":
            limit = self._death_reason(status)
        result.limit_hit = limit
        self._replace(result)

    def _death_reason(self, status: dict) -> str:
        """Why a worker closed its channel, from its exit status (read by its parent, the zygote)."""
        if status.get("signal") == signal.SIGXCPU:
            return "cpu_time"
        if status.get("signal") == signal.SIGKILL and not status.get("killed") \
                and status.get("cpu_seconds", 0) >= self.limits.episode_cpu_seconds - 1:
            return "cpu_time"  # the kernel's hard RLIMIT_CPU
        # The exit code is the worker's claim; the peak resident size, from the kernel, must back it.
        if status.get("exit_code") == worker.EXIT_MEMORY and status.get("max_rss_bytes", 0) >= self.limits.memory_bytes // 2:
            return "memory"
        return "crash"

    def _serve(self, frame: dict) -> bytes:
        """One tool call, executed and recorded here; the reply frame."""
        name = frame.get("tool")
        if name not in worker.TOOL_NAMES:
            raise wire.FrameMalformed("a call of no tool")
        if "oversize" in frame:
            size = frame["oversize"] if type(frame["oversize"]) is int else -1
            reason = f"arguments of {size:,} bytes exceed the cap of {worker.REQUEST_CAP:,}; pass fewer and shorter values"
            self.tools.refuse(name, reason)
            return wire.encode({"error": f"{name}(): {reason}"})
        args, kwargs = frame.get("args"), frame.get("kwargs")
        if type(args) is not list or type(kwargs) is not dict or set(frame) != {"op", "tool", "args", "kwargs"}:
            raise wire.FrameMalformed("a call frame needs exactly tool, args and kwargs")
        try:
            reply = wire.encode({"result": self.tools.call(name, args, kwargs)})
        except ToolError as error:
            reply = wire.encode({"error": str(error)})
        if len(reply) > worker.RESULT_CAP:
            self.tools.calls[-1].error = f"result of {len(reply):,} bytes over the cap of {worker.RESULT_CAP:,}"
            reply = wire.encode({"error": f"{name}(): the result is too large to return; ask for less (a smaller k or a page)"})
        return reply

    def _accept(self, frame: dict, result: ActionResult) -> str | None:
        """Copy a done frame's claims into ``result``, bounded; returns a limit if the output overflowed."""
        expected = {"op": str, "action": int, "stdout": str, "value": (str, type(None)), "error": (str, type(None)),
                    "traceback": (str, type(None)), "deferred_output_chars": int}
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


def _reap_quietly(zygote: Zygote, pid: int, sock, stat_fd: int | None) -> None:
    """A sandbox dropped without ``close()``: end its worker anyway."""
    try:
        zygote.release(pid)
    finally:
        sock.close()
        if stat_fd is not None:
            os.close(stat_fd)


def _warn_language_only(reason: str | None) -> None:
    global _warned_language_only
    if not _warned_language_only:
        _warned_language_only = True
        print(f"warning: sandbox workers run without the kernel fence ({reason or 'seccomp did not hold'}); "
              f"isolation is {LANGUAGE_ONLY!r} and every trajectory records it", file=sys.stderr)


__all__ = ["ActionResult", "Limits", "Sandbox", "SandboxError", "TOOLS", "VETTED_MODULES", "DEFAULT_MODULES", "observe_isolation"]
