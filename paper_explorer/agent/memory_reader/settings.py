"""The memory reader's settings: its recipe (``ReaderRecipe``, the ``[policy]`` fields of how it
reads), MemAgent's presets of it, and the steps its plan takes.

The reader reads through tool records (``memory_reader.document``), not its observations, so the
code agent's observation and conversation budgets hold it as they are; its steps do not: a paper
takes one read step per ``document.BATCH_CHARS`` of its text. Unless a config or a flag gives
``max_steps``, its episodes get the steps its plan takes for papers of up to ``READS_PER_PAPER``
such steps; the value is written into the config, so the manifest records it as it was used.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from paper_explorer.agent.policy_registry import PolicyConfig

PRESETS_FILE = Path(__file__).parent / "presets.toml"
# The outlines, the submit, and one step more: if submit() refused the answer, the reader's next
# act() ends the episode saying why (no_answer), where a limit at the submit would say only
# "no submit within N steps". The search (scope search:K) and the reads of each paper come on top.
PLAN_STEPS = 3
# Read steps per paper the default steps allow: papers of up to about a million characters (a
# QASPER paper is tens of thousands: one step). A longer paper ends the episode saying to raise
# max_steps, before its steps run out.
READS_PER_PAPER = 20


def presets() -> dict[str, dict[str, Any]]:
    return tomllib.loads(PRESETS_FILE.read_text(encoding="utf-8"))


def plan_steps(scope: str) -> int:
    """The steps the reader's plan takes at most for papers of up to ``READS_PER_PAPER`` read steps
    (see PLAN_STEPS): scope paper searches for none and reads one paper; search:K searches once and
    reads up to K."""
    if scope == "paper":
        return PLAN_STEPS + READS_PER_PAPER
    _, _, count = scope.partition(":")
    return PLAN_STEPS + 1 + READS_PER_PAPER * (int(count) if count.isdigit() else 1)


MAX_SCOPE_PAPERS = 50  # search() returns at most 50 hits


def parse_scope(scope: str) -> int | None:
    """``search:K`` -> K; ``paper`` -> None; anything else is a ValueError saying what is allowed."""
    if scope == "paper":
        return None
    kind, _, count = scope.partition(":")
    if kind == "search" and count.isascii() and count.isdigit() and not count.startswith("0") and int(count) <= MAX_SCOPE_PAPERS:
        return int(count)  # written one way only (no "03", no other scripts' digits), as the manifest records it
    raise ValueError(f"scope {scope!r}: write search:K (K from 1 to {MAX_SCOPE_PAPERS}) or paper")


class ReaderRecipe(PolicyConfig):
    """How the reader reads. The defaults are MemAgent's published recipe."""

    panel = "Memory reader"

    scope: str = Field(
        "search:3",
        description="What it reads: search:K (the top K papers a BM25 search for the question finds) "
        "or paper (the question's own paper: an oracle, reported as such).",
    )
    page_tokens: int = Field(5000, ge=16, le=1_000_000, description="Tokens of document text per page.")
    memory_tokens: int = Field(1024, ge=1, le=1_000_000, description="Tokens a memory update may write (the memory's cap).")
    answer_tokens: int = Field(256, ge=1, le=1_000_000, description="Tokens the final answer may take (cut: no answer, scored 0).")
    passes: int = Field(1, ge=1, le=2, description="1 reads once (ReadAll); 2 reads again from the first memory (ReadTwice).")
    outlines: bool = Field(True, description="Each page opens with the headings of the sections it holds.")
    outline_sections: int = Field(24, ge=1, description="Sections a page may hold (with outlines).")
    keep_sentinel: str = Field(
        "<KEEP_MEMORY>", max_length=100, description="What an update writes to keep its memory as it is (empty: none)."
    )
    token_budget: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="Model tokens (prompts and outputs, every call) an episode may spend; pages past it are left unread, counted.",
    )
    document: Literal["auto", "sections", "verbatim"] = Field(
        "auto",
        description="What is paged: verbatim (a benchmark's own context, its token stream as given), sections "
        "(papers read through the tools, laid out as sections), or auto (verbatim where the question brings one).",
    )
    prompts: Literal["explorer", "memagent"] = Field(
        "explorer", description="The prompts' words: explorer (ours) or memagent (MemAgent's own TEMPLATE and TEMPLATE_FINAL_BOXED)."
    )
    answer_from: Literal["boxed-or-text", "boxed"] = Field(
        "boxed-or-text",
        description="The answer: the last \\boxed{} (else the whole text: boxed-or-text; else none, scored 0: boxed).",
    )
    outline_fill: Literal["greedy", "balanced"] = Field(
        "greedy",
        description="With outlines: fill each page in turn (greedy), or spread the sections over as many pages "
        "as evenly as they go (balanced).",
    )
    preset: Literal["memagent", "memagent-readall", "memagent-readtwice"] | None = Field(
        None,
        description="memagent (MemAgent's released reader: its prompts and caps), or our prompts with its numbers: "
        "memagent-readall, memagent-readtwice (a setting given wins).",
    )

    @field_validator("scope")
    @classmethod
    def _scope(cls, scope: str) -> str:
        parse_scope(scope)
        return scope

    @field_validator("keep_sentinel")
    @classmethod
    def _sentinel(cls, sentinel: str) -> str:
        if sentinel != sentinel.strip() or "\n" in sentinel:
            raise ValueError(f"{sentinel!r}: write the keep sentinel without spaces around it and on one line (empty: none)")
        return sentinel

    @model_validator(mode="after")
    def _keep_needs_instruction(self) -> ReaderRecipe:
        if self.prompts == "memagent" and self.keep_sentinel:
            raise ValueError(
                f"the memagent prompts tell the model of no keep sentinel, so {self.keep_sentinel!r} would never be written "
                "on purpose: give an empty keep sentinel (the memagent preset does)"
            )
        return self

    @classmethod
    def run_defaults(cls, policy: dict[str, Any], episode: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The preset, then the steps of the reader's plan, under what was given."""
        preset = policy.get("preset")
        if isinstance(preset, str) and preset in presets():
            chosen = presets()[preset]
            policy = {**chosen.get("policy", {}), **policy}
            episode = {**chosen.get("episode", {}), **episode}
        scope = policy.get("scope", "search:3")
        episode = {"max_steps": plan_steps(scope if isinstance(scope, str) else ""), **episode}
        return policy, episode
