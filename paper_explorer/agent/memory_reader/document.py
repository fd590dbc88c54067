"""What the memory reader reads, through the sandbox's tools: its fixed actions, and the document
built from the host's records of what they returned.

The reader never touches the corpus itself: every word it reads came out of ``search`` and
``read`` calls that the sandbox ran and the trajectory logs, so the tool records, detectors and
reports treat its episodes as any other. The document is built from those records alone
(``tools.records.Shown``, written by ``tools.layout`` as it rendered each result): a piece of
paper text is what its record says it is (a title, an abstract, a section's name, a piece of a
paragraph at an offset) and where it comes from, cut out of the kept result where the record says.
Nothing is parsed back from a result's text, so paper text that imitates the layout (a fake
heading, a "[4] " after a blank line, a continuation note) is paper text in the document, as it
is in the paper.

The document is each paper's title and abstract, then its sections, each headed by the title and
the section's name and holding its paragraphs in order, each "[i] " and its whole text (a paragraph
the tool split across pages is joined back by its pieces' offsets), separated by blank lines. A
title or section name is the words its record holds: one the tool cut at ``HEADING_CHARS`` is those
characters (the tool's " ..." after them is scaffolding), and a section without a name is "(untitled)".

An action keeps at most ``ACTION_RETURNED_CHARS`` of results (``tools.paper_tools``), records
included; past that the host keeps a result's length and digest only. So a paper is read in
actions of about half that in page text (``BATCH_CHARS``), each from the first page not yet read
whole: the reader goes on from the first page whose record was not kept, and a read that keeps
nothing at all ends the episode saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paper_explorer.agent.memory_reader.paging import Section
from paper_explorer.agent.policies.base import PolicyError, action
from paper_explorer.tools.layout import UNTITLED, shown_texts
from paper_explorer.tools.paper_tools import ACTION_RETURNED_CHARS
from paper_explorer.tools.records import Page, Piece, ToolCallRecord

SEARCH_HITS = 50  # search()'s most: enough hits to find K distinct papers
QUERY_CHARS = 500  # search()'s longest query
# The pages' text one read action asks for (it stops at the first page past it): the other half of
# the results an action keeps is for the records of what the pages showed (about a quarter of
# their text on a page of ordinary paragraphs), so an action's pages are normally all kept.
BATCH_CHARS = ACTION_RETURNED_CHARS // 2


def literal(text: str) -> str:
    """``text`` as a Python string literal without a backtick: an action's code sits in a ```python
    fence, which a ``` inside the literal would close early (agent.actions.FENCED), cutting the code."""
    return repr(text).replace("`", "\\x60")


def search_action(question: str) -> str:
    """The question as a BM25 query; the hits' paper ids, best first, as the action's value."""
    query = " ".join(question.split())[:QUERY_CHARS] or "?"
    return action(f"hits = search({literal(query)}, k={SEARCH_HITS})\n[hit['paper_id'] for hit in hits]")


def top_papers(calls: list[ToolCallRecord], count: int) -> list[str]:
    """The first ``count`` distinct paper ids of the search's hits, best first, as its record names them."""
    searches = [call for call in calls if call.name == "search"]
    if len(searches) != 1:
        raise PolicyError(f"the search step recorded {len(searches)} searches, not one")
    returned = searches[0].returned
    if searches[0].error is not None or returned is None or returned.shown is None:
        why = searches[0].error or (returned.cut if returned is not None else None) or "no record of its hits"
        raise PolicyError(f"the search for the question failed: {why}")
    return list(dict.fromkeys(paper_id for paper_id, _, _ in returned.shown.paragraphs))[:count]


def outlines_action(paper_ids: list[str]) -> str:
    listed = ", ".join(literal(paper_id) for paper_id in paper_ids)
    return action(f"for paper_id in [{listed}]:\n    read(paper_id)")


