"""Rerank search hits by a model's judgement of relevance: a typed yes/no question per passage.

A passage's relevance to a query is the model's P(yes), normalised over "yes" and "no", of the
question "Does this passage help answer the question?" asked about it (``relevance.toml``), scored
by the decisions core: the prompt in the model's own chat template (``prompts.build``), each option
as its text and the end of the model's turn, the options' likelihoods from a ``Backend``.

Two options, not noul's three: "unknown" (the passage cannot tell) is, for ranking, the same as
"no" (it does not help), and a third option would only split the mass that "no" stands for.

The query comes before the passage, so the K passages of one query share their prompt up to the
passage, and a local scorer (which keeps the longest common prefix of its last prompt) computes
that prefix once per query; bench/rerank.py measures what it saves. A passage longer than the
context leaves is cut at its end, and the cut is counted per passage (``Judged.cut_tokens``),
never silent.

The order: by relevance, highest first, ties by BM25 rank (``tools.reranking.reranked_order``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paper_explorer.decisions.backends import Backend
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.likelihood import normalised
from paper_explorer.decisions.prompts import Built, PromptTexts, build, read_table
from paper_explorer.tools.reranking import RerankerIdentity, reranked_order

if TYPE_CHECKING:
    from paper_explorer.agent.renderer import ChatRenderer

RELEVANCE_FILE = Path(__file__).parent / "relevance.toml"
OPTIONS = ("yes", "no")


@dataclass(frozen=True)
class RelevancePrompt:
    before: str  # holds {query}
    after: str
    sha256: str  # of the file's bytes


@dataclass(frozen=True)
class Judged:
    relevance: float  # P(yes) among yes and no
    prompt_tokens: int
    cached_tokens: int | None  # of them, reused from the previous passage's prompt (None: a server's cache, unseen)
    cut_tokens: int  # cut from the passage's end to fit the context


def load_relevance_prompt(path: Path | None = None) -> RelevancePrompt:
    """The relevance prompt file (the project's unless ``path``): a [relevance] table with a
    ``before`` and an ``after`` text, {query} in exactly one of them."""
    path = path or RELEVANCE_FILE
    table, sha256 = read_table(path, "relevance prompt")
    entry = table.get("relevance")
    if not isinstance(entry, dict) or set(entry) != {"before", "after"} or not all(isinstance(v, str) for v in entry.values()):
        raise DecisionError(f"{path}: [relevance] must hold a before and an after text, nothing else")
    if ("{query}" in entry["before"]) == ("{query}" in entry["after"]):
        raise DecisionError(f"{path}: [relevance] must hold {{query}} in before or in after, once")
    return RelevancePrompt(entry["before"], entry["after"], sha256)


def relevance_built(renderer: ChatRenderer, context: int, prompt: RelevancePrompt, query: str, passage: str) -> Built:
    """One passage's relevance prompt (cut at the passage's end to fit ``context``) and the
    options' continuations: what the reranker scores, and what ``explorer rl-rerank`` trains."""
    before = prompt.before.replace("{query}", query)
    after = prompt.after.replace("{query}", query)
    texts = PromptTexts({"noul": before}, {"noul": after}, prompt.sha256)  # build's frame: before, passage, after
    made = build(renderer, texts, "noul", query, passage, list(OPTIONS), context=context, cut="end")
    if made.prompt is None:
        raise DecisionError(f"the query leaves no room for a passage: {made.overflow}")
    return made


class Reranker:
    """Judges passages for a query with ``backend`` (one at a time: a local scorer is not thread-safe)."""

    def __init__(self, backend: Backend, prompt: RelevancePrompt | None = None) -> None:
        self.backend = backend
        self.prompt = prompt or load_relevance_prompt()

    def settings(self) -> dict[str, Any]:
        """Everything that decides a relevance: the backend, its model settings, the prompt, the options."""
        return {
            "backend": self.backend.name,
            "model": self.backend.settings(),
            "prompts_sha256": self.prompt.sha256,
            "options": list(OPTIONS),
            "context": self.backend.max_context,
        }

    def identity(self) -> RerankerIdentity:
        settings = self.settings()
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, ensure_ascii=True).encode()).hexdigest()
        return RerankerIdentity(
            model=str(settings["model"].get("model", "")), settings_sha256=digest, prompts_sha256=self.prompt.sha256, options=list(OPTIONS)
        )

    def built(self, query: str, passage: str) -> Built:
        """One passage's prompt (cut at the passage's end to fit) and the options' continuations."""
        return relevance_built(self.backend.renderer, self.backend.max_context, self.prompt, query, passage)

    def judge(self, query: str, passages: list[str]) -> list[Judged]:
        """Each passage's relevance to ``query``, in the order given."""
        judged = []
        for passage in passages:
            built = self.built(query, passage)
            assert built.prompt is not None
            scored = self.backend.score(built.prompt, built.options, "shared")
            probabilities, _ = normalised(scored.loglikelihoods)
            judged.append(Judged(probabilities[0], len(built.prompt), scored.cached_tokens, built.cut.tokens if built.cut else 0))
        return judged

    def rerank(self, query: str, passages: list[str]) -> tuple[list[int], list[Judged]]:
        """The passages' positions in reranked order (ties by the order given), and their judgements."""
        judged = self.judge(query, passages)
        return reranked_order([item.relevance for item in judged]), judged


__all__ = ["OPTIONS", "RELEVANCE_FILE", "Judged", "RelevancePrompt", "Reranker", "load_relevance_prompt"]
