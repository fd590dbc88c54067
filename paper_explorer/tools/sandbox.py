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
2. **Authority stays in the host**: the worker holds no corpus, index, log or outcome. Its tools
   are stubs; each call is one request frame, which the episode's host process
   (``tools.episode_host``) validates, executes (``tools.paper_tools``), times and records. The
   host alone decides the outcome (the first valid ``submit``/``abstain``, recorded the moment it
   is called: nothing printed, returned or raised afterwards can create, change or erase it) and
   which limit was hit (from what it observed: its clocks, the worker's CPU clock in ``/proc``,
   frame sizes, the worker's exit status read by the zygote - never from an exception name an
   action can raise). Every frame in both directions has a size cap checked before its body is
   read, and strict JSON (no NaN, no infinity, no number past 64 bits: ``tools.wire``); a frame
   over the cap is a recorded ``output`` limit hit, not host memory; a malformed one is a
   ``protocol`` limit hit, and so is a result that names another action than the one running.
   Data a worker writes outside an action is refused and the worker replaced. What the host's
   tools returned is recorded beside each call, and detectors judge grounding from that record,
   never from what the worker printed (``evaluation.detectors``). Which papers the tools see is
   the host's too: the policy's process names the question's paper when the episode starts, and a
   paper holding the question's own documents is then all its tools see
   (``PaperTools.for_question``); no frame of the worker's can name another.
3. **Kernel fence** (``tools.zygote``, ``tools.fence``; Linux): workers fork from a zygote - a
   fresh interpreter with none of the host's state - close every descriptor but their channel,
   drop to ``nobody`` when started as root, lose every capability, and run under no-new-privs and
   a seccomp filter whose allowances and argument conditions are a reviewed table
   (``tools.fence.SYSCALL_RULES``): no syscall that takes a path (``newfstatat``/``statx``
   included), no open, socket, exec, fork, kill, ptrace or setrlimit, and the calls that can name
   a process (limits, CPU clocks, resource usage, futexes) only for the worker itself. The zygote's network namespace is a new, empty
   one where the kernel allows it. The host reads ``/proc/PID/status`` to verify the fence and
   records what held as ``isolation`` (``"seccomp"``, plus ``+netns`` and ``+uid-drop`` when they
   hold); where the fence cannot be built it records ``"language-only"`` and prints one warning.
4. **Limits the host enforces**, without any capability (``tools.limits``): the action's wall
   clock (``wall_clock``), its CPU time - the worker's, read from ``/proc``, plus the host's for
   its calls (``cpu_time``) - and the host's own time serving its calls (``host_time``), all
   enforced while the host waits on the worker *and* while it serves a call (timer signals stop a
   call mid-way; the call is recorded as stopped); a CPU budget for the worker's whole life
   (RLIMIT_CPU, set once), address space (RLIMIT_AS: allocations past it fail with MemoryError,
   the action's own error; a worker that cannot allocate for itself exits, and the host records
   ``memory`` when the kernel's peak resident size backs that), printed output (cut and recorded
   as ``output``), tool calls per action (``tool_calls``), the bytes of tool-call records an action
   and an episode may add (``records``, ``episode_records``: a call whose record would not fit is
   not run), frame sizes, and deadlines on both directions of the channel. Each tool bounds its own
   cost whatever its arguments. What the host sends this process for an action is bounded by those
   limits (``Limits.reply_cap``, checked before it is read), and its encoding there and its reading
   here are the action's work: the action's wall time runs until its reply is decoded here, and
   the CPU this process spends on it counts in the action's CPU budget. After any breach the worker
   is replaced and the result says the variables were lost. Every action's result records
   ``worker_cpu_seconds``, ``host_cpu_seconds``, ``host_seconds`` and ``reply_cpu_seconds``.
5. **Episodes apart in time**: each episode's actions run and its tools are served in a process of
   its own (``tools.episode_host``, forked from a server that holds the corpus and index), so
   one episode's tool work holds no lock, clock or queue that another episode in flight needs;
   this object, in the policy's process, only starts, attaches, reaps and replaces processes.

