"""The functions a policy calls: search, read, extract, submit, abstain.

``PaperTools`` holds one episode's view of a corpus and its BM25 index. Every call validates
its arguments (``tools.arguments``), is recorded with its latency and error, and returns fresh
plain data (str, int, float, list, dict), so nothing an action receives can reach back into
the corpus, the index or another episode. Failures raise ``ToolError`` with a message the
model can act on ("no paper 'x'; did you mean ...?").

``TOOLS`` is the single source of the tool page shown to the policy (``tools.page``): each
entry names the function, its argument model and its one-line contract.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import re2

from corpus import BM25, BM25Index, Corpus, Paper, tokenize
from tools.arguments import AbstainArgs, Arguments, ExtractArgs, ReadArgs, SearchArgs, SubmitArgs, validate
from tools.errors import ToolError
from tools.records import Evidence, Outcome, ToolCallRecord

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


TOOLS = (
    Tool("search", SearchArgs, "BM25 search over every paragraph of every paper (or of one paper).",
         "a list of hits, best first: {paper_id, title, section, section_name, paragraph, score, snippet}",
         'hits = search("learning rate QuantLens", k=3)'),
    Tool("read", ReadArgs, "Read a paper: its outline, or one section's numbered paragraphs, a page at a time.",
         "text; a long section ends with the call that reads its next page",
         'print(read("demo-00000", section="Results"))'),
    Tool("extract", ExtractArgs, "The sentences of one paper that best match a query (or a regex), with their location.",
         "a list of {paper_id, section, section_name, paragraph, sentence, score}, best first",
         'extract("demo-00000", "learning rate", k=2)'),
    Tool("submit", SubmitArgs, "Answer the question and end the episode. Cite the paragraphs you relied on.",
         "a confirmation; the episode ends after this action",
         'submit("3e-5", evidence=[hits[0]])'),
    Tool("abstain", AbstainArgs, "End the episode without an answer when the papers do not contain one.",
         "a confirmation; the episode ends after this action",
         'abstain("No paper states the batch size of QuantLens.")'),
)


TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
MAX_NAME_CHARS = 300  # paper ids and section names are short; longer arguments are refused unechoed
SECTION_NUMBER = re.compile(r"[0-9]{1,6}")  # not str.isdigit(): it accepts "²", which int() refuses
REGEX_MEMORY = 1 << 20  # RE2's budget for one compiled pattern (its default, 8 MiB, takes seconds to fill)
RECORD_TEXT_CHARS = 1_000  # a string argument kept in a call record beyond this is cut, and says so
RECORD_CHARS = 10_000  # a call record's arguments beyond this (as JSON) are summarised, and say so


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def for_record(arguments: dict) -> dict:
    """A call's arguments as the trajectory keeps them: long strings cut, and arguments that are
    still too large replaced by their size and their start. Each cut says what it left out."""
    kept = _cut_strings(arguments)
    text = json.dumps(kept, ensure_ascii=False)
    if len(text) <= RECORD_CHARS:
        return kept
    return {"arguments_not_recorded": f"{len(text):,} characters of arguments, over the {RECORD_CHARS:,} a record keeps",
            "start": text[:RECORD_TEXT_CHARS]}


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
        self._sentence_indexes: dict[str, tuple[list[tuple[int, int, str]], BM25]] = {}

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
        started = time.perf_counter()
        record = ToolCallRecord(name=name, arguments={}, seconds=0.0)
        try:
            parsed = validate(tool.arguments, name, tuple(args), kwargs)
            record.arguments = for_record(parsed.model_dump())
            return getattr(self, f"_{name}")(parsed)
        except ToolError as error:
            record.error = str(error)
            raise
        except Exception as error:  # a bug of ours: recorded as such, shown to the policy as a tool failure
            record.error = f"internal error: {type(error).__name__}: {error}"[:500]
            raise ToolError(f"{name}() failed inside the tool ({type(error).__name__}); this is not your fault, try other arguments") from None
        finally:
            record.seconds = time.perf_counter() - started
            self.calls.append(record)

    def refuse(self, name: str, reason: str) -> None:
        """Record a call the host refused before validating it (e.g. arguments over the frame cap)."""
        self.calls.append(ToolCallRecord(name=name, arguments={}, seconds=0.0, error=reason))

    def _search(self, args: SearchArgs) -> list[dict]:
        if args.paper_id is not None:
            self._paper(args.paper_id)
        hits = self.index.search(args.query, k=args.k, paper_id=args.paper_id)
        query_tokens = set(tokenize(args.query))
        return [
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

    def _read(self, args: ReadArgs) -> str:
        paper = self._paper(args.paper_id)
        if args.section is None:
            if args.page:
                raise ToolError("the outline has one page; pass a section to read further")
            return _outline(paper)
        number = self._section_number(paper, args.section)
        section = paper.sections[number]
        entries = [f"[{i}] {text}" for i, text in enumerate(section.paragraphs) if text]
        pages = _pages(entries, PAGE_CHARS)
        if args.page >= len(pages):
            raise ToolError(f"section {number} of {paper.id!r} has {len(pages)} page(s); pages are numbered from 0")
        heading = f"{paper.id} / section {number}: {section.name or '(untitled)'} (page {args.page + 1} of {len(pages)})"
        body = "\n\n".join(pages[args.page]) if pages[args.page] else "(this section has no text)"
        more = (f"\n\n... more: read({paper.id!r}, section={number}, page={args.page + 1})"
                if args.page + 1 < len(pages) else "")
        return f"{heading}\n\n{body}{more}"

    def _extract(self, args: ExtractArgs) -> list[dict]:
        paper = self._paper(args.paper_id)
        located, bm25 = self._sentences_of(paper)
        if args.regex:
            options = re2.Options()
            options.log_errors = False
            options.case_sensitive = False
            options.max_mem = REGEX_MEMORY  # bounds compile time too: a huge program is refused, not built
            try:
                pattern = re2.compile(args.query, options)
            except re2.error as error:
                detail = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
                hint = "make it smaller" if "too large" in detail else "RE2 has no backreferences or lookaround"
                raise ToolError(f"extract(): not a valid RE2 pattern ({detail}); {hint}") from None
            ranked = [(i, 1.0) for i, (_, _, text) in enumerate(located) if pattern.search(text)][:args.k]
        else:
            ranked = bm25.top_k(tokenize(args.query), args.k)
        return [
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

    def _submit(self, args: SubmitArgs) -> str:
        self._refuse_if_ended()
        evidence: list[dict] = []
        for position, item in enumerate(args.evidence):
            resolved = self._evidence(position, item)
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

    def _sentences_of(self, paper: Paper) -> tuple[list[tuple[int, int, str]], BM25]:
        """The paper's sentences with their (section, paragraph) and a BM25 over them, built once."""
        if paper.id not in self._sentence_indexes:
            located = [
                (s_index, p_index, sentence)
                for s_index, section in enumerate(paper.sections)
                for p_index, text in enumerate(section.paragraphs) if text
                for sentence in sentences(text)
            ]
            self._sentence_indexes[paper.id] = (located, BM25.build([tokenize(s) for _, _, s in located]))
        return self._sentence_indexes[paper.id]

    def _evidence(self, position: int, item: Any) -> dict:
        """A paragraph address (hit dict or triple) or an exact quote -> {paper_id, section, paragraph, text}."""
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
            if not 0 <= section < len(paper.sections) or not 0 <= paragraph < len(paper.sections[section].paragraphs) \
                    or not paper.sections[section].paragraphs[paragraph]:
                raise ToolError(f"evidence {position}: {paper.id!r} has no paragraph {paragraph} in section {section}")
            return {"paper_id": paper.id, "section": section, "paragraph": paragraph,
                    "text": paper.sections[section].paragraphs[paragraph]}
        if isinstance(item, str):
            quote = " ".join(item.split()).lower()
            if len(quote) < 10:
                raise ToolError(f"evidence {position}: a quote must have at least 10 characters to identify a paragraph")
            for paragraph in self.corpus.paragraphs():
                if quote in " ".join(paragraph.text.split()).lower():
                    return {"paper_id": paragraph.paper_id, "section": paragraph.section_index,
                            "paragraph": paragraph.paragraph_index, "text": paragraph.text}
            raise ToolError(f"evidence {position}: no paragraph contains the quote {shown(item)}; quote the text exactly as read")
        raise ToolError(f"evidence {position}: expected a hit, a [paper_id, section, paragraph] list or a quote, got {type(item).__name__}")

    def _refuse_if_ended(self) -> None:
        if self.outcome is not None:
            raise ToolError(f"the episode already ended ({self.outcome.status}); nothing more can be submitted")


