"""The text the policy sees of the papers: the one owner of the research tools' layout.

A research tool builds its result here, piece by piece: the host's own scaffolding (``Layout.write``:
markers, headings' numbers, "(page 1 of 3)", ids, JSON keys) and the papers' text
(``Layout.paper``), whose every piece is recorded as it is written, with what it is and where in
the paper it comes from (``tools.records.Piece``), beside the paragraphs the result showed and, for
a ``read``, which page (``tools.records.Page``). That record (``tools.records.Shown``) is what the
detectors (``evaluation.detectors``) and the memory reader (``agent.memory_reader.document``) read;
nothing reads the text back as layout, so no paper text (a blank line and "[4] " inside a paragraph,
a fake heading, a listing it imitates) can change what they conclude.

The one exception is at the end of this module, kept beside the writer it mirrors: trajectories of
schemas 4 to 6 recorded no such record, and their results are read back in the form the host wrote
them then (``legacy_shown``), as they always were, paper text imitating that form included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from paper_explorer.corpus import Paper
from paper_explorer.tools.shown import Page, Piece, PieceKind, Shown

PAGE_CHARS = 2500  # a read page's paragraphs, markers included
HEADING_CHARS = 200  # a title or section name as the outline and a page's heading show it: within a page
CONTINUED, CONTINUES = "[continued] ", " [continues]"  # a paragraph split over pages says so at each cut
UNTITLED, NO_ABSTRACT, NO_TEXT = "(untitled)", "(no abstract)", "(this section has no text)"
# The fields of a search and of an extract hit that hold paper text (not the paper id, which is ours,
# nor the numbers), and what each is.
HIT_TEXTS: dict[str, dict[str, PieceKind]] = {
    "search": {"title": "title", "section_name": "section_name", "snippet": "snippet"},
    "extract": {"section_name": "section_name", "sentence": "sentence"},
}


@dataclass(frozen=True)
class Rendered:
    """A research tool's result: the value the action gets, its rendering for the record, and what
    the rendering showed of the papers (written together by ``Layout``, never parsed back)."""

    value: Any
    text: str
    shown: Shown


def one_line(text: str | None, limit: int | None = HEADING_CHARS) -> str:
    """A title, section name or abstract as one line, a heading cut to ``limit`` characters: a line
    break inside one would make the outline and a page's heading say more lines (sections, pages)
    than the paper has, and a heading of 300,000 characters would be no page at all."""
    line = " ".join((text or "").split())
    return line if limit is None or len(line) <= limit else line[:limit] + " ..."


class Layout:
    """A result's text, written piece by piece: the host's own scaffolding (``write``), the papers'
    text (``paper``: where it lands, what it is and where it comes from are recorded as it is
    written) and the paragraphs shown (``showed``). The record is made by the writer, so what the
    text contains cannot change it."""

    def __init__(self, form: Literal["text", "json"]) -> None:
        self.form = form
        self.parts: list[str] = []
        self.size = 0
        self.pieces: list[Piece] = []
        self.paragraphs: list[tuple[str, int, int]] = []

    def write(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)

    def paper(
        self, text: str, what: PieceKind, paper_id: str, section: int | None = None, paragraph: int | None = None, offset: int = 0
    ) -> None:
        """Paper text (a JSON string literal of it, in a JSON layout): recorded where it lands."""
        if text:
            self.pieces.append(
                Piece(
                    start=self.size,
                    end=self.size + len(text),
                    what=what,
                    paper_id=paper_id,
                    section=section,
                    paragraph=paragraph,
                    offset=offset,
                )
            )
            self.write(text)

    def heading(
        self, text: str | None, what: PieceKind, paper_id: str, section: int | None = None, limit: int | None = HEADING_CHARS
    ) -> None:
        """A title or name as ``one_line`` writes it: the paper's words, and our " ..." when cut."""
        line = one_line(text, limit=None)
        self.paper(line if limit is None or len(line) <= limit else line[:limit], what, paper_id, section)
        if limit is not None and len(line) > limit:
            self.write(" ...")

    def showed(self, place: tuple[str, int, int]) -> None:
        if place not in self.paragraphs:
            self.paragraphs.append(place)

    def rendered(self, value: Any = None, read: Page | None = None) -> Rendered:
        """The result: ``value`` (the hits of a JSON layout), or the text itself (a text layout)."""
        text = "".join(self.parts)
        shown = Shown(form=self.form, paragraphs=self.paragraphs, parts=self.pieces, read=read)
        return Rendered(text if self.form == "text" else value, text, shown)