def pages_action(paper_id: str, sections: int, section: int, page: int) -> str:
    """The paper's pages in order from ``page`` of ``section``, until its last page or the first
    page that takes the text read past ``BATCH_CHARS``. How many pages a section has, the action
    reads from its pages' heading line, "... (page 1 of N)": the tool writes names on one line, so
    no paper text can stand in that line's place; and the reader takes from the records only the
    pages it asked for, in order, so a miscount could only end the episode, never change the document."""
    code = (
        f"paper_id, section, page, read_chars = {literal(paper_id)}, {section}, {page}, 0\n"
        f"while section < {sections} and read_chars < {BATCH_CHARS}:\n"
        "    text = read(paper_id, section=section, page=page)\n"
        "    read_chars += len(text)\n"
        "    page += 1\n"
        "    if page == int(text.split('\\n', 1)[0].rsplit(' of ', 1)[1][:-1]):\n"
        "        section, page = section + 1, 0"
    )
    return action(code)


@dataclass
class PaperRead:
    """One paper as its records say so far: its outline, then its sections' paragraphs, page by page."""

    paper_id: str
    title: str
    abstract: str
    names: list[str]  # each section's name as the outline shows it
    paragraphs: list[dict[int, str]] = field(default_factory=list)  # per section read: paragraph -> its text so far
    section: int = 0  # the next page to read: its section, its number, and how many pages that section has
    page: int = 0
    pages: int | None = None

    @property
    def done(self) -> bool:
        return self.section == len(self.names)

    def sections(self) -> list[Section]:
        """The paper as sections of the document: its title and abstract first, then each section."""
        found = [Section(heading=self.title, text=self.abstract)]
        for name, paragraphs in zip(self.names, self.paragraphs):
            text = "\n\n".join(f"[{number}] {paragraphs[number]}" for number in sorted(paragraphs))
            found.append(Section(heading=f"{self.title} / {name}", text=text))
        return found


class Reads:
    """The reader's reading of ``paper_ids``: the action to take next, and the document its steps'
    tool-call records make, taken step by step (``take``). The policy and the parity check
    (``memory_reader.parity``) both go through it, so the check rebuilds the document the reader read."""

    def __init__(self, paper_ids: list[str]) -> None:
        self.paper_ids = paper_ids
        self.papers: list[PaperRead] = []  # outlined so far, in order

    def next_action(self) -> str | None:
        """The next action of the plan, or None once every paper is read whole."""
        if len(self.papers) < len(self.paper_ids):
            return outlines_action(self.paper_ids[len(self.papers) :])
        paper = self._current()
        return None if paper is None else pages_action(paper.paper_id, len(paper.names), paper.section, paper.page)

    def take(self, calls: list[ToolCallRecord]) -> None:
        """What the step of ``next_action`` returned, from its records: outlines, or pages of the paper
        being read, each in order up to the first the host did not keep (the next action reads on from it)."""
        if len(self.papers) < len(self.paper_ids):
            taken = self._outlines(calls)
            where = f"paper {self.paper_ids[len(self.papers)]!r}: its outline" if taken == 0 else ""
        else:
            paper = self._current()
            if paper is None:
                raise PolicyError("a read step after every paper was read whole")
            where = f"paper {paper.paper_id!r}: section {paper.section} page {paper.page + 1}"
            taken = 0
            for call in calls:
                if paper.done:
                    raise PolicyError(f"paper {paper.paper_id!r}: the step read more than its pages")
                kept = _kept_page(call, paper)
                if kept is None:
                    break
                _add_page(paper, *kept)
                taken += 1
        if taken == 0:
            why = _not_kept(calls[0]) if calls else "the step called no tool"
            raise PolicyError(f"{where} was not read ({why}); a read step must keep at least one result")

    def sections(self) -> list[Section]:
        """The document's sections: every paper, read whole, in order."""
        if len(self.papers) < len(self.paper_ids) or self._current() is not None:
            raise PolicyError("the document is not read whole yet")
        return [section for paper in self.papers for section in paper.sections()]

    def _outlines(self, calls: list[ToolCallRecord]) -> int:
        taken = 0
        for call, paper_id in zip(calls, self.paper_ids[len(self.papers) :]):
            outline = _outline(call, paper_id)
            if outline is None:
                break
            self.papers.append(outline)
            taken += 1
        return taken

    def _current(self) -> PaperRead | None:
        return next((paper for paper in self.papers if not paper.done), None)


