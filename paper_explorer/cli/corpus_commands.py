"""``explorer corpus stats|search|generate|export|from-text``.

The corpus hashes have the names a run's manifest gives them: ``corpus_sha256`` (the papers),
``questions_sha256``; ``sha256`` is both together.

Paper text, section names and ids come from corpus files: shown as ``agent.terminal_text``
data (JSON with its controls escaped), never as rich markup."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.agent.terminal_text import json_visible, untrusted
from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.options import CorpusOption, JsonOption, QuestionsOption, open_corpus
from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.corpus.plain_text import papers_from_text
from paper_explorer.corpus.writing import FORMATS, export_corpus, write_jsonl

corpus_app = typer.Typer(help="Inspect, search, generate and export paper corpora.", no_args_is_help=True)
console = Console()
log = logging.getLogger(__name__)


def _refuse_overwrite(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; pass --force to overwrite it")
    if out.is_dir():
        raise UsageError(f"{out}: is a directory; name a file to write")


def _print_json(value) -> None:
    typer.echo(json_visible(json.dumps(value, indent=2, ensure_ascii=False)))


def _hashes(corpus) -> dict:
    """The hashes by the names a run's manifest uses, and both together."""
    return {"sha256": corpus.sha256, "corpus_sha256": corpus.papers_sha256, "questions_sha256": corpus.questions_sha256}


def _label(key: str) -> str:
    return key if key.endswith("sha256") else key.replace("_", " ")  # hash names as manifests and preregistrations spell them


@corpus_app.command("stats")
def stats(
    corpus_path: Path | None = CorpusOption,
    questions: Path | None = QuestionsOption,
    as_json: bool = JsonOption,
) -> None:
    """Count papers, paragraphs, questions by answer type and split; show content hashes."""
    from paper_explorer.corpus import BM25Index
    from paper_explorer.corpus.stats import corpus_stats

    corpus = open_corpus(corpus_path, questions)
    _ = corpus.papers_sha256  # hashed (and cached) before the clock starts: "seconds" times the index alone
    started = time.perf_counter()
    index = BM25Index.cached(corpus)
    summary = corpus_stats(corpus, index, time.perf_counter() - started).model_dump(mode="json")
    if as_json:
        _print_json(summary)
        return
    table = Table(title="corpus", show_header=False, title_justify="left")
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # a hash is one long word: folded whole, never cut with an ellipsis
    for key, value in summary.items():
        if key == "file_sha256":  # as sha256sum prints them, one file a line: `sha256sum -c` checks a copy
            value = "\n".join(f"{digest}  {file}" for file, digest in value.items()) or "-"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
        elif isinstance(value, list):
            value = ", ".join(value)
        table.add_row(_label(key), untrusted(str(value)))
    console.print(table)


