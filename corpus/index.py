"""BM25 search over a corpus's paragraphs, with an on-disk cache keyed by the corpus hash.

The cache file records the hash of the papers it was built from, the BM25 parameters, the
tokenizer settings and a format version; a cache whose record differs from the corpus at hand
is rebuilt, never trusted. Files are written whole (temporary file, fsync, rename), so a crash
mid-write cannot leave a cache that loads. Where caches live: ``$EXPLORER_CACHE_DIR``, else
``$XDG_CACHE_HOME/paper-explorer``, else ``~/.cache/paper-explorer``.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from corpus.atomic import atomic_file
from corpus.bm25 import BM25, BM25Params
from corpus.collection import Corpus
from corpus.schema import Paragraph
from corpus.tokenize import tokenize

CACHE_FORMAT = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    paper_id: str
    section_index: int
    section: str | None
    paragraph_index: int
    score: float
    text: str


def cache_dir() -> Path:
    if os.environ.get("EXPLORER_CACHE_DIR"):
        return Path(os.environ["EXPLORER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paper-explorer"


class BM25Index:
    """Paragraph-level BM25 over a corpus (``corpus.paragraphs()`` order)."""

    def __init__(self, corpus: Corpus, bm25: BM25, stopwords: bool, source: str) -> None:
        self.corpus = corpus
        self.bm25 = bm25
        self.stopwords = stopwords
        #: "built" or "cache": how this index came to be (shown by `explorer corpus stats`).
        self.source = source
        self.paragraphs: list[Paragraph] = list(corpus.paragraphs())
        if len(self.paragraphs) != bm25.n_docs:
            raise ValueError(f"index holds {bm25.n_docs} paragraphs, the corpus {len(self.paragraphs)}")
        self._paper_ranges = _paper_ranges(self.paragraphs)

    @classmethod
    def build(cls, corpus: Corpus, params: BM25Params = BM25Params(), stopwords: bool = True) -> BM25Index:
        documents = [tokenize(p.text, stopwords) for p in corpus.paragraphs()]
        return cls(corpus, BM25.build(documents, params), stopwords, source="built")

    @classmethod
    def cached(
        cls, corpus: Corpus, params: BM25Params = BM25Params(), stopwords: bool = True, directory: Path | None = None
    ) -> BM25Index:
        """Load the index for this corpus from the cache, or build it and store it there."""
        path = (directory or cache_dir()) / f"bm25-{corpus.papers_sha256[:20]}.npz"
        header = _header(corpus, params, stopwords)
        loaded = _load(path, header)
        if loaded is not None:
            return cls(corpus, BM25(*loaded, params), stopwords, source="cache")
        index = cls.build(corpus, params, stopwords)
        try:
            _save(path, header, index.bm25)
        except OSError as error:  # a read-only cache costs speed, not correctness: say so and go on
            log.warning("could not write the BM25 index cache %s: %s", path, error)
        return index

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text, self.stopwords)

    def scores(self, query: str) -> np.ndarray:
        """One score per paragraph, in ``corpus.paragraphs()`` order."""
        return self.bm25.scores(self.tokenize(query))

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
            hits.append(
                Hit(paragraph.paper_id, paragraph.section_index, section.name, paragraph.paragraph_index, score, paragraph.text)
            )
        return hits


def _paper_ranges(paragraphs: Sequence[Paragraph]) -> dict[str, slice]:
    ranges: dict[str, slice] = {}
    start = 0
    for i in range(1, len(paragraphs) + 1):
        if i == len(paragraphs) or paragraphs[i].paper_id != paragraphs[start].paper_id:
            ranges[paragraphs[start].paper_id] = slice(start, i)
            start = i
    return ranges


def _header(corpus: Corpus, params: BM25Params, stopwords: bool) -> dict:
    return {
        "format": CACHE_FORMAT,
        "papers_sha256": corpus.papers_sha256,
        "params": asdict(params),
        "stopwords": stopwords,
    }


_ARRAYS = ("indptr", "indices", "weights", "doc_lengths")


def _save(path: Path, header: dict, bm25: BM25) -> None:
    vocabulary = "\n".join(bm25.vocabulary).encode("utf-8")  # tokens never contain a newline
    with atomic_file(path, binary=True) as handle:
        np.savez(
            handle,
            header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8),
            vocabulary=np.frombuffer(vocabulary, dtype=np.uint8),
            **{name: getattr(bm25, name) for name in _ARRAYS},
        )


def _load(path: Path, header: dict):
    """The arrays of a cache file that matches ``header``, else None (and the reason logged)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = json.loads(data["header"].tobytes())
            if stored != header:
                log.info("rebuilding BM25 index: cache %s was built for other content or settings", path)
                return None
            words = data["vocabulary"].tobytes().decode("utf-8")
            vocabulary = {word: i for i, word in enumerate(words.split("\n"))} if words else {}
            arrays = [data[name] for name in _ARRAYS]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        log.warning("rebuilding BM25 index: cache %s is unreadable (%s)", path, error)
        return None
    if len(vocabulary) + 1 != len(arrays[0]):
        log.warning("rebuilding BM25 index: cache %s is inconsistent", path)
        return None
    return (vocabulary, *arrays)
