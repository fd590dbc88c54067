"""The sandbox that runs model-written actions: RestrictedPython inside a killable process.

What it protects against
------------------------
* Reaching anything but the tools: code is compiled by RestrictedPython (no names or
  attributes starting with ``_``, so no dunders), attribute access goes through
  ``safer_getattr`` (no ``str.format``/``format_map``, no frame, code, generator or traceback
  attributes such as ``gi_frame``, ``f_globals``, ``tb_frame``) and refuses ``mro``; builtins
  are RestrictedPython's safe set plus pure helpers (``sorted``, ``min``, ``enumerate`` ...), with
  no ``open``, ``exec``, ``eval``, ``compile``, ``globals``, ``vars``, ``getattr`` on private names,
  ``type`` or ``__import__``. ``import`` works only for an allow-list of modules (default:
  ``math``, ``re``, ``json``; ``Limits.allowed_modules`` may name others from the audited
  ``VETTED_MODULES`` and nothing else), and an import yields a read-only copy of the module's public,
  non-module attributes, so ``re.enum.sys`` and the like do not exist.
* Runaway actions: each action has a wall-clock limit enforced by the host (SIGKILL), a CPU
  limit (RLIMIT_CPU), an address-space limit (RLIMIT_AS) and an output limit. C-level work
  that no signal interrupts (``10**10**9``), huge allocations and interpreter crashes from deep
  nesting end in the worker's death, which the host sees and reports. After any breach the
  worker is replaced and the result says the variables were lost.
* Leaks between episodes: one forked worker per episode; its namespace, output buffer and
  tool state die with it. Only JSON crosses the process boundary (a length-prefixed frame on
  a private pipe, so printed text can never pose as a control message). Tool results are fresh
  objects (``tools.paper_tools``), so an action cannot poison what another action receives.
* ``BaseException``: ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` raised by an
  action are reported as its error; the worker loop does not stop.

What it does not protect against
--------------------------------
* It is not a kernel boundary: the worker runs as the same user, with the same file-system and
  network permissions, and relies on RestrictedPython to keep code away from them. Run hostile
  workloads inside a container or VM as well.
* Workers are forked from the host process, so they start with a copy of its memory (that is
  how the corpus index is shared at no cost). Do not load secrets into the host before
  starting sandboxes. Forking a process that runs other threads copies only the calling thread.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import os
import resource
import select
import signal
import struct
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from RestrictedPython import compile_restricted_exec, safe_builtins
from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
from RestrictedPython.Guards import raise_ as _RAISE
from RestrictedPython.Guards import full_write_guard, guarded_iter_unpack_sequence, guarded_unpack_sequence, safer_getattr

from corpus import BM25Index, Corpus
from tools.paper_tools import TOOLS, PaperTools

DEFAULT_MODULES = ("math", "re", "json")
# Modules an action may be allowed to import. Each was audited: its public attributes are pure
# functions, classes and constants; none is a module (those are dropped anyway) and none formats
# strings against objects (``string.Formatter`` reaches attributes, so ``string`` is not here).
VETTED_MODULES = ("math", "re", "json", "collections", "itertools", "functools", "statistics", "heapq", "bisect", "datetime")
LAST_VALUE = "last_expression_value_"  # RestrictedPython forbids leading underscores, so not _
ACTION_FILENAME = "<action>"


@dataclass(frozen=True)
class Limits:
    """Per-action limits. Every breach replaces the worker (the episode's variables are lost)."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 2 * 2**30
    output_chars: int = 20_000
    allowed_modules: tuple[str, ...] = DEFAULT_MODULES

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_bytes", "output_chars"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        unvetted = [name for name in self.allowed_modules if name not in VETTED_MODULES]
        if unvetted:
            raise ValueError(
                f"module {unvetted[0]!r} cannot be allowed in actions; choose from {', '.join(VETTED_MODULES)}"
            )


@dataclass
class ActionResult:
    stdout: str = ""
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    limit_hit: str | None = None
    variables_lost: bool = False
    tool_calls: list[dict] = field(default_factory=list)
    outcome: dict | None = None
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


# -- the worker side -----------------------------------------------------------------------------

class OutputLimit(BaseException):
    """Raised inside the worker when an action prints more than its limit."""


class _Output:
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > self.limit:
            keep = self.limit - (self.size - len(text))
            self.parts.append(text[:max(keep, 0)])
            raise OutputLimit()
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


class _PrintTo:
    """What RestrictedPython's rewritten ``print`` calls; writes only to the action's output."""

    output: _Output

    def __init__(self, _getattr_=None) -> None:
        pass

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.keys() - {"sep", "end"}:
            raise TypeError("print() here accepts only sep= and end=")
        sep, end = kwargs.get("sep", " "), kwargs.get("end", "\n")
        if not isinstance(sep, str) or not isinstance(end, str):
            raise TypeError("sep and end must be strings")
        self.output.write(sep.join(str(item) for item in objects) + end)


def _guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """RestrictedPython's safer_getattr, minus ``mro``, and raising for missing attributes
    (its default returns None, which hides typos from the policy)."""
    if type(name) is not str:
        raise TypeError("attribute names must be strings")
    if name == "mro":
        raise AttributeError('"mro" is not available in actions')
    return safer_getattr(obj, name, default[0] if default else _RAISE)


INPLACE_OPERATIONS = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "<<=": operator.ilshift,
    ">>=": operator.irshift, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
}


