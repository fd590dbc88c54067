"""BM25 search: ours vs rank_bm25 vs bm25s, at two corpus sizes, in one run.

    python bench/search.py                 # 416 and 10,000 generated papers; writes bench/RESULTS.md
    python bench/search.py --sizes 416 --no-write

All three libraries get the same token lists (our tokenizer) and the same queries (the
corpus's question texts), so the comparison is of indexing and scoring alone. Each library
runs in its own process. Memory is measured with tracemalloc in a second, untimed build:
"index MiB" is what the built index keeps, "peak MiB" the most the build held at once (both
beyond the shared token lists). Query latency is
per query, top 10: ours `BM25.top_k`, rank_bm25 `get_scores` plus `np.argpartition` (faster
than its own `get_top_n`, which sorts everything), bm25s `retrieve` with its default (numpy)
backend and method.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402

LIBRARIES = ("ours", "rank_bm25", "bm25s")


def builder(library: str):
    """(build(documents) -> index, search(index, query)) for a library, imported up front."""
    if library == "ours":
        from paper_explorer.corpus.bm25 import BM25

        return BM25.build, lambda index, query: index.top_k(query, 10)
    if library == "rank_bm25":
        from rank_bm25 import BM25Okapi

        def search(index, query):
            scores = index.get_scores(query)
            top = np.argpartition(-scores, 10)[:10]
            return top[np.argsort(-scores[top])]

        return BM25Okapi, search
    import bm25s

    def build(documents):
        index = bm25s.BM25()
        index.index(documents, show_progress=False)
        return index

    def search(index, query):
        known = [token for token in query if token in index.vocab_dict] or [""]
        return index.retrieve([known], k=10, show_progress=False, n_threads=0)

    return build, search


def worker(library: str, tokens_file: str, n_queries: int) -> dict:
    with open(tokens_file, "rb") as handle:
        documents, queries = pickle.load(handle)
    queries = queries[:n_queries]
    build, search = builder(library)
    started = time.perf_counter()
    index = build(documents)
    build_seconds = time.perf_counter() - started
    search(index, queries[0])  # warm-up
    latencies = []
    for query in queries:
        started = time.perf_counter()
        search(index, query)
        latencies.append((time.perf_counter() - started) * 1000)
    del index
    gc.collect()
    # Memory in a second, untimed build: tracemalloc sees Python objects and numpy buffers alike.
    tracemalloc.start()
    index = build(documents)
    retained, peak = tracemalloc.get_traced_memory()  # while the index is alive: what it retains
    tracemalloc.stop()
    del index
    return {
        "library": library,
        "build_s": build_seconds,
        "p50_ms": statistics.median(latencies),
        "p95_ms": float(np.percentile(latencies, 95)),
        "queries": len(latencies),
        "index_mib": retained / 2**20,
        "peak_mib": peak / 2**20,
    }


def prepare(papers: int, directory: Path) -> tuple[Path, int, dict]:
    from paper_explorer.corpus import DemoConfig, generate, tokenize

    corpus = generate(DemoConfig(papers=papers, seed=0))
    started = time.perf_counter()
    documents = [tokenize(p.text) for p in corpus.paragraphs()]
    tokenize_s = time.perf_counter() - started
    queries = [tokenize(q.text) for q in corpus.questions]
    path = directory / f"tokens-{papers}.pickle"
    with open(path, "wb") as handle:
        pickle.dump((documents, queries), handle, protocol=pickle.HIGHEST_PROTOCOL)
    extra = {"tokenize_s": tokenize_s, "tokens": sum(map(len, documents))}
    if papers <= 1000:
        extra.update(cache_load_seconds(corpus))
    return path, len(documents), extra


def cache_load_seconds(corpus) -> dict:
    """How long the on-disk index cache takes to load, with and without hashing the corpus."""
    from paper_explorer.corpus import BM25Index
    from paper_explorer.corpus.collection import Corpus

    with tempfile.TemporaryDirectory() as cache:
        BM25Index.cached(corpus, directory=Path(cache))
        load_times, with_hash = [], []
        for _ in range(5):
            started = time.perf_counter()
            index = BM25Index.cached(corpus, directory=Path(cache))
            load_times.append(time.perf_counter() - started)
            assert index.source == "cache"
            fresh = Corpus(papers=corpus.papers, questions=corpus.questions)  # hash not yet computed
            started = time.perf_counter()
            BM25Index.cached(fresh, directory=Path(cache))
            with_hash.append(time.perf_counter() - started)
    return {"cache_load_s": statistics.median(load_times), "cache_load_with_hash_s": statistics.median(with_hash)}


def table(rows_by_size: list[tuple[int, int, dict, list[dict]]]) -> str:
    lines = [
        "| papers | paragraphs | library | build s | query p50 ms | query p95 ms | index MiB | build peak MiB | p50 vs ours | build vs ours |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for papers, paragraphs, _, rows in rows_by_size:
        ours = next(row for row in rows if row["library"] == "ours")
        for row in rows:
            lines.append(
                f"| {papers:,} | {paragraphs:,} | {row['library']} | {row['build_s']:.2f} | {row['p50_ms']:.3f} | "
                f"{row['p95_ms']:.3f} | {row['index_mib']:.0f} | {row['peak_mib']:.0f} | {row['p50_ms'] / ours['p50_ms']:.2f}x | "
                f"{row['build_s'] / ours['build_s']:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="416,10000", help="comma-separated paper counts")
    parser.add_argument("--queries", type=int, default=300, help="queries per library and size")
    parser.add_argument("--rank-bm25-queries", type=int, default=40, help="queries for rank_bm25 above 1,000 papers (it is slow)")
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens, args.queries)))
        return

    results = []
    with tempfile.TemporaryDirectory() as directory:
        for papers in (int(size) for size in args.sizes.split(",")):
            tokens_file, paragraphs, extra = prepare(papers, Path(directory))
            rows = []
            for library in LIBRARIES:
                queries = args.rank_bm25_queries if library == "rank_bm25" and papers > 1000 else args.queries
                output = subprocess.run(
                    [sys.executable, __file__, "--worker", library, "--tokens", str(tokens_file), "--queries", str(queries)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                rows.append(json.loads(output.strip().splitlines()[-1]))
                print(f"{papers} papers, {library}: {rows[-1]}", file=sys.stderr)
            results.append((papers, paragraphs, extra, rows))

    report = [table(results), ""]
    for papers, _paragraphs, extra, rows in results:
        by = {row["library"]: row for row in rows}
        report.append(
            f"- {papers:,} papers ({extra['tokens']:,} tokens): query p50 ours / bm25s = "
            f"{by['ours']['p50_ms'] / by['bm25s']['p50_ms']:.2f} (target <= 1.5), build ours / rank_bm25 = "
            f"{by['ours']['build_s'] / by['rank_bm25']['build_s']:.2f} (target <= 2), tokenizing took {extra['tokenize_s']:.2f} s."
        )
        if "cache_load_s" in extra:
            report.append(
                f"- {papers:,} papers: loading the cached index takes {extra['cache_load_s'] * 1000:.0f} ms "
                f"({extra['cache_load_with_hash_s'] * 1000:.0f} ms including hashing the corpus; target < 500 ms)."
            )
    text = "\n".join(report)
    print(text)
    if not args.no_write:
        write_results("## BM25 search (bench/search.py)", "python bench/search.py", ("numpy", "scipy", "rank-bm25", "bm25s"), text)


if __name__ == "__main__":
    main()
