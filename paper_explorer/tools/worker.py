"""The untrusted side of the sandbox: RestrictedPython running one episode's actions.

This module runs inside the worker process that ``tools.zygote`` forks and ``tools.fence``
walls in. It holds no corpus, no index, no log and no outcome: its tools (``search``, ``read``,
``extract``, ``submit``, ``abstain`` and any other the host's registry declares, named by the host
when it starts the worker) are stubs that send one request to the host and wait for its answer. Everything this process says is treated by the host as a claim, never as a fact
(see ``tools.sandbox``), so the code below is the *first* wall, not the last.

Output from every path lands in the current action's capture: RestrictedPython's ``print``,
``sys.stdout``/``sys.stderr`` writes, warnings, unraisable-exception reports and ``re.DEBUG``
dumps; descriptors 1 and 2 point at /dev/null, so C-level writes reach nobody. Code that runs
after its action returned (generator finalizers run by the collection that ends each action)
belongs to no step: its tool calls are refused and what it prints is dropped and counted.

Only the standard library and RestrictedPython are imported, so the zygote can load it fast.

Why one module of this size: it is everything the untrusted process imports, and keeping it
in one file keeps what runs behind the fence reviewable as one piece.
"""

from __future__ import annotations

import ast
import gc
import importlib
import operator
import os
import resource
import sys
import traceback
from typing import Any

from RestrictedPython import compile_restricted_exec, safe_builtins
from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safer_getattr,
)
from RestrictedPython.Guards import raise_ as _RAISE

from paper_explorer.tools import wire
from paper_explorer.tools.modules import MODULE_EXPORTS

LAST_VALUE = "last_expression_value_"  # RestrictedPython forbids leading underscores, so not _
ACTION_FILENAME = "<action>"
TOOL_NAME_CHARS = 40  # tools.registry.NAME's bound, checked again here
ERROR_CHARS = 2_000
C_LEVEL_IMPORTS = ("time", "_strptime")  # what allowed modules' C code imports for itself
THOROUGH_FROM = 16  # the first action whose collection also walks what earlier actions left
TRACEBACK_CHARS = 4_000
# Frame caps on the worker's side of the channel (the host has its own).
CODE_CAP = 1 << 20
RESULT_CAP = 4 << 20
REQUEST_CAP = 256 << 10
# Exit codes the host reads from the worker's status (the only thing of the worker's it believes).
EXIT_HOST_GONE = 0
EXIT_PROTOCOL = 3
EXIT_MEMORY = 4


class ToolError(Exception):
    """A tool refused the call; the message comes from the host and says what to do."""


class OutputLimit(BaseException):
    """Raised once, when an action prints past its limit; later writes are dropped anyway."""


class Capture:
    """One action's printed text: keeps at most ``limit + 1`` characters, so the host can see an overflow."""

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit
        self.raised = False

    def write(self, text: str) -> None:
        room = self.limit + 1 - self.size
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.size += len(piece)
        if self.size > self.limit and not self.raised:
            self.raised = True
            raise OutputLimit()

    def text(self) -> str:
        return "".join(self.parts)


class Discard:
    """Where output goes outside an action: nowhere, but counted."""

    def __init__(self) -> None:
        self.dropped = 0

    def write(self, text: str) -> None:
        self.dropped += len(text)


class Router:
    """Stands in for sys.stdout and sys.stderr: every write goes to the current sink."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self) -> None:
        self.sink: Capture | Discard = Discard()

    def write(self, text: Any) -> int:
        if type(text) is str:
            self.sink.write(text)
            return len(text)
        return 0

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class PrintTo:
    """What RestrictedPython's rewritten ``print`` calls; writes to the router like sys.stdout."""

    router: Router

    def __init__(self, _getattr_=None) -> None:
        pass

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.keys() - {"sep", "end"}:
            raise TypeError("print() here accepts only sep= and end=")
        sep, end = kwargs.get("sep", " "), kwargs.get("end", "\n")
        if not isinstance(sep, str) or not isinstance(end, str):
            raise TypeError("sep and end must be strings")
        self.router.write(sep.join(str(item) for item in objects) + end)


def guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """RestrictedPython's safer_getattr, minus ``mro``, and raising for missing attributes
    (its default returns None, which hides typos from the policy)."""
    if type(name) is not str:
        raise TypeError("attribute names must be strings")
    if name == "mro":
        raise AttributeError('"mro" is not available in actions')
    return safer_getattr(obj, name, default[0] if default else _RAISE)