def hits(found: list[dict], tool: str) -> Rendered:
    """Search or extract hits, rendered exactly as ``json.dumps(found, ensure_ascii=False)``, with the
    string literal of each field of ``HIT_TEXTS[tool]`` recorded as paper text and each hit's
    paragraph as named by it."""
    texts = HIT_TEXTS[tool]
    layout = Layout("json")
    layout.write("[")
    for number, hit in enumerate(found):
        layout.write(", {" if number else "{")
        for position, (key, value) in enumerate(hit.items()):
            layout.write((", " if position else "") + json.dumps(key, ensure_ascii=False) + ": ")
            literal = json.dumps(value, ensure_ascii=False)
            if key in texts and value:
                what = texts[key]
                layout.paper(
                    literal,
                    what,
                    hit["paper_id"],
                    section=None if what == "title" else hit["section"],
                    paragraph=hit["paragraph"] if what in ("snippet", "sentence") else None,
                )
            else:
                layout.write(literal)
        layout.write("}")
        layout.showed((hit["paper_id"], hit["section"], hit["paragraph"]))
    layout.write("]")
    return layout.rendered(found)


def outline(paper: Paper) -> Rendered:
    """The paper's id and title, its abstract, a line per section ("  {n}. {name} ({count}
    paragraphs)") and the call that reads one; it shows no paragraph."""
    layout = Layout("text")
    layout.write(f"{paper.id}: ")
    layout.heading(paper.title, "title", paper.id)
    layout.write("\n\n")
    layout.heading(paper.abstract, "abstract", paper.id, limit=None)
    layout.write("" if one_line(paper.abstract, limit=None) else NO_ABSTRACT)
    layout.write("\n\nSections:")
    for number, section in enumerate(paper.sections):
        count = sum(1 for text in section.paragraphs if text)
        layout.write(f"\n  {number}. ")
        layout.heading(section.name, "section_name", paper.id, number)
        layout.write("" if one_line(section.name) else UNTITLED)
        layout.write(f" ({count} paragraph{'s' if count != 1 else ''})")
    layout.write(f"\n\nread({paper.id!r}, section=N) shows a section's paragraphs.")
    return layout.rendered(read=Page(paper_id=paper.id, sections=len(paper.sections)))


class SectionPages:
    """A section cut into pages of whole paragraphs ("[i] text"; one longer than a page is split
    and says so)."""

    def __init__(self, paper: Paper, number: int) -> None:
        self.paper, self.number = paper, number
        section = paper.sections[number]
        self.paragraphs = [(i, f"[{i}] ", text) for i, text in enumerate(section.paragraphs) if text]
        self.pages = _paged([marker + text for _, marker, text in self.paragraphs], PAGE_CHARS)

    def __len__(self) -> int:
        return len(self.pages)

    def page(self, index: int) -> Rendered:
        """Page ``index``: "{paper} / section {n}: {name} (page {p} of {m})", a blank line, the
        paragraphs separated by blank lines, and, unless it is the last, the call for the next."""
        paper, number = self.paper, self.number
        name = paper.sections[number].name
        layout = Layout("text")
        layout.write(f"{paper.id} / section {number}: ")
        layout.heading(name, "section_name", paper.id, number)
        layout.write("" if one_line(name) else UNTITLED)
        layout.write(f" (page {index + 1} of {len(self.pages)})\n\n")
        if not self.pages[index]:
            layout.write(NO_TEXT)
        for position, (entry, start, end) in enumerate(self.pages[index]):
            paragraph, marker, text = self.paragraphs[entry]
            layout.write(("\n\n" if position else "") + (CONTINUED if start else "") + marker[start:end])  # the marker, or what of it fits
            offset = max(start - len(marker), 0)
            layout.paper(text[offset : max(end - len(marker), 0)], "paragraph", paper.id, number, paragraph, offset)
            layout.write(CONTINUES if end < len(marker) + len(text) else "")
            if start == 0:  # a paragraph is shown where its first piece (its marker) is
                layout.showed((paper.id, number, paragraph))
        if index + 1 < len(self.pages):
            layout.write(f"\n\n... more: read({paper.id!r}, section={number}, page={index + 1})")
        return layout.rendered(read=Page(paper_id=paper.id, section=number, page=index, pages=len(self.pages)))


