"""Your own questions: the questions file (``--questions``), its templates, and its check.

The format (``explorer schema question``): JSON lines, UTF-8, one ``corpus.Question`` per line::

    {"id": "p1-q1", "paper_id": "p1", "text": "What does X use?", "answers": [ANSWER, ...]}

Each ANSWER is one annotator's answer (one is enough) of one kind, with QASPER's field names:

    extractive   {"extractive_spans": ["words copied from the paper"], "evidence": ["<paragraph>"]}
    free-form    {"free_form_answer": "the answer in your words", "evidence": ["<paragraph>"]}
    yes/no       {"yes_no": true, "evidence": ["<paragraph>"]}
    unanswerable {"unanswerable": true}

Evidence quotes whole paragraphs of the paper, exactly as the corpus holds them (QASPER's
Evidence-F1 compares strings). The file replaces the corpus's own questions
(``explorer eval --corpus PAPERS --questions FILE``).

What is protected: a template (``explorer questions init``) cannot be run by accident - a line
that still holds a ``<<FILL IN ...>>`` placeholder or its ``template`` help is refused at load
with its file and line; a question with no answer that says anything is refused at load
(``corpus.loading``); ``check_questions`` also refuses evidence that is not a paragraph of the
paper (at load that is only a warning, because QASPER's own data holds some).
What is not: whether an answer is right; placeholders spelled differently from ``<<FILL IN``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.errors import CorpusError, LoadWarning, format_location
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.schema import FIGURE_EVIDENCE_PREFIX, Paper

PLACEHOLDER = "<<FILL IN"
TEMPLATE_FIELD = "template"
HOW_TO = (
    "Write the question in text and its answers in answers, then delete this template field. Each answer is one "
    "annotator's, of one kind: copy one of answer_examples and edit it. Extractive spans and evidence are copied "
    "exactly from the paper, and evidence is a whole paragraph (explorer corpus search --paper-id finds it). "
    "More questions about this paper: copy the line and give each its own id. None: delete the line. "
    "Then: explorer questions check FILE --corpus PAPERS."
)


def fill_in(what: str) -> str:
    return f"{PLACEHOLDER}: {what}>>"


# --- templates -------------------------------------------------------------------------------


def template_record(paper: Paper) -> dict:
    """One question to write about ``paper``: placeholders to fill, and an example of each answer
    kind taken from the paper's first paragraph (so the examples show what "copied exactly" means)."""
    paragraph = next((text for section in paper.sections for text in section.paragraphs if text), None)
    evidence = [paragraph] if paragraph else []
    span = " ".join(paragraph.split(" ")[:8]) if paragraph else fill_in("words copied from the paper")
    return {
        "id": f"{paper.id}-q1",
        "paper_id": paper.id,
        "text": fill_in("a question a reader of this paper might ask"),
        "answers": [
            {
                "extractive_spans": [fill_in("words copied from the paper that answer it")],
                "evidence": [fill_in("the whole paragraph they are in, copied exactly")],
            }
        ],
        TEMPLATE_FIELD: {
            "paper_title": paper.title,
            "how_to": HOW_TO,
            "answer_examples": {
                "extractive": {"extractive_spans": [span], "evidence": evidence},
                "free_form": {"free_form_answer": fill_in("the answer in your own words"), "evidence": evidence},
                "yes_no": {"yes_no": True, "evidence": evidence},
                "unanswerable": {"unanswerable": True},
            },
        },
    }


def template_lines(corpus: Corpus) -> Iterator[str]:
    import json

    for paper in corpus.papers:
        yield json.dumps(template_record(paper), ensure_ascii=False) + "\n"


def write_template(corpus: Corpus, path: str | os.PathLike) -> int:
    """Start a questions file for ``corpus``: one template line per paper; never over a file
    (it may hold questions someone wrote). Returns the number of lines written."""
    path = Path(path)
    if path.exists():
        raise CorpusError(
            f"{path}: already exists; a questions file is never overwritten (it may hold your questions): "
            "name another --out, or delete it first"
        )
    if not corpus.papers:
        raise CorpusError("the corpus holds no papers; there is nothing to write questions about")
    with atomic_file(path) as handle:
        handle.writelines(template_lines(corpus))
    return len(corpus.papers)


