"""``explorer rerank-serve``: the reranking service that ``search(..., rerank=K)`` calls
(``decisions.rerank_service``), one model loaded once, on 127.0.0.1; ``explorer rerank-train``:
a LoRA adapter for it trained listwise (``decisions.listwise``)."""

from __future__ import annotations

from pathlib import Path

import typer

from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.options import CorpusOption


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


def rerank_train_command(
    model: str = typer.Option(..., "--model", "-m", help="The reranking model to start from: a directory or hub id (transformers)."),
    out: Path = typer.Option(..., "--out", "-o", help="The directory to write: the adapter, steps.jsonl, summary.json."),
    corpus_path: Path | None = CorpusOption,
    questions: int = typer.Option(64, "--questions", min=1, help="Train-split questions with gold evidence to learn from."),
    held_out: int = typer.Option(
        16, "--held-out", min=1, help="Validation-split questions whose greedy NDCG@5 is measured before and after."
    ),
    depth: int = typer.Option(20, "--depth", min=2, max=50, help="K: BM25 candidates per question."),
    steps: int = typer.Option(20, "--steps", min=1, help="AdamW steps."),
    queries_per_step: int = typer.Option(2, "--queries-per-step", min=1, help="Questions per step."),
    samples: int = typer.Option(8, "--samples", min=2, help="G: Plackett-Luce rankings drawn per question."),
    beta: float = typer.Option(0.05, "--beta", min=0.0, help="Weight of the KL penalty toward the starting model."),
    learning_rate: float = typer.Option(1e-4, "--learning-rate", min=0.0, help="AdamW's learning rate."),
    seed: int = typer.Option(0, "--seed", help="Seeds the adapter, the questions' order and the rankings drawn."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch's CPU threads (default: half the cores)."),
    force: bool = typer.Option(False, "--force", help="Write into OUT even if it holds files."),
) -> None:
    """Train the reranker listwise: Plackett-Luce rankings, NDCG@5 reward, leave-one-out baseline, KL to the start."""
    from paper_explorer.cli.options import open_corpus
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.listwise import ListwiseSettings, candidates, train_listwise
    from paper_explorer.decisions.rerank import Reranker

    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out}: not empty; pass --force to write into it, or choose another --out")
    corpus = open_corpus(corpus_path)
    split_of = {paper.id: paper.split for paper in corpus.papers}
    train = candidates(corpus, [q for q in corpus.questions if split_of.get(q.paper_id) == "train"][: questions * 4], depth)[:questions]
    validation = [q for q in corpus.questions if split_of.get(q.paper_id) == "validation"]
    held = candidates(corpus, validation[: held_out * 4], depth)[:held_out]
    if not any(item.learnable for item in train):
        raise UsageError("no train-split question has a gold paragraph among its BM25 candidates; raise --depth or --questions")
    settings = ListwiseSettings(
        steps=steps,
        queries_per_step=queries_per_step,
        samples=samples,
        beta=beta,
        learning_rate=learning_rate,
        seed=seed,
    )
    summary = train_listwise(Reranker(LocalBackend.load(model, threads=threads)), train, held, settings, out)
    typer.echo(
        f"held-out NDCG@5 {summary['held_out_ndcg@5_before']:.3f} -> {summary['held_out_ndcg@5_after']:.3f} "
        f"({summary['held_out_questions']} questions); adapter in {out}/adapter (explorer rerank-serve --adapter)"
    )
