"""Our BM25 against rank_bm25.BM25Okapi, the reference it promises to reproduce."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from paper_explorer.corpus import BM25, BM25Index, BM25Params, tokenize


def reference_and_ours(documents, **params):
    return BM25Okapi(documents, **params), BM25.build(documents, BM25Params(**params))


def test_scores_equal_rank_bm25_on_a_generated_corpus(small_demo):
    documents = [tokenize(p.text) for p in small_demo.paragraphs()]
    reference, ours = reference_and_ours(documents)
    queries = [tokenize(q.text) for q in small_demo.questions] + [["learning", "learning", "rate"], ["unseen-token"], []]
    for query in queries:
        expected, actual = reference.get_scores(query), ours.scores(query)
        np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=0)
        # Same expression, same order of operations: in practice the floats are identical.
        assert np.array_equal(actual, expected)


@pytest.mark.parametrize("params", [dict(k1=1.2, b=0.75, epsilon=0.25), dict(k1=2.0, b=0.3, epsilon=0.5), dict(k1=0.9, b=0.0, epsilon=0.1)])
def test_parameters_are_honoured(small_demo, params):
    documents = [tokenize(p.text) for p in small_demo.paragraphs()][:500]
    reference, ours = reference_and_ours(documents, **params)
    for query in (["model", "datasets"], ["learning", "rate", "batch", "size"]):
        np.testing.assert_allclose(ours.scores(query), reference.get_scores(query), rtol=1e-9)


def test_idf_matches_including_the_epsilon_floor_for_common_terms():
    documents = [["common", "rare"], ["common"], ["common", "other"], ["common"], []]
    reference, ours = reference_and_ours(documents)
    assert ours.idf() == pytest.approx(reference.idf, rel=1e-12)
    assert ours.idf()["common"] == pytest.approx(0.25 * reference.average_idf)


words = st.sampled_from([f"w{i}" for i in range(25)])


@settings(max_examples=150, deadline=None)
@given(
    documents=st.lists(st.lists(words, max_size=12), min_size=1, max_size=40),
    query=st.lists(st.one_of(words, st.just("never-indexed")), max_size=8),
)
def test_property_scores_equal_rank_bm25(documents, query):
    assume(any(documents))  # rank_bm25 divides by the vocabulary size
    reference, ours = reference_and_ours(documents)
    np.testing.assert_allclose(ours.scores(query), reference.get_scores(query), rtol=1e-9, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    documents=st.lists(st.lists(words, max_size=10), min_size=1, max_size=30),
    query=st.lists(words, min_size=1, max_size=5),
    k=st.integers(1, 12),
)
def test_property_top_k_is_the_best_matching_documents_in_a_stable_order(documents, query, k):
    ours = BM25.build(documents)
    scores = ours.scores(query)
    matching = [i for i, doc in enumerate(documents) if set(doc) & set(query)]
    expected = sorted(matching, key=lambda i: (-scores[i], i))[:k]
    assert [doc for doc, _ in ours.top_k(query, k)] == expected


@settings(max_examples=100, deadline=None)
@given(
    documents=st.lists(st.lists(words, max_size=10), min_size=1, max_size=30),
    query=st.lists(words, min_size=1, max_size=6),
    k=st.integers(1, 12),
    bounds=st.tuples(st.integers(0, 30), st.integers(0, 30)),
)
def test_property_top_k_within_a_range_is_rank_bm25s_ranking_of_that_range(documents, query, k, bounds):
    assume(any(documents))
    start, stop = min(bounds), max(bounds)
    reference, ours = reference_and_ours(documents)
    scores = reference.get_scores(query)  # of every document: only the postings in range are read, to the same floats
    matching = [i for i, doc in enumerate(documents) if set(doc) & set(query) and start <= i < stop]
    expected = sorted(matching, key=lambda i: (-scores[i], i))[:k]
    assert ours.top_k(query, k, slice(start, stop)) == [(i, float(scores[i])) for i in expected]


def test_top_k_breaks_ties_by_document_order():
    ours = BM25.build([["a", "b"], ["a", "b"], ["c"], ["a", "b"]])
    assert [doc for doc, _ in ours.top_k(["a"], 2)] == [0, 1]


def test_empty_corpus_and_empty_query_give_no_hits():
    assert BM25.build([]).top_k(["a"], 5) == []
    assert BM25.build([["a"]]).top_k([], 5) == []


@pytest.mark.parametrize("params", [dict(k1=0.0), dict(b=1.5), dict(b=-0.1)])
def test_parameters_outside_their_range_are_refused(params):
    with pytest.raises(ValueError):
        BM25Params(**params)


def test_index_search_returns_addresses_and_respects_paper_filter(small_demo):
    index = BM25Index.build(small_demo)
    question = next(q for q in small_demo.questions if q.answers[0].kind == "extractive")
    hits = index.search(question.text, k=5)
    assert len(hits) == 5 and hits == sorted(hits, key=lambda h: -h.score)
    for hit in hits:
        section = small_demo.paper(hit.paper_id).sections[hit.section_index]
        assert section.paragraphs[hit.paragraph_index] == hit.text and section.name == hit.section
    other = small_demo.papers[3].id
    within = index.search(question.text, k=50, paper_id=other)
    assert within and {hit.paper_id for hit in within} == {other}
    with pytest.raises(KeyError):
        index.search("x", paper_id="no-such-paper")


def test_index_scores_follow_corpus_paragraph_order(small_demo):
    index = BM25Index.build(small_demo)
    paragraphs = list(small_demo.paragraphs())
    scores = index.scores("learning rate")
    best = int(np.argmax(scores))
    assert len(scores) == len(paragraphs)
    assert "learning rate" in paragraphs[best].text
