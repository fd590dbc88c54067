"""The functions a policy calls: search, read, extract, submit, abstain.

``PaperTools`` holds one episode's view of a corpus and its BM25 index. Every call validates
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
(``_Layout``; ``tools.records.Shown``): the paragraphs it showed and where each piece of paper
text lies in the rendering. Nothing reads a result's text back to find them, so no paper text
(a blank line and "[4] " inside a paragraph, a heading or a listing it imitates) can add to them.

``TOOLS`` is the single source of the tool page shown to the policy (``tools.page``): each
entry names the function, its argument model and its one-line contract.

Why one module of this size: each tool's cost bound sits beside the tool it bounds, so that a
reviewer of one tool sees every limit its arguments meet; splitting them would scatter that check.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import heapq
import itertools
import json
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import re2
import scipy.sparse

from paper_explorer.corpus import BM25, BM25Index, Corpus, Paper, tokenize
from paper_explorer.corpus.index import quote_form
from paper_explorer.tools import wire
from paper_explorer.tools.arguments import AbstainArgs, Arguments, ExtractArgs, ReadArgs, SearchArgs, SubmitArgs, validate
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.records import Evidence, Outcome, Returned, Shown, ToolCallRecord

PAGE_CHARS = 2500
SNIPPET_CHARS = 300
SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


@dataclass(frozen=True)
class Tool:
    name: str
    arguments: type[Arguments]
    summary: str
    returns: str
    example: str


# The examples are one sequence (the later ones use the search's ``hits``) and name no paper,
# method or dataset: a model copies them verbatim, so they must fit any corpus. Ids come from an
# earlier result, queries are words most papers use, and a copied answer is one the
# placeholder_answer detector flags (it is in the prompt, and no tool returns it).
TOOLS = (
    Tool(
        "search",
        SearchArgs,
        "BM25 search over every paragraph of every paper (or of one paper).",
        "a list of hits, best first: {paper_id, title, section, section_name, paragraph, score, snippet}",
        'hits = search("training data size", k=3)',
    ),
    Tool(
        "read",
        ReadArgs,
        "Read a paper: its outline, or one section's numbered paragraphs, a page at a time.",
        "text; a long section ends with the call that reads its next page",
        'print(read(hits[0]["paper_id"], section=hits[0]["section"]))',
    ),
    Tool(
        "extract",
        ExtractArgs,
        "The sentences of one paper that best match a query (or a regex), with their location.",
        "a list of {paper_id, section, section_name, paragraph, sentence, score}, best first",
        'extract(hits[0]["paper_id"], "number of training examples", k=2)',
    ),
    Tool(
        "submit",
        SubmitArgs,
        "Answer the question and end the episode. Cite the paragraphs you relied on.",
        "a confirmation; the episode ends after this action",
        'submit("12,000 examples", evidence=[hits[0]])',
    ),
    Tool(
        "abstain",
        AbstainArgs,
        "End the episode without an answer when the papers do not contain one.",
        "a confirmation; the episode ends after this action",
        'abstain("No paper states the size of the training data.")',
    ),
)


TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
MAX_NAME_CHARS = 300  # paper ids and section names are short; longer arguments are refused unechoed
SECTION_NUMBER = re.compile(r"[0-9]{1,6}")  # not str.isdigit(): it accepts "²", which int() refuses
REGEX_MEMORY = 1 << 20  # RE2's budget for one compiled pattern (its default, 8 MiB, takes seconds to fill)
# RE2 program instructions x bytes of sentences one regex extract may scan: where its DFA gives up,
# its NFA costs ~1-3 ns per instruction and byte, so this bounds a call to ~0.15 s whatever the pattern.
REGEX_WORK = 50_000_000
# Sentence indexes (extract) kept per process, least recently used first out (emptied between episodes).
SENTENCE_INDEX_PAPERS = 128
SENTENCE_INDEX_CHARS = 8_000_000
# Whole-corpus scans one submit may spend on quotes with no uncommon word to look them up by
# (each ~1 ns per byte of corpus text; a quote with one costs a look at the few paragraphs holding it).
QUOTE_SCANS = 3
CLOSE_CUTOFF = 0.6  # difflib.get_close_matches's default, as for every "did you mean"
CLOSE_POOL = 20  # similar ids ranked before the best few are shown
CLOSE_WORK = 100_000  # character pairs SequenceMatcher may compare per lookup (~100 ns each)
RECORD_TEXT_CHARS = 1_000  # a string argument kept in a call record beyond this is cut, and says so
RECORD_CHARS = 10_000  # a call record's arguments beyond this (as JSON) are summarised, and say so
# What a tool returned is kept for the detectors: whole up to RETURNED_CHARS (a search at k=50 with
# long titles is ~30,000), and up to ACTION_RETURNED_CHARS per action; beyond that, length and sha256.
RETURNED_CHARS = 32_000
ACTION_RETURNED_CHARS = 100_000
# The fields of a search and of an extract hit that hold paper text (not the paper id, which is ours,
# nor the numbers): what their records count as shown text.
HIT_TEXTS = {"search": ("title", "section_name", "snippet"), "extract": ("section_name", "sentence")}
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
    (research calls: what the rendering showed, ``_Layout``) is kept with the text: its pieces
    within what the cut kept, and its size charged to both budgets with the text's."""
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    chars, sha256 = len(text), hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    cut = None
    if len(text) > RETURNED_CHARS:
        text, cut = text[:RETURNED_CHARS], f"the first {RETURNED_CHARS:,} of {len(text):,} characters (the cap for one result)"
        if shown is not None:
            shown = shown.model_copy(update={"pieces": [(start, end) for start, end in shown.pieces if end <= len(text)]})
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


