"""``search(query, k=5, paper_id=None)``: BM25 over every paragraph, or one paper's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from paper_explorer.corpus import tokenize
from paper_explorer.corpus.schema import PAPER_ID_CHARS
from paper_explorer.tools import layout
from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.paper_tools import sentences
from paper_explorer.tools.registry import Tool

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools

SNIPPET_CHARS = 300


class SearchArgs(Arguments):
    query: Annotated[str, Field(min_length=1, max_length=500, description="words to look for")]
    k: Annotated[int, Field(ge=1, le=50, description="number of hits")] = 5
    paper_id: Annotated[str | None, Field(max_length=PAPER_ID_CHARS, description="search only this paper")] = None


def search(episode: PaperTools, args: SearchArgs) -> layout.Rendered:
    if args.paper_id is not None:
        episode.paper(args.paper_id)
    hits = episode.index.search(args.query, k=args.k, paper_id=args.paper_id)
    query_tokens = set(tokenize(args.query))
    found = [
        {
            "paper_id": hit.paper_id,
            "title": episode.corpus.paper(hit.paper_id).title,
            "section": hit.section_index,
            "section_name": hit.section or "",
            "paragraph": hit.paragraph_index,
            "score": round(hit.score, 3),
            "snippet": snippet(hit.text, query_tokens),
        }
        for hit in hits
    ]
    return layout.hits(found, "search")


def snippet(text: str, query_tokens: set[str]) -> str:
    """The paragraph's best-matching sentence and what follows it, up to SNIPPET_CHARS."""
    parts = sentences(text) or [text]
    best = max(range(len(parts)), key=lambda i: (len(query_tokens & set(tokenize(parts[i]))), -i))
    found = " ".join(parts[best:])
    prefix = "... " if best > 0 else ""
    if len(found) > SNIPPET_CHARS:
        found = found[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."
    return prefix + found


# The examples on the tool page are one sequence (the later ones use this search's ``hits``) and
# name no paper, method or dataset: a model copies them verbatim, so they must fit any corpus.
TOOL = Tool(
    name="search",
    arguments=SearchArgs,
    function=search,
    summary="BM25 search over every paragraph of every paper (or of one paper).",
    returns="a list of hits, best first: {paper_id, title, section, section_name, paragraph, score, snippet}",
    example='hits = search("training data size", k=3)',
    order=10,
    record="shown",
)