What is still not protected
---------------------------
* An escaped action can use the CPU, memory and wall time it is allowed, read its own memory
  (which holds nothing but its own episode), and send the host any well-formed frames on its one
  channel: it can lie about what it printed, but not about tool calls (a call it writes by hand
  is a call, which the host validates, runs and records), what the tools returned, outcomes or
  limits.
* The machine is shared: episodes in flight compete for the same CPU cores, memory bandwidth and
  caches, so a hostile episode that uses the CPU its limits allow slows the others (their limits
  hold: CPU limits count CPU time, not wall time; a wall limit can be reached sooner on a machine
  that is oversubscribed) and can measure the load others put on the machine: a timing channel
  between episodes in flight that only separate machines close. ``bench/interference.py``
  measures what it costs.
* Tool arguments and results are plain JSON; the host's tools are only as correct as
  ``tools.paper_tools`` (a bug there is recorded as ``internal error``, not hidden).
* Without seccomp (not Linux, no libseccomp) the walls are the language layer, closed
  descriptors, rlimits (no new descriptor, even in a number it closed; no processes for non-root)
  and, as root, privilege dropping; the trajectory says ``language-only``. Nothing then stops an
  escaped action's signals or ptrace: started by a user, the worker runs as that user and can
  signal, and where ptrace is not restricted (Yama) attach to, the user's own processes, the
  policy's included; as root, those running as ``nobody``. Run hostile workloads in a container or VM too.
* The episode host processes are trusted code without a fence of their own; they hold the corpus
  and index, nothing else of the policy's process (no model, no keys, no log).
* Timing: an action can measure time and so learn how long the host's tools take.

Why one module
--------------
``Sandbox`` is the one object the policy's process talks to for an episode: it starts and replaces
workers, asks the host, reads the host's verdict on limits, and charges the reply's reading to the
action. Split, each half would have to know the other's lifecycle (a worker replaced mid-action
loses its variables, which the result must say; a tainted host is never kept), which is the state
this module exists to keep in one place.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import weakref
from typing import Any, Literal

from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.tools import registry, wire, worker
from paper_explorer.tools.episode_host import DEATH_GRACE_SECONDS, ActionResult, IdleHosts, host_server, with_text
from paper_explorer.tools.limits import MAX_MEMORY_BYTES, Limits
from paper_explorer.tools.modules import DEFAULT_MODULES, VETTED_MODULES
from paper_explorer.tools.records import Outcome
from paper_explorer.tools.zygote import Zygote, ZygoteError, shared_zygote

READY_SECONDS = 120.0  # a worker's start, generous for a loaded machine (normally a few ms)
# How long past an action's wall limit its episode host may take to answer before it is taken for
# dead: it enforces the limit itself, so this only bounds a bug or a machine stalled for minutes.
HOST_ANSWER_SECONDS = 300.0
LANGUAGE_ONLY = "language-only"
_warned_language_only = False


class SandboxError(Exception):
    """The sandbox could not start a worker (the zygote failed, or the worker died at once), or its
    episode host stopped answering."""


