"""Where a served prompt and the sequence it should be first differ, shown as decoded tokens on both sides."""

from __future__ import annotations

from dataclasses import dataclass

from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.served import common_prefix

CONTEXT_TOKENS = 12


@dataclass
class Mismatch:
    where: str  # "episode E step N", "example E"
    what: str
    position: int | None = None
    served: str = ""
    trained: str = ""
    step: int | None = None  # the step's index, for a trajectory's mismatch

    def __str__(self) -> str:
        if self.position is None:
            return f"{self.where}: {self.what}"
        return f"{self.where}: {self.what} at token {self.position}\n  served:  {self.served!r}\n  trained: {self.trained!r}"


def differing(where: str, what: str, served: list[int], trained: list[int], renderer: ChatRenderer) -> Mismatch | None:
    """None when ``served`` is ``trained``, else the first differing position with the decoded tokens around it."""
    position = common_prefix(served, trained)
    if position == len(served) == len(trained):
        return None
    start = max(position - CONTEXT_TOKENS, 0)
    return Mismatch(
        where,
        what,
        position,
        renderer.decode(served[start : position + CONTEXT_TOKENS]),
        renderer.decode(trained[start : position + CONTEXT_TOKENS]),
    )
