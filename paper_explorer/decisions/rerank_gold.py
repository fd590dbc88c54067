"""The gold of reranking: a question's BM25 candidates and the paragraphs its annotators cite.

A question's candidates are the top ``depth`` paragraphs its episode's search finds for its text
(``BM25Index.scoped``: its own documents alone, else the shared papers); its gold is
``evaluation.retrieval``'s (one set of paragraph texts per annotator who gave text evidence), and
every figure takes the best annotator's, as the run's retrieval figures do. NDCG@k has binary
gains and its ideal puts every gold paragraph first, found by BM25 or not; recall@k is the share
of the gold within the first k. ``bench/rerank.py`` and ``explorer rl-rerank`` both read these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paper_explorer.corpus import Corpus
    from paper_explorer.corpus.schema import Question


@dataclass(frozen=True)
class Candidates:
    """One question: its query, BM25's top K paragraph texts in BM25 order, and its gold evidence
    (evaluation/retrieval.py's: one set of paragraph texts per annotator who gave text evidence)."""

    query: str
    passages: list[str]
    golds: list[set[str]]

    def reward(self, order: list[int], k: int = 5) -> float:
        """NDCG@k of the passages in ``order`` (the best annotator's, as retrieval metrics take it)."""
        return ndcg([self.passages[i] for i in order], self.golds, k)

    def recall(self, order: list[int], k: int) -> float:
        """The share of the best annotator's gold paragraphs among the first k of ``order``."""
        top = {self.passages[i] for i in order[:k]}
        return max(len(gold & top) / len(gold) for gold in self.golds)

    @property
    def learnable(self) -> bool:
        """Some gold paragraph is among the candidates (else every ranking's reward is 0)."""
        return any(text in gold for gold in self.golds for text in self.passages)


def candidates(corpus: Corpus, questions: list[Question], depth: int) -> list[Candidates]:
    """Each question with gold evidence, with the top ``depth`` paragraphs its episode's search finds
    for its text (``BM25Index.scoped``: a question's own documents alone, else the shared papers)."""
    from paper_explorer.corpus import BM25Index
    from paper_explorer.evaluation.retrieval import gold_paragraph_sets

    index = BM25Index.cached(corpus)
    found = []
    for question in questions:
        golds = gold_paragraph_sets(question)
        if golds:
            hits = index.scoped(question.paper_id).search(question.text, k=depth)
            found.append(Candidates(question.text, [hit.text for hit in hits], golds))
    return found


def ndcg(ranked: list[str], golds: list[set[str]], k: int = 5) -> float:
    """NDCG@k of paragraph texts in ranked order, binary gains (DCG over that of every gold paragraph
    first); with several annotators, the best one's."""

    def one(gold: set[str]) -> float:
        dcg = sum(1 / math.log2(rank + 1) for rank, text in enumerate(ranked[:k], 1) if text in gold)
        return dcg / sum(1 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))

    return max(one(gold) for gold in golds)


__all__ = ["Candidates", "candidates", "ndcg"]
