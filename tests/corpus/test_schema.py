import pytest
from pydantic import ValidationError

from paper_explorer.corpus import Answer, Question


@pytest.mark.parametrize(
    ("answer", "kind", "reference"),
    [
        (Answer(unanswerable=True, extractive_spans=("ignored",)), "none", "Unanswerable"),
        (Answer(extractive_spans=("CoNLL", "WNUT")), "extractive", "CoNLL, WNUT"),
        (Answer(free_form_answer="about a third", yes_no=True), "abstractive", "about a third"),
        (Answer(yes_no=True), "boolean", "Yes"),
        (Answer(yes_no=False), "boolean", "No"),
        (Answer(), None, None),
    ],
)
def test_answer_kind_follows_the_official_evaluator_precedence(answer, kind, reference):
    # unanswerable > extractive spans > free form > yes/no, as in qasper_evaluator.py
    assert answer.kind == kind
    assert answer.reference_text == reference


def test_question_is_answerable_unless_every_annotator_says_unanswerable():
    both = Question(id="q", paper_id="p", text="t", answers=(Answer(unanswerable=True), Answer(yes_no=False)))
    none = Question(id="q", paper_id="p", text="t", answers=(Answer(unanswerable=True),))
    assert both.answerable and not none.answerable


def test_an_annotation_with_no_answer_counts_for_neither_side():
    """The seed's two rules disagreed here: stats counted it answerable, eval and sft did not."""
    empty = Question(id="q", paper_id="p", text="t", answers=(Answer(),))
    with_abstention = Question(id="q", paper_id="p", text="t", answers=(Answer(), Answer(unanswerable=True)))
    assert not empty.answerable and not with_abstention.answerable


@pytest.mark.parametrize(("field", "value"), [("yes_no", "yes"), ("unanswerable", 1), ("extractive_spans", "CoNLL")])
def test_types_are_strict(field, value):
    with pytest.raises(ValidationError):
        Answer(**{field: value})


def test_records_are_immutable():
    answer = Answer(extractive_spans=["a"])
    assert answer.extractive_spans == ("a",)
    with pytest.raises(ValidationError):
        answer.yes_no = True
