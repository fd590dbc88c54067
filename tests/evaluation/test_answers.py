"""QASPER answer metrics on hand-worked examples."""

import pytest

from paper_explorer.corpus.schema import Answer, Question
from paper_explorer.evaluation.answers import ABSTENTION, best_over_references, exact_match, normalize_answer, token_f1


def question(*answers: Answer) -> Question:
    return Question(id="q", paper_id="p", text="?", answers=answers)


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces():
    assert normalize_answer("  The  BERT-base, an   encoder! ") == "bertbase encoder"
    assert normalize_answer("") == ""


@pytest.mark.parametrize(
    "prediction, reference, f1",
    [
        ("3e-5", "3e-5", 1.0),
        ("a learning rate of 3e-5", "3e-5", 2 * (1 / 4) * 1 / (1 / 4 + 1)),  # "a" is an article: 4 tokens remain
        ("SQuAD, NewsQA and HotpotQA", "SQuAD, NewsQA, HotpotQA", 2 * (3 / 4) * 1 / (3 / 4 + 1)),
        ("", "3e-5", 0.0),
        ("the", "a", 0.0),  # both normalise to nothing: no common token
        ("Yes", "No", 0.0),
    ],
)
def test_token_f1(prediction, reference, f1):
    assert token_f1(prediction, reference) == pytest.approx(f1)


def test_best_over_annotators_who_disagree_about_answerability():
    disagreeing = question(Answer(unanswerable=True), Answer(extractive_spans=("AdamW",)))
    assert best_over_references(token_f1, ABSTENTION, disagreeing) == 1.0
    assert best_over_references(token_f1, "AdamW", disagreeing) == 1.0
    assert best_over_references(exact_match, "the AdamW.", disagreeing) == 1.0
    assert disagreeing.answerable
    assert not question(Answer(unanswerable=True)).answerable


def test_references_follow_qasper_answer_kinds():
    assert best_over_references(exact_match, "No", question(Answer(yes_no=False))) == 1.0
    free = question(Answer(free_form_answer="By 2.3 F1 points over BERT."))
    assert best_over_references(token_f1, "2.3 F1 points", free) == pytest.approx(2 * 1 * 0.5 / 1.5)  # "by 23 f1 points over bert": 3 of 6
    assert best_over_references(token_f1, "x", question()) == 0.0


from paper_explorer.evaluation.answers import answer_and_evidence_f1, paragraph_f1, sub_exact_match  # noqa: E402


@pytest.mark.parametrize(
    "prediction, reference, score",
    [
        ("3e-5", "a learning rate of 3e-5", 1.0),  # inside the reference
        ("We use a learning rate of 3e-5.", "3e-5", 1.0),  # holds the reference
        ("1", "10 layers", 0.0),  # whole tokens only
        ("", "3e-5", 0.0),
        ("the", "3e-5", 0.0),  # empty after normalisation
        ("3e-5", "", 0.0),
        ("AdamW", "SGD", 0.0),
    ],
)
def test_sub_exact_match(prediction, reference, score):
    assert sub_exact_match(prediction, reference) == score


def test_paragraph_f1_follows_the_official_evaluator():
    assert paragraph_f1([], []) == 1.0  # unanswerable, nothing cited
    assert paragraph_f1(["p1"], []) == 0.0
    assert paragraph_f1(["p1", "p2"], ["p1"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert paragraph_f1(["p1", "p1"], ["p1"]) == pytest.approx(2 * 0.5 * 1 / 1.5)  # duplicates count in precision


def test_evidence_f1_is_the_best_over_annotators_in_both_float_selected_modes():
    q = question(
        Answer(extractive_spans=("AdamW",), evidence=("FLOAT SELECTED: Table 2", "We train with AdamW.")),
        Answer(extractive_spans=("SGD",), evidence=("We also tried SGD.",)),
    )
    assert answer_and_evidence_f1("AdamW", ["We train with AdamW."], q) == pytest.approx((1.0, 2 / 3, "extractive"))
    assert answer_and_evidence_f1("AdamW", ["We train with AdamW."], q, text_evidence_only=True) == (1.0, 1.0, "extractive")
    # as the official evaluator: evidence F1 is maximised over annotators independently of the answer
    assert answer_and_evidence_f1("AdamW", ["We also tried SGD."], q)[1] == 1.0
    assert answer_and_evidence_f1("Unanswerable", [], question(Answer(unanswerable=True))) == (1.0, 1.0, "none")


def test_f1_by_type_files_the_score_under_the_best_matching_annotators_type():
    disagreeing = question(Answer(unanswerable=True), Answer(extractive_spans=("AdamW",)))
    assert answer_and_evidence_f1("AdamW", [], disagreeing)[2] == "extractive"
    assert answer_and_evidence_f1("Unanswerable", [], disagreeing)[2] == "none"