@dataclass(frozen=True)
class Rendered:
    """A research tool's result: the value the action gets, its rendering for the record, and what
    the rendering showed of the papers (written together by ``_Layout``, never parsed back)."""

    value: Any
    text: str
    shown: Shown


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
    """One episode's tools over a corpus; ``calls`` and ``outcome`` record what happened."""

    def __init__(self, corpus: Corpus, index: BM25Index) -> None:
        self.corpus = corpus
        self.index = index
        self.calls: list[ToolCallRecord] = []
        self.outcome: Outcome | None = None
        self._returned_left = ACTION_RETURNED_CHARS  # of this action's budget for kept results
        self._record_left: int | None = None  # bytes of records this action may still add (None: no budget)
        self._results_left: int | None = None  # of them, bytes its kept results may still take
        self._records_limit = "records"  # the budget that binds: the action's, or what is left of the episode's
        self.record_bytes = 0  # bytes of records this action added, as tools.wire sends them
        # Looked up once: a name built per call (getattr(self, f"_{name}")) would sit in CPython's type
        # method cache, pinning the memory the episode allocated around it (tools.process_caches).
        self._implementations: dict[str, Callable[[Any], Any]] = {tool.name: getattr(self, "_" + tool.name) for tool in TOOLS}

    # -- the functions the policy sees ------------------------------------------------------------

    def functions(self) -> dict[str, Callable[..., Any]]:
        """name -> callable taking the policy's positional and keyword arguments (in-process use)."""
        return {tool.name: self._bound(tool.name) for tool in TOOLS}

    def _bound(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, args, kwargs)

        call.__name__ = name
        call.__qualname__ = name
        return call

    def call(self, name: str, args: tuple | list, kwargs: dict) -> Any:
        """Validate, run and record one call. Every failure is a ToolError, and every call is recorded,
        a failure of ours included (as ``internal error``), so no broken call looks clean."""
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            raise ToolError(f"no tool {name!r}; the tools are {', '.join(TOOLS_BY_NAME)}")
        self._admit(name)
        started = time.perf_counter()
        record = ToolCallRecord(name=name, arguments={}, seconds=0.0)
        room: int | None = None
        try:
            parsed = validate(tool.arguments, name, tuple(args), kwargs)
            record.arguments = for_record(parsed.model_dump())
            room = self._room(record)
            result = self._implementations[name](parsed)
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

    def _search(self, args: SearchArgs) -> Rendered:
        if args.paper_id is not None:
            self._paper(args.paper_id)
        hits = self.index.search(args.query, k=args.k, paper_id=args.paper_id)
        query_tokens = set(tokenize(args.query))
        found = [
            {
                "paper_id": hit.paper_id,
                "title": self.corpus.paper(hit.paper_id).title,
                "section": hit.section_index,
                "section_name": hit.section or "",
                "paragraph": hit.paragraph_index,
                "score": round(hit.score, 3),
                "snippet": _snippet(hit.text, query_tokens),
            }
            for hit in hits
        ]
        return _hits(found, HIT_TEXTS["search"])

    def _read(self, args: ReadArgs) -> Rendered:
        paper = self._paper(args.paper_id)
        if args.section is None:
            if args.page:
                raise ToolError("the outline has one page; pass a section to read further")
            return _outline(paper)
        number = self._section_number(paper, args.section)
        section = paper.sections[number]
        paragraphs = [(i, f"[{i}] ", text) for i, text in enumerate(section.paragraphs) if text]
        pages = _paged([marker + text for _, marker, text in paragraphs], PAGE_CHARS)
        if args.page >= len(pages):
            raise ToolError(f"section {number} of {paper.id!r} has {len(pages)} page(s); pages are numbered from 0")
        layout = _Layout("text")
        layout.write(f"{paper.id} / section {number}: ")
        layout.heading(section.name)
        layout.write("" if one_line(section.name) else "(untitled)")
        layout.write(f" (page {args.page + 1} of {len(pages)})\n\n")
        if not pages[args.page]:
            layout.write("(this section has no text)")
        for position, (entry, start, end) in enumerate(pages[args.page]):
            paragraph, marker, text = paragraphs[entry]
            layout.write(("\n\n" if position else "") + (CONTINUED if start else "") + marker[start:end])  # the marker, or what of it fits
            layout.paper(text[max(start - len(marker), 0) : max(end - len(marker), 0)])
            layout.write(CONTINUES if end < len(marker) + len(text) else "")
            if start == 0:  # a paragraph is shown where its first piece (its marker) is
                layout.showed((paper.id, number, paragraph))
        if args.page + 1 < len(pages):
            layout.write(f"\n\n... more: read({paper.id!r}, section={number}, page={args.page + 1})")
        return layout.rendered()

    def _extract(self, args: ExtractArgs) -> Rendered:
        paper = self._paper(args.paper_id)
        sentence_index = self._sentences_of(paper)
        located = sentence_index.located
        if args.regex:
            pattern = _regex(args.query)
            work = pattern.programsize * sentence_index.utf8_bytes
            if work > REGEX_WORK:
                raise ToolError(
                    f"extract(): the pattern is too complex to run over {paper.id!r} ({pattern.programsize:,} RE2 "
                    f"instructions x {sentence_index.utf8_bytes:,} bytes of text, over the {REGEX_WORK:,} a call "
                    f"may use); use a simpler pattern, or words without regex=True"
                )
            matching = (i for i, text in enumerate(sentence_index.searchable) if pattern.search(text))
            ranked = [(i, 1.0) for i in itertools.islice(matching, args.k)]  # the first k: no need to look further
        else:
            ranked = sentence_index.bm25.top_k(tokenize(args.query), args.k)
        found = [
            {
                "paper_id": paper.id,
                "section": located[i][0],
                "section_name": paper.sections[located[i][0]].name or "",
                "paragraph": located[i][1],
                "sentence": located[i][2],
                "score": round(score, 3),
            }
            for i, score in ranked
        ]
        return _hits(found, HIT_TEXTS["extract"])

    def _submit(self, args: SubmitArgs) -> str:
        self._refuse_if_ended()
        evidence: list[dict] = []
        quote_bytes_left = QUOTE_SCANS * len(self.index.quotes.text)
        for position, item in enumerate(args.evidence):
            resolved, read = self._evidence(position, item, quote_bytes_left)
            quote_bytes_left -= read
            if resolved not in evidence:  # a paragraph cited twice (as a hit and as a quote) counts once
                evidence.append(resolved)
        self.outcome = Outcome(status="submitted", answer=args.answer, evidence=[Evidence(**item) for item in evidence])
        return f"submitted {args.answer!r} with {len(evidence)} evidence paragraph(s)"

    def _abstain(self, args: AbstainArgs) -> str:
        self._refuse_if_ended()
        self.outcome = Outcome(status="abstained", reason=args.reason)
        return "abstained"

    # -- helpers -------------------------------------------------------------------------------------

    def _paper(self, paper_id: str) -> Paper:
        if paper_id in self.corpus:
            return self.corpus.paper(paper_id)
        if len(paper_id) > MAX_NAME_CHARS:
            raise ToolError(f"no paper {shown(paper_id)}; paper ids are short, and search() returns them")
        close = _closest(paper_id, self.corpus.paper_ids)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else "; search() returns paper ids"
        raise ToolError(f"no paper {paper_id!r}{hint}")

    def _section_number(self, paper: Paper, section: int | str) -> int:
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

    def _sentences_of(self, paper: Paper) -> SentenceIndex:
        """The paper's sentence index, from the process's bounded cache (emptied between episodes)."""
        return SENTENCE_INDEXES.get(paper)

    def _evidence(self, position: int, item: Any, quote_bytes_left: int) -> tuple[dict, int]:
        """A paragraph address (hit dict or triple) or an exact quote -> ({paper_id, section, paragraph,
        text}, bytes of corpus text read to find it): a quote may read ``quote_bytes_left`` at most."""
        if isinstance(item, dict):
            missing = [key for key in ("paper_id", "section", "paragraph") if key not in item]
            if missing:
                raise ToolError(f"evidence {position}: a dict needs paper_id, section and paragraph (missing {', '.join(missing)})")
            item = [item["paper_id"], item["section"], item["paragraph"]]
        if isinstance(item, list):
            if len(item) != 3 or not isinstance(item[0], str) or not all(type(x) is int for x in item[1:]):
                raise ToolError(f"evidence {position}: expected [paper_id, section, paragraph] with two integers, got {shown(item)}")
            paper = self._paper(item[0])
            section, paragraph = item[1], item[2]
            if (
                not 0 <= section < len(paper.sections)
                or not 0 <= paragraph < len(paper.sections[section].paragraphs)
                or not paper.sections[section].paragraphs[paragraph]
            ):
                raise ToolError(f"evidence {position}: {paper.id!r} has no paragraph {paragraph} in section {section}")
            return {
                "paper_id": paper.id,
                "section": section,
                "paragraph": paragraph,
                "text": paper.sections[section].paragraphs[paragraph],
            }, 0
        if isinstance(item, str):
            if len(quote_form(item)) < 10:
                raise ToolError(f"evidence {position}: a quote must have at least 10 characters to identify a paragraph")
            plan = self.index.plan_quote(item)
            if plan.cost > quote_bytes_left:
                raise ToolError(
                    f"evidence {position}: this quote has no word uncommon enough to look it up by, and a submit "
                    f"may scan the whole corpus for {QUOTE_SCANS} such quotes at most; quote a longer passage, "
                    f"or cite the paragraph as [paper_id, section, paragraph]"
                )
            found = self.index.find_planned(plan)  # the first paragraph, in corpus order, that contains it
            if found is not None:
                paragraph = self.index.paragraphs[found]
                return {
                    "paper_id": paragraph.paper_id,
                    "section": paragraph.section_index,
                    "paragraph": paragraph.paragraph_index,
                    "text": paragraph.text,
                }, plan.cost
            raise ToolError(f"evidence {position}: no paragraph contains the quote {shown(item)}; quote the text exactly as read")
        raise ToolError(f"evidence {position}: expected a hit, a [paper_id, section, paragraph] list or a quote, got {type(item).__name__}")

    def _refuse_if_ended(self) -> None:
        if self.outcome is not None:
            raise ToolError(f"the episode already ended ({self.outcome.status}); nothing more can be submitted")


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
        return [_encodable(sentence) for _, _, sentence in self.located]

    @functools.cached_property
    def utf8_bytes(self) -> int:
        """What a regex scans."""
        return sum(len(text) if text.isascii() else len(text.encode("utf-8")) for text in self.searchable)


