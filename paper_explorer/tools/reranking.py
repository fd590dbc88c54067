"""``search(query, k, rerank=K)``'s reranker, as the episode host reaches it: a service over HTTP.

The model that judges relevance never runs in the episode host: a host holds the corpus and its
index and nothing else of the policy's process (docs/sandbox.md), and a model loaded per episode
would cost seconds each. The run names a reranking service instead (``--rerank-url``, the sandbox
setting ``rerank_url``; ``explorer rerank-serve`` starts one with a model loaded once), and the
host posts the query and the top K passages to it, within the action's budgets like any tool work.

The API (``POST {url}/v1/rerank``): ``RerankRequest`` in, ``RerankReply`` out: one relevance
(the model's P(yes) that the passage helps answer the query) per passage, in the order sent, and
what identifies the reranker (its model, its settings' and its prompt's sha256), which the call's
record keeps so a run says which model reordered its hits.

The order is ``reranked_order``: by relevance, highest first, ties by BM25 rank, so the same
scores always give the same order.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from paper_explorer.tools.errors import ToolError

MAX_RERANK = 50  # as search's k: the most hits one call reorders
QUERY_CHARS = 500  # as search's query
REPLY_BYTES = 1 << 20  # a reply of 50 probabilities and a settings record is a few KiB
TIMEOUT_SECONDS = 120.0  # the action's own budgets (host_seconds, wall_seconds) stop a call long before


class RerankRequest(BaseModel):
    """What the host sends: a query and the passages to judge, in BM25 order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: Annotated[str, Field(min_length=1, max_length=QUERY_CHARS)]
    passages: Annotated[list[str], Field(min_length=1, max_length=MAX_RERANK)]


class RerankerIdentity(BaseModel):
    """Which reranker judged: kept in the call's record (``ToolCallRecord.reranker``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str  # the model as the service loaded it (a directory or a hub name)
    settings_sha256: str  # of the service's whole settings record (GET /v1/reranker shows it)
    prompts_sha256: str  # of the relevance prompt file
    options: list[str]  # the options scored; relevance is the first's probability among them


class RerankReply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    relevance: list[Annotated[float, Field(ge=0.0, le=1.0)]]
    cut_tokens: list[Annotated[int, Field(ge=0)]]  # per passage: tokens cut from its end to fit the context
    reranker: RerankerIdentity


def reranked_order(relevance: list[float]) -> list[int]:
    """Positions (BM25 ranks from 0) ordered by relevance, highest first; equal relevance keeps BM25's order."""
    return sorted(range(len(relevance)), key=lambda rank: (-relevance[rank], rank))


class RerankClient:
    """Posts to a reranking service; every failure is a ToolError the action sees."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def rerank(self, query: str, passages: list[str]) -> RerankReply:
        body = RerankRequest(query=query, passages=passages).model_dump_json().encode()
        request = urllib.request.Request(f"{self.url}/v1/rerank", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (the run's own setting)
                data = response.read(REPLY_BYTES + 1)
        except urllib.error.HTTPError as error:
            raise ToolError(f"search(rerank=...): the reranker at {self.url} answered HTTP {error.code}; search without rerank") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ToolError(f"search(rerank=...): the reranker at {self.url} cannot be reached ({reason}); search without rerank") from None
        if len(data) > REPLY_BYTES:
            raise ToolError(f"search(rerank=...): the reranker's reply is over {REPLY_BYTES:,} bytes; search without rerank")
        try:
            reply = RerankReply.model_validate_json(data)
        except (ValidationError, json.JSONDecodeError):
            raise ToolError("search(rerank=...): the reranker's reply is not a rerank reply; search without rerank") from None
        if len(reply.relevance) != len(passages) or len(reply.cut_tokens) != len(passages):
            raise ToolError(
                f"search(rerank=...): the reranker judged {len(reply.relevance)} passages of {len(passages)}; search without rerank"
            )
        return reply


__all__ = ["MAX_RERANK", "RerankClient", "RerankReply", "RerankRequest", "RerankerIdentity", "reranked_order"]
