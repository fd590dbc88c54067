"""The long-context benchmarks' answer metrics against their upstreams' own code, kept verbatim in
tests/evaluation/upstream/ (LongBench's ``qa_f1_score`` and scorer, MemAgent's HotpotQA F1, EM and
SubEM): on hand-worked cases, on answers generated from the cases that matter (punctuation,
articles, yes/no/noanswer, empty strings, unicode, several references), and through the registry as
a run scores an episode. Where ours differs from upstream on purpose (docs/statistics.md), a test
pins the difference, so the docs stay true."""

from __future__ import annotations

from statistics import fmean

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from paper_explorer.corpus.schema import Answer, Question
from paper_explorer.evaluation.answer_metrics import (
    ANSWER_F1,
    EXACT_MATCH,
    HOTPOTQA_F1,
    SUB_EXACT_MATCH_SUBSTRING,
    Answered,
    answer_metric,
)
from paper_explorer.evaluation.answers import exact_match, hotpotqa_f1, normalize_answer, substring_exact_match, token_f1
from tests.evaluation.upstream import longbench, memagent

# Words that exercise the rules: articles (removed), yes/no/noanswer (HotpotQA's decisions), numbers
# inside numbers (substring SubEM), punctuation, unicode that lower() or split() treat specially.
WORDS = [
    "a", "an", "the", "The", "A", "yes", "Yes.", "YES!", "no", "No,", "noanswer", "NoAnswer", "no answer", "unanswerable",
    "Paris", "paris,", "1990", "199", "10", "1", "cat", "concatenate", "BERT", "it's", "U.S.", "co-op", "...", "?!",
    "état", "Ünïcode", "中文", "İstanbul", "ß", "ﬁ", "e\u0301", "😀", "—", "«»", "\u00a0", "\u3000", "",
]  # fmt: skip
SEPARATORS = [" ", "", ", ", ".", "-", "\n", "\t", "  "]
text = st.lists(st.tuples(st.sampled_from(WORDS) | st.text(max_size=5), st.sampled_from(SEPARATORS)), max_size=6).map(
    lambda parts: "".join(word + separator for word, separator in parts)
)
# A benchmark's references: at least one, each a nonempty string (an empty one is no reference: Answer.kind is None)
references = st.lists(text.filter(bool), min_size=1, max_size=4)


def question(refs: list[str], benchmark: str | None = None) -> Question:
    """A benchmark question as the loaders give it: one free-form Answer per reference."""
    answers = tuple(Answer(free_form_answer=ref) for ref in refs)
    return Question(id="q", paper_id="p", text="Q?", answers=answers, benchmark=benchmark)


def scored(name: str, prediction: str, refs: list[str]) -> float:
    """The registry's value of a metric for an episode that submitted ``prediction``, as scoring computes it."""
    return answer_metric(name).score(Answered(prediction=prediction, evidence=[], question=question(refs), decided=True))


def normalises_to_nothing(text: str) -> bool:
    return not normalize_answer(text)


# -- against upstream, generated ----------------------------------------------------------------


@settings(max_examples=1500, deadline=None)
@given(text, text)
@example("yes, it was", "yes")
@example("", "")
@example("The", "a")
def test_token_f1_is_longbench_qa_f1_score(prediction, reference):
    assert token_f1(prediction, reference) == longbench.qa_f1_score(prediction, reference)


@settings(max_examples=1500, deadline=None)
@given(text, text)
@example("yes, it was", "yes")
@example("No!", "no")
@example("noanswer", "no answer")
@example("", "")
def test_hotpotqa_f1_is_memagents(prediction, reference):
    assert hotpotqa_f1(prediction, reference) == memagent.f1_score(prediction, reference)[0]


@settings(max_examples=1500, deadline=None)
@given(text, text)
def test_exact_match_is_memagents(prediction, reference):
    assert exact_match(prediction, reference) == float(memagent.exact_match_score(prediction, reference))


@settings(max_examples=1500, deadline=None)
@given(text, text)
@example("", "10")
@example("the", "the theory")
@example("10", "A")
def test_sub_exact_match_is_memagents_but_for_an_answer_or_reference_that_normalises_to_nothing(prediction, reference):
    ours, theirs = substring_exact_match(prediction, reference), memagent.sub_exact_match_score(prediction, reference)
    if normalises_to_nothing(prediction) or normalises_to_nothing(reference):
        assert ours == 0.0 and theirs is True  # "" is in every string: upstream matches, we do not
    else:
        assert ours == float(theirs)


@settings(max_examples=500, deadline=None)
@given(text, references, st.sampled_from(["narrativeqa", "qasper", "hotpotqa", "2wikimqa", "musique", "multifieldqa_en"]))
def test_a_questions_f1_is_longbenchs_scorer_the_best_over_its_references(prediction, refs, subset):
    """eval.py's scorer on one prediction: round(100 x the best qa_f1_score over the references, 2)."""
    ours = scored(ANSWER_F1, prediction, refs)
    assert round(100 * ours, 2) == longbench.scorer(subset, [prediction], [refs], None)
    assert ours == max(longbench.qa_f1_score(prediction, ref) for ref in refs)