def _encodable(text: str) -> str:
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


def _regex(query: str) -> re2._Regexp:
    """``query`` compiled by RE2, case-insensitive, within REGEX_MEMORY; a bad pattern is a ToolError."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = False
    options.max_mem = REGEX_MEMORY  # bounds compile time too: a huge program is refused, not built
    try:
        # The class, not re2.compile: that keeps the last 128 patterns in a cache of the process, which
        # would hold up to 128 x REGEX_MEMORY and tell the next episode on this host, by how fast its
        # own patterns compile, which patterns an earlier one asked for.
        return re2._Regexp(_encodable(query), options)
    except re2.error as error:
        detail = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
        hint = "make it smaller" if "too large" in detail else "RE2 has no backreferences or lookaround"
        raise ToolError(f"extract(): not a valid RE2 pattern ({detail}); {hint}") from None


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


HEADING_CHARS = 200  # a title or section name as the outline and a page's heading show it: within a page


def one_line(text: str | None, limit: int | None = HEADING_CHARS) -> str:
    """A title, section name or abstract as one line, a heading cut to ``limit`` characters: a line
    break inside one would make the outline and a page's heading say more lines (sections, pages)
    than the paper has, and a heading of 300,000 characters would be no page at all."""
    line = " ".join((text or "").split())
    return line if limit is None or len(line) <= limit else line[:limit] + " ..."


class _Layout:
    """A result's text, written piece by piece: the host's own scaffolding (``write``), the papers'
    text (``paper``: where it lands is recorded as it is written) and the paragraphs shown
    (``showed``). The record is made by the writer, so what the text contains cannot change it."""

    def __init__(self, form: Literal["text", "json"]) -> None:
        self.form = form
        self.parts: list[str] = []
        self.size = 0
        self.pieces: list[tuple[int, int]] = []
        self.paragraphs: list[tuple[str, int, int]] = []

    def write(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)

    def paper(self, text: str) -> None:
        """Paper text (a JSON string literal of it, in a JSON layout): recorded where it lands."""
        if text:
            self.pieces.append((self.size, self.size + len(text)))
            self.write(text)

    def heading(self, text: str | None, limit: int | None = HEADING_CHARS) -> None:
        """A title or name as ``one_line`` writes it: the paper's words, and our " ..." when cut."""
        line = one_line(text, limit=None)
        self.paper(line if limit is None or len(line) <= limit else line[:limit])
        if limit is not None and len(line) > limit:
            self.write(" ...")

    def showed(self, place: tuple[str, int, int]) -> None:
        if place not in self.paragraphs:
            self.paragraphs.append(place)

    def rendered(self, value: Any = None) -> Rendered:
        """The result: ``value`` (the hits of a JSON layout), or the text itself (a text layout)."""
        text = "".join(self.parts)
        return Rendered(text if self.form == "text" else value, text, Shown(form=self.form, paragraphs=self.paragraphs, pieces=self.pieces))


