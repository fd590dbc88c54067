"""What a loaded question's gold says about itself, checked against its paper: a question whose
answers say nothing (refused in our own formats, warned about in QASPER's), an annotation with no
answer of any kind, and evidence that quotes no paragraph of the paper."""

from __future__ import annotations

from collections.abc import Iterable

from paper_explorer.corpus.errors import CorpusError, LoadWarning
from paper_explorer.corpus.schema import FIGURE_EVIDENCE_PREFIX, Paper, Question


def gold_warnings(file: str, place: str, paper: Paper, question: Question, official: bool) -> Iterable[LoadWarning]:
    """A question whose answers say nothing: refused (our formats), or warned about (QASPER's)."""
    if any(answer.kind is not None for answer in question.answers):
        return
    if not official:
        raise CorpusError(
            f"{place}: question {question.id!r} {_no_gold(question)}; give it at least one answer "
            "(extractive_spans, free_form_answer, yes_no, or unanswerable: true; "
            "`explorer schema question` shows the format), or delete it"
        )
    detail = f"question {question.id!r} {_no_gold(question)}; it scores as a missed abstention"
    yield LoadWarning("no_gold_answer", file, paper.id, detail, place, question.id)


def _no_gold(question: Question) -> str:
    if not question.answers:
        return "has no answers"
    return "has only empty answers" if len(question.answers) > 1 else "has an empty answer"


def evidence_warnings(file: str, place: str, paper: Paper, question: Question) -> Iterable[LoadWarning]:
    """Evidence must quote a paragraph of its own paper exactly (QASPER's Evidence-F1 compares
    strings); quotes of figures and tables ("FLOAT SELECTED: ...") are a separate, legal kind."""
    paragraphs = {text for section in paper.sections for text in section.paragraphs if text}
    has_gold = any(answer.kind is not None for answer in question.answers)  # else reported once, as no_gold_answer
    for index, answer in enumerate(question.answers):
        if answer.kind is None and has_gold:
            yield LoadWarning(
                "empty_answer", file, paper.id, f"question {question.id!r} answer {index} has no answer of any kind", place, question.id
            )
        for text in answer.evidence:
            if text not in paragraphs and not text.startswith(FIGURE_EVIDENCE_PREFIX):
                shown = text if len(text) <= 50 else text[:47] + "..."
                yield LoadWarning(
                    "evidence_not_a_paragraph",
                    file,
                    paper.id,
                    f"question {question.id!r} answer {index}: evidence {shown!r} is not a paragraph of the paper",
                    place,
                    question.id,
                )
