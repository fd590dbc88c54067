"""QASPER answer metrics on hand-worked examples."""

import pytest

from corpus.schema import Answer, Question
from evaluation.answers import ABSTENTION, best_over_references, exact_match, is_answerable, normalize_answer, token_f1


def question(*answers: Answer) -> Question:
    return Question(id="q", paper_id="p", text="?", answers=answers)


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces():
    assert normalize_answer("  The  BERT-base, an   encoder! ") == "bertbase encoder"
    assert normalize_answer("") == ""


@pytest.mark.parametrize("prediction, reference, f1", [
    ("3e-5", "3e-5", 1.0),
    ("a learning rate of 3e-5", "3e-5", 2 * (1 / 4) * 1 / (1 / 4 + 1)),  # "a" is an article: 4 tokens remain
    ("SQuAD, NewsQA and HotpotQA", "SQuAD, NewsQA, HotpotQA", 2 * (3 / 4) * 1 / (3 / 4 + 1)),
    ("", "3e-5", 0.0),
    ("the", "a", 0.0),  # both normalise to nothing: no common token
    ("Yes", "No", 0.0),
])
def test_token_f1(prediction, reference, f1):
    assert token_f1(prediction, reference) == pytest.approx(f1)


def test_best_over_annotators_who_disagree_about_answerability():
    disagreeing = question(Answer(unanswerable=True), Answer(extractive_spans=("AdamW",)))
    assert best_over_references(token_f1, ABSTENTION, disagreeing) == 1.0
    assert best_over_references(token_f1, "AdamW", disagreeing) == 1.0
    assert best_over_references(exact_match, "the AdamW.", disagreeing) == 1.0
    assert is_answerable(disagreeing)
    assert not is_answerable(question(Answer(unanswerable=True)))


def test_references_follow_qasper_answer_kinds():
    assert best_over_references(exact_match, "No", question(Answer(yes_no=False))) == 1.0
    free = question(Answer(free_form_answer="By 2.3 F1 points over BERT."))
    assert best_over_references(token_f1, "2.3 F1 points", free) == pytest.approx(2 * 1 * 0.5 / 1.5)  # "by 23 f1 points over bert": 3 of 6
    assert best_over_references(token_f1, "x", question()) == 0.0