def pages(entries: list[str], budget: int) -> list[list[str]]:
    """Whole paragraphs per page; a paragraph longer than a page is split and says so."""
    return [
        [
            (CONTINUED if start else "") + entries[entry][start:end] + (CONTINUES if end < len(entries[entry]) else "")
            for entry, start, end in page
        ]
        for page in _paged(entries, budget)
    ]


def _paged(entries: list[str], budget: int) -> list[list[tuple[int, int, int]]]:
    """``pages`` as (entry, start, end) per piece: the piece is ``entries[entry][start:end]``, after
    CONTINUED when start > 0 and before " [continues]" when end is not the entry's end."""
    if budget <= len(CONTINUED):
        raise ValueError(f"a page of {budget} characters cannot hold a continued paragraph")
    paged: list[list[tuple[int, int, int]]] = [[]]
    used = 0
    for entry, text in enumerate(entries):
        for start, end in _split(text, budget):
            size = (len(CONTINUED) if start else 0) + end - start + (len(CONTINUES) if end < len(text) else 0)
            if paged[-1] and used + size > budget:
                paged.append([])
                used = 0
            paged[-1].append((entry, start, end))
            used += size + 2
    return paged


def _split(entry: str, budget: int) -> list[tuple[int, int]]:
    """``entry`` cut into pieces of ``budget`` characters (CONTINUED included, " [continues]" added
    beyond it), as [start, end) of each: the paging first written, in time linear in the entry's
    length, not quadratic."""
    cut = []
    head, start = 0, 0
    while head + len(entry) - start > budget:
        taken = budget - head
        cut.append((start, start + taken))
        start += taken
        head = len(CONTINUED)
    cut.append((start, len(entry)))
    return cut


def shown_texts(text: str, shown: Shown) -> list[tuple[Piece | None, str]] | None:
    """Each piece of paper text a record says ``text`` holds, cut out where it says (a JSON string
    literal decoded, in a JSON layout), with its typed record (None for schema 7's bare spans); None
    when the record does not fit the text (the host never writes one that does not)."""
    typed: list[Piece | None] = list(shown.parts) if shown.parts is not None else [None] * len(shown.pieces)
    found: list[tuple[Piece | None, str]] = []
    for piece, (start, end) in zip(typed, shown.spans()):
        if not 0 <= start < end <= len(text):
            return None
        cut = text[start:end]
        if shown.form == "json":
            try:
                cut = json.loads(cut)
            except ValueError:
                return None
            if not isinstance(cut, str):
                return None
        found.append((piece, cut))
    return found


