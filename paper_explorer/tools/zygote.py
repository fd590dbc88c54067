"""The fork server that sandbox workers come from, and the host's handle on it.

The zygote is a fresh interpreter (``python -s -P -c``, a minimal environment, no inherited
descriptors but its control socket), so what a worker inherits is the zygote's state, never the
host's: no model weights, no open logs, no API keys in the environment, no other episode's pipe.
It imports what actions may use, builds the seccomp filter once, enters a new network namespace
when it can, freezes its heap (``gc.freeze``: collections in workers never walk it, so pages stay
shared) and then forks one worker per request, which fences itself (``tools.fence``) and runs
``tools.worker``.

Protocol on the control socket (SOCK_SEQPACKET, one JSON message each way):
``spawn`` (+ the worker's end of a fresh socketpair) -> ``{"pid"}`` (a worker forked ahead, so the
answer does not wait for a fork); ``reap`` -> the worker's exit status, CPU time and peak resident
size, or ``{"running"}`` (unless told to kill it); ``release`` (no answer) kills a worker whose end
nobody needs to know, and reaps it later. The zygote
is the workers' parent, so it alone can read how they ended; the host asks. When the host goes
away the control socket closes and the zygote kills every worker and exits.

Hash randomisation is fixed (PYTHONHASHSEED=0) in the zygote, so set iteration order inside
actions, and with it every trajectory, is the same from run to run.

Why one module of this size: the fork server and the host's handle on it speak one small protocol;
both ends of it are kept in one file so that a change to one is seen against the other.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# argv: control descriptor, kernel fence (1/0), project root, the module whose main() serves, payload descriptor (-1: none)
BOOT = (
    "import sys, importlib; sys.path.insert(0, sys.argv[3]); "
    "importlib.import_module(sys.argv[4]).main(int(sys.argv[1]), sys.argv[2] == '1', int(sys.argv[5]))"
)
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds paper_explorer/
MESSAGE_BYTES = 1 << 16
HELLO_SECONDS = 120.0  # a loaded CI machine can take seconds to start an interpreter
SPARE_ACK_SECONDS = 60.0  # a spare's "got it": a few microseconds, bounded for a machine stalled for a minute
EXIT_CHILD_RETURNED = 3  # a forked child whose entry returned or raised (the worker's EXIT_PROTOCOL)


class ZygoteError(Exception):
    """The zygote could not start or stopped answering."""


# -- the zygote process ------------------------------------------------------------------------


def main(control_fd: int, kernel_fence: bool, payload_fd: int = -1) -> None:
    """The workers' zygote (``payload_fd`` is unused: a worker inherits nothing but what it imports)."""
    control = socket.socket(fileno=control_fd)
    try:
        import gc
        import resource

        from paper_explorer.tools import fence, worker

        worker.preload_modules()
        fence.prepare()
        if kernel_fence:
            seccomp_program, seccomp_missing = fence.build_seccomp_filter()
            netns_missing = fence.unshare_network()
        else:
            seccomp_program, seccomp_missing, netns_missing = None, "the kernel fence was turned off for this sandbox", "turned off"
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir("/")
        gc.collect()
        address_space = fence.address_space()
    except BaseException as error:
        control.send(json.dumps({"op": "hello", "error": f"{type(error).__name__}: {error}"}).encode())
        os._exit(1)
    control.send(
        json.dumps({"op": "hello", "pid": os.getpid(), "seccomp_missing": seccomp_missing, "netns_missing": netns_missing}).encode()
    )
    # A spare worker waits, unfenced but holding nothing but the zygote's imports and its link, and
    # walls itself in when its request (its limits and channel) comes, as a freshly forked one does.
    serve_forks(
        control,
        lambda request, fds: _worker(control, fds[0], request, address_space, seccomp_program, seccomp_missing),
        prepare_spare=lambda: None,
    )