def _inplace(op: str, x: Any, y: Any) -> Any:
    return INPLACE_OPERATIONS[op](x, y)


def _module_copy(name: str) -> "_ReadOnlyModule":
    import importlib

    module = importlib.import_module(name)
    public = {
        key: value for key, value in vars(module).items()
        if not key.startswith("_") and type(value).__name__ != "module"
    }
    return _ReadOnlyModule(name, public)


class _ReadOnlyModule:
    """A module's public, non-module attributes; nothing can be set on it."""

    __slots__ = ("_name", "_items")

    def __init__(self, name: str, items: dict) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_items", items)

    def __getattr__(self, key: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if key in items:
            return items[key]
        raise AttributeError(f"module {object.__getattribute__(self, '_name')!r} has no public attribute {key!r} here")

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("modules are read-only in actions")

    def __repr__(self) -> str:
        return f"<module {object.__getattribute__(self, '_name')!r} (read-only)>"


EXTRA_BUILTINS = {
    "all": all, "any": any, "dict": dict, "enumerate": enumerate, "filter": filter, "frozenset": frozenset,
    "list": list, "map": map, "max": max, "min": min, "reversed": reversed, "set": set, "sorted": sorted,
    "sum": sum, "tuple": tuple, "zip": zip, "format": format, "bin": bin, "next": next, "iter": iter,
}
REMOVED_BUILTINS = ("setattr", "delattr", "_getattr_")


class _Worker:
    """Runs in the forked process: one namespace, one PaperTools, one action at a time."""

    def __init__(self, corpus: Corpus, index: BM25Index, limits: Limits) -> None:
        self.limits = limits
        self.tools = PaperTools(corpus, index)
        self.printer = type("Printer", (_PrintTo,), {})
        builtins = {k: v for k, v in safe_builtins.items() if k not in REMOVED_BUILTINS}
        builtins.update(EXTRA_BUILTINS)
        builtins["__import__"] = self._import
        builtins["getattr"] = _guarded_getattr
        self.namespace: dict[str, Any] = {
            "__builtins__": builtins,
            "__name__": "action",
            "_getattr_": _guarded_getattr,
            "_getitem_": default_guarded_getitem,
            "_getiter_": default_guarded_getiter,
            "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
            "_unpack_sequence_": guarded_unpack_sequence,
            "_write_": full_write_guard,
            "_inplacevar_": _inplace,
            "_print_": self.printer,
            **self.tools.functions(),
        }

    def _import(self, name: str, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in self.limits.allowed_modules:
            allowed = ", ".join(self.limits.allowed_modules) or "none"
            raise ImportError(f"import of {name!r} is not allowed in actions (allowed: {allowed})")
        return _module_copy(name)

    def run(self, code: str) -> dict:
        output = _Output(self.limits.output_chars)
        self.printer.output = output
        result = ActionResult()
        calls_before = len(self.tools.calls)
        ended_before = self.tools.outcome is not None
        try:
            exec(_compile(code), self.namespace)
            value = self.namespace.pop(LAST_VALUE, None)
            if value is not None:
                result.value = _bounded_repr(value, self.limits.output_chars)
        except OutputLimit:
            result.limit_hit = "output"
        except MemoryError:
            result.limit_hit = "memory"
        except _CompileError as error:
            result.error = f"SyntaxError: {error}"
        except BaseException as error:  # the action's own exceptions, SystemExit included
            result.error = f"{type(error).__name__}: {error}"
            result.traceback = _action_traceback(error)
        result.stdout = output.text()
        result.tool_calls = [asdict(call) for call in self.tools.calls[calls_before:]]
        if self.tools.outcome is not None and not ended_before:
            result.outcome = asdict(self.tools.outcome)
        return result.to_json()


class _CompileError(Exception):
    pass


def _compile(code: str):
    """RestrictedPython bytecode; a final bare expression is assigned to LAST_VALUE (notebook style)."""
    try:
        tree = ast.parse(code, filename=ACTION_FILENAME)
    except SyntaxError as error:
        raise _CompileError(f"line {error.lineno}: {error.msg}") from None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(ast.Assign(targets=[ast.Name(LAST_VALUE, ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    compiled = compile_restricted_exec(tree, filename=ACTION_FILENAME)
    if compiled.errors:
        raise _CompileError("; ".join(compiled.errors))
    return compiled.code


def _bounded_repr(value: Any, limit: int) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... [repr cut at {limit} characters]"


def _action_traceback(error: BaseException) -> str:
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == ACTION_FILENAME]
    lines = [f"  line {frame.lineno}" for frame in frames]
    return "\n".join(["Traceback (action lines only):", *lines, f"{type(error).__name__}: {error}"])


def _send(fd: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _receive(fd: int, deadline: float | None = None) -> dict | None:
    """One frame, or None on EOF or when the deadline passes."""
    header = _read_exactly(fd, 4, deadline)
    if header is None:
        return None
    body = _read_exactly(fd, struct.unpack(">I", header)[0], deadline)
    return None if body is None else json.loads(body)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not select.select([fd], [], [], timeout)[0]:
                return None
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _worker_main(requests: int, responses: int, corpus: Corpus, index: BM25Index, limits: Limits) -> None:
    os.setsid()  # its own process group: nothing it starts outlives a kill
    # The fork starts with the host's address space; the limit is what an action may add to it.
    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (current + limits.memory_bytes, current + limits.memory_bytes))
    if os.getuid() != 0:  # root ignores RLIMIT_NPROC
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    worker = _Worker(corpus, index, limits)
    while True:
        request = _receive(requests)
        if request is None:
            os._exit(0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu_now = math.ceil(used.ru_utime + used.ru_stime)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_now + limits.cpu_seconds, cpu_now + limits.cpu_seconds + 1))
        try:
            response = worker.run(request["code"])
        except BaseException as error:  # a failure of ours while running the action: report, don't die
            response = ActionResult(error=f"internal error: {type(error).__name__}").to_json()
        _send(responses, response)


# -- the host side -------------------------------------------------------------------------------

class Sandbox:
    """One episode's sandbox: ``with Sandbox(corpus) as sb: result = sb.execute(code)``."""

    def __init__(self, corpus: Corpus, limits: Limits = Limits(), index: BM25Index | None = None) -> None:
        self.corpus = corpus
        self.limits = limits
        self.index = index if index is not None else BM25Index.cached(corpus)
        self.pid: int | None = None
        self.start_seconds = 0.0
        self.replacements = 0

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def start(self) -> None:
        started = time.perf_counter()
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.close(request_write)
                os.close(response_read)
                _worker_main(request_read, response_write, self.corpus, self.index, self.limits)
            finally:
                os._exit(1)
        os.close(request_read)
        os.close(response_write)
        self.pid, self._requests, self._responses = pid, request_write, response_read
        self.start_seconds = time.perf_counter() - started

    def execute(self, code: str) -> ActionResult:
        if self.pid is None:
            self.start()
        started = time.perf_counter()
        try:
            _send(self._requests, {"code": code})
            response = _receive(self._responses, time.monotonic() + self.limits.wall_seconds)
        except (BrokenPipeError, OSError):
            response = None
        if response is not None:
            result = ActionResult(**response)
            if result.limit_hit:
                self._replace(result)
        else:
            result = ActionResult(limit_hit=self._death_reason())
            self._replace(result)
        result.seconds = time.perf_counter() - started
        return result

    def _death_reason(self) -> str:
        """Why the worker did not answer: wall clock, CPU, memory or a crash."""
        assert self.pid is not None
        finished, status = os.waitpid(self.pid, os.WNOHANG)
        if finished == 0:
            return "wall_clock"
        if os.WIFSIGNALED(status):
            signal_number = os.WTERMSIG(status)
            if signal_number in (signal.SIGXCPU, signal.SIGKILL):
                return "cpu_time"
            if signal_number == signal.SIGSEGV:
                return "crash"
        return "crash"

    def _replace(self, result: ActionResult) -> None:
        self.close()
        self.replacements += 1
        result.variables_lost = True
        self.start()

    def close(self) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # already reaped by _death_reason
            pass
        for fd in (self._requests, self._responses):
            os.close(fd)
        self.pid = None


__all__ = ["ActionResult", "Limits", "Sandbox", "TOOLS"]
