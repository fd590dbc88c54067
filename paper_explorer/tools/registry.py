"""The tools a policy may call: each declared once, as a ``Tool``, and registered here.

A tool is one module: its arguments model, its function, and a ``TOOL = Tool(...)`` declaration
that names them with its page entry and what it records. Every module of ``tools.catalog`` is
registered when the registry is first read, so adding a tool there is a one-file change; a tool kept
in a module of your own is registered with ``register`` (docs/sandbox.md, "Add a tool"). Everything
else is derived from the registry: the tool page in the system prompt (``tools.page``), the names
the sandbox's worker gives the action (``tools.sandbox`` sends them), the validation of every call
(``tools.paper_tools``), and which calls the detectors count as research (``tools.records.Shown``)
or as the episode's end.

Tools run in the episode's host process, a fresh interpreter (``tools.episode_host``): a tool
registered from a module outside the package is loaded there again from that module's file, so it
must be declared at a module's top level, never in ``__main__``, in the module that defines its
function. The host runs that file only as it was when its first tool was registered (its sha256),
and serves exactly the tools the policy's process has registered: a file edited since, a tool its
module does not register again there, or one unregistered since, cannot be served behind the
registry's back.

Only the standard library and the argument models are imported here; the catalog's modules are
imported on first use, so ``agent.trajectory`` can ask which tools end an episode without loading
the corpus.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.util
import keyword
import pkgutil
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paper_explorer.tools.arguments import Arguments

NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# Names an action already has, which a tool must not shadow (tools.worker.Runtime's namespace), and
# names the sandbox takes for itself: RestrictedPython compiles "printed" to the print collector's
# text, and the worker keeps an action's last value in tools.worker.LAST_VALUE.
RESERVED = frozenset(vars(builtins)) | {"ToolError", "printed", "last_expression_value_"}


class RegistryError(Exception):
    """A tool declaration the registry refuses (its message says which and why)."""


@dataclass(frozen=True)
class Tool:
    """One tool, declared once.

    - ``name``: what the action calls; a lower-case identifier.
    - ``arguments``: the pydantic model (``tools.arguments.Arguments``) every call is validated by;
      its fields, descriptions and bounds are the tool page's.
    - ``function``: ``function(episode, args)``, run in the episode's host process with the
      episode's ``PaperTools`` (its corpus, index and helpers) and the validated arguments. It
      returns plain data (str, int, float, bool, None, list, dict), or, for a tool that shows the
      papers, a ``tools.layout.Rendered`` (the value, its text and the ``Shown`` record of what it
      showed), and raises ``ToolError`` with a message the model can act on.
    - ``summary``, ``returns``, ``example``: its entry on the tool page.
    - ``order``: where that entry sits on the page (lower first).
    - ``record``: ``"shown"`` for a tool that shows the policy paper text (its function returns a
      ``Rendered``; the detectors count it as research and read its ``Shown`` record), ``"outcome"``
      for one that ends the episode (it sets ``episode.outcome``), None for any other.
    """

    name: str
    arguments: type[Arguments]
    function: Callable[[Any, Any], Any]  # (the episode's tools.paper_tools.PaperTools, the validated arguments)
    summary: str
    returns: str
    example: str
    order: int
    record: str | None = None


_lock = threading.Lock()
_tools: dict[str, Tool] = {}
# module name -> (its file, the file's sha256 when its first tool was registered), for tools registered
# from outside the catalog
_external: dict[str, tuple[str, str]] = {}
_loaded = False
generation = 0  # bumped by every registration after the catalog's: a host started before it lacks the tool


def register(tool: Tool) -> Tool:
    """Add ``tool`` (once; a second tool of the same name is refused). Returns it, so a module can
    write ``TOOL = register(Tool(...))``."""
    global generation
    _check(tool)
    _load_catalog()
    with _lock:
        if _tools.get(tool.name) is tool:
            return tool
        if tool.name in _tools:
            raise RegistryError(f"a tool named {tool.name!r} is already registered (from {_tools[tool.name].function.__module__})")
        module = sys.modules.get(tool.function.__module__)
        if not tool.function.__module__.startswith(f"{__package__}.catalog."):
            path = getattr(module, "__file__", None)
            if module is None or path is None or tool.function.__module__ == "__main__":
                raise RegistryError(f"tool {tool.name!r}: declare it in a module of its own (a file), not in {tool.function.__module__}")
            if tool.function.__module__ not in _external:
                _external[tool.function.__module__] = (path, _sha256(path, tool.name))
        _tools[tool.name] = tool
        generation += 1
    return tool


def unregister(name: str) -> None:
    """Remove a tool registered with ``register`` (a catalog tool is part of the package: remove
    its module instead)."""
    global generation
    with _lock:
        tool = _tools.get(name)
        if tool is None or tool.function.__module__.startswith(f"{__package__}.catalog."):
            raise RegistryError(f"no tool {name!r} registered from outside tools.catalog")
        del _tools[name]
        if not any(other.function.__module__ == tool.function.__module__ for other in _tools.values()):
            _external.pop(tool.function.__module__, None)
        generation += 1


def tools() -> tuple[Tool, ...]:
    """Every registered tool, in page order."""
    _load_catalog()
    with _lock:
        return tuple(sorted(_tools.values(), key=lambda tool: (tool.order, tool.name)))


def by_name() -> dict[str, Tool]:
    return {tool.name: tool for tool in tools()}


def names() -> tuple[str, ...]:
    """The names the worker gives the action, one stub each."""
    return tuple(tool.name for tool in tools())


def research_tools() -> frozenset[str]:
    """Tools that show the papers: the detectors' research."""
    return frozenset(tool.name for tool in tools() if tool.record == "shown")


