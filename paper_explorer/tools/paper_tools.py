"""One episode's tools: the host side that validates, runs, bounds and records every call.

``PaperTools`` holds one episode's view of a corpus and its BM25 index (the shared papers, or the
question's own documents alone: ``PaperTools.for_question``), and runs the tools the
registry declares (``tools.registry``; the built-in ones are ``tools.catalog``'s modules, each
holding its tool's arguments, function and cost bounds). Every call validates
its arguments (``tools.arguments``), is recorded with its latency, its error and what it returned
(bounded per call and per action: ``start_action`` opens an action's budget), and returns fresh
plain data (str, int, float, list, dict), so nothing an action receives can reach back into
the corpus, the index or another episode. Failures raise ``ToolError`` with a message the
model can act on ("no paper 'x'; did you mean ...?").

Every call's host cost is bounded whatever its arguments: quotes are found through the index's
normalised text (at most ``QUOTE_SCANS`` whole-corpus scans per submit), "did you mean" under a
work cap, regular expressions by program size times text, sentence indexes by a per-process LRU.
An episode host serves one episode after another: every cache of its process is returned to a fresh
host's state between two episodes (``tools.process_caches``), so one episode's calls tell the next
nothing by their timing.

What a research call showed of the papers is recorded as data while its result is written
(``tools.layout``; ``tools.records.Shown``): the paragraphs it showed and where each piece of paper
text lies in the rendering. Nothing reads a result's text back to find them, so no paper text
(a blank line and "[4] " inside a paragraph, a heading or a listing it imitates) can add to them.

Why one module of this size: the budgets a call is charged to (kept results, records) and the
bounded helpers every tool shares (paper ids with "did you mean", sentence indexes) sit together,
so that a reviewer sees every limit a call meets in one place; each tool's own bounds sit in its
module of ``tools.catalog``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import heapq
import json
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse

from paper_explorer.corpus import BM25, BM25Index, Corpus, Paper, tokenize
from paper_explorer.tools import registry, wire
from paper_explorer.tools.arguments import validate
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.layout import Rendered
from paper_explorer.tools.records import Outcome, Returned, Shown, ToolCallRecord
from paper_explorer.tools.reranking import RerankClient, RerankerIdentity

SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


MAX_NAME_CHARS = 300  # paper ids and section names are short; longer arguments are refused unechoed
SECTION_NUMBER = re.compile(r"[0-9]{1,6}")  # not str.isdigit(): it accepts "²", which int() refuses
# Sentence indexes (extract) kept per process, least recently used first out (emptied between episodes).
SENTENCE_INDEX_PAPERS = 128
SENTENCE_INDEX_CHARS = 8_000_000
CLOSE_CUTOFF = 0.6  # difflib.get_close_matches's default, as for every "did you mean"
CLOSE_POOL = 20  # similar ids ranked before the best few are shown
CLOSE_WORK = 100_000  # character pairs SequenceMatcher may compare per lookup (~100 ns each)
RECORD_TEXT_CHARS = 1_000  # a string argument kept in a call record beyond this is cut, and says so
RECORD_CHARS = 10_000  # a call record's arguments beyond this (as JSON) are summarised, and say so
# What a tool returned is kept for the detectors: whole up to RETURNED_CHARS (a search at k=50 with
# long titles is ~30,000), and up to ACTION_RETURNED_CHARS per action; beyond that, length and sha256.
RETURNED_CHARS = 32_000
ACTION_RETURNED_CHARS = 100_000
# Every record is also charged, in bytes as tools.wire sends it, to the action's budget for records
# (tools.limits: record_bytes, and what is left of episode_record_bytes). A call runs only when its
# arguments and RECORD_RESERVE fit in what is left: its kept result gets what the reserve leaves (and
# kept results at most half the budget, so that they cannot crowd out later calls), and its error (cut
# to RECORD_ERROR_CHARS) and the record's other fields take at most half the reserve, so a refused
# call's record always fits too, and an action's records never pass its budget.
RECORD_RESERVE = 16 << 10
RECORD_VALUE_BYTES = 64  # a decoded value's memory (an empty list: 56 bytes and a pointer), charged at least per value
RECORD_ERROR_CHARS = 1_000


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def for_record(arguments: dict) -> dict:
    """A call's arguments as the trajectory keeps them: long strings cut, and arguments that are
    still too large replaced by their size and their start. Each cut says what it left out."""
    kept = _cut_strings(arguments)
    text = json.dumps(kept, ensure_ascii=False, allow_nan=False)  # decoded frames hold no NaN or infinity
    if len(text) <= RECORD_CHARS:
        return kept
    return {
        "arguments_not_recorded": f"{len(text):,} characters of arguments, over the {RECORD_CHARS:,} a record keeps",
        "start": text[:RECORD_TEXT_CHARS],
    }


def returned_record(result: Any, budget_left: int, shown: Shown | None = None, bytes_left: int | None = None) -> Returned:
    """A tool's result rendered once (a str as it is, anything else as JSON) and bounded: cut to
    RETURNED_CHARS, then only its length and sha256 when it does not fit in ``budget_left``, what
    is left of the action's budget of kept characters, or in ``bytes_left``, what its record may
    still take of the action's budget for records. Each cut says what it left out. ``shown``
    (research calls: what the rendering showed, ``tools.layout``) is kept with the text: its pieces
    within what the cut kept, and its size charged to both budgets with the text's."""
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    chars, sha256 = len(text), hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    cut = None
    if len(text) > RETURNED_CHARS:
        text, cut = text[:RETURNED_CHARS], f"the first {RETURNED_CHARS:,} of {len(text):,} characters (the cap for one result)"
        if shown is not None:
            kept = len(text)
            shown = shown.model_copy(
                update={
                    "pieces": [(start, end) for start, end in shown.pieces if end <= kept],
                    "parts": None if shown.parts is None else [part for part in shown.parts if part.end <= kept],
                }
            )
    size = len(text) + record_chars(shown)
    if size > budget_left:
        said = f"{len(text):,} characters" + (f" and {record_chars(shown):,} of the record of what it showed" if shown is not None else "")
        return Returned(
            text=None,
            chars=chars,
            sha256=sha256,
            cut=f"not kept: {said}, over the {budget_left:,} left of the action's {ACTION_RETURNED_CHARS:,} characters of kept results",
        )
    if bytes_left is not None and (size := wire.size(text) + (0 if shown is None else record_cost(shown.model_dump()))) > bytes_left:
        return Returned(
            text=None,
            chars=chars,
            sha256=sha256,
            cut=f"not kept: {size:,} bytes, over the {max(bytes_left, 0):,} its record may still spend of the action's budget "
            f"for tool-call records",
        )
    return Returned(text=text, chars=chars, sha256=sha256, cut=cut, shown=shown)


