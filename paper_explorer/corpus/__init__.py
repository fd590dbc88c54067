"""Papers and questions (QASPER's model), their loaders, the demo corpus and BM25 search.

BM25 and its index need numpy and scipy (a third of a second to import): their names load their
modules when first used (PEP 562), so ``from corpus import Corpus`` - and ``explorer --help`` -
costs neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.demo import DemoConfig, generate
from paper_explorer.corpus.errors import CorpusError, LoadWarning
from paper_explorer.corpus.loading import load
from paper_explorer.corpus.schema import Answer, Figure, Paper, Paragraph, Question, Section
from paper_explorer.corpus.tokenize import tokenize

if TYPE_CHECKING:
    from paper_explorer.corpus.bm25 import BM25, BM25Params
    from paper_explorer.corpus.index import BM25Index, Hit

# The heavy names, and the module each comes from.
_LOADED_WHEN_USED = {
    "BM25": "paper_explorer.corpus.bm25",
    "BM25Params": "paper_explorer.corpus.bm25",
    "BM25Index": "paper_explorer.corpus.index",
    "Hit": "paper_explorer.corpus.index",
}

__all__ = [
    "BM25",
    "BM25Index",
    "BM25Params",
    "Answer",
    "Corpus",
    "CorpusError",
    "DemoConfig",
    "Figure",
    "Hit",
    "LoadWarning",
    "Paper",
    "Paragraph",
    "Question",
    "Section",
    "generate",
    "load",
    "tokenize",
]


def __getattr__(name: str) -> object:
    if name not in _LOADED_WHEN_USED:
        raise AttributeError(f"module 'corpus' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LOADED_WHEN_USED[name]), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LOADED_WHEN_USED})
