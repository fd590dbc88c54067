"""Okapi BM25 over paragraphs: rank_bm25's scores, at the speed of a sparse index.

``BM25`` reproduces ``rank_bm25.BM25Okapi`` exactly: the same idf (``log(N - n + 0.5) -
log(n + 0.5)``, with negative idfs replaced by ``epsilon`` times the mean idf), the same term
weight expression evaluated in the same order, and query terms summed in query order with
repeats counted. rank_bm25 recomputes every document's weight for every query term in Python
(O(documents) per term); we compute each (term, document) weight once at build time and store
them in a term-major CSR matrix, so a query only touches the postings of its own terms.

Building maps tokens to ids in C (``dict.fromkeys`` and ``map``) and lets scipy's COO->CSR
conversion do the counting sort, so the only per-token Python work is one dictionary lookup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import scipy.sparse


@dataclass(frozen=True)
class BM25Params:
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25

    def __post_init__(self) -> None:
        # k1 = 0 or (b = 1 with an empty paragraph) makes rank_bm25 divide 0 by 0.
        if not self.k1 > 0:
            raise ValueError(f"k1 must be positive, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise ValueError(f"b must lie in [0, 1], got {self.b}")


class BM25:
    """Term-major sparse BM25 weights built from token lists (one list per document)."""

    def __init__(
        self,
        vocabulary: dict[str, int],
        indptr: np.ndarray,
        indices: np.ndarray,
        weights: np.ndarray,
        doc_lengths: np.ndarray,
        params: BM25Params,
    ) -> None:
        self.vocabulary = vocabulary
        self.indptr = indptr
        self.indices = indices
        self.weights = weights
        self.doc_lengths = doc_lengths
        self.params = params

    @property
    def n_docs(self) -> int:
        return len(self.doc_lengths)

    @classmethod
    def build(cls, documents: Sequence[list[str]], params: BM25Params = BM25Params()) -> BM25:
        n_docs = len(documents)
        lengths = np.fromiter(map(len, documents), dtype=np.int64, count=n_docs)
        n_tokens = int(lengths.sum())
        # dict.fromkeys keeps first-occurrence order, which is rank_bm25's idf summation order.
        terms = dict.fromkeys(chain.from_iterable(documents))
        vocabulary = dict(zip(terms, range(len(terms))))
        term_ids = np.fromiter(map(vocabulary.__getitem__, chain.from_iterable(documents)), dtype=np.int64, count=n_tokens)
        doc_ids = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
        # Rows are terms, columns documents; duplicates (a term repeated in a document) sum to tf.
        counts = scipy.sparse.csr_matrix(
            (np.ones(n_tokens, dtype=np.float64), (term_ids, doc_ids)), shape=(len(vocabulary), max(n_docs, 1))
        )
        counts.sum_duplicates()
        counts.sort_indices()
        del term_ids, doc_ids
        indptr = counts.indptr.astype(np.int64)
        indices = counts.indices.astype(np.int32)
        tf = counts.data
        document_frequency = np.diff(indptr)
        idf = _okapi_idf(document_frequency, n_docs, params.epsilon)
        avgdl = n_tokens / n_docs if n_docs else 0.0
        # The expression and its evaluation order are rank_bm25's, so each weight is the same float.
        k1, b = params.k1, params.b
        doc_len = lengths[indices]
        weights = np.repeat(idf, document_frequency) * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avgdl)))
        return cls(vocabulary, indptr, indices, weights, lengths, params)

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """One float64 score per document, equal to ``BM25Okapi.get_scores(query_tokens)``."""
        return self._accumulate(query_tokens, None)

    def _accumulate(self, query_tokens: Sequence[str], matched: np.ndarray | None, within: slice | None = None) -> np.ndarray:
        scores = np.zeros(self.n_docs, dtype=np.float64)
        for token in query_tokens:
            term = self.vocabulary.get(token)
            if term is not None:
                start, end = self.indptr[term], self.indptr[term + 1]
                if within is not None:
                    # Postings are sorted by document: keep those in range. Each kept document gets
                    # the same additions in the same order, so its score is the same float.
                    low, high = np.searchsorted(self.indices[start:end], (within.start, within.stop))
                    start, end = start + low, start + high
                postings = self.indices[start:end]
                # A term's postings name each document once, so fancy-index += is exact here.
                scores[postings] += self.weights[start:end]
                if matched is not None:
                    matched[postings] = True
        return scores

    def top_k(self, query_tokens: Sequence[str], k: int, within: slice | None = None) -> list[tuple[int, float]]:
        """The k best documents that share a token with the query, as (index, score).

        Ties are broken by document order, so results are deterministic. ``within`` restricts
        the ranking to a contiguous range of documents (one paper's paragraphs).
        """
        matched = np.zeros(self.n_docs, dtype=bool)
        scores = self._accumulate(query_tokens, matched, within)
        candidates = np.flatnonzero(matched)
        if within is not None:
            candidates = candidates[(candidates >= within.start) & (candidates < within.stop)]
        if k <= 0 or len(candidates) == 0:
            return []
        candidate_scores = scores[candidates]
        if len(candidates) > k:
            # Keep every candidate tied with the k-th best, then order by (-score, index).
            threshold = np.partition(candidate_scores, len(candidates) - k)[len(candidates) - k]
            keep = candidate_scores >= threshold
            candidates, candidate_scores = candidates[keep], candidate_scores[keep]
        order = np.lexsort((candidates, -candidate_scores))[:k]
        return [(int(candidates[i]), float(candidate_scores[i])) for i in order]

    def idf(self) -> dict[str, float]:
        """Each term's idf as rank_bm25 would compute it (for inspection and tests)."""
        frequency = np.diff(self.indptr)
        values = _okapi_idf(frequency, self.n_docs, self.params.epsilon)
        return dict(zip(self.vocabulary, values.tolist()))


def _okapi_idf(document_frequency: np.ndarray, n_docs: int, epsilon: float) -> np.ndarray:
    # math.log in vocabulary order, exactly as rank_bm25 does it, so the mean matches to the bit.
    idf = [math.log(n_docs - n + 0.5) - math.log(n + 0.5) for n in document_frequency.tolist()]
    if not idf:
        return np.zeros(0, dtype=np.float64)
    total = 0.0
    for value in idf:  # not sum(): since Python 3.12 it compensates, and rank_bm25 does not
        total += value
    floor = epsilon * (total / len(idf))
    values = np.array(idf, dtype=np.float64)
    values[values < 0] = floor
    return values
