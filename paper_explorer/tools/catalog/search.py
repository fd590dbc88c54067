"""``search(query, k=5, paper_id=None, rerank=None)``: BM25 over every paragraph, or one paper's;
with ``rerank=K``, the top K BM25 hits reordered by a model's relevance (``tools.reranking``: the
run's reranking service judges them; the call's record keeps which one), the first k shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from paper_explorer.corpus import tokenize
from paper_explorer.corpus.schema import PAPER_ID_CHARS
from paper_explorer.tools import layout
from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.paper_tools import sentences
from paper_explorer.tools.registry import Tool
from paper_explorer.tools.reranking import MAX_RERANK, reranked_order

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools

SNIPPET_CHARS = 300


class SearchArgs(Arguments):
    query: Annotated[str, Field(min_length=1, max_length=500, description="words to look for")]
    k: Annotated[int, Field(ge=1, le=50, description="number of hits")] = 5
    paper_id: Annotated[str | None, Field(max_length=PAPER_ID_CHARS, description="search only this paper")] = None
    rerank: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_RERANK,
            description="reorder the top rerank BM25 hits (at least k) by a model's relevance, when the run has a reranker",
        ),
    ] = None


def search(episode: PaperTools, args: SearchArgs) -> layout.Rendered:
    if args.rerank is not None:
        if args.rerank < args.k:
            raise ToolError(f"search(): rerank={args.rerank} reorders the top {args.rerank} hits, fewer than k={args.k}; pass rerank >= k")
        if episode.reranker is None:
            raise ToolError("search(rerank=...): this run has no reranker (its --rerank-url); search without rerank")
    if args.paper_id is not None:
        episode.paper(args.paper_id)
    hits = episode.index.search(args.query, k=args.rerank or args.k, paper_id=args.paper_id)
    judged: dict[int, tuple[int, float]] = {}  # position among the hits shown -> (BM25 rank, relevance)
    if args.rerank is not None and hits:
        assert episode.reranker is not None
        reply = episode.reranker.rerank(args.query, [hit.text for hit in hits])
        episode.reranked_by = reply.reranker
        order = reranked_order(reply.relevance)[: args.k]
        judged = {position: (rank + 1, reply.relevance[rank]) for position, rank in enumerate(order)}
        hits = [hits[rank] for rank in order]
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
            **({"bm25_rank": judged[position][0], "relevance": round(judged[position][1], 3)} if judged else {}),
        }
        for position, hit in enumerate(hits)
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
    returns="a list of hits, best first: {paper_id, title, section, section_name, paragraph, score, snippet}; "
    "reranked, also bm25_rank and relevance (0 to 1)",
    example='hits = search("training data size", k=3)',
    order=10,
    record="shown",
)
