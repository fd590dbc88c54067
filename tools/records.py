"""The records of what happened in a sandbox, defined once: a tool call, a cited paragraph, an
episode's outcome. The host's tools make them (``tools.paper_tools``) and the trajectory keeps
them as they are (``agent.trajectory``), so the two sides cannot drift apart."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["submitted", "abstained", "step_limit", "context_limit", "policy_error"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCallRecord(Record):
    """One call, as the host validated, ran and timed it (arguments as recorded: long ones cut)."""

    name: str
    arguments: dict[str, Any]
    seconds: float
    error: str | None = None  # the ToolError the policy saw, or "internal error: ..." for a bug of ours


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
