"""``submit(answer, evidence=[])``: answer and end the episode, citing hits, ``[paper_id, section,
paragraph]`` triples or exact quotes; every quote is found at a bounded cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from paper_explorer.corpus.index import quote_form
from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.paper_tools import shown
from paper_explorer.tools.records import Evidence, Outcome
from paper_explorer.tools.registry import Tool

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools

# Whole-corpus scans one submit may spend on quotes with no uncommon word to look them up by
# (each ~1 ns per byte of corpus text; a quote with one costs a look at the few paragraphs holding it).
QUOTE_SCANS = 3


class SubmitArgs(Arguments):
    answer: Annotated[str, Field(min_length=1, max_length=2000, description="the answer, as short as the question allows")]
    evidence: Annotated[
        list[Any],
        Field(
            max_length=20,
            description="paragraphs that support the answer: hits from search/extract, "
            "[paper_id, section, paragraph] triples, or exact quotes",
        ),
    ] = []


def submit(episode: PaperTools, args: SubmitArgs) -> str:
    episode.refuse_if_ended()
    evidence: list[dict] = []
    quote_bytes_left = QUOTE_SCANS * len(episode.index.quotes.text)
    for position, item in enumerate(args.evidence):
        resolved, read = cited(episode, position, item, quote_bytes_left)
        quote_bytes_left -= read
        if resolved not in evidence:  # a paragraph cited twice (as a hit and as a quote) counts once
            evidence.append(resolved)
    episode.end(Outcome(status="submitted", answer=args.answer, evidence=[Evidence(**item) for item in evidence]))
    return f"submitted {args.answer!r} with {len(evidence)} evidence paragraph(s)"


def cited(episode: PaperTools, position: int, item: Any, quote_bytes_left: int) -> tuple[dict, int]:
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
        paper = episode.paper(item[0])
        section, paragraph = item[1], item[2]
        if (
            not 0 <= section < len(paper.sections)
            or not 0 <= paragraph < len(paper.sections[section].paragraphs)
            or not paper.sections[section].paragraphs[paragraph]
        ):
            raise ToolError(f"evidence {position}: {paper.id!r} has no paragraph {paragraph} in section {section}")
        return {"paper_id": paper.id, "section": section, "paragraph": paragraph, "text": paper.sections[section].paragraphs[paragraph]}, 0
    if isinstance(item, str):
        if len(quote_form(item)) < 10:
            raise ToolError(f"evidence {position}: a quote must have at least 10 characters to identify a paragraph")
        plan = episode.index.plan_quote(item)
        if plan.cost > quote_bytes_left:
            raise ToolError(
                f"evidence {position}: this quote has no word uncommon enough to look it up by, and a submit "
                f"may scan the whole corpus for {QUOTE_SCANS} such quotes at most; quote a longer passage, "
                f"or cite the paragraph as [paper_id, section, paragraph]"
            )
        found = episode.index.find_planned(plan)  # the first paragraph, in corpus order, that contains it
        if found is not None:
            paragraph_record = episode.index.paragraphs[found]
            return {
                "paper_id": paragraph_record.paper_id,
                "section": paragraph_record.section_index,
                "paragraph": paragraph_record.paragraph_index,
                "text": paragraph_record.text,
            }, plan.cost
        raise ToolError(f"evidence {position}: no paragraph contains the quote {shown(item)}; quote the text exactly as read")
    raise ToolError(f"evidence {position}: expected a hit, a [paper_id, section, paragraph] list or a quote, got {type(item).__name__}")


TOOL = Tool(
    name="submit",
    arguments=SubmitArgs,
    function=submit,
    summary="Answer the question and end the episode. Cite the paragraphs you relied on.",
    returns="a confirmation; the episode ends after this action",
    example='submit("12,000 examples", evidence=[hits[0]])',
    order=40,
    record="outcome",
)