INPLACE_OPERATIONS = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
}


def inplace(op: str, x: Any, y: Any) -> Any:
    return INPLACE_OPERATIONS[op](x, y)


def apply(function: Any, *args: Any, **kwargs: Any) -> Any:
    """RestrictedPython's hook for ``f(*args, **kwargs)``: the action may call what it can reach."""
    return function(*args, **kwargs)


class ReadOnlyModule:
    """Exactly the names ``tools.modules.MODULE_EXPORTS`` lists for a module; nothing can be set on it."""

    __slots__ = ("_name", "_items")

    def __init__(self, name: str, items: dict) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_items", items)

    def __getattr__(self, key: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if key in items:
            return items[key]
        raise AttributeError(f"module {object.__getattribute__(self, '_name')!r} has no attribute {key!r} here")

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("modules are read-only in actions")

    def __dir__(self) -> list[str]:
        return sorted(object.__getattribute__(self, "_items"))

    def __repr__(self) -> str:
        return f"<module {object.__getattribute__(self, '_name')!r} (read-only)>"


def module_view(name: str) -> ReadOnlyModule:
    module = importlib.import_module(name)
    return ReadOnlyModule(name, {key: getattr(module, key) for key in MODULE_EXPORTS[name] if hasattr(module, key)})


def preload_modules() -> None:
    """Import every allowed module, and warm what they load lazily, before the fence closes files."""
    for name in MODULE_EXPORTS:
        importlib.import_module(name)
    import datetime
    import re

    datetime.datetime.strptime("2020-01-02", "%Y-%m-%d")  # imports _strptime, reads the locale
    datetime.datetime.now()  # reads /etc/localtime once
    re.compile(r"(?P<warm>\w+)\s", re.IGNORECASE).sub(r"\g<warm>", "a b")
    traceback.extract_stack()


EXTRA_BUILTINS = {
    "all": all,
    "any": any,
    "dict": dict,
    "enumerate": enumerate,
    "filter": filter,
    "frozenset": frozenset,
    "list": list,
    "map": map,
    "max": max,
    "min": min,
    "reversed": reversed,
    "set": set,
    "sorted": sorted,
    "sum": sum,
    "tuple": tuple,
    "zip": zip,
    "format": format,
    "bin": bin,
    "next": next,
    "iter": iter,
}
REMOVED_BUILTINS = ("setattr", "delattr", "_getattr_")


class CompileError(Exception):
    pass


class OutOfMemory(BaseException):
    """Parsing an action ran out of memory: the worker, not the action, is spent (``serve`` exits
    with EXIT_MEMORY and the host starts a fresh one, variables lost)."""


def compile_action(code: str, restricted: bool = True):
    """Bytecode for an action; a final bare expression is assigned to LAST_VALUE (notebook style).
    RestrictedPython compiles it; ``restricted=False`` (fence tests only) compiles plain Python."""
    try:
        tree = ast.parse(code, filename=ACTION_FILENAME)
    except SyntaxError as error:
        raise CompileError(f"line {error.lineno}: {error.msg}") from None
    except MemoryError:  # an action is at most CODE_CAP: what the worker holds left no room to parse it
        raise OutOfMemory() from None
    except (ValueError, RecursionError) as error:  # NUL bytes, parser limits
        raise CompileError(f"{type(error).__name__}: {error}") from None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(ast.Assign(targets=[ast.Name(LAST_VALUE, ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    if not restricted:
        return compile(tree, ACTION_FILENAME, "exec")
    compiled = compile_restricted_exec(tree, filename=ACTION_FILENAME)
    if compiled.errors:
        raise CompileError("; ".join(compiled.errors))
    return compiled.code


def bounded(text: str, limit: int, what: str) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{what} cut at {limit} characters]"


def safe_text(function: Any, value: Any) -> str:
    try:
        text = function(value)
        return text if type(text) is str else "<not text>"
    except BaseException:  # a broken __repr__/__str__ must not break the report
        return "<unprintable>"


def action_traceback(error: BaseException) -> str:
    try:
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == ACTION_FILENAME]
    except BaseException:
        frames = []
    lines = [f"  line {frame.lineno}" for frame in frames]
    return "\n".join(["Traceback (action lines only):", *lines, f"{type(error).__name__}: {safe_text(str, error)}"])


class Runtime:
    """One episode's namespace; runs one action at a time and asks the host for every tool call."""

    def __init__(
        self,
        channel: int,
        output_chars: int,
        allowed_modules: tuple[str, ...],
        restricted: bool = True,
        memory_bytes: int = 2 * 2**30,
        tool_names: tuple[str, ...] = (),
    ) -> None:
        self.channel = channel
        self.memory_bytes = memory_bytes
        self.peak_at_thorough = 0
        self.output_chars = output_chars
        self.allowed_modules = allowed_modules
        self.restricted = restricted
        self.in_action = False
        self.exchanging = False
        self.actions = 0
        self.router = Router()
        self.printer = type("Printer", (PrintTo,), {"router": self.router})
        builtins = {k: v for k, v in safe_builtins.items() if k not in REMOVED_BUILTINS}
        builtins.update(EXTRA_BUILTINS)
        builtins["__import__"] = self._import
        builtins["getattr"] = guarded_getattr
        self.namespace: dict[str, Any] = {
            "__builtins__": builtins,
            "__name__": "action",
            "_getattr_": guarded_getattr,
            "_getitem_": default_guarded_getitem,
            "_getiter_": default_guarded_getiter,
            "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
            "_unpack_sequence_": guarded_unpack_sequence,
            "_write_": full_write_guard,
            "_inplacevar_": inplace,
            "_apply_": apply,  # calls with *args or **kwargs
            "_print_": self.printer,
            "ToolError": ToolError,
            "__metaclass__": type,  # RestrictedPython's class statements need it (names with _ stay unreachable)
        }
        for name in tool_names:
            # the host names the tools (tools.registry checks them); a stub never replaces a guard or a builtin
            if not (name.isidentifier() and name.islower() and not name.startswith("_") and len(name) <= TOOL_NAME_CHARS):
                raise ValueError(f"not a tool name: {name!r}")
            if name in self.namespace or name in builtins or name in (LAST_VALUE, "printed"):  # "printed": RestrictedPython's
                raise ValueError(f"a tool may not shadow {name!r}")
            self.namespace[name] = self._stub(name)
        if not restricted:  # the kernel-fence tests run plain Python here, as an escaped action would
            import builtins as all_builtins

            self.namespace["__builtins__"] = all_builtins

    def _import(self, name: str, globals=None, locals=None, fromlist=(), level=0):
        if name in C_LEVEL_IMPORTS and type(fromlist) is list and not fromlist and name in sys.modules:
            # PyImport_Import: C code of an allowed module (datetime's strftime) importing a helper it
            # uses internally passes an empty *list*; import statements pass None or a tuple, and an
            # action cannot call __import__ itself. The module goes to that C code, never to the action.
            return sys.modules[name]
        if level != 0 or name not in self.allowed_modules:
            allowed = ", ".join(self.allowed_modules) or "none"
            raise ImportError(f"import of {name!r} is not allowed in actions (allowed: {allowed})")
        return module_view(name)

    def _stub(self, name: str):
        runtime = self

        def call(*args: Any, **kwargs: Any) -> Any:
            if not runtime.in_action:
                raise ToolError(f"{name}() cannot be called from code that runs after its action ended (a finalizer)")
            request = wire.encode({"op": "call", "tool": name, "args": wire.to_wire(list(args)), "kwargs": wire.to_wire(dict(kwargs))})
            if len(request) > REQUEST_CAP:  # the host records the call and refuses it
                request = wire.encode({"op": "call", "tool": name, "oversize": len(request)})
            reply = runtime.exchange(request)
            if "error" in reply:
                raise ToolError(reply["error"])
            return reply["result"]

        call.__name__ = name
        call.__qualname__ = name
        return call

    def exchange(self, request: bytes) -> dict:
        """Send one request and read its answer. A failure half-way (memory, recursion) leaves the
        channel in an unknown state, so the worker exits rather than read the wrong frame later."""
        if self.exchanging:  # a finalizer run by a collection inside another call's exchange
            raise ToolError("tools cannot be called from code that runs while another tool call is in flight")
        depth_limit, collecting = sys.getrecursionlimit(), gc.isenabled()
        try:
            self.exchanging = True
            gc.disable()  # no finalizer may run between a request and its reply
            sys.setrecursionlimit(depth_limit + 100)  # a call made at the recursion limit still completes
            wire.send_blocking(self.channel, request)
            reply = wire.receive_blocking(self.channel, RESULT_CAP)
            sys.setrecursionlimit(depth_limit)
            if collecting:
                gc.enable()
            self.exchanging = False
        except BaseException:
            os._exit(EXIT_PROTOCOL)
        if reply is None:
            os._exit(EXIT_HOST_GONE)
        return reply

    def _collect(self, thorough: bool) -> None:
        """Collect this action's garbage now, so its finalizers run as code of no step, then freeze
        what survived: the next collection walks only what later actions allocate, so a large
        episode does not make every action slower. Frozen cycles that later become garbage wait
        for a thorough collection (which also walks the zygote's heap): after a MemoryError, after
        every action once the peak resident size has passed half the memory budget (so dropped
        cycles cannot fill it; such an episode pays a full collection per action, as Python would),
        once the peak has grown by a quarter of the budget since the last one, and at actions 16,
        32, 64 ..."""
        self.actions += 1
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        crowded = peak > self.memory_bytes // 2 or peak - self.peak_at_thorough > self.memory_bytes // 4
        if thorough or crowded or (self.actions >= THOROUGH_FROM and self.actions & (self.actions - 1) == 0):
            gc.unfreeze()
            self.peak_at_thorough = peak
        gc.collect()
        gc.freeze()

    def run(self, code: str) -> dict:
        capture = Capture(self.output_chars)
        result: dict[str, Any] = {"value": None, "error": None, "traceback": None}
        self.router.sink = capture
        self.in_action = True
        try:
            try:
                compiled = compile_action(code, self.restricted)
                exec(compiled, self.namespace)
                value = self.namespace.pop(LAST_VALUE, None)
                if value is not None:
                    result["value"] = bounded(safe_text(repr, value), self.output_chars, "repr")
                del value
            except OutputLimit:
                pass  # the host sees the overflow in the text itself
            except CompileError as error:
                result["error"] = bounded(f"SyntaxError: {error}", ERROR_CHARS, "error")
            except OutOfMemory:  # variables an earlier action kept fill the memory: no action could run, replace the worker
                raise MemoryError() from None
            except BaseException as error:  # the action's own exceptions, SystemExit and MemoryError included
                result["error"] = bounded(f"{type(error).__name__}: {safe_text(str, error)}", ERROR_CHARS, "error")
                result["traceback"] = bounded(action_traceback(error), TRACEBACK_CHARS, "traceback")
                error = None  # drop the frames it holds before the collection below
        except OutputLimit:  # printed past the limit while the value or the error was being formatted
            pass
        finally:
            self.in_action = False
            deferred = Discard()
            self.router.sink = deferred
        self.namespace.pop(LAST_VALUE, None)
        self._collect(thorough=(result["error"] or "").startswith("MemoryError"))
        result["stdout"] = capture.text()
        result["deferred_output_chars"] = deferred.dropped
        return result


def serve(
    channel: int,
    output_chars: int,
    allowed_modules: tuple[str, ...],
    restricted: bool,
    fence_notes: list[str],
    memory_bytes: int,
    tool_names: tuple[str, ...],
) -> None:
    """The worker's loop: ready, then one action per request, until the host closes the channel."""
    runtime = Runtime(channel, output_chars, allowed_modules, restricted, memory_bytes, tool_names)
    # The originals too: an action may reach them, and every byte it prints must pass the router's cap.
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = runtime.router  # type: ignore[misc,assignment]
    wire.send_blocking(channel, wire.encode({"op": "ready", "notes": fence_notes}))
    while True:
        try:
            request = wire.receive_blocking(channel, CODE_CAP)
        except (wire.FrameTooLarge, wire.FrameMalformed):
            os._exit(EXIT_PROTOCOL)
        if request is None:
            os._exit(EXIT_HOST_GONE)
        if request.get("op") != "run" or type(request.get("code")) is not str or type(request.get("action")) is not int:
            os._exit(EXIT_PROTOCOL)
        try:
            frame = wire.encode({"op": "done", "action": request["action"], **runtime.run(request["code"])})
        except MemoryError:
            os._exit(EXIT_MEMORY)
        except BaseException:
            os._exit(EXIT_PROTOCOL)
        try:
            wire.send_blocking(channel, frame)
        except BaseException:
            os._exit(EXIT_PROTOCOL)