@corpus_app.command("search")
def search(
    query: str = typer.Argument(..., help="Free-text query; tokenized like the paragraphs."),
    corpus_path: Path | None = CorpusOption,
    k: int = typer.Option(10, "-k", min=1, max=1000, help="Number of hits."),
    paper_id: str | None = typer.Option(
        None, "--paper-id", help="Search only this paper's paragraphs (a question's own documents are searched only so)."
    ),
    rerank: int | None = typer.Option(
        None, "--rerank", min=1, max=1000, help="Reorder the top RERANK BM25 hits (at least k) by --model's relevance, P(yes)."
    ),
    model: str | None = typer.Option(None, "--model", "-m", help="The reranking model (with --rerank): a directory or hub id."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch's CPU threads for --model (default: half the cores)."),
    as_json: bool = JsonOption,
) -> None:
    """BM25 search over paragraphs: the best k, with paper, section and paragraph index.

    Without --paper-id it searches the shared papers, as an episode's search does; a paper that
    holds its questions' own documents is searched alone, with --paper-id, over its own statistics.
    With --rerank K and --model M the top K hits are judged by M (its P(yes) that the paragraph
    helps answer the query) and the best k of them shown in that order, beside their BM25 rank."""
    from paper_explorer.corpus import BM25Index

    if (rerank is None) != (model is None):
        raise UsageError("--rerank K and --model M go together: pass both to rerank, or neither")
    if rerank is not None and rerank < k:
        raise UsageError(f"--rerank {rerank} reorders fewer hits than -k {k} shows; pass --rerank at least -k")
    corpus = open_corpus(corpus_path)
    if paper_id is not None and paper_id not in corpus:
        raise UsageError(f"--paper-id: no paper {paper_id!r} in the corpus; `explorer corpus stats` lists its size")
    index = BM25Index.cached(corpus).scoped(paper_id)
    hits = index.search(query, k=rerank or k, paper_id=paper_id)
    relevance: list[float] | None = None
    bm25_ranks = list(range(1, len(hits) + 1))
    if model is not None and hits:
        from paper_explorer.decisions.backends import LocalBackend
        from paper_explorer.decisions.rerank import Reranker

        order, judged = Reranker(LocalBackend.load(model, threads=threads)).rerank(query, [hit.text for hit in hits])
        order = order[:k]
        hits, bm25_ranks, relevance = [hits[i] for i in order], [i + 1 for i in order], [judged[i].relevance for i in order]
    own = sum(1 for paper in corpus.papers if paper.own_documents)
    if paper_id is None and own:
        typer.echo(f"note: {own} papers hold their questions' own documents and are searched only with --paper-id", err=True)
    if as_json:
        reranked = [{"bm25_rank": rank, "relevance": p} for rank, p in zip(bm25_ranks, relevance)] if relevance is not None else None
        _print_json([asdict(hit) | (reranked[n] if reranked else {}) for n, hit in enumerate(hits)])
        return
    if not hits:
        console.print(untrusted(f"no paragraph shares a word with {query!r} (tokens: {index.tokenize(query)})"))
        return
    title = f"{len(hits)} hits for {query!r}" + (f", the top {rerank} reranked by {model}" if relevance is not None else "")
    table = Table(title=untrusted(title), title_justify="left")
    table.add_column("#", no_wrap=True)
    if relevance is not None:
        table.add_column("BM25 #", no_wrap=True)
        table.add_column("P(relevant)", no_wrap=True)
    table.add_column("score", no_wrap=True)
    table.add_column("paper", no_wrap=True)
    table.add_column("section", max_width=22, overflow="ellipsis", no_wrap=True)
    table.add_column("¶", no_wrap=True)
    table.add_column("text", ratio=1, overflow="fold")
    for rank, hit in enumerate(hits, start=1):
        text = hit.text if len(hit.text) <= 160 else hit.text[:157] + "..."
        table.add_row(
            str(rank),
            *([str(bm25_ranks[rank - 1]), f"{relevance[rank - 1]:.3f}"] if relevance is not None else []),
            f"{hit.score:.3f}",
            untrusted(hit.paper_id),
            untrusted(f"{hit.section_index}: {hit.section or '-'}"),
            str(hit.paragraph_index),
            untrusted(text),
        )
    console.print(table)


@corpus_app.command("generate")
def generate_command(
    out: Path = typer.Option(..., "--out", "-o", help="JSONL file to write."),
    papers: int = typer.Option(DemoConfig.papers, "--papers", min=1, rich_help_panel="Demo corpus", help="Number of papers."),
    seed: int = typer.Option(
        DemoConfig.seed, "--seed", rich_help_panel="Demo corpus", help="Random seed; the same seed gives the same bytes."
    ),
    unanswerable_ratio: float = typer.Option(
        DemoConfig.unanswerable_ratio,
        "--unanswerable-ratio",
        min=0.0,
        max=1.0,
        rich_help_panel="Demo corpus",
        help="Share of unanswerable questions.",
    ),
    questions_per_paper: int = typer.Option(
        DemoConfig.questions_per_paper,
        "--questions-per-paper",
        min=1,
        max=6,
        rich_help_panel="Demo corpus",
        help="Questions asked of each paper.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    as_json: bool = JsonOption,
) -> None:
    """Write a synthetic NLP/ML paper corpus with QASPER-style questions and splits."""
    _refuse_overwrite(out, force)
    config = DemoConfig(papers=papers, seed=seed, unanswerable_ratio=unanswerable_ratio, questions_per_paper=questions_per_paper)
    corpus = generate(config)
    write_jsonl(corpus, out)
    summary = {
        "out": str(out),
        "papers": len(corpus.papers),
        "questions": len(corpus.questions),
        "paragraphs": sum(1 for _ in corpus.paragraphs()),
        **_hashes(corpus),
    }
    if as_json:
        _print_json(summary)
    else:
        console.print(
            untrusted(f"wrote {summary['papers']} papers, {summary['questions']} questions, {summary['paragraphs']} paragraphs to {out}")
        )


@corpus_app.command("export")
def export(
    out: Path = typer.Option(..., "--out", "-o", help="File to write."),
    corpus_path: Path | None = CorpusOption,
    questions: Path | None = QuestionsOption,
    to: str = typer.Option(
        "jsonl",
        "--to",
        help="jsonl (explorer, one paper per line) or qasper (v0.3 JSON; each paper's split "
        'in a "split" key, which QASPER\'s readers ignore).',
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    as_json: bool = JsonOption,
) -> None:
    """Write the corpus as explorer JSONL (or QASPER v0.3 JSON), splits included.

    The file is read back: corpus_sha256 and questions_sha256 are kept, or a note says why not
    (questions not in paper order; a file name such as qasper-dev-v0.3.json that states a split
    the papers do not have)."""
    if to not in FORMATS:
        raise UsageError(f"--to: unknown format {to!r}; use jsonl or qasper")
    _refuse_overwrite(out, force)
    corpus = open_corpus(corpus_path, questions)
    notes = export_corpus(corpus, out, to)
    summary = {
        "out": str(out),
        "format": to,
        "papers": len(corpus.papers),
        "questions": len(corpus.questions),
        **_hashes(corpus),
        "hashes_kept": not notes,
        "notes": notes,
    }
    if as_json:
        _print_json(summary)
    else:
        console.print(untrusted(f"wrote {summary['papers']} papers and {summary['questions']} questions to {out} ({to})"))
    for note in notes:
        typer.echo(f"note: {note}", err=True)


@corpus_app.command("from-text")
def from_text(
    paths: list[Path] = typer.Argument(..., help="Text or Markdown files (.txt, .md), or directories of them: one paper per file."),
    out: Path = typer.Option(..., "--out", "-o", help="Explorer JSONL corpus to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    as_json: bool = JsonOption,
) -> None:
    """Make a corpus of bare papers from their text (e.g. extracted from PDFs): one paper per file.

    The id is the file name; headings (# lines, or lines underlined with === or ---) start
    sections; blank lines separate paragraphs; the title is the first heading or the file name.
    Next: explorer questions init --corpus OUT --out questions.jsonl."""
    _refuse_overwrite(out, force)
    corpus = papers_from_text(paths)
    write_jsonl(corpus, out)
    summary = {
        "out": str(out),
        "papers": len(corpus.papers),
        "sections": sum(len(p.sections) for p in corpus.papers),
        "paragraphs": sum(1 for _ in corpus.paragraphs()),
        **_hashes(corpus),
    }
    if as_json:
        _print_json(summary)
        return
    console.print(
        untrusted(f"wrote {summary['papers']} papers ({summary['sections']} sections, {summary['paragraphs']} paragraphs) to {out}")
    )
    typer.echo(f"next: explorer questions init --corpus {out} --out questions.jsonl", err=True)
