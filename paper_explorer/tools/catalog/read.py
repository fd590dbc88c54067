"""``read(paper_id, section=None, page=0)``: a paper's outline, or one section's numbered paragraphs,
a page at a time (the layout is ``tools.layout``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from paper_explorer.corpus.schema import PAPER_ID_CHARS
from paper_explorer.tools import layout
from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.registry import Tool

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools


class ReadArgs(Arguments):
    paper_id: Annotated[str, Field(min_length=1, max_length=PAPER_ID_CHARS, description="the paper to read")]
    section: Annotated[
        int | str | None,
        Field(description="section number or name; omit it for the paper's outline"),
    ] = None
    page: Annotated[int, Field(ge=0, le=10_000, description="page of a long section")] = 0


def read(episode: PaperTools, args: ReadArgs) -> layout.Rendered:
    paper = episode.paper(args.paper_id)
    if args.section is None:
        if args.page:
            raise ToolError("the outline has one page; pass a section to read further")
        return layout.outline(paper)
    number = episode.section_number(paper, args.section)
    pages = layout.SectionPages(paper, number)
    if args.page >= len(pages):
        raise ToolError(f"section {number} of {paper.id!r} has {len(pages)} page(s); pages are numbered from 0")
    return pages.page(args.page)


TOOL = Tool(
    name="read",
    arguments=ReadArgs,
    function=read,
    summary="Read a paper: its outline, or one section's numbered paragraphs, a page at a time.",
    returns="text; a long section ends with the call that reads its next page",
    example='print(read(hits[0]["paper_id"], section=hits[0]["section"]))',
    order=20,
    record="shown",
)
