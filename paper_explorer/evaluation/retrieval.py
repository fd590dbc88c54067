"""How well the search tool finds the gold evidence: recall@k and MRR for the question text.

The query is each question's own text, never what a policy searched for: the figures belong to the
questions and the index, and are the same for every policy on them (``searched_episodes`` says
whether the policy searched at all, so the summary can say so beside them).

Each question searches what its episode's search does (``BM25Index.scoped``): a question that brings
its own documents (a LongBench or MemAgent context) searches them alone, any other the shared papers.

Gold evidence is matched by exact paragraph text (QASPER stores evidence as text). A question
counts when some annotator answered it with text evidence; with several annotators, the best
annotator's figures count (as answer metrics take the best reference).
"""

from __future__ import annotations

import functools
from statistics import fmean

from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus import BM25Index
from paper_explorer.corpus.schema import Question
from paper_explorer.evaluation.answers import reference_evidence


def gold_paragraph_sets(question: Question) -> list[set[str]]:
    return [set(texts) for answer in question.answers if (texts := reference_evidence(answer, text_evidence_only=True))]


def retrieval_metrics(index: BM25Index, questions: list[Question], ks: tuple[int, ...] = (1, 5, 10)) -> dict:
    """``index``: the loaded corpus's (``BM25Index.cached``), which finds each question's own documents."""
    depth = max(ks)
    searched = functools.lru_cache(maxsize=1)(index.scoped)  # an own paper's index, once for its questions in a row
    recalls: dict[int, list[float]] = {k: [] for k in ks}
    reciprocal_ranks: list[float] = []
    for question in questions:
        golds = gold_paragraph_sets(question)
        if not golds:
            continue
        ranked = [hit.text for hit in searched(question.paper_id).search(question.text, k=depth)]
        for k in ks:
            recalls[k].append(max(len(gold & set(ranked[:k])) / len(gold) for gold in golds))
        reciprocal_ranks.append(max(next((1 / rank for rank, text in enumerate(ranked, 1) if text in gold), 0.0) for gold in golds))
    return {
        "questions": len(reciprocal_ranks),
        **{f"recall@{k}": fmean(values) if values else None for k, values in recalls.items()},
        f"mrr@{depth}": fmean(reciprocal_ranks) if reciprocal_ranks else None,
    }


def searched_episodes(trajectories: list[Trajectory]) -> int:
    """Episodes with at least one search call that ran (one refused for its arguments searched nothing)."""
    return sum(any(call.name == "search" and call.error is None for step in t.steps for call in step.tool_calls) for t in trajectories)
