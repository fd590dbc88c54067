"""What a tool call showed of the papers, as the host recorded it while it rendered the result
(``tools.layout``): each piece of paper text, where it lies in the returned text and where in the
paper it comes from, and for a ``read`` which page. Its own module because the layout writes these
and the call records (``tools.records``) check a result against the layout: both import it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


PieceKind = Literal["title", "abstract", "section_name", "paragraph", "snippet", "sentence"]


class Piece(Record):
    """One piece of paper text in ``Returned.text``: where it lies there, what it is, and where in
    the paper it comes from (schema 8 on). A piece of a paragraph says where in the paragraph's text
    it starts (``offset``): a page that continues a paragraph split over pages starts past 0, so
    the pieces of a paragraph join back whole, by their offsets, without reading the page."""

    start: int
    end: int  # [start, end) in Returned.text
    what: PieceKind
    paper_id: str
    section: int | None = None  # a section name's, a paragraph's, a snippet's or a sentence's section
    paragraph: int | None = None  # a paragraph's piece, a snippet's or a sentence's paragraph
    offset: int = 0


class Page(Record):
    """Where a ``read`` was (schema 8 on): the paper, and the section's page it showed (``section``
    None: the outline, which lists ``sections`` sections)."""

    paper_id: str
    section: int | None = None
    page: int = 0  # numbered from 0, as read() takes it
    pages: int = 1
    sections: int | None = None  # the outline: how many sections the paper has


class Shown(Record):
    """What a research call (search, read, extract, or any tool declared with ``record="shown"``)
    showed the policy of the papers, written by the host while it rendered the result
    (``tools.layout``) and never read back from the text: the paragraphs it showed, each piece of
    paper text (where it lies in ``Returned.text``, what it is, where in the paper), and for a
    ``read`` which page. Paper text can therefore not make a paragraph count as shown, nor pass the
    host's scaffolding (markers, headings, numbers, ids) off as paper text; the grounding detectors
    (``evaluation.detectors``) and the memory reader read this and nothing else of a result.

    ``form`` says how to read a piece: "text" (a read: the piece is the paper's text as it stands)
    or "json" (a search or extract, rendered as JSON: the piece is a JSON string literal, quotes
    included, of the paper's text). A result cut at its cap keeps only the pieces within what was
    kept; its paragraphs are all kept (a few dozen at most: a page's paragraphs or a call's hits).

    Schema 7 kept ``pieces`` as bare [start, end) pairs; schema 8 keeps ``parts`` (typed pieces)
    and ``read`` instead, and leaves ``pieces`` empty."""

    form: Literal["text", "json"]
    # (paper_id, section, paragraph) of each paragraph the call showed or named: a search or extract
    # hit's paragraph, or a paragraph whose first piece (its "[i] " marker) a read page showed
    paragraphs: list[tuple[str, int, int]] = Field(default_factory=list)
    pieces: list[tuple[int, int]] = Field(default_factory=list)  # schema 7: [start, end) of each piece of paper text
    parts: list[Piece] | None = None  # schema 8: each piece of paper text, typed and placed
    read: Page | None = None  # schema 8, a read: which paper, section and page

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) in Returned.text of each piece of paper text, whichever schema wrote it."""
        return [(part.start, part.end) for part in self.parts] if self.parts is not None else list(self.pieces)
