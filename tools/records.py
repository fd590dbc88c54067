"""The records of what happened in a sandbox, defined once: a tool call and what it returned, a
cited paragraph, an episode's outcome. The host's tools make them (``tools.paper_tools``) and the
trajectory keeps them as they are (``agent.trajectory``), so the two sides cannot drift apart."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# no_answer: the policy ended without a valid answer of its own (the memory reader's final answer empty
# or cut at its cap): scored zero, kept in the denominator
Status = Literal["submitted", "abstained", "step_limit", "context_limit", "policy_error", "no_answer"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Returned(Record):
    """What a host tool returned, as the trajectory keeps it: the evidence the grounding detectors
    trust (``evaluation.detectors``), because the host made it and the worker cannot forge it.

    ``text`` is the result rendered once: a str as it is, any other result as JSON. It is bounded
    (``tools.paper_tools``: a cap per call, a budget per action), and what it leaves out is said in
    ``cut``; ``chars`` and ``sha256`` always describe the whole rendering."""

    text: str | None  # None: over the action's budget; only chars and sha256 were kept
    chars: int  # the whole rendering's length, in characters
    sha256: str  # of the whole rendering, UTF-8
    cut: str | None = None  # why text is not the whole result; None when it is


class ToolCallRecord(Record):
    """One call, as the host validated, ran and timed it (arguments as recorded: long ones cut)."""

    name: str
    arguments: dict[str, Any]
    seconds: float
    error: str | None = None  # the ToolError the policy saw, or "internal error: ..." for a bug of ours
    # What the tool returned (None: the call failed, or a trajectory of schema 3 or older, which did not keep it)
    returned: Returned | None = None


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