def refuse_unfilled(place: str, value: dict) -> None:
    """Refuse a line of a questions file that is still (part of) a template, in one line."""
    asked = {key: item for key, item in value.items() if key != TEMPLATE_FIELD}
    field = _first_placeholder(asked, ())
    who = _naming(value)
    if field is not None:
        raise CorpusError(
            f"{place}: {who} is an unfilled template ({field} still says {PLACEHOLDER} ...>>); "
            f"fill it in and delete its {TEMPLATE_FIELD!r} field, or delete the line"
        )
    if TEMPLATE_FIELD in value:
        raise CorpusError(
            f"{place}: {who} still has its {TEMPLATE_FIELD!r} field (the template's help); "
            "delete that field once the question and answers are filled in, or delete the line"
        )


def _first_placeholder(value: object, loc: tuple) -> str | None:
    if isinstance(value, str):
        return format_location(loc) if PLACEHOLDER in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_placeholder(item, (*loc, key))
        if found is not None:
            return found
    return None


def _naming(value: dict) -> str:
    question_id, paper_id = value.get("id"), value.get("paper_id")
    named = f"question {question_id!r}" if isinstance(question_id, str) else "the question"
    return f"{named} (paper {paper_id!r})" if isinstance(paper_id, str) else named


# --- the check -------------------------------------------------------------------------------


class QuestionsSummary(BaseModel):
    """What ``explorer questions check`` reports about a questions file that passed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    questions: int
    papers: int  # in the corpus
    papers_with_questions: int
    answerable_questions: int
    unanswerable_questions: int
    answers: int  # one per annotator and question
    answer_kinds: dict[str, int]  # extractive, abstractive (free-form), boolean (yes/no), none (unanswerable)
    questions_per_paper: dict[str, int]  # every paper of the corpus, 0 where it has none
    questions_sha256: str  # what a run's manifest records for this question set


def check_questions(corpus: Corpus) -> QuestionsSummary:
    """The summary of a corpus loaded with a questions file, or CorpusError naming the first
    problem a load only warns about (evidence that is not a paragraph, an empty answer)."""
    for warning in corpus.warnings:
        raise CorpusError(_problem(corpus, warning))
    per_paper = Counter(question.paper_id for question in corpus.questions)
    kinds = Counter(answer.kind or "empty" for question in corpus.questions for answer in question.answers)
    return QuestionsSummary(
        questions=len(corpus.questions),
        papers=len(corpus.papers),
        papers_with_questions=len(per_paper),
        answerable_questions=sum(1 for question in corpus.questions if question.answerable),
        unanswerable_questions=sum(1 for question in corpus.questions if not question.answerable),
        answers=sum(kinds.values()),
        answer_kinds=dict(sorted(kinds.items())),
        questions_per_paper={paper.id: per_paper.get(paper.id, 0) for paper in corpus.papers},
        questions_sha256=corpus.questions_sha256,
    )


def _problem(corpus: Corpus, warning: LoadWarning) -> str:
    place = warning.place or f"{warning.file}: paper {warning.paper_id!r}"
    if warning.kind != "evidence_not_a_paragraph":
        return f"{place}: {warning.detail}; give the answer a kind, or delete it"
    paper = corpus.paper(warning.paper_id)
    paragraphs = {text for section in paper.sections for text in section.paragraphs if text}
    (question,) = (question for question in corpus.questions if question.id == warning.question_id)
    quoted = next(
        text
        for answer in question.answers
        for text in answer.evidence
        if text not in paragraphs and not text.startswith(FIGURE_EVIDENCE_PREFIX)
    )
    return f"{place}: {warning.detail}; {_evidence_hint(paper, quoted)}"


def _evidence_hint(paper: Paper, quoted: str) -> str:
    """What to do about evidence that is not a paragraph, said with where it nearly is."""
    squeezed = " ".join(quoted.split())
    for section_index, section in enumerate(paper.sections):
        for paragraph_index, text in enumerate(section.paragraphs):
            where = f"section {section_index} paragraph {paragraph_index}"
            if text and " ".join(text.split()) == squeezed:
                return f"it differs from {where} only in spaces or line breaks: copy that paragraph from the corpus file"
            if text and quoted in text:
                return f"it is part of {where}: evidence quotes the whole paragraph"
    return f"quote a whole paragraph of the paper, exactly (explorer corpus search WORDS --paper-id {paper.id} shows them)"
