"""QASPER's two published layouts, validated as they stand in the file, then turned into ours.

* v0.3 JSON (the official release files ``qasper-{train,dev,test}-v0.3.json``): one object
  keyed by paper id; each paper has ``full_text`` as a list of ``{section_name, paragraphs}``
  and ``qas`` as a list of questions whose ``answers`` wrap each annotation in ``answer``.
* The Hugging Face ``allenai/qasper`` layout, as exported with ``Dataset.to_json`` (JSONL) or as
  a JSON list of rows: the same content stored column-wise (``full_text.section_name[i]`` goes
  with ``full_text.paragraphs[i]``, ``qas.question[j]`` with ``qas.answers[j]``).

Validating the raw layout first means a type error is reported with the field path the user
sees in their own file (``qas[3].answers[0].answer.yes_no``), not in our schema.

Whitespace-only paragraphs become ``""`` placeholders (see ``corpus.schema``); no other text is
changed, because QASPER's evidence strings must match paragraphs exactly.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from paper_explorer.corpus.schema import Answer, Figure, Paper, Question, Section


def _none_as_empty(value):
    return "" if value is None else value


OptionalText = Annotated[str, BeforeValidator(_none_as_empty)]


class Raw(BaseModel):
    # Unknown keys are QASPER's business (it has added fields before); types are ours.
    model_config = ConfigDict(extra="ignore", strict=True)


class RawAnswerInfo(Raw):
    unanswerable: bool = False
    extractive_spans: list[str] = []
    yes_no: bool | None = None
    free_form_answer: OptionalText = ""
    evidence: list[str] = []
    highlighted_evidence: list[str] = []

    def to_answer(self, annotation_id: str | None, worker_id: str | None) -> Answer:
        return Answer(
            unanswerable=self.unanswerable,
            extractive_spans=tuple(self.extractive_spans),
            yes_no=self.yes_no,
            free_form_answer=self.free_form_answer,
            evidence=tuple(self.evidence),
            highlighted_evidence=tuple(self.highlighted_evidence),
            annotation_id=annotation_id,
            worker_id=worker_id,
        )


class RawAnswer(Raw):
    answer: RawAnswerInfo
    annotation_id: str | None = None
    worker_id: str | None = None


class RawQuestion(Raw):
    question: str
    question_id: str
    answers: list[RawAnswer] = []
    question_writer: OptionalText = ""
    nlp_background: OptionalText = ""
    topic_background: OptionalText = ""
    paper_read: OptionalText = ""
    search_query: OptionalText = ""


class RawSection(Raw):
    section_name: str | None = None
    paragraphs: list[str]


class RawFigure(Raw):
    caption: OptionalText = ""
    file: OptionalText = ""


class RawQasperPaper(Raw):
    title: str
    abstract: OptionalText = ""
    full_text: list[RawSection]
    qas: list[RawQuestion] = []
    figures_and_tables: list[RawFigure] = []


def _paragraph(text: str) -> str:
    return text if text.strip() else ""


def _question(paper_id: str, raw: RawQuestion, answers: tuple[Answer, ...]) -> Question:
    return Question(
        id=raw.question_id,
        paper_id=paper_id,
        text=raw.question,
        answers=answers,
        question_writer=raw.question_writer,
        nlp_background=raw.nlp_background,
        topic_background=raw.topic_background,
        paper_read=raw.paper_read,
        search_query=raw.search_query,
    )


def from_qasper_v03(paper_id: str, raw: RawQasperPaper) -> tuple[Paper, list[Question]]:
    paper = Paper(
        id=paper_id,
        title=raw.title,
        abstract=raw.abstract,
        sections=tuple(Section(name=s.section_name, paragraphs=tuple(_paragraph(p) for p in s.paragraphs)) for s in raw.full_text),
        figures_and_tables=tuple(Figure(caption=f.caption, file=f.file) for f in raw.figures_and_tables),
    )
    questions = [_question(paper_id, qa, tuple(a.answer.to_answer(a.annotation_id, a.worker_id) for a in qa.answers)) for qa in raw.qas]
    return paper, questions


def _same_lengths(owner: str, columns: dict[str, list]) -> None:
    lengths = {name: len(values) for name, values in columns.items() if values is not None}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"the columns of {owner} must have equal lengths: {shown}")


class RawHfFullText(Raw):
    section_name: list[str | None]
    paragraphs: list[list[str]]

    @model_validator(mode="after")
    def _columns_align(self):
        _same_lengths("full_text", {"section_name": self.section_name, "paragraphs": self.paragraphs})
        return self


class RawHfAnswers(Raw):
    answer: list[RawAnswerInfo]
    annotation_id: list[str | None] = []
    worker_id: list[str | None] = []

    @model_validator(mode="after")
    def _columns_align(self):
        _same_lengths(
            "answers",
            {
                "answer": self.answer,
                "annotation_id": self.annotation_id or None,
                "worker_id": self.worker_id or None,
            },
        )
        return self


class RawHfQas(Raw):
    question: list[str]
    question_id: list[str]
    answers: list[RawHfAnswers]
    question_writer: list[OptionalText] = []
    nlp_background: list[OptionalText] = []
    topic_background: list[OptionalText] = []
    paper_read: list[OptionalText] = []
    search_query: list[OptionalText] = []

    @model_validator(mode="after")
    def _columns_align(self):
        optional = ("question_writer", "nlp_background", "topic_background", "paper_read", "search_query")
        columns = {"question": self.question, "question_id": self.question_id, "answers": self.answers}
        columns.update({name: getattr(self, name) or None for name in optional})
        _same_lengths("qas", columns)
        return self


class RawHfFigures(Raw):
    caption: list[OptionalText] = []
    file: list[OptionalText] = []


class RawHfRow(Raw):
    id: str
    title: str
    abstract: OptionalText = ""
    full_text: RawHfFullText
    qas: RawHfQas = RawHfQas(question=[], question_id=[], answers=[])
    figures_and_tables: RawHfFigures = RawHfFigures()


def from_hf_row(row: RawHfRow) -> tuple[Paper, list[Question]]:
    """The column layout rewritten as v0.3 rows, so both layouts share one conversion."""
    qas = row.qas

    def column(values: list[str], index: int) -> str:
        return values[index] if values else ""

    v03 = RawQasperPaper.model_construct(
        title=row.title,
        abstract=row.abstract,
        full_text=[
            RawSection.model_construct(section_name=name, paragraphs=paragraphs)
            for name, paragraphs in zip(row.full_text.section_name, row.full_text.paragraphs)
        ],
        qas=[
            RawQuestion.model_construct(
                question=qas.question[j],
                question_id=qas.question_id[j],
                answers=[
                    RawAnswer.model_construct(
                        answer=info,
                        annotation_id=answers.annotation_id[i] if answers.annotation_id else None,
                        worker_id=answers.worker_id[i] if answers.worker_id else None,
                    )
                    for i, info in enumerate(answers.answer)
                ],
                question_writer=column(qas.question_writer, j),
                nlp_background=column(qas.nlp_background, j),
                topic_background=column(qas.topic_background, j),
                paper_read=column(qas.paper_read, j),
                search_query=column(qas.search_query, j),
            )
            for j, answers in enumerate(qas.answers)
        ],
        figures_and_tables=[
            RawFigure.model_construct(caption=caption, file=column(row.figures_and_tables.file, i))
            for i, caption in enumerate(row.figures_and_tables.caption)
        ],
    )
    return from_qasper_v03(row.id, v03)


def to_qasper_v03(paper: Paper, questions: list[Question]) -> dict:
    """One paper in the official v0.3 layout (the inverse of ``from_qasper_v03``)."""
    return {
        "title": paper.title,
        "abstract": paper.abstract,
        "full_text": [{"section_name": s.name, "paragraphs": list(s.paragraphs)} for s in paper.sections],
        "qas": [
            {
                "question": q.text,
                "question_id": q.id,
                "question_writer": q.question_writer,
                "nlp_background": q.nlp_background,
                "topic_background": q.topic_background,
                "paper_read": q.paper_read,
                "search_query": q.search_query,
                "answers": [
                    {
                        "answer": {
                            "unanswerable": a.unanswerable,
                            "extractive_spans": list(a.extractive_spans),
                            "yes_no": a.yes_no,
                            "free_form_answer": a.free_form_answer,
                            "evidence": list(a.evidence),
                            "highlighted_evidence": list(a.highlighted_evidence),
                        },
                        "annotation_id": a.annotation_id,
                        "worker_id": a.worker_id,
                    }
                    for a in q.answers
                ],
            }
            for q in questions
        ],
        "figures_and_tables": [{"caption": f.caption, "file": f.file} for f in paper.figures_and_tables],
    }
