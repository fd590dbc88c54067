"""The caches of an episode host's process, and how a reused host gives every one of them back.

An episode host serves one episode after another (``tools.episode_host``). A cache of the process
that one episode's calls fill would tell the next episode, by how fast its own calls run, what the
last one asked (its patterns, its mistyped ids, the papers it read), and would keep the memory it
took. So every cache the tools can fill is listed here (``CACHES``), with what fills it, and both
the fork server (before its first fork) and ``reset`` (between two episodes) ``settle`` them the
same way: each cache emptied, then filled with what every episode gets (the corpus's did-you-mean
table), so a reused host starts from the state a fresh one does. ``reset`` also collects the
garbage and hands the freed memory back to the kernel (glibc's ``malloc_trim``).

A cache that no episode can change is left as it is: ``settle`` empties only what changed since
the last time it settled (an lru cache whose misses or size moved, a dict that is not its snapshot),
so a host that served an ordinary episode pays nothing for it.

Beyond the caches, a host's first call down each path maps code and data pages and imports or
compiles what that path loads lazily: every spare runs each tool's paths once (``episode_host._touch``)
before its episode, so no episode can tell from a path's speed that an earlier one took it (a
regex extract in a host's second episode took a median 7.4 ms after a first episode without one
and 2.3 ms after one, when spares warmed only a search; with every path warmed, medians of 2.4
and 2.3 ms over 60 hosts, within the machine's noise).

What this does not reach: pages of the fork server's memory that an earlier episode wrote (a Python
object's reference count is a write) are private copies in the host, so touching them again costs
no copy-on-write fault (measured with reads and extracts over 200 papers: the next episode guessed
which papers the last one read no better than chance); memory the allocators keep after the
collection and the trim (a few MB, the same after any episode, against +45 MB that 128 large
patterns used to leave: what is still resident lets a later allocation skip a page fault, ~0.1-0.2 ms
on the fastest of 30 regex extracts after an episode that made one, lost in the noise of the median);
caches inside C libraries that Python cannot see (RE2 keeps none across patterns; numpy, scipy and
pydantic-core keep none keyed by values).

The census test (``tests/tools/test_host_caches.py``) walks every module a real host has loaded,
finds every lru cache, container and pydantic class table reachable from them (module globals, class
attributes, objects' attributes, functions' defaults and closures) and the modules loaded, runs an
episode of many distinct calls, resets the host, and fails when a cache the episode filled is not
listed here or is not back to a fresh host's state: a cache added later without a line here fails it.
"""

from __future__ import annotations

import ctypes
import gc
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import re2

from paper_explorer.tools import paper_tools
from paper_explorer.tools.records import Evidence, Outcome, Record, Returned, ToolCallRecord


@dataclass
class ProcessCache:
    """One cache of the host's process: its name (as the census finds it), what fills it, its state
    (compared with the state it settled in), and how to return it there."""

    name: str
    fills: str  # which calls put what in it
    state: Callable[[], Any]
    empty: Callable[[], None]
    refill: Callable[[Any], object] = lambda corpus: None  # what every episode gets in it (the corpus's entries)
    settled: Any = field(default=None, init=False)


def _lru(name: str, fills: str, function: Any, refill: Callable[[Any], object] = lambda corpus: None) -> ProcessCache:
    """An lru cache: its state is its size and its misses (only a miss adds an entry)."""
    return ProcessCache(name, fills, lambda: (function.cache_info().currsize, function.cache_info().misses), function.cache_clear, refill)


class _Snapshot:
    """A dict that modules fill at import (re's pattern cache): emptied back to what it held when
    it first settled, which every host shares."""

    def __init__(self, table: dict) -> None:
        self.table = table
        self.kept: dict | None = None

    def state(self) -> list:
        return list(self.table.items())

    def restore(self) -> None:
        if self.kept is None:  # the first settling, before the fork: what it holds is every host's
            self.kept = dict(self.table)
            return
        self.table.clear()
        self.table.update(self.kept)


