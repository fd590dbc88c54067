"""The memory reader's document and its pages, exactly in the model's tokens.

Guaranteed:

* ``encode_document``: each section is one piece of text (the prompts file's ``document_section``)
  encoded as one piece by the renderer, so every section begins and ends on a token boundary; the
  document's ids are the pieces' ids joined, and its text the pieces joined (decoding the ids gives
  the text back with a byte-level tokenizer such as Qwen3's).
* ``page_document``: the pages' ids joined are exactly the read ids (the document's first
  ``read_tokens``; the rest is counted as unread, never dropped silently); pages are contiguous,
  none is empty and none holds more than ``page_tokens`` ids of text.
  Without outlines every page but the last holds exactly ``page_tokens``. With outlines a page is
  filled greedily with whole sections and ends where the next section does not fit in what is left;
  a section that does not fit an empty page is cut at exactly ``page_tokens``; a page touches at
  most ``outline_sections`` sections. Balanced (``balanced=True``), the pages are as many as greedy
  makes and the sections are cut where greedy cuts them, but the pages end where their sizes are
  most even (least sum of squares), so no page is left short while others are full.
  Each page then carries its outline's ids (the headings of the sections it touches, the first
  marked continued when it began on an earlier page), which are served before the page's text
  and counted apart from it.
* ``verbatim_document``: a benchmark's context is one piece: its text with the surrounding
  whitespace stripped (as MemAgent's evaluation strips it), encoded whole; no heading, no layout.

Not guaranteed: that a page's text decodes on its own to whole characters (a cut inside a section
may fall inside a multi-byte character; the ids, not their text, are what is served).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts, Renderer


@dataclass(frozen=True)
class Section:
    """One section of the document: its heading line and its text."""

    heading: str
    text: str


@dataclass(frozen=True)
class Span:
    """Where one section lies in the document's ids: [start, end)."""

    heading: str
    start: int
    end: int


@dataclass(frozen=True)
class Document:
    ids: list[int]
    spans: list[Span]  # one per section, in order, contiguous from 0 to len(ids)
    text: str  # the sections' pieces joined

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Page:
    index: int  # from 0
    start: int  # the page's text is the document's ids [start, end)
    end: int
    sections: tuple[int, ...]  # the indices (into Document.spans) of the sections it touches, in order
    continued: bool  # its first section began on an earlier page
    outline_ids: list[int]  # the page-local outline served before its text; empty without outlines

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def outline_tokens(self) -> int:
        return len(self.outline_ids)

    def ids(self, document: Document) -> list[int]:
        """The page's text ids."""
        return document.ids[self.start : self.end]


@dataclass(frozen=True)
class Paging:
    pages: list[Page]
    document_tokens: int
    read_tokens: int  # the ids paged: the document's first read_tokens

    @property
    def unread_tokens(self) -> int:
        return self.document_tokens - self.read_tokens


def verbatim_document(text: str, renderer: Renderer) -> Document:
    """A question's own document as its benchmark gives it, in the model's tokens: the text's own
    token stream (stripped of surrounding whitespace, as ``memory_eval/utils/recurrent_boxed.py``
    strips ``item["context"]``), one section without a heading, paged without outlines."""
    read = text.strip()
    ids = renderer.text(read)
    return Document(ids=ids, spans=[Span("", 0, len(ids))], text=read)


def encode_document(sections: Sequence[Section], renderer: Renderer, prompts: ReaderPrompts) -> Document:
    """The document of ``sections`` in reading order, each section one piece of text and of ids."""
    ids: list[int] = []
    spans: list[Span] = []
    pieces: list[str] = []
    for section in sections:
        piece = prompts.document_section.format(heading=section.heading, text=section.text)
        piece_ids = renderer.text(piece)
        spans.append(Span(section.heading, len(ids), len(ids) + len(piece_ids)))
        ids += piece_ids
        pieces.append(piece)
    return Document(ids=ids, spans=spans, text="".join(pieces))


def page_document(
    document: Document,
    *,
    page_tokens: int,
    outlines: bool,
    outline_sections: int,
    renderer: Renderer,
    prompts: ReaderPrompts,
    read_tokens: int | None = None,
    balanced: bool = False,
) -> Paging:
    """The pages of ``document``'s first ``read_tokens`` ids (all of them when None; a budget
    beyond the document reads it all). See the module docstring for what is guaranteed."""
    if page_tokens < 1:
        raise AgentError(f"pages must hold at least 1 token, not {page_tokens}")
    if outline_sections < 1:
        raise AgentError(f"a page must be allowed at least 1 section in its outline, not {outline_sections}")
    if read_tokens is not None and read_tokens < 0:
        raise AgentError(f"the tokens to read cannot be negative ({read_tokens})")
    read = document.tokens if read_tokens is None else min(read_tokens, document.tokens)
    if outlines:
        ends = _section_ends(document.spans, read)
        ranges = _sectioned_ranges(ends, page_tokens, outline_sections)
        if balanced and len(ranges) > 1:
            ranges = _balanced_ranges(ends, page_tokens, outline_sections, len(ranges))
    else:
        ranges = [(start, min(start + page_tokens, read)) for start in range(0, read, page_tokens)]
    pages = []
    for index, (start, end) in enumerate(ranges):
        touched = _touched(document.spans, start, end)
        continued = bool(touched) and document.spans[touched[0]].start < start
        outline = _outline_ids(document, touched, continued, renderer, prompts) if outlines else []
        pages.append(Page(index=index, start=start, end=end, sections=touched, continued=continued, outline_ids=outline))
    return Paging(pages=pages, document_tokens=document.tokens, read_tokens=read)