def _not_kept(call: ToolCallRecord) -> str:
    """Why a read's record holds no result the document can use."""
    returned = call.returned
    if call.error is not None:
        return call.error
    if returned is None or returned.text is None:
        return returned.cut if returned is not None and returned.cut else "no result was kept"
    if returned.cut is not None:
        return returned.cut
    return "its record says nothing of what it showed"


def _shown(call: ToolCallRecord) -> tuple[Page, list[tuple[Piece, str]]] | None:
    """A kept read's page and the typed pieces of paper text it showed; None when the record has none."""
    returned = call.returned
    if call.name != "read" or call.error is not None or returned is None or returned.text is None or returned.cut is not None:
        return None
    shown = returned.shown
    if shown is None or shown.read is None or shown.parts is None:
        return None
    pieces = shown_texts(returned.text, shown)
    if pieces is None:
        raise PolicyError(f"the record of read({shown.read.paper_id!r}) does not fit its result")
    return shown.read, [(piece, text) for piece, text in pieces if piece is not None]


def _outline(call: ToolCallRecord, paper_id: str) -> PaperRead | None:
    """The title, abstract and section names of ``read(paper_id)``'s outline, as its record types
    them; None when its result was not kept."""
    found = _shown(call)
    if found is None:
        return None
    page, pieces = found
    if page.paper_id != paper_id or page.section is not None or page.sections is None:
        raise PolicyError(f"paper {paper_id!r}: the outline step read another paper or a section ({page.paper_id!r})")
    texts: dict[tuple[str, int | None], str] = {}
    for piece, text in pieces:
        if piece.paper_id != paper_id or piece.what not in ("title", "abstract", "section_name"):
            raise PolicyError(f"paper {paper_id!r}: its outline's record holds a {piece.what} of {piece.paper_id!r}")
        texts[piece.what, piece.section] = text
    names = [texts.get(("section_name", number), UNTITLED) for number in range(page.sections)]
    return PaperRead(paper_id, title=texts.get(("title", None), ""), abstract=texts.get(("abstract", None), ""), names=names)


def _kept_page(call: ToolCallRecord, paper: PaperRead) -> tuple[Page, list[tuple[Piece, str]]] | None:
    """The record of the page ``paper`` reads next, or None when its result was not kept. A kept
    record of any other page is an error: the reader takes the pages in order, each once."""
    found = _shown(call)
    if found is None:
        return None
    page = found[0]
    expected = (paper.paper_id, paper.section, paper.page)
    if (page.paper_id, page.section, page.page) != expected or (paper.pages is not None and page.pages != paper.pages):
        raise PolicyError(
            f"paper {paper.paper_id!r}: a step read section {page.section} page {page.page + 1} of {page.paper_id!r} "
            f"where section {paper.section} page {paper.page + 1} came next"
        )
    return found


def _add_page(paper: PaperRead, page: Page, pieces: list[tuple[Piece, str]]) -> None:
    """A section's page, its pieces of paragraphs joined on to what the pages before it showed."""
    if paper.page == 0:
        paper.paragraphs.append({})
        paper.pages = page.pages
    paragraphs = paper.paragraphs[-1]
    for piece, text in pieces:
        if piece.paper_id != paper.paper_id or piece.section != paper.section or piece.what not in ("section_name", "paragraph"):
            raise PolicyError(f"paper {paper.paper_id!r}: section {paper.section}'s page holds a {piece.what} of another place")
        if piece.what == "section_name":
            continue  # the outline's name is the section's heading
        assert piece.paragraph is not None
        before = paragraphs.get(piece.paragraph, "")
        if piece.offset != len(before):
            raise PolicyError(
                f"paper {paper.paper_id!r}: section {paper.section} paragraph {piece.paragraph} goes on at character "
                f"{piece.offset}, after {len(before)}"
            )
        paragraphs[piece.paragraph] = before + text
    paper.page += 1
    if paper.page == paper.pages:
        paper.section, paper.page, paper.pages = paper.section + 1, 0, None
