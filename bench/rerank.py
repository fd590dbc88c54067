"""Reranking search with a model: R@1, R@5 and NDCG@5 of BM25 alone against BM25's top K reranked
by a model's P(yes) (paper_explorer/decisions/rerank.py), on questions with gold evidence.

    nice python bench/rerank.py                          # demo corpus, tiny model and SmolLM2-135M; writes RESULTS.md
    python bench/rerank.py --questions 20 --no-write
    python bench/rerank.py --corpus C.json --questions-file Q.jsonl --no-write   # your own questions

The gold is evaluation/retrieval.py's, as for BM25's retrieval metrics: a question counts when an
annotator gave text evidence; its evidence paragraphs (exact text) are the relevant ones; with
several annotators the best annotator's figure counts. The query is the question's own text, and
each question searches what its episode's search does (``BM25Index.scoped``). R@k: the share of
the gold paragraphs in the top k; NDCG@5: binary gains, ideal = all gold first.

The questions are every n-th of those with gold (a deterministic sample, ``--questions``). Every
model runs with one torch thread. The query-first prompt (the project's) is timed against a
passage-first one on the first questions: the first shares the query's KV cache across the K
passages, the second cannot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.corpus import DemoConfig, generate, load  # noqa: E402
from paper_explorer.decisions.rerank_gold import Candidates, candidates, ndcg  # noqa: E402
from paper_explorer.evaluation.retrieval import gold_paragraph_sets  # noqa: E402

SMOLLM2 = ROOT / ".models" / "smollm2-135m-instruct"
PASSAGE_FIRST = '''[relevance]
before = """Decide whether a passage from a paper helps answer a question.

<passage>
"""
after = """
</passage>

Question: {query}

Does this passage help answer the question? Answer with one word: yes or no."""
'''


def recall(ranked: list[str], golds: list[set[str]], k: int) -> float:
    return max(len(gold & set(ranked[:k])) / len(gold) for gold in golds)


def figures(ranked_lists: list[list[str]], cases: list[Candidates]) -> dict[str, float]:
    return {
        "R@1": statistics.fmean(recall(ranked, case.golds, 1) for ranked, case in zip(ranked_lists, cases)),
        "R@5": statistics.fmean(recall(ranked, case.golds, 5) for ranked, case in zip(ranked_lists, cases)),
        "NDCG@5": statistics.fmean(ndcg(ranked, case.golds) for ranked, case in zip(ranked_lists, cases)),
    }


def sampled(corpus, count: int) -> list:
    """Every n-th question with gold evidence, ``count`` of them (0: all)."""
    with_gold = [question for question in corpus.questions if gold_paragraph_sets(question)]
    step = max(1, len(with_gold) // count) if count else 1
    return with_gold[::step][:count] if count else with_gold


def rerank_all(model: str, cases, prompt_path: Path | None = None):
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.rerank import Reranker, load_relevance_prompt

    reranker = Reranker(LocalBackend.load(model, threads=1), load_relevance_prompt(prompt_path))
    reranker.judge("warm up", ["a passage"])
    ranked, seconds, cached, tokens = [], [], 0, 0
    for case in cases:
        started = time.perf_counter()
        order, judged = reranker.rerank(case.query, case.passages)
        seconds.append(time.perf_counter() - started)
        ranked.append([case.passages[i] for i in order])
        cached += sum(item.cached_tokens for item in judged)
        tokens += sum(item.prompt_tokens for item in judged)
    return ranked, seconds, cached / max(tokens, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=100, help="questions sampled (every n-th with gold; 0: all)")
    parser.add_argument("--depth", type=int, default=20, help="K: BM25 hits reranked")
    parser.add_argument("--corpus", type=Path, help="a corpus file (default: the demo corpus)")
    parser.add_argument("--questions-file", type=Path, help="its questions (our JSONL), with evidence")
    parser.add_argument("--prefix-questions", type=int, default=10, help="questions timed with the passage-first prompt")
    parser.add_argument("--models", default="tiny,smollm2", help="tiny (built here, random weights), smollm2, or a model directory")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    corpus = generate(DemoConfig()) if args.corpus is None else load(args.corpus, args.questions_file)
    cases = candidates(corpus, sampled(corpus, args.questions), args.depth)
    rows = [("BM25 alone", figures([case.passages for case in cases], cases), None, None)]
    ceiling = statistics.fmean(recall(case.passages, case.golds, args.depth) for case in cases)
    prefix_rows = []
    with tempfile.TemporaryDirectory() as scratch:
        passage_first = Path(scratch) / "passage_first.toml"
        passage_first.write_text(PASSAGE_FIRST)
        for name in args.models.split(","):
            if name == "tiny":
                from paper_explorer.agent.testing.tiny_model import build_tiny_model

                model, label = str(build_tiny_model(Path(scratch) / "tiny")), "tiny random Qwen3"
            elif name == "smollm2":
                model, label = str(SMOLLM2), "SmolLM2-135M-Instruct"
            else:
                model, label = name, name
            ranked, seconds, cached = rerank_all(model, cases)
            rows.append((f"BM25 top {args.depth}, reranked by {label}", figures(ranked, cases), statistics.median(seconds), cached))
            print(label, rows[-1], flush=True)
            if args.prefix_questions:
                few = cases[: args.prefix_questions]
                _, first, first_cached = rerank_all(model, few)
                _, last, last_cached = rerank_all(model, few, passage_first)
                prefix_rows.append((label, statistics.median(first), first_cached, statistics.median(last), last_cached))
    lines = [
        f"{len(cases)} questions with gold evidence ({'the demo corpus, every n-th' if args.corpus is None else args.corpus.name}); "
        f"BM25's top {args.depth} holds {ceiling:.3f} of the gold (R@{args.depth}, what reranking can reach).",
        "",
        "| ranking | R@1 | R@5 | NDCG@5 | s/query (median) | prompt tokens from cache |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, values, seconds, cached in rows:
        time_cell = "-" if seconds is None else f"{seconds:.2f}"
        cache_cell = "-" if cached is None else f"{cached:.0%}"
        lines.append(f"| {label} | {values['R@1']:.3f} | {values['R@5']:.3f} | {values['NDCG@5']:.3f} | {time_cell} | {cache_cell} |")
    if prefix_rows:
        lines += [
            "",
            f"Query first (the project's prompt) against passage first, on the first {args.prefix_questions} questions, "
            f"{args.depth} passages each:",
            "",
            "| model | query first s/query | from cache | passage first s/query | from cache | speed-up |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for label, first, first_cached, last, last_cached in prefix_rows:
            lines.append(f"| {label} | {first:.2f} | {first_cached:.0%} | {last:.2f} | {last_cached:.0%} | {last / first:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        command = " ".join(["nice python bench/rerank.py", *sys.argv[1:]])
        write_results("## Reranking search with a model (bench/rerank.py)", command, ("torch", "transformers"), text)


if __name__ == "__main__":
    main()
