"""``abstain(reason)``: end the episode without an answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.records import Outcome
from paper_explorer.tools.registry import Tool

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools


class AbstainArgs(Arguments):
    reason: Annotated[str, Field(min_length=1, max_length=1000, description="why the corpus does not answer the question")]


def abstain(episode: PaperTools, args: AbstainArgs) -> str:
    episode.end(Outcome(status="abstained", reason=args.reason))
    return "abstained"


TOOL = Tool(
    name="abstain",
    arguments=AbstainArgs,
    function=abstain,
    summary="End the episode without an answer when the papers do not contain one.",
    returns="a confirmation; the episode ends after this action",
    example='abstain("No paper states the size of the training data.")',
    order=50,
    record="outcome",
)
