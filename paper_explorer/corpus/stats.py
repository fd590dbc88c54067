"""What ``explorer corpus stats`` reports: a corpus's counts and hashes, and its index's size.

One typed record, printed as JSON by ``--json`` and as a table otherwise; the field order is
the order of both.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.index import BM25Index
from paper_explorer.corpus.schema import FIGURE_EVIDENCE_PREFIX


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IndexStats(Record):
    """The BM25 index the corpus is searched with."""

    paragraphs: int  # documents indexed: the corpus's non-empty paragraphs
    vocabulary: int  # distinct tokens (after stopword removal)
    source: Literal["built", "cache"]  # built now, or loaded from the on-disk cache
    seconds: float  # to load or build it, rounded to milliseconds


class CorpusStats(Record):
    """Papers, paragraphs and questions counted, by answer kind and split, and the content hashes."""

    sources: list[str]  # the files (or the demo generator) the corpus was read from
    file_sha256: dict[str, str]  # each file read (corpus files, a questions file): the SHA-256 of its bytes, to pin it
    papers: int
    sections: int
    paragraphs: int  # non-empty ones: what is indexed and shown
    empty_paragraphs_skipped: int  # "" placeholders that keep source paragraph indices
    words_per_paragraph: float  # mean over non-empty paragraphs, one decimal
    questions: int
    answerable_questions: int
    unanswerable_questions: int
    annotations: int  # answers, one per annotator and question
    answer_kinds: dict[str, int]  # by Answer.kind, "empty" where it has none
    figure_evidence: int  # evidence strings that cite a figure or table ("FLOAT SELECTED")
    papers_per_split: dict[str, int]  # "none" for papers without a split
    questions_per_split: dict[str, int]  # by their paper's split
    questions_per_benchmark: dict[str, int]  # by Question.benchmark ("longbench/hotpotqa"), "none" where it has none
    warnings: dict[str, int]  # load warnings by kind
    sha256: str  # papers and questions together
    corpus_sha256: str  # the papers: a run's manifest and a preregistration call it so
    questions_sha256: str
    index: IndexStats


def corpus_stats(corpus: Corpus, index: BM25Index, index_seconds: float) -> CorpusStats:
    """Count ``corpus``; ``index`` is its BM25 index, which took ``index_seconds`` to load or build."""
    papers, questions = corpus.papers, corpus.questions
    paragraphs = list(corpus.paragraphs())
    answers = Counter(answer.kind or "empty" for q in questions for answer in q.answers)
    split_of = {paper.id: paper.split or "none" for paper in papers}
    return CorpusStats(
        sources=list(corpus.sources),
        file_sha256=dict(corpus.file_sha256),
        papers=len(papers),
        sections=sum(len(paper.sections) for paper in papers),
        paragraphs=len(paragraphs),
        empty_paragraphs_skipped=sum(1 for paper in papers for s in paper.sections for text in s.paragraphs if not text),
        words_per_paragraph=round(sum(len(p.text.split()) for p in paragraphs) / max(len(paragraphs), 1), 1),
        questions=len(questions),
        answerable_questions=sum(1 for q in questions if q.answerable),
        unanswerable_questions=sum(1 for q in questions if not q.answerable),
        annotations=sum(answers.values()),
        answer_kinds=dict(sorted(answers.items())),
        figure_evidence=sum(1 for q in questions for a in q.answers for text in a.evidence if text.startswith(FIGURE_EVIDENCE_PREFIX)),
        papers_per_split=dict(sorted(Counter(paper.split or "none" for paper in papers).items())),
        questions_per_split=dict(sorted(Counter(split_of[q.paper_id] for q in questions).items())),
        questions_per_benchmark=dict(sorted(Counter(q.benchmark or "none" for q in questions).items())),
        warnings=corpus.warning_counts(),
        sha256=corpus.sha256,
        corpus_sha256=corpus.papers_sha256,
        questions_sha256=corpus.questions_sha256,
        index=IndexStats(
            paragraphs=index.bm25.n_docs,
            vocabulary=len(index.bm25.vocabulary),
            source=index.source,
            seconds=round(index_seconds, 3),
        ),
    )