def serve_forks(
    control: socket.socket, start_child: Callable[[dict, list[int]], None], prepare_spare: Callable[[], None] | None = None
) -> NoReturn:
    """A fork server's loop: ``spawn`` forks a child that runs ``start_child(request, fds)`` (it
    must never return), ``release`` kills one, ``reap`` says how one ended. Every child dies when
    the control socket closes (its owner is gone).

    With ``prepare_spare``, one child is always forked ahead and has run it (warmed what every
    child will touch), waiting for its request: a spawn hands the request to it and answers at
    once, and the next spare is forked after the answer, off the spawn's path."""
    import gc

    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    gc.freeze()
    children: set[int] = set()
    released: set[int] = set()  # killed on the host's word, not yet reaped (nobody needs their status)
    spare = _fork_spare(control, start_child, prepare_spare, children) if prepare_spare else None
    while True:
        for pid in list(released):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    released.discard(pid)
            except ChildProcessError:
                released.discard(pid)
        try:
            message, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2)
        except OSError:
            message, fds = b"", []
        if not message:  # the host is gone: so are its workers
            for pid in children | released:
                _kill(pid)
            os._exit(0)
        request = json.loads(message)
        if request["op"] == "spawn":
            handed = False
            if spare is not None:
                pid, link = spare
                try:  # the spare says it has the request: one that died meanwhile answers nothing
                    socket.send_fds(link, [message], fds)
                    link.settimeout(SPARE_ACK_SECONDS)
                    handed = link.recv(1) == b"k"
                except OSError:
                    pass
                if not handed:  # it died (killed from outside): reaped later, and a fresh child forked
                    children.discard(pid)
                    _kill(pid)
                    released.add(pid)
                link.close()
            if not handed:
                pid = os.fork()
                if pid == 0:
                    try:
                        start_child(request, fds)
                    finally:
                        os._exit(EXIT_CHILD_RETURNED)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            control.send(json.dumps({"pid": pid}).encode())
            if prepare_spare is not None:
                spare = _fork_spare(control, start_child, prepare_spare, children)
            continue
        if request["op"] == "release":  # unanswered: nobody waits for a kill
            _kill(request["pid"])
            children.discard(request["pid"])
            released.add(request["pid"])
            continue
        else:
            reply = _reap(request["pid"], request["kill"])
            if "running" not in reply:
                children.discard(request["pid"])
        control.send(json.dumps(reply).encode())