def _stdlib_re() -> list[ProcessCache]:
    """re's caches, whichever this Python has (3.11: _cache and _compile_repl; 3.12: _cache, _cache2, _compile_template)."""
    caches = []
    for name in ("_cache", "_cache2"):
        table = getattr(re, name, None)
        if isinstance(table, dict):
            snapshot = _Snapshot(table)
            caches.append(
                ProcessCache(
                    f"re.{name}",
                    "re's compiled patterns, keyed by their text (every tool compiles its own at import)",
                    snapshot.state,
                    snapshot.restore,
                )
            )
    for name in ("_compile_repl", "_compile_template"):
        function = getattr(re, name, None)
        if function is not None and hasattr(function, "cache_clear"):
            caches.append(_lru(f"re.{name}", "re's replacement templates (no tool uses them)", function))
    return caches


def _setattr_handlers(model: type[Record]) -> ProcessCache:
    """pydantic (2.11 on) keeps, per model class, a handler for each field the first time it is set
    on an instance: which fields a host's records were ever given (a call's ``error``...) would be
    one episode's mark on the next. Filled for every field before the fork, it never changes."""

    def handlers() -> dict:
        return vars(model).get("__pydantic_setattr_handlers__", {})

    def fill(corpus: Any) -> None:
        instance = model.model_construct()
        for name in model.model_fields:
            setattr(instance, name, None)  # no validation on assignment: this only memoises the handler

    return ProcessCache(
        f"paper_explorer.tools.records.{model.__name__}.__pydantic_setattr_handlers__",
        f"the fields of a {model.__name__} set after it was made",
        lambda: sorted(handlers()),
        lambda: handlers().clear(),
        fill,
    )


CACHES: tuple[ProcessCache, ...] = (
    ProcessCache(
        "paper_explorer.tools.paper_tools.SENTENCE_INDEXES",
        "extract(): the sentence index of each paper it read",
        lambda: (len(paper_tools.SENTENCE_INDEXES), paper_tools.SENTENCE_INDEXES.chars),
        paper_tools.SENTENCE_INDEXES.clear,
    ),
    _lru(
        "paper_explorer.tools.paper_tools._id_table",
        "did you mean: a table of the ids compared (in a host the shared papers' ids, built before the fork, and the one id "
        "of a question's own documents)",
        paper_tools._id_table,
        lambda corpus: paper_tools._id_table(tuple(corpus.paper_ids)),
    ),
    _lru("re2._Regexp._make", "re2.compile's last 128 patterns (extract compiles without it; emptied in case)", re2._Regexp._make),
    _lru("re2._Match._split", "re2's replacement templates (no tool uses them)", re2._Match._split),
    *_stdlib_re(),
    *(_setattr_handlers(model) for model in (ToolCallRecord, Returned, Evidence, Outcome)),
)


def settle(corpus: Any) -> None:
    """Each cache that changed since it last settled (all of them, the first time) back to its
    settled state: emptied, then given what every episode gets."""
    for cache in CACHES:
        if cache.settled is None or cache.state() != cache.settled:
            cache.empty()
            cache.refill(corpus)
            cache.settled = cache.state()


def reset(corpus: Any) -> None:
    """Between two episodes: the caches settled, the garbage collected and freed memory handed back."""
    settle(corpus)
    # CPython's type method cache holds a reference to each attribute name looked up on a type (4096
    # slots); names built during the episode then pin the memory blocks they sit in, so that what the
    # episode allocated stays resident after the collection (up to ~250 MB). Emptied first.
    sys._clear_type_cache()
    gc.collect()
    trim_memory()


def trim_memory() -> None:
    """Free heap memory back to the kernel where the C library can (glibc's malloc_trim)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc (musl has no malloc_trim): the memory stays in the heap
        pass
