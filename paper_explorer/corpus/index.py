"""BM25 search over a corpus's paragraphs, with an on-disk cache keyed by the corpus hash
(``corpus.index_cache``: its file format, and where caches live).

The index also answers "which paragraph contains this quote?" (``find_quote``) from the corpus's
paragraphs in ``quote_form``, kept once per corpus as one UTF-8 string (cached with the BM25
arrays): a quote costs at most one scan of that string, and usually a look at the few paragraphs
that hold its inner words (``plan_quote``), instead of normalising every paragraph of the corpus.
That string takes about as much memory as the corpus's text once more.

What an index covers: a corpus's shared papers (``Corpus.shared``). A paper that holds a question's
own documents (a LongBench or MemAgent context, ``Paper.own_documents``) is searched only by its own
questions, over an index of its own (``scoped``, ``of_own_documents``: built in memory when an
episode starts, never cached), so loading hundreds of 224k-token contexts builds and caches no index
over all of them, and no other question's search ranks or counts their paragraphs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

import paper_explorer.corpus.files as files
from paper_explorer.corpus import index_cache
from paper_explorer.corpus.bm25 import BM25, BM25Params
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.schema import Paper, Paragraph
from paper_explorer.corpus.tokenize import STOP_WORDS, TOKEN_PATTERN, tokenize

log = logging.getLogger(__name__)

# A character no token holds (TOKEN_PATTERN takes letters, digits, and "." or "," inside numbers).
HARD_SEPARATOR = re.compile(r"[^\w.,]|_")
QUOTE_WORDS = 8  # inner words whose paragraphs are intersected, rarest first
QUOTE_FEW_CANDIDATES = 64  # candidates few enough to check without intersecting further
# A candidate paragraph costs about this many bytes of scanning on top of its own length (a
# Python call per paragraph): beyond the whole text's length in all, one scan of it is cheaper.
QUOTE_CANDIDATE_BYTES = 512


@dataclass(frozen=True)
class Hit:
    paper_id: str
    section_index: int
    section: str | None
    paragraph_index: int
    score: float
    text: str


def quote_form(text: str) -> str:
    """Text as quotes are matched: whitespace runs as one space, lower case."""
    return " ".join(text.split()).lower()


class QuoteText:
    """Every paragraph's ``quote_form`` in corpus order, joined by newlines, as UTF-8 bytes.

    A quote in quote form holds no newline (``str.split`` removes it, and ``lower`` never makes
    one), so a match never spans two paragraphs, and the first match in the string lies in the
    first paragraph, in corpus order, that contains the quote. Bytes rather than str: a str with
    one non-Latin-1 character would take four bytes per character, and UTF-8 is
    self-synchronising, so a byte match of an encoded quote is a character match.
    """

    def __init__(self, text: bytes, starts: np.ndarray) -> None:
        self.text = text
        #: Byte offset of each paragraph's first byte; paragraph i ends one byte before starts[i + 1].
        self.starts = starts
        self.ends = np.append(starts[1:] - 1, len(text)) if len(starts) else starts
        self.longest = int((self.ends - self.starts).max()) if len(starts) else 0

    @classmethod
    def build(cls, paragraphs: Sequence[Paragraph]) -> QuoteText:
        encoded = [_utf8(quote_form(p.text)) for p in paragraphs]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])).astype(np.int64) if len(encoded) else lengths
        return cls(b"\n".join(encoded), starts)

    def first(self, needle: bytes) -> int | None:
        """The first paragraph containing ``needle``, by one scan of the whole text."""
        position = self.text.find(needle)
        return None if position < 0 else int(np.searchsorted(self.starts, position, side="right")) - 1

    def first_among(self, needle: bytes, candidates: np.ndarray) -> int | None:
        """The first of ``candidates`` (paragraph numbers, ascending) whose text contains ``needle``."""
        find = self.text.find
        spans = zip(candidates.tolist(), self.starts[candidates].tolist(), self.ends[candidates].tolist())
        return next((paragraph for paragraph, start, end in spans if find(needle, start, end) >= 0), None)

    def bytes_of(self, candidates: np.ndarray) -> int:
        """How many bytes the text of these paragraphs holds."""
        return int((self.ends[candidates] - self.starts[candidates]).sum())


@dataclass(frozen=True)
class QuotePlan:
    """Where ``find_quote`` looks for a quote: in ``candidates`` (paragraph numbers, ascending),
    or, when that is None, by a scan of the whole corpus text."""

    needle: bytes  # the quote's quote_form, as UTF-8
    candidates: np.ndarray | None
    cost: int  # about how many bytes the look-up reads: the whole text's length at most

    @property
    def scans_everything(self) -> bool:
        return self.candidates is None


def _holding(candidates: np.ndarray, postings: np.ndarray) -> np.ndarray:
    """The candidates that are also in ``postings`` (both ascending), in
    O(len(candidates) x log(len(postings)))."""
    where = np.searchsorted(postings, candidates)
    inside = where < len(postings)
    keep = np.zeros(len(candidates), dtype=bool)
    keep[inside] = postings[where[inside]] == candidates[inside]
    return candidates[keep]


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate (JSON allows one) is text too


class BM25Index:
    """Paragraph-level BM25 over the papers of ``corpus`` (``corpus.paragraphs()`` order): made by
    ``build`` and ``cached``, a loaded corpus's shared papers; by ``of_own_documents``, one paper
    holding a question's own documents."""

    def __init__(
        self,
        corpus: Corpus,
        bm25: BM25,
        stopwords: bool,
        source: Literal["built", "cache"],
        quotes: QuoteText | None = None,
        loaded: Corpus | None = None,
    ) -> None:
        #: The papers indexed, all of them: what a search ranks and what the tools over it may show.
        self.corpus = corpus
        #: The corpus it was made for (``corpus`` is its shared papers): where ``scoped`` finds the
        #: papers that hold a question's own documents.
        self.loaded = loaded if loaded is not None else corpus
        self.bm25 = bm25
        self.stopwords = stopwords
        #: "built" or "cache": how this index came to be (shown by `explorer corpus stats`).
        self.source = source
        self.paragraphs: list[Paragraph] = list(corpus.paragraphs())
        if len(self.paragraphs) != bm25.n_docs:
            raise ValueError(f"index holds {bm25.n_docs} paragraphs, the corpus {len(self.paragraphs)}")
        self._paper_ranges = _paper_ranges(self.paragraphs)
        self.quotes = quotes if quotes is not None else QuoteText.build(self.paragraphs)
        if len(self.quotes.starts) != bm25.n_docs:
            raise ValueError(f"quote text holds {len(self.quotes.starts)} paragraphs, the corpus {bm25.n_docs}")

    @classmethod
    def build(cls, corpus: Corpus, params: BM25Params = BM25Params(), stopwords: bool = True) -> BM25Index:
        """The index of ``corpus``'s shared papers (``Corpus.shared``)."""
        return cls._over(corpus.shared, params, stopwords, loaded=corpus)

    @classmethod
    def of_own_documents(cls, paper: Paper, params: BM25Params = BM25Params(), stopwords: bool = True) -> BM25Index:
        """An index of ``paper`` alone, the own documents of its questions: its statistics (idf,
        average length) are that paper's, as if it were the whole corpus. Built in memory, never
        cached: ~0.2 s for a 0.93 MB context (the size of a 224k-token HotpotQA one) on a loaded
        two-core machine."""
        if not paper.own_documents:
            raise ValueError(f"paper {paper.id!r} holds no question's own documents; it is searched in its corpus's shared index")
        return cls._over(Corpus(papers=(paper,)), params, stopwords)

    @classmethod
    def _over(cls, corpus: Corpus, params: BM25Params, stopwords: bool, loaded: Corpus | None = None) -> BM25Index:
        documents = [tokenize(p.text, stopwords) for p in corpus.paragraphs()]
        return cls(corpus, BM25.build(documents, params), stopwords, source="built", loaded=loaded)

    @classmethod
    def cached(cls, corpus: Corpus, params: BM25Params = BM25Params(), stopwords: bool = True, directory: Path | None = None) -> BM25Index:
        """Load the index of this corpus's shared papers from the cache, or build it and store it there."""
        shared = corpus.shared
        path = (directory or index_cache.cache_dir()) / f"bm25-{shared.papers_sha256[:20]}.npz"
        header = index_cache.header(shared, params, stopwords)
        stored = index_cache.load(path, header)
        if stored is not None:
            bm25 = BM25(stored.vocabulary, stored.indptr, stored.indices, stored.weights, stored.doc_lengths, params)
            quotes = QuoteText(stored.quote_text, stored.quote_starts.astype(np.int64))
            return cls(shared, bm25, stopwords, source="cache", quotes=quotes, loaded=corpus)
        index = cls.build(corpus, params, stopwords)
        try:
            index_cache.save(path, header, index.bm25, index.quotes)
        except (
            OSError,
            files.FileRefused,
        ) as error:  # a read-only cache (or a FIFO where it belongs) costs speed, not correctness: say so and go on
            log.warning("could not write the BM25 index cache %s: %s", path, error)
        return index

    def scoped(self, paper_id: str | None) -> BM25Index:
        """The index a question about ``paper_id`` searches: when that paper holds the question's own
        documents, an index of it alone (built here: ``of_own_documents``), else this one."""
        paper = self.loaded.own_documents(paper_id)
        if paper is None or (len(self.corpus.papers) == 1 and self.corpus.papers[0] is paper):
            return self
        return BM25Index.of_own_documents(paper, self.bm25.params, self.stopwords)

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text, self.stopwords)

    def scores(self, query: str) -> np.ndarray:
        """One score per paragraph, in ``corpus.paragraphs()`` order."""
        return self.bm25.scores(self.tokenize(query))

    def find_quote(self, text: str) -> int | None:
        """The number (in ``paragraphs``) of the first paragraph whose ``quote_form`` contains
        ``quote_form(text)``, or None: the same answer as trying every paragraph in corpus order,
        at the cost of one scan of the corpus text at most (``plan_quote`` says where it looks)."""
        return self.find_planned(self.plan_quote(text))

    def plan_quote(self, text: str) -> QuotePlan:
        """Where ``find_quote`` would look for ``text``: the paragraphs that hold all of the
        quote's inner words, or (when it has no indexed inner word, or those paragraphs would
        cost more to check than the whole text) a scan of the whole text.

        An inner word is a token that starts after the quote's first hard separator (a
        character no token holds: anything but letters, digits, "." and ",") and ends before
        its last one. Such a word is a whole token of any paragraph that contains the quote: no
        token spans a hard separator, and the token pattern looks at nothing outside its match,
        so tokenizing the quote and the paragraph agree from the first hard separator to the
        last. So every paragraph that contains the quote holds all its inner words, and an inner
        word that no paragraph holds means no paragraph holds the quote. The first and last
        words may be cut, and stop words are not indexed: they choose nothing.
        """
        quote = quote_form(text)
        needle = _utf8(quote)
        nothing = np.zeros(0, dtype=np.int64)
        if len(needle) > self.quotes.longest:
            return QuotePlan(needle, nothing, 0)
        terms = self._inner_terms(quote)
        if terms is None:
            return QuotePlan(needle, nothing, 0)
        everything = QuotePlan(needle, None, len(self.quotes.text))
        if not terms:
            return everything
        indptr, indices = self.bm25.indptr, self.bm25.indices
        terms.sort(key=lambda term: indptr[term + 1] - indptr[term])
        candidates = indices[indptr[terms[0]] : indptr[terms[0] + 1]]  # ascending: the CSR keeps them sorted
        for term in terms[1:QUOTE_WORDS]:
            if len(candidates) <= QUOTE_FEW_CANDIDATES:
                break
            candidates = _holding(candidates, indices[indptr[term] : indptr[term + 1]])
        cost = self.quotes.bytes_of(candidates) + QUOTE_CANDIDATE_BYTES * len(candidates)
        return everything if cost >= everything.cost else QuotePlan(needle, candidates, cost)

    def find_planned(self, plan: QuotePlan) -> int | None:
        """``find_quote``'s answer, looking where ``plan`` says."""
        if plan.candidates is None:
            return self.quotes.first(plan.needle)
        return self.quotes.first_among(plan.needle, plan.candidates)

    def _inner_terms(self, quote: str) -> list[int] | None:
        """The term ids of the quote's inner words (see ``plan_quote``), or None when one of them
        is in no paragraph (so neither is the quote)."""
        hard = [match.start() for match in HARD_SEPARATOR.finditer(quote)]
        inner = quote[hard[0] + 1 : hard[-1]] if len(hard) >= 2 else ""
        terms = []
        for word in dict.fromkeys(TOKEN_PATTERN.findall(inner)):  # no lower(): the quote is lower case already
            term = self.bm25.vocabulary.get(word)
            if term is not None:
                terms.append(term)
            elif not (self.stopwords and word in STOP_WORDS):  # stop words are in the text, not in the index
                return None
        return terms

    def search(self, query: str, k: int = 10, paper_id: str | None = None) -> list[Hit]:
        """The k best paragraphs sharing at least one token with the query, best first.

        Ties keep corpus order. With ``paper_id``, only that paper's paragraphs compete;
        an unknown paper id raises KeyError.
        """
        within = None
        if paper_id is not None:
            if paper_id not in self.corpus:
                raise KeyError(paper_id)
            within = self._paper_ranges.get(paper_id, slice(0, 0))
        hits = []
        for doc, score in self.bm25.top_k(self.tokenize(query), k, within):
            paragraph = self.paragraphs[doc]
            section = self.corpus.paper(paragraph.paper_id).sections[paragraph.section_index]
            hits.append(Hit(paragraph.paper_id, paragraph.section_index, section.name, paragraph.paragraph_index, score, paragraph.text))
        return hits


def _paper_ranges(paragraphs: Sequence[Paragraph]) -> dict[str, slice]:
    ranges: dict[str, slice] = {}
    start = 0
    for i in range(1, len(paragraphs) + 1):
        if i == len(paragraphs) or paragraphs[i].paper_id != paragraphs[start].paper_id:
            ranges[paragraphs[start].paper_id] = slice(start, i)
            start = i
    return ranges