def record_chars(shown: Shown | None) -> int:
    """What a record of what a result showed costs the action's budget: its length as JSON."""
    return 0 if shown is None else len(shown.model_dump_json())


class RecordsFull(Exception):
    """A call whose record would pass what is left of the budget for records: recorded as not run,
    and the action is cut. ``limit`` names the budget (``records``: the action's; ``episode_records``)."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


def record_cost(value: Any) -> int:
    """What a record (or its arguments) is charged to the budgets for records: its bytes as tools.wire
    sends them, or, when more, what its values cost to hold as Python objects once decoded (the
    host's and the policy's process keep every record of the episode): an empty list is 3 bytes on
    the wire and ~64 in memory, so bytes alone would let an action hold 20 times its budget."""
    return max(wire.size(value), RECORD_VALUE_BYTES * _values(value))


def _values(value: Any) -> int:
    """The containers and scalars in ``value``, itself included."""
    if isinstance(value, dict):
        return 1 + sum(1 + _values(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(_values(item) for item in value)
    return 1


def _recorded_error(text: str) -> str:
    """An error as its call record keeps it (the action is shown it whole)."""
    if len(text) <= RECORD_ERROR_CHARS:
        return text
    return text[:RECORD_ERROR_CHARS] + f"... [{len(text) - RECORD_ERROR_CHARS} characters not recorded]"


def _cut_strings(value: Any) -> Any:
    if isinstance(value, str) and len(value) > RECORD_TEXT_CHARS:
        return value[:RECORD_TEXT_CHARS] + f"... [{len(value) - RECORD_TEXT_CHARS} characters not recorded]"
    if isinstance(value, list):
        return [_cut_strings(item) for item in value]
    if isinstance(value, dict):
        return {_cut_strings(key): _cut_strings(item) for key, item in value.items()}
    return value


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_BOUNDARY.split(text) if s.strip()]


class PaperTools:
    """One episode's tools over the papers its index covers; ``calls`` and ``outcome`` record what
    happened.

    The papers an episode sees are exactly those of its index (``index.corpus``): a corpus's shared
    papers, or, for a question that brings its own documents, that one paper (``for_question``).
    Every tool finds papers through ``corpus`` and ``paper``, so an id outside them is an unknown id,
    with a "did you mean" drawn from them alone."""

    def __init__(
        self,
        corpus: Corpus,
        index: BM25Index,
        tools: dict[str, registry.Tool] | None = None,
        own_sentences: SentenceIndex | None = None,
    ) -> None:
        if corpus is not index.corpus and corpus is not index.loaded:
            raise ValueError("the index was made for another corpus than the tools'")
        self.corpus = index.corpus  # the papers this episode sees: exactly those its index searches
        self.index = index
        # The sentence index of the question's own documents, built with the episode (a context of
        # 0.93 MB takes ~0.2 s on a loaded two-core machine, which no extract should pay within its
        # action's budgets).
        self._own_sentences = own_sentences
        self.calls: list[ToolCallRecord] = []
        self.outcome: Outcome | None = None
        self._returned_left = ACTION_RETURNED_CHARS  # of this action's budget for kept results
        self._record_left: int | None = None  # bytes of records this action may still add (None: no budget)
        self._results_left: int | None = None  # of them, bytes its kept results may still take
        self._records_limit = "records"  # the budget that binds: the action's, or what is left of the episode's
        self.record_bytes = 0  # bytes of records this action added, as tools.wire sends them
        self._tools = registry.by_name() if tools is None else tools  # the tools registered when the episode began
        self.tool_names = frozenset(self._tools)
        self.reranker: RerankClient | None = None  # the run's reranking service (search's rerank), set by the episode host
        self.reranked_by: RerankerIdentity | None = None  # set by a call that reranked: its record keeps it

    @classmethod
    def for_question(cls, index: BM25Index, paper_id: str | None, tools: dict[str, registry.Tool] | None = None) -> PaperTools:
        """The tools of an episode whose question is about ``paper_id`` (None: a question of the
        caller's own): over that paper alone when it holds the question's own documents
        (``Corpus.own_documents``), its index and sentence index built here, before the episode's
        first action; else over the shared papers ``index`` covers."""
        scoped = index.scoped(paper_id)
        if scoped is index:
            return cls(index.corpus, index, tools)
        return cls(scoped.corpus, scoped, tools, own_sentences=SentenceIndex.build(scoped.corpus.papers[0]))

    # -- the functions the policy sees ------------------------------------------------------------

    def functions(self) -> dict[str, Callable[..., Any]]:
        """name -> callable taking the policy's positional and keyword arguments (in-process use)."""
        return {name: self._bound(name) for name in self._tools}

    def _bound(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, args, kwargs)

        call.__name__ = name
        call.__qualname__ = name
        return call

    def call(self, name: str, args: tuple | list, kwargs: dict) -> Any:
        """Validate, run and record one call. Every failure is a ToolError, and every call is recorded,
        a failure of ours included (as ``internal error``), so no broken call looks clean."""
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError(f"no tool {name!r}; the tools are {', '.join(self._tools)}")
        self._admit(name)
        started = time.perf_counter()
        record = ToolCallRecord(name=name, arguments={}, seconds=0.0)
        room: int | None = None
        self.reranked_by = None
        try:
            parsed = validate(tool.arguments, name, tuple(args), kwargs)
            record.arguments = for_record(parsed.model_dump())
            room = self._room(record)
            result = tool.function(self, parsed)
            record.reranker = self.reranked_by
            if isinstance(result, Rendered):  # a research call: its rendering and what it showed, written together
                record.returned = self._kept(result.text, room, result.shown)
                return result.value
            record.returned = self._kept(result, room)
            return result
        except ToolError as error:
            record.error = _recorded_error(str(error))
            raise
        except RecordsFull:
            raise
        except Exception as error:  # a bug of ours: recorded as such, shown to the policy as a tool failure
            record.error = f"internal error: {type(error).__name__}: {error}"[:500]
            raise ToolError(
                f"{name}() failed inside the tool ({type(error).__name__}); this is not your fault, try other arguments"
            ) from None
        finally:
            record.seconds = time.perf_counter() - started
            self._append(record)

    def refuse(self, name: str, reason: str) -> None:
        """Record a call the host refused before validating it (e.g. arguments over the frame cap)."""
        self._admit(name)
        self._append(ToolCallRecord(name=name, arguments={}, seconds=0.0, error=_recorded_error(reason)))

    def stopped(self, name: str, reason: str) -> None:
        """Record a call a budget stopped before the tool recorded it (the action ends with it)."""
        self._append(ToolCallRecord(name=name, arguments={}, seconds=0.0, error=_recorded_error(reason)))

    def start_action(self, record_bytes: int | None = None, limit: str = "records") -> None:
        """A new action begins: its calls' results get the whole per-action budget again, and its
        records ``record_bytes`` (None: no budget; ``limit`` names the budget that sets it). The
        sandbox calls this before each action; without it the budgets are the episode's."""
        self._returned_left = ACTION_RETURNED_CHARS
        self._record_left, self._records_limit, self.record_bytes = record_bytes, limit, 0
        self._results_left = None if record_bytes is None else record_bytes // 2

    def _room(self, record: ToolCallRecord) -> int | None:
        """Bytes the call's kept result may take of the records budget (None: no budget). A call
        whose arguments leave less than the reserve is not run: its record says so, briefly, and
        RecordsFull cuts the action."""
        if self._record_left is None:
            return None
        arguments = record_cost(record.arguments)
        room = self._record_left - arguments - RECORD_RESERVE
        if room < 0:
            record.arguments = {"arguments_not_recorded": f"{arguments:,} bytes"}
            record.error = self._full()
            raise RecordsFull(self._records_limit)
        assert self._results_left is not None
        return min(room, self._results_left)

    def _admit(self, name: str) -> None:
        """Before a call is looked at: when what is left of the budget could not hold its record
        (whatever it turns out to be: an argument error is a record too), it is not run."""
        if self._record_left is not None and self._record_left < RECORD_RESERVE:
            self._append(ToolCallRecord(name=name, arguments={}, seconds=0.0, error=self._full()))
            raise RecordsFull(self._records_limit)

    def _full(self) -> str:
        whose = "episode" if self._records_limit == "episode_records" else "action"
        left = max(self._record_left or 0, 0)
        return f"not run: its record would pass what is left of the {whose}'s budget for tool-call records ({left:,} bytes)"

    def _append(self, record: ToolCallRecord) -> None:
        self.calls.append(record)
        if self._record_left is not None:
            size = record_cost(record.model_dump())
            self.record_bytes += size
            self._record_left -= size

    def _kept(self, result: Any, room: int | None = None, shown: Shown | None = None) -> Returned:
        """``result`` as the call record keeps it, charged to this action's budgets: the first result
        that does not fit spends it, so every later one keeps only its length and sha256 too."""
        returned = returned_record(result, self._returned_left, shown, room)
        if returned.text is None:
            self._returned_left = 0
        else:
            self._returned_left -= len(returned.text) + record_chars(returned.shown)
        if self._results_left is not None:
            kept = (
                0
                if returned.text is None
                else wire.size(returned.text) + (0 if returned.shown is None else record_cost(returned.shown.model_dump()))
            )
            self._results_left = self._results_left - kept if returned.text is not None else 0
        return returned

    # -- what the tools share (``tools.catalog``) -------------------------------------------------

    def end(self, outcome: Outcome) -> None:
        """End the episode with ``outcome`` (a tool declared with ``record="outcome"``): the first
        ending call decides it; any later one is refused."""
        self.refuse_if_ended()
        self.outcome = outcome

    def refuse_if_ended(self) -> None:
        if self.outcome is not None:
            raise ToolError(f"the episode already ended ({self.outcome.status}); nothing more can be submitted")

    def paper(self, paper_id: str) -> Paper:
        """The paper ``paper_id``; a ToolError naming the closest ids when there is none."""
        if paper_id in self.corpus:
            return self.corpus.paper(paper_id)
        if len(paper_id) > MAX_NAME_CHARS:
            raise ToolError(f"no paper {shown(paper_id)}; paper ids are short, and search() returns them")
        close = _closest(paper_id, self.corpus.paper_ids)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else "; search() returns paper ids"
        raise ToolError(f"no paper {paper_id!r}{hint}")

    def section_number(self, paper: Paper, section: int | str) -> int:
        """A section given by number or name (exact, after ":::", or a unique part of it) -> its number."""
        count = len(paper.sections)
        if isinstance(section, str) and len(section) > MAX_NAME_CHARS:
            raise ToolError(f"no section {shown(section)} in {paper.id!r}; read({paper.id!r}) lists its sections")
        if isinstance(section, str) and SECTION_NUMBER.fullmatch(section.strip()):
            section = int(section.strip())
        if isinstance(section, int):
            if not 0 <= section < count:
                raise ToolError(f"{paper.id!r} has sections 0 to {count - 1}; read({paper.id!r}) lists them")
            return section
        wanted = section.strip().lower()
        names = [(s.name or "").lower() for s in paper.sections]
        for rule in (lambda n: n == wanted, lambda n: n.split(":::")[-1].strip() == wanted, lambda n: wanted in n):
            matches = [i for i, name in enumerate(names) if rule(name)]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                listed = ", ".join(f"{i}: {paper.sections[i].name}" for i in matches)
                raise ToolError(f"section {section!r} is ambiguous in {paper.id!r} ({listed}); pass its number")
        raise ToolError(f"no section {section!r} in {paper.id!r}; read({paper.id!r}) lists its sections")

    def sentences_of(self, paper: Paper) -> SentenceIndex:
        """The paper's sentence index: the question's own documents' was built with the episode;
        any other paper's comes from the process's bounded cache (emptied between episodes)."""
        if self._own_sentences is not None and self._own_sentences.paper is paper:
            return self._own_sentences
        return SENTENCE_INDEXES.get(paper)


@dataclass(frozen=True)
class SentenceIndex:
    """One paper's sentences with their (section, paragraph), and a BM25 over them."""

    paper: Paper  # held, so the id() that keys it in the cache is not reused while it is cached
    located: list[tuple[int, int, str]]
    bm25: BM25
    chars: int  # of all its sentences: what the cache's bound counts

    @classmethod
    def build(cls, paper: Paper) -> SentenceIndex:
        """One pass over the paper's text: its cost grows with the paper's length, nothing else."""
        located = [
            (s_index, p_index, sentence)
            for s_index, section in enumerate(paper.sections)
            for p_index, text in enumerate(section.paragraphs)
            if text
            for sentence in sentences(text)
        ]
        texts = [sentence for _, _, sentence in located]
        return cls(paper, located, BM25.build([tokenize(text) for text in texts]), sum(map(len, texts)))

    @functools.cached_property
    def searchable(self) -> list[str]:
        """The sentences as RE2 takes them (a lone surrogate, which JSON allows, as U+FFFD); for regex only."""
        return [encodable(sentence) for _, _, sentence in self.located]

    @functools.cached_property
    def utf8_bytes(self) -> int:
        """What a regex scans."""
        return sum(len(text) if text.isascii() else len(text.encode("utf-8")) for text in self.searchable)


def encodable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so that it encodes as UTF-8."""
    if text.isascii():
        return text
    return LONE_SURROGATE.sub("\ufffd", text)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class SentenceIndexCache:
    """Sentence indexes of the papers used last, at most ``max_papers`` of them holding at most
    ``max_chars`` characters of sentences (one paper larger than that is kept alone). Shared by the
    calls of a process, so an action that extracts from every paper costs one build per paper and
    leaves the cache no larger; emptied when an episode host is reset for another episode
    (``tools.process_caches``); safe to use from several threads."""

    def __init__(self, max_papers: int, max_chars: int) -> None:
        self.max_papers = max_papers
        self.max_chars = max_chars
        self.chars = 0
        self._entries: OrderedDict[int, SentenceIndex] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, paper: Paper) -> SentenceIndex:
        with self._lock:
            entry = self._entries.get(id(paper))
            if entry is not None:
                self._entries.move_to_end(id(paper))
                return entry
        entry = SentenceIndex.build(paper)  # outside the lock: other threads' lookups need not wait
        with self._lock:
            previous = self._entries.pop(id(paper), None)
            self.chars -= previous.chars if previous is not None else 0
            self._entries[id(paper)] = entry
            self.chars += entry.chars
            while len(self._entries) > 1 and (len(self._entries) > self.max_papers or self.chars > self.max_chars):
                self.chars -= self._entries.popitem(last=False)[1].chars
        return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.chars = 0


SENTENCE_INDEXES = SentenceIndexCache(SENTENCE_INDEX_PAPERS, SENTENCE_INDEX_CHARS)


def _closest(wanted: str, candidates: list[str], n: int = 3) -> list[str]:
    """Similar ids, most similar first; among equals, ids that contain what was typed, then by name."""
    close = _close_matches(wanted, candidates)

    def rank(candidate: str) -> tuple:
        ratio = difflib.SequenceMatcher(None, wanted, candidate).ratio()
        return (-round(ratio, 6), wanted not in candidate, candidate)

    return sorted(close, key=rank)[:n]


def _close_matches(wanted: str, candidates: list[str]) -> list[str]:
    """``difflib.get_close_matches(wanted, candidates, n=CLOSE_POOL, cutoff=CLOSE_CUTOFF)`` at a
    bounded cost.

    difflib computes SequenceMatcher's ratio (quadratic in the lengths, in Python) for every
    candidate that passes two cheap upper bounds of it. Here an upper bound is computed for all
    candidates at once (``_IdTable.ratio_bounds``), and the ratio in order of that bound, best
    first, until no candidate left could enter the best CLOSE_POOL: the same ids in the same
    order. After CLOSE_WORK character pairs the search stops where it is, which only a list of
    thousands of ids alike in every character reaches (a hint, not a result).
    """
    table = _id_table(tuple(candidates))
    rows, bounds = table.ratio_bounds(wanted)
    order = np.argsort(-bounds, kind="stable")
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(wanted)  # as get_close_matches does: the ratio is not symmetric
    best: list[tuple[float, str]] = []  # a heap of the CLOSE_POOL best (ratio, id), as heapq.nlargest keeps them
    work = 0
    for row, bound in zip(rows[order].tolist(), bounds[order].tolist()):
        if len(best) == CLOSE_POOL and bound < best[0][0]:
            break  # its ratio is at most its bound, below every id kept
        work += len(wanted) * int(table.lengths[row]) + 100  # 100: a call's own overhead, in pairs
        if work > CLOSE_WORK:
            break
        matcher.set_seq1(candidates[row])
        ratio = matcher.ratio()
        if ratio >= CLOSE_CUTOFF:
            (heapq.heappush if len(best) < CLOSE_POOL else heapq.heappushpop)(best, (ratio, candidates[row]))
    return [candidate for _, candidate in sorted(best, reverse=True)]


LCS_CHARS = 64  # the longest typed id whose common subsequences are counted in one uint64 per id
LCS_WIDTH = 150  # characters of each id the table keeps (a longer id is rarely a near match of LCS_CHARS typed)


@dataclass(frozen=True)
class _IdTable:
    """Ids' lengths and characters, for upper bounds of their ratio to a typed id."""

    lengths: np.ndarray
    columns: dict[str, int]  # character -> column number
    counts: scipy.sparse.csc_matrix  # id x character: occurrences
    characters: np.ndarray  # id x position (the first LCS_WIDTH): column numbers, len(columns) past the end

    def ratio_bounds(self, wanted: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids (rows) that difflib's cheap bounds let through, and for each an upper bound of
        its ratio: 2 x matches / total length, where matches is at most the characters in common
        (difflib's quick_ratio) and, for a typed id of up to LCS_CHARS characters, at most the
        longest common subsequence (SequenceMatcher's matching blocks are one)."""
        total = self.lengths + len(wanted)
        divisor = np.maximum(total, 1).astype(np.float64)
        # difflib's _calculate_ratio, 2.0 * matches / length, as the same float operations.
        real_quick = np.where(total > 0, 2.0 * np.minimum(self.lengths, len(wanted)) / divisor, 1.0)
        quick = np.where(total > 0, 2.0 * self._shared_characters(wanted) / divisor, 1.0)
        rows = np.flatnonzero((real_quick >= CLOSE_CUTOFF) & (quick >= CLOSE_CUTOFF))
        bounds = quick[rows]
        held = self.lengths[rows] <= self.characters.shape[1]  # ids the table holds every character of
        if 0 < len(wanted) <= LCS_CHARS and held.any():
            common = self._common_subsequence(wanted, rows[held])
            bounds[held] = np.minimum(bounds[held], 2.0 * common / divisor[rows[held]])
        return rows, bounds

    def _shared_characters(self, wanted: str) -> np.ndarray:
        """Per id, how many characters it has in common with ``wanted`` (as multisets)."""
        shared = np.zeros(len(self.lengths), dtype=np.int64)
        indptr, indices, data = self.counts.indptr, self.counts.indices, self.counts.data
        for character, count in Counter(wanted).items():
            column = self.columns.get(character)
            if column is not None:
                start, end = indptr[column], indptr[column + 1]
                shared[indices[start:end]] += np.minimum(data[start:end], count)
        return shared

    def _common_subsequence(self, wanted: str, rows: np.ndarray) -> np.ndarray:
        """Per id in ``rows``, the length of its longest common subsequence with ``wanted``, for
        all of them at once: Hyyrö's bit-parallel LCS, one uint64 per id, one step per position."""
        masks = np.zeros(len(self.columns) + 1, dtype=np.uint64)  # the last column: past an id's end
        for position, character in enumerate(wanted):
            column = self.columns.get(character)
            if column is not None:
                masks[column] |= np.uint64(1 << position)
        full = np.uint64((1 << len(wanted)) - 1)
        v = np.full(len(rows), full, dtype=np.uint64)
        characters = self.characters[rows]
        for position in range(characters.shape[1]):  # past an id's end the mask is 0 and v stays
            u = v & masks[characters[:, position]]
            v = ((v + u) | (v - u)) & full  # uint64 wraps: a carry past bit 63 is one the mask drops
        return len(wanted) - _popcount(v)


def _popcount(values: np.ndarray) -> np.ndarray:
    """Set bits per uint64 (numpy < 2 has no bitwise_count)."""
    x = values - ((values >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)


@functools.lru_cache(maxsize=4)  # the corpus's paper ids, and a run's question ids
def _id_table(ids: tuple[str, ...]) -> _IdTable:
    columns: dict[str, int] = {}
    column_of = [columns.setdefault(character, len(columns)) for identifier in ids for character in identifier]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    rows = np.repeat(np.arange(len(ids)), lengths)
    counts = scipy.sparse.csc_matrix((np.ones(len(column_of), dtype=np.int64), (rows, column_of)), shape=(len(ids), len(columns)))
    counts.sum_duplicates()
    width = min(int(lengths.max(initial=0)), LCS_WIDTH)
    characters = np.full((len(ids), width), len(columns), dtype=np.int32)
    for row, identifier in enumerate(ids):
        characters[row, : min(len(identifier), width)] = [columns[character] for character in identifier[:width]]
    return _IdTable(lengths, columns, counts, characters)