def _section_ends(spans: list[Span], read: int) -> list[int]:
    """Where each non-empty section within the read ids ends (the last cut at ``read``), increasing."""
    ends = {min(span.end, read) for span in spans if span.start < min(span.end, read)}
    return sorted(ends | {read}) if read else []


def _sectioned_ranges(section_ends: list[int], page_tokens: int, outline_sections: int) -> list[tuple[int, int]]:
    """Greedy pages over the read ids, whose section boundaries are ``section_ends``."""
    ranges = []
    position, boundary = 0, 0
    read = section_ends[-1] if section_ends else 0
    while position < read:
        start, room, touched = position, page_tokens, 0
        while position < read and room > 0 and touched < outline_sections:
            while section_ends[boundary] <= position:
                boundary += 1
            rest = section_ends[boundary] - position  # what is left of the section at `position`
            if rest <= room:
                position, room = position + rest, room - rest
            elif room == page_tokens:  # it does not fit even an empty page: cut it at the page's size
                position, room = position + page_tokens, 0
            else:  # it does not fit what is left: the page ends on this section boundary
                break
            touched += 1
        ranges.append((start, position))
    return ranges


def _balanced_ranges(section_ends: list[int], page_tokens: int, outline_sections: int, pages: int) -> list[tuple[int, int]]:
    """The pages of ``_sectioned_ranges`` made even: as many pages, each of whole pieces (the
    sections, cut where greedy cuts them: at ``page_tokens`` from the start of one too long for a
    page), within ``page_tokens`` and ``outline_sections``, ending where the sum of the pages'
    squared sizes is least (so no page is left short while another is full). Dynamic programming
    over the piece boundaries: pages x pieces x ``outline_sections`` steps; the first of equal
    choices is taken, so the pages are the same on every run."""
    pieces = _pieces(section_ends, page_tokens)
    bounds = [0, *(end for _, end in pieces)]
    count = len(pieces)
    inf = float("inf")
    # best[p][j]: the least cost of the first j pieces on p pages; back[p][j]: where its last page begins
    best = [[inf] * (count + 1) for _ in range(pages + 1)]
    back = [[0] * (count + 1) for _ in range(pages + 1)]
    best[0][0] = 0
    for page in range(1, pages + 1):
        # page `page` can end only where the pages before it could reach, and the rest still fits
        for j in range(max(page, count - (pages - page) * outline_sections), min(count, page * outline_sections) + 1):
            for k in range(j - 1, max(j - outline_sections, 0) - 1, -1):
                size = bounds[j] - bounds[k]
                if size > page_tokens:
                    break
                cost = best[page - 1][k] + size * size
                if cost < best[page][j]:
                    best[page][j], back[page][j] = cost, k
    ranges, j = [], count
    for page in range(pages, 0, -1):
        k = back[page][j]
        ranges.append((bounds[k], bounds[j]))
        j = k
    return ranges[::-1]


def _pieces(section_ends: list[int], page_tokens: int) -> list[tuple[int, int]]:
    """The read ids as whole sections, each too long for one page cut at every ``page_tokens`` from its start."""
    pieces, start = [], 0
    for end in section_ends:
        while end - start > page_tokens:
            pieces.append((start, start + page_tokens))
            start += page_tokens
        pieces.append((start, end))
        start = end
    return pieces


def _touched(spans: list[Span], start: int, end: int) -> tuple[int, ...]:
    """The indices of the sections holding any of the ids [start, end)."""
    return tuple(i for i, span in enumerate(spans) if span.start < end and span.end > start and span.start < span.end)


def _outline_ids(document: Document, touched: tuple[int, ...], continued: bool, renderer: Renderer, prompts: ReaderPrompts) -> list[int]:
    """The page-local outline, as one piece of ids: the headings of the sections the page touches."""
    lines = []
    for position, section in enumerate(touched):
        suffix = prompts.outline_continued if position == 0 and continued else ""
        lines.append(prompts.outline_line.format(heading=document.spans[section].heading + suffix))
    return renderer.text(prompts.outline.format(lines="".join(lines)))
