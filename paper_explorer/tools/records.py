"""The records of what happened in a sandbox, defined once: a tool call and what it returned, a
cited paragraph, an episode's outcome. The host's tools make them (``tools.paper_tools``) and the
trajectory keeps them as they are (``agent.trajectory``), so the two sides cannot drift apart."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import Field, model_validator

from paper_explorer.tools.layout import misfit
from paper_explorer.tools.reranking import RerankerIdentity
from paper_explorer.tools.shown import Page, Piece, PieceKind, Record, Shown

__all__ = [  # what a tool call showed is defined in tools.shown (tools.layout, which these records check against, makes it)
    "Evidence",
    "Outcome",
    "Page",
    "Piece",
    "PieceKind",
    "Record",
    "Returned",
    "Shown",
    "Status",
    "ToolCallRecord",
]

# no_answer: the policy ended without a valid answer of its own (the memory reader's final answer empty
# or cut at its cap): scored zero, kept in the denominator
Status = Literal["submitted", "abstained", "step_limit", "context_limit", "policy_error", "no_answer"]


class Returned(Record):
    """What a host tool returned, as the trajectory keeps it: the evidence the grounding detectors
    trust (``evaluation.detectors``), because the host made it and the worker cannot forge it.

    ``text`` is the result rendered once: a str as it is, any other result as JSON. It is bounded
    (``tools.paper_tools``: a cap per call, a budget per action, which ``shown`` is charged to as
    well), and what it leaves out is said in ``cut``; ``chars`` and ``sha256`` always describe the
    whole rendering."""

    text: str | None  # None: over the action's budget; only chars and sha256 were kept
    chars: int  # the whole rendering's length, in characters
    sha256: str  # of the whole rendering, UTF-8
    cut: str | None = None  # why text is not the whole result; None when it is
    shown: Shown | None = None  # research calls (schema 7 on): what the result showed of the papers; None with text None

    @model_validator(mode="after")
    def _described(self) -> Returned:
        """A trajectory file is untrusted: a kept text edited after the host wrote it (a snippet made
        to hold an answer) no longer has the length and sha256 the host recorded of it, and a result
        not kept showed nothing anyone can check."""
        if self.text is None:
            if self.shown is not None:
                raise ValueError("a result that was not kept cannot have a record of what it showed")
        elif self.cut is None and (len(self.text) != self.chars or _sha256(self.text) != self.sha256):
            raise ValueError("its text is not the one its chars and sha256 describe: it was changed after the host recorded it")
        elif self.cut is not None and len(self.text) >= self.chars:
            raise ValueError("a result said to be cut keeps all of its characters")
        return self


class ToolCallRecord(Record):
    """One call, as the host validated, ran and timed it (arguments as recorded: long ones cut)."""

    name: str
    arguments: dict[str, Any]
    seconds: float
    error: str | None = None  # the ToolError the policy saw, or "internal error: ..." for a bug of ours
    # What the tool returned (None: the call failed, or a trajectory of schema 3 or older, which did not keep it)
    returned: Returned | None = None
    reranker: RerankerIdentity | None = None  # search(rerank=K): the model that reordered its hits (tools.reranking)

    @model_validator(mode="after")
    def _fits(self) -> ToolCallRecord:
        """What a catalog research call showed must be a record its layout could have written for the
        kept text (``tools.layout.misfit``): read back from a file, a record that names paragraphs or
        paper text its result does not hold is refused, not believed."""
        returned = self.returned
        if returned is not None and returned.text is not None and returned.shown is not None:
            problem = misfit(self.name, self.arguments, returned.text, returned.shown, whole=returned.cut is None)
            if problem is not None:
                raise ValueError(f"{self.name}: its record of what it showed does not fit its result: {problem}")
        return self


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Evidence(Record):
    """A paragraph cited by a submission, with its text."""

    paper_id: str
    section: int
    paragraph: int
    text: str


class Outcome(Record):
    """How an episode ended. The host's tools decide submitted/abstained; the loop the others."""

    status: Status
    answer: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    reason: str | None = None  # abstention reason, or what ended the episode otherwise
