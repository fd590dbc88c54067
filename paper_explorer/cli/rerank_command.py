"""``explorer rerank-serve``: the reranking service that ``search(..., rerank=K)`` calls
(``decisions.rerank_service``), one model loaded once, on 127.0.0.1; the adapter it may load
is one ``explorer rl-rerank`` trained listwise (``rl.listwise_train``)."""

from __future__ import annotations

from pathlib import Path

import typer


def rerank_serve_command(
    model: str = typer.Option(..., "--model", "-m", help="The model that judges relevance: a directory or hub id (transformers)."),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="The port on 127.0.0.1 to serve on."),
    adapter: str | None = typer.Option(None, "--adapter", help="A LoRA adapter directory to load on the model."),
    quantization: str = typer.Option("auto", "--quantization", help="auto (4-bit on CUDA, full on CPU), 4bit or none."),
    max_context: int | None = typer.Option(None, "--max-context", min=16, help="The most tokens of a prompt (default: the model's)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch's CPU threads (default: half the cores)."),
) -> None:
    """Serve relevance judgements over HTTP (POST /v1/rerank) for runs given --rerank-url."""
    import uvicorn

    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.rerank import Reranker
    from paper_explorer.decisions.rerank_service import rerank_app

    backend = LocalBackend.load(
        model, adapter=Path(adapter) if adapter else None, quantization=quantization, max_context=max_context, threads=threads
    )
    typer.echo(f"reranking with {model} at http://127.0.0.1:{port} (runs: --rerank-url http://127.0.0.1:{port})", err=True)
    uvicorn.run(rerank_app(Reranker(backend)), host="127.0.0.1", port=port, log_level="warning")