def observe_isolation(pid: int) -> str:
    """What the host can see of a worker's fence in /proc: ``seccomp[+netns][+uid-drop]`` or ``language-only``."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = dict(line.split(":", 1) for line in handle.read().split("\n") if ":" in line)
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

    This object lives in the policy's process and owns the lifecycles: the worker (spawned by the
    workers' zygote, verified from /proc, reaped and replaced after a breach) and the episode host
    (``tools.episode_host``), the process that runs the actions and serves their tool calls.
    ``paper_id`` is the paper of the episode's question (None: a question of the caller's own, or
    no question): when that paper holds the question's own documents (``Paper.own_documents``), the
    tools see it alone, else the corpus's shared papers (``documents`` says which). It goes to the
    episode host with the episode's start, from this process: nothing a worker sends can change it.
    ``zygote`` defaults to this process's shared one; ``restricted=False`` runs plain Python in the
    worker (the kernel-fence tests use it to play an action that has escaped the language layer)."""

    def __init__(
        self,
        corpus: Corpus,
        limits: Limits = Limits(),
        index: BM25Index | None = None,
        *,
        zygote: Zygote | None = None,
        restricted: bool = True,
        paper_id: str | None = None,
    ) -> None:
        self.corpus = corpus
        self.paper_id = paper_id
        self.limits = limits
        self.index = index if index is not None else BM25Index.cached(corpus)
        self.zygote = zygote if zygote is not None else shared_zygote()
        self.restricted = restricted
        self.pid: int | None = None
        self.isolation: str | None = None
        self.start_seconds = 0.0
        self.replacements = 0
        self.refused_frames = 0  # data a worker wrote outside an action
        self.outcome: Outcome | None = None  # the episode's outcome as the host recorded it, once set
        self.actions = 0  # actions the episode host has run (it numbers the frames to its worker the same way)
        self.host_pid: int | None = None
        self._host_server: Zygote | None = None
        self._idle_hosts: IdleHosts | None = None  # of that server
        self._host_tainted = False  # a budget stopped a tool of its host mid-way: never kept for another episode
        self._host_socket: socket.socket | None = None
        self._host: wire.HostChannel | None = None
        self._finalizer: weakref.finalize | None = None
        self._host_finalizer: weakref.finalize | None = None

    @property
    def documents(self) -> Literal["own", "shared"]:
        """What the episode's tools see: ``own``, the paper ``paper_id`` alone (its question's own
        documents); ``shared``, the corpus's shared papers (every paper that holds no question's
        own documents). The episode host's rule, on the same corpus: the one its index was made for
        (``BM25Index.scoped``)."""
        return "own" if self.index.loaded.own_documents(self.paper_id) is not None else "shared"

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- processes -----------------------------------------------------------------------------

    def start(self) -> None:
        """A worker, attached to this episode's host (started first, with a fresh episode, if there is none)."""
        started = time.perf_counter()
        if self._host is None:
            self._start_host()
        settings = {
            "memory_bytes": self.limits.memory_bytes,
            "episode_cpu_seconds": self.limits.episode_cpu_seconds,
            "output_chars": self.limits.output_chars,
            "allowed_modules": list(self.limits.allowed_modules),
            "restricted": self.restricted,
            "tool_names": list(registry.names()),
        }
        try:
            pid, sock = self.zygote.spawn(settings)
        except (ZygoteError, OSError) as error:
            raise SandboxError(f"could not start a sandbox worker: {error}") from None
        self.pid = pid
        self._finalizer = weakref.finalize(self, _release_quietly, self.zygote, pid)
        try:
            try:
                ready = wire.HostChannel(sock.fileno()).receive(1 << 16, time.monotonic() + READY_SECONDS)
                if ready.get("op") != "ready":
                    raise wire.FrameMalformed("expected the ready frame")
            except (wire.ChannelClosed, wire.ChannelTimeout, wire.FrameTooLarge, wire.FrameMalformed) as error:
                status = self._end_worker(0.0)
                raise SandboxError(f"the sandbox worker did not start ({type(error).__name__}; exit status {status})") from None
            self._tell_host({"op": "attach", "pid": pid}, sock)
        finally:
            sock.close()  # the episode host holds the channel now
        self.isolation = observe_isolation(pid)
        if self.isolation == LANGUAGE_ONLY:
            _warn_language_only(self.zygote.seccomp_missing)
        self.start_seconds = time.perf_counter() - started

    def _start_host(self) -> None:
        """An episode host for a fresh episode: an idle one, reset, or a new one from the fork server."""
        self._host_server, self._idle_hosts = host_server(self.corpus, self.index)
        self.outcome, self.actions, self._host_tainted = None, 0, False
        while (idle := self._idle_hosts.take()) is not None:
            self._adopt_host(*idle)
            assert self._host is not None
            try:
                self._host.send(wire.encode({"op": "reset", **self._episode_start()}), time.monotonic() + READY_SECONDS)
                if self._host.receive(1 << 16, time.monotonic() + READY_SECONDS).get("op") == "ready":
                    return
            except (wire.ChannelClosed, wire.ChannelTimeout, wire.FrameTooLarge, wire.FrameMalformed):
                pass  # it died idle (killed from outside): take another
            self._end_host(keep=False)
        self.zygote.warm()  # on a first episode both servers start, side by side
        try:
            pid, sock = self._host_server.spawn(self._episode_start())
        except (ZygoteError, OSError) as error:
            raise SandboxError(f"could not start the episode's host process: {error}") from None
        self._adopt_host(pid, sock)

    def _episode_start(self) -> dict:
        """What the episode host is told of a new episode: its limits and its question's paper, from
        which the host makes its tools (``PaperTools.for_question``)."""
        return {"limits": self.limits.model_dump(mode="json"), "paper_id": self.paper_id}

    def _adopt_host(self, pid: int, sock: socket.socket) -> None:
        assert self._host_server is not None
        self.host_pid, self._host_socket, self._host = pid, sock, wire.HostChannel(sock.fileno())
        self._host_finalizer = weakref.finalize(self, _release_quietly, self._host_server, pid, sock)

    def _tell_host(self, frame: dict, channel: socket.socket | None = None) -> None:
        """A frame to the episode host (and the worker's channel after it, passed as a descriptor)."""
        assert self._host is not None and self._host_socket is not None
        try:
            self._host.send(wire.encode(frame), time.monotonic() + READY_SECONDS)
            if channel is not None:
                socket.send_fds(self._host_socket, [b"F"], [channel.fileno()])
        except (wire.ChannelClosed, wire.ChannelTimeout, OSError) as error:
            self._end_host()
            raise SandboxError(f"the episode's host process stopped answering ({type(error).__name__})") from None

    def _ask_host(self, frame: dict) -> dict:
        """Send ``frame`` and read the host's reply, which may be no larger than an action's
        (``Limits.reply_cap``): what the host sends this process is bounded by the limits, so no
        episode can make it hold or decode more."""
        self._tell_host(frame)
        deadline = time.monotonic() + self.limits.wall_seconds + HOST_ANSWER_SECONDS
        assert self._host is not None
        try:
            return self._host.receive(self.limits.reply_cap(longest_paper_id(self.corpus)), deadline)
        except (wire.ChannelClosed, wire.ChannelTimeout, wire.FrameTooLarge, wire.FrameMalformed) as error:
            self._end_host()
            raise SandboxError(f"the episode's host process stopped answering ({type(error).__name__})") from None

    def _end_worker(self, grace: float | None) -> dict:
        """Make sure the worker is gone and return how it ended (``grace`` None: kill it without
        asking how it ended, as a normal close does)."""
        assert self.pid is not None
        if self._finalizer is not None:
            self._finalizer.detach()
        if grace is None:
            self.zygote.release(self.pid)
            status = {}
        else:
            status = self.zygote.reap(self.pid, grace)
        self.pid = None
        return status

    def _end_host(self, keep: bool = False) -> None:
        """The episode host goes: kept idle for another episode (``keep``), or killed."""
        if self._host_finalizer is not None:
            self._host_finalizer.detach()
        assert self._host_server is not None and self._idle_hosts is not None
        if keep:
            assert self.host_pid is not None and self._host_socket is not None
            self._idle_hosts.keep(self.host_pid, self._host_socket)
        else:
            if self.host_pid is not None:
                self._host_server.release(self.host_pid)
            if self._host_socket is not None:
                self._host_socket.close()
        self.host_pid, self._host_socket, self._host = None, None, None

    def _replace(self, result: ActionResult) -> None:
        self.replacements += 1
        result.variables_lost = True
        self.start()

    def close(self) -> None:
        if self.pid is not None:
            self._end_worker(None)
        if self._host is not None:
            self._end_host(keep=not self._host_tainted)

    # -- actions -------------------------------------------------------------------------------

    def execute(self, code: str) -> ActionResult:
        started = time.perf_counter()
        if self.pid is None:
            self.start()
        request = {"op": "execute", "code": code}
        if len(wire.encode(request)) > worker.CODE_CAP:
            result = ActionResult(
                error=f"ActionTooLong: the action is {len(wire.encode(request)):,} bytes; the sandbox takes at most {worker.CODE_CAP:,}"
            )
            result.seconds = time.perf_counter() - started
            return result
        cpu_started = time.thread_time()  # this process's work for the action: its reply, read and decoded
        reply = self._ask_host(request)
        lost = False
        if reply["op"] == "stale":  # it wrote, or died, between actions: replaced before this one runs
            if reply["spoke"]:
                self.refused_frames += 1  # nothing a worker says outside an action counts
            self._end_worker(DEATH_GRACE_SECONDS)
            self.replacements += 1
            lost = True
            self.start()
            cpu_started = time.thread_time()
            reply = self._ask_host(request)
            if reply["op"] == "stale":  # a fresh worker, dead before its first action: the machine, not the action
                raise SandboxError("a fresh sandbox worker died before its first action; is the machine out of memory?")
        self.actions += 1
        self._host_tainted = self._host_tainted or reply["tainted"]
        result = ActionResult.from_json(reply["result"])
        if result.outcome is not None:
            result.outcome = with_text(result.outcome, self.corpus)
        spent = reply["spent"]
        for figure in ("worker_cpu_seconds", "host_cpu_seconds", "host_seconds"):
            setattr(result, figure, spent[figure])
        result.reply_cpu_seconds = round(time.thread_time() - cpu_started, 6)
        result.variables_lost = result.variables_lost or lost
        limit, grace = reply["limit"], reply["grace"]
        if limit is None:  # its reply, sent, read and decoded, is the action's work too: charged to its budgets
            if time.monotonic() - spent["started"] > self.limits.wall_seconds:  # both processes read CLOCK_MONOTONIC
                limit = "wall_clock"
            elif result.worker_cpu_seconds + result.host_cpu_seconds + result.reply_cpu_seconds > self.limits.cpu_seconds:
                limit = "cpu_time"
        if limit is not None:
            status = self._end_worker(grace)
            result.limit_hit = self._death_reason(status) if limit == "crash" else limit
            self._replace(result)
        if result.outcome is not None and self.outcome is None:
            self.outcome = result.outcome
        result.seconds = time.perf_counter() - started
        return result

    def _death_reason(self, status: dict) -> str:
        """Why a worker closed its channel, from its exit status (read by its parent, the zygote)."""
        if status.get("signal") == signal.SIGXCPU:
            return "cpu_time"
        if (
            status.get("signal") == signal.SIGKILL
            and not status.get("killed")
            and status.get("cpu_seconds", 0) >= self.limits.episode_cpu_seconds - 1
        ):
            return "cpu_time"  # the kernel's hard RLIMIT_CPU
        # The exit code is the worker's claim; the peak resident size, from the kernel, must back it.
        if status.get("exit_code") == worker.EXIT_MEMORY and status.get("max_rss_bytes", 0) >= self.limits.memory_bytes // 2:
            return "memory"
        return "crash"


_longest_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def longest_paper_id(corpus: Corpus) -> int:
    """The longest paper id of ``corpus``, in characters (an outcome's cited paragraphs carry their ids)."""
    longest = _longest_ids.get(corpus)
    if longest is None:
        longest = _longest_ids[corpus] = max(map(len, corpus.paper_ids), default=0)
    return longest


def _release_quietly(zygote: Zygote, pid: int, sock: socket.socket | None = None) -> None:
    """A sandbox dropped without ``close()``: end its process anyway."""
    try:
        zygote.release(pid)
    finally:
        if sock is not None:
            sock.close()


def _warn_language_only(reason: str | None) -> None:
    global _warned_language_only
    if not _warned_language_only:
        _warned_language_only = True
        print(
            f"warning: sandbox workers run without the kernel fence ({reason or 'seccomp did not hold'}); "
            f"isolation is {LANGUAGE_ONLY!r} and every trajectory records it",
            file=sys.stderr,
        )


__all__ = [
    "ActionResult",
    "Limits",
    "MAX_MEMORY_BYTES",
    "Sandbox",
    "SandboxError",
    "VETTED_MODULES",
    "DEFAULT_MODULES",
    "observe_isolation",
]
