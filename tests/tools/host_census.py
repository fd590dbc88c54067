"""A census of the caches an episode host's process holds, taken inside a real host.

``main`` is a fork server of episode hosts (``tools.episode_host.main``) whose hosts answer one
more request: an action whose code is ``CENSUS`` returns the census instead of running. The census
walks every module the host has loaded and finds what could remember one episode for the next:

- lru caches (``functools.lru_cache``/``cache``), wherever they hang: module globals, class
  attributes, static and class methods, properties;
- mutable containers (dict, list, set, bytearray, deque and weak collections) held by a module, a
  class, an object a module holds, a function's defaults or its closure;
- the modules loaded (a module imported lazily by one episode's call would load faster for the next).

Each is named by where it was first found and described by a fingerprint of its state: the size
and misses of an lru cache (only a miss adds an entry), the length and the shallow contents of a
container (values of plain types by value, anything else by identity, in the container's order).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import sys
import types
import weakref
from typing import Any

from paper_explorer.tools import episode_host, wire

CENSUS = "# census of the host's caches"
CONTAINERS = (dict, list, set, bytearray, collections.deque, weakref.WeakValueDictionary, weakref.WeakKeyDictionary, weakref.WeakSet)
PLAIN = (str, bytes, int, float, bool, type(None))
LARGE = 100_000  # a container this long is described by its length and identity only


def _token(value: Any) -> str:
    if isinstance(value, PLAIN):
        return repr(value)[:200]
    if isinstance(value, tuple) and all(isinstance(item, PLAIN) for item in value):
        return repr(value)[:200]
    return f"{type(value).__name__}@{id(value):x}"


def _fingerprint(value: Any) -> list:
    if isinstance(value, functools._lru_cache_wrapper):
        info = value.cache_info()
        return ["lru", info.currsize, info.misses]
    size = len(value)
    if size > LARGE:
        return [type(value).__name__, size]
    if isinstance(value, (dict, weakref.WeakValueDictionary, weakref.WeakKeyDictionary)):
        items = [f"{_token(key)}={_token(item)}" for key, item in list(value.items())]
    elif isinstance(value, (set, weakref.WeakSet)):
        items = sorted(_token(item) for item in list(value))
    elif isinstance(value, bytearray):
        items = [bytes(value).hex()]
    else:
        items = [_token(item) for item in list(value)]
    return [type(value).__name__, size, hashlib.sha256("\n".join(items).encode("utf-8", "surrogatepass")).hexdigest()[:16]]


def census(roots: dict[str, Any]) -> dict[str, list]:
    """name -> fingerprint, for every cache and container reachable from the loaded modules and from ``roots``."""
    found: dict[str, list] = {}
    seen: set[int] = set()

    def visit(name: str, value: Any, depth: int) -> None:
        if id(value) in seen or value is found or value is seen:
            return
        if isinstance(value, types.ModuleType) or depth > 5:
            return
        seen.add(id(value))
        if isinstance(value, functools._lru_cache_wrapper):
            found[name] = _fingerprint(value)
            visit(f"{name}.__wrapped__", getattr(value, "__wrapped__", None), depth + 1)
        elif isinstance(value, (classmethod, staticmethod)):
            visit(name, value.__func__, depth)
        elif isinstance(value, property):
            for part in ("fget", "fset", "fdel"):
                visit(f"{name}.{part}", getattr(value, part), depth + 1)
        elif isinstance(value, functools.partial):
            visit(f"{name}.func", value.func, depth + 1)
            for index, argument in enumerate(value.args):
                visit(f"{name}.args[{index}]", argument, depth + 1)
        elif isinstance(value, types.FunctionType):
            for index, default in enumerate(value.__defaults__ or ()):
                visit(f"{name}.__defaults__[{index}]", default, depth + 1)
            for key, default in (value.__kwdefaults__ or {}).items():
                visit(f"{name}.__kwdefaults__[{key}]", default, depth + 1)
            for cell_name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
                try:
                    visit(f"{name}.<closure {cell_name}>", cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(value, types.MethodType):
            visit(f"{name}.__func__", value.__func__, depth)
        elif isinstance(value, CONTAINERS):
            found[name] = _fingerprint(value)
            if isinstance(value, (dict, collections.deque, list)) and len(value) <= 1000 and depth < 5:
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for key, item in list(items):
                    if not isinstance(item, PLAIN + (tuple, types.FunctionType, type)):
                        visit(f"{name}[{_token(key)}]", item, depth + 1)
        elif isinstance(value, type):
            for key, item in list(vars(value).items()):
                if key not in ("__dict__", "__weakref__", "__doc__", "__module__", "__annotations__"):
                    visit(f"{name}.{key}", item, depth + 1)
        elif isinstance(value, PLAIN + (tuple, frozenset, types.BuiltinFunctionType, types.CodeType)):
            return
        else:  # an object: its attributes
            try:  # the instance's own attributes, never a __getattr__ of its class
                attributes = object.__getattribute__(value, "__dict__")
            except Exception:
                attributes = None
            if isinstance(attributes, dict):
                for key, item in list(attributes.items()):
                    visit(f"{name}.{key}", item, depth + 1)
            for slot in _slots(type(value)):
                try:
                    item = object.__getattribute__(value, slot)
                except Exception:
                    continue
                visit(f"{name}.{slot}", item, depth + 1)

    for root, value in roots.items():  # first, so that what they hold is named from them
        visit(root, value, 0)
    for module_name, module in sorted(list(sys.modules.items())):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in sorted(list(namespace.items())):
            if key.startswith("__") and key.endswith("__"):
                continue
            visit(_own_name(value) or f"{module_name}.{key}", value, 0)
    found["sys.modules"] = ["modules", len(sys.modules), hashlib.sha256("\n".join(sorted(sys.modules)).encode()).hexdigest()[:16]]
    return found


def _own_name(value: Any) -> str | None:
    """A class's or function's own dotted name (whichever module imported it first is found first)."""
    if isinstance(value, (type, types.FunctionType, functools._lru_cache_wrapper)):
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
            return f"{module}.{qualname}"
    return None


def _slots(kind: type) -> list[str]:
    names = []
    for klass in kind.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [slot for slot in slots if slot not in ("__dict__", "__weakref__")]
    return names


class CensusHost(episode_host.EpisodeHost):
    """An episode host that answers ``CENSUS`` with the census of its process."""

    def execute(self, code: str) -> bytes:
        if code == CENSUS:
            return wire.encode({"op": "census", "caches": census({"host.corpus": self.tools.corpus, "host.index": self.tools.index})})
        return super().execute(code)


def main(control_fd: int, kernel_fence: bool, payload_fd: int) -> None:
    episode_host.main(control_fd, kernel_fence, payload_fd, host=CensusHost)