def misfit(name: str, arguments: dict, text: str, shown: Shown, whole: bool) -> str | None:
    """Why a catalog research tool's record of what it showed cannot be the one this module wrote
    for ``text`` (``whole``: the text is the whole result, not cut at its cap); None when it can.
    A trajectory file is untrusted: a record edited to name a paragraph the result never showed, or
    to pass a hit's id or score off as paper text, would otherwise ground an answer or clear a
    direct submit. Hits are written again from their own JSON and must be the record exactly; a
    read's page must show exactly the paragraphs whose first piece it holds, all of its paper and
    section. Without the corpus a text rewritten together with its record and its sha256 still
    passes: nothing here is a signature."""
    if name in HIT_TEXTS:
        return _hits_misfit(name, text, shown, whole)
    if name == "read" and shown.parts is not None:
        return _read_misfit(arguments, shown, whole)
    return None


def _hits_misfit(name: str, text: str, shown: Shown, whole: bool) -> str | None:
    try:
        found = json.loads(text) if whole else whole_items(text)
    except ValueError:
        return "its text is not the JSON of hits"
    if not isinstance(found, list) or not all(is_hit(name, hit) for hit in found):
        return "its text is not a list of hits"
    again = hits(found, name).shown
    typed = shown.parts is not None
    if shown.form != "json" or shown.read is not None:
        return "a list of hits recorded as another form"
    if whole:
        same = again.paragraphs == shown.paragraphs and again.spans() == shown.spans() and (not typed or again.parts == shown.parts)
        return None if same else "its paragraphs or pieces of paper text are not those of its hits"
    # cut at its cap: the whole hits kept must lead the record (what follows was not kept to check)
    kept = len(again.paragraphs)
    same = again.paragraphs == shown.paragraphs[:kept] and again.spans() == shown.spans()[: len(again.spans())]
    return None if same and (not typed or again.parts == (shown.parts or [])[: len(again.spans())]) else "its kept hits are not its record"


def _read_misfit(arguments: dict, shown: Shown, whole: bool) -> str | None:
    page, parts = shown.read, shown.parts or []
    if page is None or shown.form != "text":
        return "a read without the page it showed"
    if isinstance(arguments.get("paper_id"), str) and arguments["paper_id"] != page.paper_id:
        return "a read of one paper recorded as another's"
    if any(part.paper_id != page.paper_id for part in parts):
        return "a read page holding another paper's text"
    if page.section is None:
        if shown.paragraphs or any(part.what not in ("title", "abstract", "section_name") for part in parts):
            return "an outline recorded as showing paragraphs"
        return None
    if any(part.what not in ("section_name", "paragraph") or part.section != page.section for part in parts):
        return "a section's page holding text of another section, or other than its paragraphs and name"
    firsts = list(
        dict.fromkeys((page.paper_id, page.section, part.paragraph) for part in parts if part.what == "paragraph" and not part.offset)
    )
    if whole and shown.paragraphs != firsts:
        return "a page's paragraphs are not those whose first piece it holds"
    return None


# The keys of a search or extract hit, as the tools write them (a hit with others is not one of theirs).
HIT_FIELDS = {
    "search": {"paper_id", "title", "section", "section_name", "paragraph", "score", "snippet"},
    "extract": {"paper_id", "section", "section_name", "paragraph", "sentence", "score"},
}


RERANKED_FIELDS = {"bm25_rank", "relevance"}  # a search hit reordered by search(rerank=K) has these too


def is_hit(name: str, hit: Any) -> bool:
    return (
        isinstance(hit, dict)
        and (set(hit) == HIT_FIELDS[name] or (name == "search" and set(hit) == HIT_FIELDS[name] | RERANKED_FIELDS))
        and isinstance(hit["paper_id"], str)
        and all(type(hit[key]) is int for key in ("section", "paragraph"))
        and all(isinstance(hit[key], str) for key in HIT_TEXTS[name])
    )


def whole_items(text: str) -> list:
    """The items of a JSON list cut short (as ``json.dumps`` writes it: "[a, b, ..."), up to the last whole one."""
    if not text.startswith("["):
        raise ValueError("not a list")
    decoder, at = json.JSONDecoder(), 1
    items: list = []
    while True:
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            return items
        items.append(item)
        if not text.startswith(", ", at):
            return items
        at += 2