def _hits(hits: list[dict], texts: tuple[str, ...]) -> Rendered:
    """Search or extract hits, rendered exactly as ``json.dumps(hits, ensure_ascii=False)``, with the
    string literal of each field in ``texts`` recorded as paper text and each hit's paragraph as
    named by it."""
    layout = _Layout("json")
    layout.write("[")
    for number, hit in enumerate(hits):
        layout.write(", {" if number else "{")
        for position, (key, value) in enumerate(hit.items()):
            layout.write((", " if position else "") + json.dumps(key, ensure_ascii=False) + ": ")
            literal = json.dumps(value, ensure_ascii=False)
            if key in texts and value:
                layout.paper(literal)
            else:
                layout.write(literal)
        layout.write("}")
        layout.showed((hit["paper_id"], hit["section"], hit["paragraph"]))
    layout.write("]")
    return layout.rendered(hits)


def _outline(paper: Paper) -> Rendered:
    """The paper's id and title, its abstract, a line per section ("  {n}. {name} ({count}
    paragraphs)") and the call that reads one; it shows no paragraph."""
    layout = _Layout("text")
    layout.write(f"{paper.id}: ")
    layout.heading(paper.title)
    layout.write("\n\n")
    layout.heading(paper.abstract, limit=None)
    layout.write("" if one_line(paper.abstract, limit=None) else "(no abstract)")
    layout.write("\n\nSections:")
    for number, section in enumerate(paper.sections):
        count = sum(1 for text in section.paragraphs if text)
        layout.write(f"\n  {number}. ")
        layout.heading(section.name)
        layout.write("" if one_line(section.name) else "(untitled)")
        layout.write(f" ({count} paragraph{'s' if count != 1 else ''})")
    layout.write(f"\n\nread({paper.id!r}, section=N) shows a section's paragraphs.")
    return layout.rendered()


