"""Papers, questions and answers: QASPER's data model as frozen pydantic v2 models.

Paragraph addressing. A paragraph is addressed as ``(paper_id, section_index,
paragraph_index)``, where both indices are positions in the *source* file. QASPER papers
contain empty paragraphs; we keep them as ``""`` placeholders inside ``Section.paragraphs``
so that every later index stays equal to the source's, and we never index, search or show
them. ``Corpus.paragraphs()`` yields only the non-empty ones.

Every container is a tuple, so a loaded corpus cannot be mutated by whoever holds it.
"""

from __future__ import annotations

from typing import Annotated, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

T = TypeVar("T")
# Strict everywhere (a "yes" is not a boolean, 1 is not a string), except that a JSON list
# may become one of our tuples.
Items = Annotated[tuple[T, ...], Field(strict=False)]

FIGURE_EVIDENCE_PREFIX = "FLOAT SELECTED"  # evidence that quotes a figure or table, not a paragraph (QASPER's)
AnswerKind = Literal["extractive", "abstractive", "boolean", "none"]
Split = Literal["train", "validation", "test"]
# The longest paper id the tools take (read, search and extract refuse a longer paper_id), so the
# longest a corpus may hold: a paper with a longer id could be found by search but never read or cited.
PAPER_ID_CHARS = 200


def _absent(value: object) -> bool:
    """Fields added after corpora were hashed are left out of a record's JSON while unset, so every
    earlier corpus, questions file and export keeps its bytes and its SHA-256."""
    return value is None


class Record(BaseModel):
    # A field's docstring is its description in ``explorer schema`` (the questions file's documentation).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True)


class Answer(Record):
    """One annotator's answer, with QASPER's own field names. Give it one kind: extractive_spans,
    free_form_answer, yes_no, or unanswerable (checked in that order when more are set)."""

    unanswerable: bool = False
    """True: the paper does not answer the question (the agent should abstain)."""
    extractive_spans: Items[str] = ()
    """Extractive: the answer as spans copied exactly from the paper."""
    yes_no: bool | None = None
    """Yes/no: true or false."""
    free_form_answer: str = ""
    """Free-form (QASPER's abstractive): the answer in your own words."""
    evidence: Items[str] = ()
    """Paragraphs of the paper that support the answer, each quoted whole and exactly (Evidence-F1 compares strings); "FLOAT SELECTED: ..." quotes a figure or table."""
    highlighted_evidence: Items[str] = ()
    """QASPER's annotators' highlighted sentences; optional."""
    annotation_id: str | None = None
    """Optional: an id for this annotation."""
    worker_id: str | None = None
    """Optional: who wrote this answer."""

    @property
    def kind(self) -> AnswerKind | None:
        """The answer type as QASPER's official evaluator decides it; None if empty."""
        if self.unanswerable:
            return "none"
        if self.extractive_spans:
            return "extractive"
        if self.free_form_answer:
            return "abstractive"
        if self.yes_no is not None:
            return "boolean"
        return None

    @property
    def reference_text(self) -> str | None:
        """The reference string QASPER's evaluator scores against; None if empty."""
        kind = self.kind
        if kind == "none":
            return "Unanswerable"
        if kind == "extractive":
            return ", ".join(self.extractive_spans)
        if kind == "abstractive":
            return self.free_form_answer
        if kind == "boolean":
            return "Yes" if self.yes_no else "No"
        return None


class Question(Record):
    """A question about one paper and its gold answers: one line of a questions file (JSONL)."""

    id: str = Field(min_length=1)
    """Unique in the file, e.g. the paper's id and -q1."""
    paper_id: str = Field(min_length=1)
    """The id of a paper of the corpus."""
    text: str = Field(min_length=1)
    """The question, as the agent will read it."""
    answers: Items[Answer] = ()
    """One answer per annotator (one is enough); a question with none that says anything is refused at load."""
    # QASPER's metadata about how the question was written; kept so an export round-trips.
    question_writer: str = ""
    """Optional: QASPER's metadata about how the question was written (as are the four fields after it)."""
    nlp_background: str = ""
    topic_background: str = ""
    paper_read: str = ""
    search_query: str = ""
    benchmark: str | None = Field(None, min_length=1, pattern=r"^[a-z0-9][a-z0-9_.-]*/[a-z0-9][a-z0-9_.-]*$", exclude_if=_absent)
    """Optional: the benchmark and subset it comes from, as benchmark/subset (longbench/hotpotqa,
    memagent/hotpotqa); its metrics follow that benchmark's rules and runs table it apart."""

    @property
    def answerable(self) -> bool:
        """The one rule, QASPER's: answerable when some annotator gave an answer. An annotation with
        no answer of any kind counts for neither side (the loader reports it as ``empty_answer``)."""
        return any(answer.kind not in (None, "none") for answer in self.answers)


class Figure(Record):
    caption: str
    file: str = ""


class Section(Record):
    name: str | None
    paragraphs: Items[str]


class Paper(Record):
    id: str = Field(min_length=1, max_length=PAPER_ID_CHARS)
    title: str
    abstract: str = ""
    sections: Items[Section] = ()
    figures_and_tables: Items[Figure] = ()
    split: Split | None = None
    context: str | None = Field(None, exclude_if=_absent)
    """Optional: the text exactly as a long-context benchmark gives it with one question (LongBench's
    and MemAgent's ``context``). Such a paper is that question's own document set: the code agent's
    tools show its questions only it, no other question sees it, and the memory reader can read
    these characters' tokens as they are (``document = "verbatim"``). Its sections hold the same
    text split for search and read."""

    @property
    def own_documents(self) -> bool:
        """Whether the paper is its questions' own document set (it holds a benchmark's context)."""
        return self.context is not None

    @field_validator("id")
    @classmethod
    def _one_line_id(cls, identifier: str) -> str:
        """An id is written into outlines, headings and actions as it is: no line break, tab or
        control character may split or hide it (a space may stand in one)."""
        odd = next((c for c in identifier if (c.isspace() and c != " ") or not c.isprintable()), None)
        if odd is not None:
            raise ValueError(f"paper id {identifier!r} holds {odd!r}: write ids without line breaks, tabs or control characters")
        return identifier


class Paragraph(NamedTuple):
    """One indexed (non-empty) paragraph and its address."""

    paper_id: str
    section_index: int
    paragraph_index: int
    text: str
