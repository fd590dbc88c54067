"""Retrieval metrics on a hand-built corpus where the ranking is known."""

import pytest

from paper_explorer.corpus import BM25Index
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.schema import Answer, Paper, Question, Section
from paper_explorer.evaluation.retrieval import retrieval_metrics

PARAGRAPHS = (
    "QuantLens is trained with AdamW and a learning rate of 3e-5.",
    "The batch size of QuantLens is 128.",
    "Unrelated text about tokenization and parsing.",
)


@pytest.fixture
def index():
    paper = Paper(id="p", title="QuantLens", abstract="", sections=(Section(name="Setup", paragraphs=PARAGRAPHS),))
    return BM25Index.build(Corpus(papers=(paper,)))


def test_recall_and_mrr(index):
    first = Question(
        id="q1",
        paper_id="p",
        text="What learning rate trains QuantLens with AdamW?",
        answers=(Answer(extractive_spans=("3e-5",), evidence=(PARAGRAPHS[0],)),),
    )
    second = Question(
        id="q2",
        paper_id="p",
        text="What batch size does QuantLens use?",
        answers=(Answer(extractive_spans=("128",), evidence=(PARAGRAPHS[1], PARAGRAPHS[2])),),
    )
    unanswerable = Question(id="q3", paper_id="p", text="How many heads?", answers=(Answer(unanswerable=True),))
    metrics = retrieval_metrics(index, [first, second, unanswerable], ks=(1, 2))
    assert metrics["questions"] == 2  # the unanswerable question has no gold paragraph
    assert metrics["recall@1"] == pytest.approx((1 + 0.5) / 2)  # q2: its top hit is one of its two gold paragraphs
    assert metrics["mrr@2"] == pytest.approx(1.0)


def test_float_selected_evidence_is_not_a_retrieval_target(index):
    figure = Question(
        id="q",
        paper_id="p",
        text="QuantLens learning rate",
        answers=(Answer(extractive_spans=("3e-5",), evidence=("FLOAT SELECTED: Table 1",)),),
    )
    assert retrieval_metrics(index, [figure])["questions"] == 0