CONTINUED, CONTINUES = "[continued] ", " [continues]"


def _pages(entries: list[str], budget: int) -> list[list[str]]:
    """Whole paragraphs per page; a paragraph longer than a page is split and says so."""
    return [
        [
            (CONTINUED if start else "") + entries[entry][start:end] + (CONTINUES if end < len(entries[entry]) else "")
            for entry, start, end in page
        ]
        for page in _paged(entries, budget)
    ]


def _paged(entries: list[str], budget: int) -> list[list[tuple[int, int, int]]]:
    """``_pages`` as (entry, start, end) per piece: the piece is ``entries[entry][start:end]``, after
    CONTINUED when start > 0 and before " [continues]" when end is not the entry's end."""
    if budget <= len(CONTINUED):
        raise ValueError(f"a page of {budget} characters cannot hold a continued paragraph")
    pages: list[list[tuple[int, int, int]]] = [[]]
    used = 0
    for entry, text in enumerate(entries):
        for start, end in _split(text, budget):
            size = (len(CONTINUED) if start else 0) + end - start + (len(CONTINUES) if end < len(text) else 0)
            if pages[-1] and used + size > budget:
                pages.append([])
                used = 0
            pages[-1].append((entry, start, end))
            used += size + 2
    return pages


def _split(entry: str, budget: int) -> list[tuple[int, int]]:
    """``entry`` cut into pieces of ``budget`` characters (CONTINUED included, " [continues]" added
    beyond it), as [start, end) of each: the paging first written, in time linear in the entry's
    length, not quadratic."""
    pieces = []
    head, start = 0, 0
    while head + len(entry) - start > budget:
        taken = budget - head
        pieces.append((start, start + taken))
        start += taken
        head = len(CONTINUED)
    pieces.append((start, len(entry)))
    return pieces


def _snippet(text: str, query_tokens: set[str]) -> str:
    """The paragraph's best-matching sentence and what follows it, up to SNIPPET_CHARS."""
    parts = sentences(text) or [text]
    best = max(range(len(parts)), key=lambda i: (len(query_tokens & set(tokenize(parts[i]))), -i))
    snippet = " ".join(parts[best:])
    prefix = "... " if best > 0 else ""
    if len(snippet) > SNIPPET_CHARS:
        snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."
    return prefix + snippet