def _closest(wanted: str, candidates: list[str], n: int = 3) -> list[str]:
    """Similar ids, most similar first; among equals, ids that contain what was typed, then by name."""
    close = difflib.get_close_matches(wanted, candidates, n=20, cutoff=0.6)

    def rank(candidate: str) -> tuple:
        ratio = difflib.SequenceMatcher(None, wanted, candidate).ratio()
        return (-round(ratio, 6), wanted not in candidate, candidate)

    return sorted(close, key=rank)[:n]


def _outline(paper: Paper) -> str:
    lines = [f"{paper.id}: {paper.title}", "", paper.abstract or "(no abstract)", "", "Sections:"]
    for number, section in enumerate(paper.sections):
        count = sum(1 for text in section.paragraphs if text)
        lines.append(f"  {number}. {section.name or '(untitled)'} ({count} paragraph{'s' if count != 1 else ''})")
    lines += ["", f"read({paper.id!r}, section=N) shows a section's paragraphs."]
    return "\n".join(lines)


def _pages(entries: list[str], budget: int) -> list[list[str]]:
    """Whole paragraphs per page; a paragraph longer than a page is split and says so."""
    pieces: list[str] = []
    for entry in entries:
        while len(entry) > budget:
            pieces.append(entry[:budget] + " [continues]")
            entry = "[continued] " + entry[budget:]
        pieces.append(entry)
    pages: list[list[str]] = [[]]
    used = 0
    for piece in pieces:
        if pages[-1] and used + len(piece) > budget:
            pages.append([])
            used = 0
        pages[-1].append(piece)
        used += len(piece) + 2
    return pages


def _snippet(text: str, query_tokens: set[str]) -> str:
    """The paragraph's best-matching sentence and what follows it, up to SNIPPET_CHARS."""
    parts = sentences(text) or [text]
    best = max(range(len(parts)), key=lambda i: (len(query_tokens & set(tokenize(parts[i]))), -i))
    snippet = " ".join(parts[best:])
    prefix = "... " if best > 0 else ""
    if len(snippet) > SNIPPET_CHARS:
        snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."
    return prefix + snippet