def ending_tools() -> frozenset[str]:
    """Tools that end the episode with an outcome."""
    return frozenset(tool.name for tool in tools() if tool.record == "outcome")


def external_modules() -> dict[str, tuple[str, str]]:
    """Modules outside the catalog that registered tools, with their files and those files' sha256:
    what an episode host loads."""
    _load_catalog()
    with _lock:
        return dict(_external)


def load_external(modules: dict[str, tuple[str, str]], names: tuple[str, ...]) -> None:
    """In an episode host: load the modules that registered tools in the policy's process (each
    registers its tools again when it runs ``register``, or by its ``TOOL`` below), each from the
    bytes its sha256 names, and keep exactly the tools ``names`` (the policy's registry) lists."""
    for name, (path, digest) in modules.items():
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RegistryError(f"tool module {name!r}: cannot load {path}")
        source = _file_bytes(path, f"tool module {name!r}")
        if hashlib.sha256(source).hexdigest() != digest:
            raise RegistryError(
                f"tool module {name!r}: {path} changed since its tools were registered; register them again "
                f"from the file as it is now (in a new process), or restore it"
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        if path.endswith(".py"):  # the very bytes checked, not the file read again
            exec(compile(source, path, "exec"), module.__dict__)
        else:
            spec.loader.exec_module(module)
        declared = getattr(module, "TOOL", None)
        if isinstance(declared, Tool):
            register(declared)
    served = by_name()
    for wanted in names:
        if wanted not in served:
            raise RegistryError(
                f"tool {wanted!r}: the episode's host process loaded {', '.join(modules) or 'no module'} and it did not "
                f"register it; declare the tool (TOOL = Tool(...)) in the module that defines its function"
            )
    for extra in set(served) - set(names):  # unregistered in the policy's process since its module registered it
        unregister(extra)


def _file_bytes(path: str, whose: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise RegistryError(f"{whose}: cannot read {path} ({error.strerror})") from None


def _sha256(path: str, tool: str) -> str:
    return hashlib.sha256(_file_bytes(path, f"tool {tool!r}")).hexdigest()


def _check(tool: Tool) -> None:
    from paper_explorer.tools.arguments import Arguments

    if not isinstance(tool.name, str) or not NAME.fullmatch(tool.name) or keyword.iskeyword(tool.name) or tool.name in RESERVED:
        raise RegistryError(f"tool name {tool.name!r}: use a lower-case identifier of at most 40 characters that is no builtin")
    if not (isinstance(tool.arguments, type) and issubclass(tool.arguments, Arguments)):
        raise RegistryError(f"tool {tool.name!r}: its arguments must be a subclass of tools.arguments.Arguments")
    if not callable(tool.function):
        raise RegistryError(f"tool {tool.name!r}: its function is not callable")
    if tool.record not in (None, "shown", "outcome"):
        raise RegistryError(f"tool {tool.name!r}: record must be 'shown', 'outcome' or None, not {tool.record!r}")


def _load_catalog() -> None:
    """Register every module of ``tools.catalog`` (once per process)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        catalog = importlib.import_module(f"{__package__}.catalog")
        found = []
        for info in sorted(pkgutil.iter_modules(catalog.__path__), key=lambda info: info.name):
            module = importlib.import_module(f"{catalog.__name__}.{info.name}")
            declared = getattr(module, "TOOL", None)
            if not isinstance(declared, Tool):
                raise RegistryError(f"{module.__name__} declares no TOOL = Tool(...)")
            _check(declared)
            found.append(declared)
        for tool in found:
            if tool.name in _tools:
                raise RegistryError(f"two catalog modules declare the tool {tool.name!r}")
            _tools[tool.name] = tool
        _loaded = True