def _fork_spare(
    control: socket.socket, start_child: Callable[[dict, list[int]], None], prepare: Callable[[], None], children: set[int]
) -> tuple[int, socket.socket]:
    """A child forked ahead: it runs ``prepare``, then waits for its spawn request on a private link."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            ours.close()
            try:
                prepare()
            except Exception:  # a warm-up only touches memory: what failed here fails again, and is reported, in the child's work
                pass
            message, fds, _, _ = socket.recv_fds(theirs, MESSAGE_BYTES, 2)
            if message:  # nothing: the server is gone
                theirs.send(b"k")
                theirs.close()
                start_child(json.loads(message), fds)
        finally:
            os._exit(EXIT_CHILD_RETURNED)
    theirs.close()
    children.add(pid)
    return pid, ours


def _worker(
    control: socket.socket, channel: int, request: dict, address_space: int, seccomp_program: bytes | None, seccomp_missing: str | None
) -> None:
    from paper_explorer.tools import fence, worker

    try:
        control.close()
        zygote = os.getppid()
        notes = fence.wall_in(channel, request["memory_bytes"], request["episode_cpu_seconds"], zygote, address_space, seccomp_program)
        if seccomp_missing:
            notes.append(seccomp_missing)
        worker.serve(
            fence.CHANNEL_FD,
            request["output_chars"],
            tuple(request["allowed_modules"]),
            request["restricted"],
            notes,
            request["memory_bytes"],
            tuple(request["tool_names"]),
        )
    finally:
        os._exit(worker.EXIT_PROTOCOL)


def _kill(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(pid: int, kill: bool) -> dict:
    """How worker ``pid`` ended; ``{"running"}`` if it has not ended and ``kill`` is false."""
    try:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if not done:
            if not kill:
                return {"pid": pid, "running": True}
            _kill(pid)
            _, status, usage = os.wait4(pid, 0)
    except ChildProcessError:
        return {"pid": pid, "unknown": True}
    return {
        "pid": pid,
        "killed": not done,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_bytes": usage.ru_maxrss * 1024,
    }


# -- the host's handle -------------------------------------------------------------------------


class Zygote:
    """The host's end of one zygote. Thread-safe; started on first use."""

    def __init__(self, kernel_fence: bool = True, *, entry: str = "paper_explorer.tools.zygote", payload: bytes | None = None) -> None:
        """``entry``: the module whose ``main`` serves forks (the workers' zygote by default);
        ``payload``: bytes its ``main`` reads once at start from a descriptor (an unlinked file)."""
        self.kernel_fence = kernel_fence
        self.entry = entry
        self._payload = _unlinked_file(payload) if payload is not None else None  # kept: a restarted zygote reads it again
        self.owner_pid = os.getpid()
        self.pid: int | None = None
        self.seccomp_missing: str | None = None
        self.netns_missing: str | None = None
        self._control: socket.socket | None = None
        self._process: subprocess.Popen | None = None
        self._launched: socket.socket | None = None  # started, its hello not read yet
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Start the zygote's interpreter now without waiting for it (two zygotes start side by side)."""
        with self._lock:
            if self._control is None and self._launched is None:
                self._launch()

    def _start(self) -> None:
        if self._launched is None:
            self._launch()
        self._greet()

    def _launch(self) -> None:
        host_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environment = {"PATH": os.defpath, "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        payload = self._payload
        passed = [zygote_end.fileno()] + ([payload.fileno()] if payload is not None else [])
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-s",
                    "-P",
                    "-c",
                    BOOT,
                    str(zygote_end.fileno()),
                    "1" if self.kernel_fence else "0",
                    PROJECT_ROOT,
                    self.entry,
                    str(payload.fileno()) if payload is not None else "-1",
                ],
                pass_fds=passed,
                env=environment,
                cwd="/",
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            zygote_end.close()
        self._launched = host_end

    def _greet(self) -> None:
        host_end, self._launched = self._launched, None
        assert host_end is not None and self._process is not None
        host_end.settimeout(HELLO_SECONDS)
        try:
            hello = json.loads(host_end.recv(MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError) as error:
            hello = {"error": f"no answer ({error})"}
        if "pid" not in hello:
            host_end.close()
            self._process.kill()
            self._process.wait()
            raise ZygoteError(f"the sandbox's zygote did not start: {hello.get('error', 'it exited at once')}")
        host_end.settimeout(None)
        self._control, self.pid = host_end, hello["pid"]
        self.seccomp_missing, self.netns_missing = hello["seccomp_missing"], hello["netns_missing"]

    def _ask(self, request: dict, fds: tuple[int, ...] | list[int] = ()) -> dict:
        if self._control is None:
            self._start()
        assert self._control is not None
        socket.send_fds(self._control, [json.dumps(request).encode()], list(fds))
        reply = self._control.recv(MESSAGE_BYTES)
        if not reply:
            raise ZygoteError("the sandbox's zygote stopped answering")
        return json.loads(reply)

    def spawn(self, settings: dict) -> tuple[int, socket.socket]:
        """A new worker: its pid and the host's end of its channel."""
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                try:
                    reply = self._ask({"op": "spawn", **settings}, [worker_end.fileno()])
                except (ZygoteError, OSError):  # it died (killed from outside?): start another, once
                    self._discard()
                    reply = self._ask({"op": "spawn", **settings}, [worker_end.fileno()])
        except BaseException:
            host_end.close()
            raise
        finally:
            worker_end.close()
        return reply["pid"], host_end

    def reap(self, pid: int, grace: float = 0.0) -> dict:
        """How worker ``pid`` ended (killed if it is still running after ``grace`` seconds). The
        lock is held per question, not across the grace period: other sandboxes go on meanwhile."""
        deadline = time.monotonic() + grace
        while True:
            kill = time.monotonic() >= deadline
            with self._lock:
                try:
                    reply = self._ask({"op": "reap", "pid": pid, "kill": kill})
                except (ZygoteError, OSError):  # its workers died with it
                    self._discard()
                    return {"pid": pid, "unknown": True}
            if "running" not in reply:
                return reply
            time.sleep(0.002)

    def release(self, pid: int) -> None:
        """Kill worker ``pid`` without waiting to learn how it ended, or for an answer (a sandbox
        closing normally: the zygote kills it when it reads the request, and reaps it later)."""
        with self._lock:
            if self._control is None:  # never started, or gone: its workers died with it
                return
            try:
                socket.send_fds(self._control, [json.dumps({"op": "release", "pid": pid}).encode()], [])
            except OSError:  # its workers died with it
                self._discard()

    def _discard(self) -> None:
        if self._launched is not None:
            self._launched.close()
            self._launched = None
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def close(self) -> None:
        with self._lock:
            self._discard()

    def forget(self) -> None:
        """In a forked child of the host: drop the inherited handle without touching the parent's zygote."""
        for handle in (self._control, self._launched):
            if handle is not None:
                handle.close()
        self._control = self._launched = None
        self._process = None


def _unlinked_file(data: bytes):
    """``data`` in a file with no name, for whoever is handed its descriptor (read it with pread: the offset is shared)."""
    import tempfile

    handle = tempfile.TemporaryFile()
    handle.write(data)
    handle.flush()
    return handle


_shared: Zygote | None = None
_shared_lock = threading.Lock()


def shared_zygote() -> Zygote:
    """This process's zygote (a forked child of the host gets its own)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.owner_pid != os.getpid():
            _shared = Zygote()
        return _shared


def _after_fork_in_child() -> None:
    global _shared, _shared_lock
    _shared_lock = threading.Lock()
    if _shared is not None:
        _shared.forget()
        _shared = None


os.register_at_fork(after_in_child=_after_fork_in_child)
