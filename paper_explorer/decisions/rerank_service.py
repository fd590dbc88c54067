"""The reranking service an episode's ``search(..., rerank=K)`` calls: one model loaded once, behind
``POST /v1/rerank`` (``tools.reranking``: the request, the reply, the client the episode host uses).

A FastAPI app (``rerank_app``) over a ``Reranker``; ``explorer rerank-serve`` runs it with uvicorn on
127.0.0.1. Requests are judged one at a time under a lock (the local scorer keeps one KV cache, so
two queries at once would each spoil the other's shared prefix); FastAPI runs the handler in its
thread pool, so waiting requests never block the event loop. A malformed request is answered 422
with the field named (FastAPI's validation); a query that leaves no room for a passage, 422 too.
``GET /v1/reranker`` shows the whole settings record whose sha256 each reply carries.

What it leaves open: episodes that share one service share its queue, so an episode can tell from
its rerank latency that others are reranking (as episodes sharing a machine's cores can).
"""

from __future__ import annotations

import threading
from typing import Any

from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.rerank import Reranker
from paper_explorer.tools.reranking import RerankReply, RerankRequest


def rerank_app(reranker: Reranker) -> Any:
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="explorer rerank-serve", description="Relevance of passages to a query, by a model's P(yes).")
    lock = threading.Lock()
    identity = reranker.identity()
    settings = reranker.settings()

    @app.post("/v1/rerank")
    def rerank(request: RerankRequest) -> RerankReply:
        with lock:
            try:
                judged = reranker.judge(request.query, request.passages)
            except DecisionError as error:
                raise HTTPException(status_code=422, detail=str(error)) from None
        return RerankReply(
            relevance=[item.relevance for item in judged], cut_tokens=[item.cut_tokens for item in judged], reranker=identity
        )

    @app.get("/v1/reranker")
    def described() -> dict[str, Any]:
        return {"identity": identity.model_dump(), "settings": settings}

    return app


__all__ = ["rerank_app"]