@settings(max_examples=500, deadline=None)
@given(text, references)
def test_a_questions_hotpotqa_metrics_are_memagents_best_over_its_references(prediction, refs):
    """update_answer per reference, keeping the best of each figure (upstream scores answers[0] only)."""
    per_reference = []
    for ref in refs:
        figures = {"f1": 0, "prec": 0, "recall": 0, "em": 0, "sub_em": 0, "total_num": 0}
        memagent.update_answer(figures, prediction, ref)
        per_reference.append(figures)
    assert scored(HOTPOTQA_F1, prediction, refs) == max(f["f1"] for f in per_reference)
    assert scored(EXACT_MATCH, prediction, refs) == max(f["em"] for f in per_reference)
    if not normalises_to_nothing(prediction) and not any(normalises_to_nothing(ref) for ref in refs):
        assert scored(SUB_EXACT_MATCH_SUBSTRING, prediction, refs) == max(float(f["sub_em"]) for f in per_reference)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(text, references), min_size=1, max_size=12))
def test_a_subsets_mean_is_longbenchs_scorer(items):
    """A subset's figure, the mean of its questions' values, is eval.py's scorer over them (before its rounding)."""
    predictions, answers = [p for p, _ in items], [refs for _, refs in items]
    ours = fmean(scored(ANSWER_F1, p, refs) for p, refs in items)
    assert abs(100 * ours - longbench.scorer("hotpotqa", predictions, answers, None)) <= 0.005 + 1e-9


# -- hand-worked ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, reference, f1, hotpot, em, subem",
    [
        ("Paris", "He went to Paris", 0.4, 0.4, 0.0, 1.0),  # 1 of 1 predicted, 1 of 4 gold: 2 x 1 x 0.25 / 1.25
        ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0, 1.0, 1.0),  # case, punctuation and articles normalised away
        ("yes, it was", "yes", 0.5, 0.0, 0.0, 1.0),  # HotpotQA: "yes it was" is not the decision "yes"
        ("Yes.", "yes", 1.0, 1.0, 1.0, 1.0),
        ("no", "Marie Curie", 0.0, 0.0, 0.0, 0.0),
        ("no", "no way", 2 / 3, 0.0, 0.0, 1.0),  # the prediction is a decision the gold is not
        ("noanswer", "no answer", 0.0, 0.0, 0.0, 0.0),  # one token against two
        ("199", "1990", 0.0, 0.0, 0.0, 1.0),  # a character substring: SubEM counts it, F1 does not
        ("Lake Geneva", "Geneva", 2 / 3, 2 / 3, 0.0, 1.0),
        ("", "Paris", 0.0, 0.0, 0.0, 0.0),  # an empty answer: nothing
        ("...", "Paris", 0.0, 0.0, 0.0, 0.0),  # empty after normalisation
    ],
)
def test_hand_worked(prediction, reference, f1, hotpot, em, subem):
    assert token_f1(prediction, reference) == pytest.approx(f1)
    assert hotpotqa_f1(prediction, reference) == pytest.approx(hotpot)
    assert exact_match(prediction, reference) == em
    assert substring_exact_match(prediction, reference) == subem


def test_several_references_keep_the_best_of_each_metric_apart():
    refs = ["a dog", "the hound", "yes"]
    assert scored(EXACT_MATCH, "Hound", refs) == 1.0
    assert scored(ANSWER_F1, "the dog barked", refs) == pytest.approx(2 * 0.5 * 1 / 1.5)  # "dog barked" against "dog"
    assert scored(HOTPOTQA_F1, "yes", refs) == 1.0 and scored(HOTPOTQA_F1, "yes it is", refs) == 0.0
    assert scored(ANSWER_F1, "yes it is", refs) == pytest.approx(0.5)  # LongBench's F1 gives it credit
    assert scored(SUB_EXACT_MATCH_SUBSTRING, "hounds", refs) == 1.0  # "hound" inside "hounds"


# -- where we differ from upstream, on purpose (docs/statistics.md) --------------------------------


def test_an_empty_answer_matches_nothing_where_upstreams_subem_matches_everything():
    for prediction in ("", " ", "the", "?!"):
        assert memagent.sub_exact_match_score(prediction, "Marie Curie") is True
        assert substring_exact_match(prediction, "Marie Curie") == 0.0


def test_a_reference_that_normalises_to_nothing_matches_no_answer_in_our_subem():
    assert memagent.sub_exact_match_score("Marie Curie", "The") is True
    assert substring_exact_match("Marie Curie", "The") == 0.0


def test_upstreams_hotpotqa_evaluation_rounds_each_item_and_scores_the_first_reference_only():
    """ruler_hqa.py scores calc_metrics([pred], [answers[0]]): per item rounded to two decimals, one reference."""
    item = memagent.calc_metrics(["Lake Geneva"], ["Geneva"])
    assert item["f1"] == 0.67 and hotpotqa_f1("Lake Geneva", "Geneva") == pytest.approx(2 / 3)
    assert memagent.calc_metrics(["Hound"], ["a dog"])["em"] == 0 and scored(EXACT_MATCH, "Hound", ["a dog", "the hound"]) == 1.0
