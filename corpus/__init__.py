"""Papers and questions (QASPER's model), their loaders, the demo corpus and BM25 search."""

from corpus.bm25 import BM25, BM25Params
from corpus.collection import Corpus
from corpus.demo import DemoConfig, generate
from corpus.errors import CorpusError, LoadWarning
from corpus.index import BM25Index, Hit
from corpus.loading import load
from corpus.schema import Answer, Figure, Paper, Paragraph, Question, Section
from corpus.tokenize import tokenize

__all__ = [
    "BM25", "BM25Index", "BM25Params", "Answer", "Corpus", "CorpusError", "DemoConfig", "Figure", "Hit",
    "LoadWarning", "Paper", "Paragraph", "Question", "Section", "generate", "load", "tokenize",
]
