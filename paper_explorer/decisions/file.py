"""Reading a typed decision file (``decisions.schema``): every line checked, every cross-reference
resolved, each problem one ``DecisionError`` line naming the file, the line and the fix.

A document given as ``paper`` is read from a corpus: its benchmark context verbatim where it has
one, else its title, abstract and sections as headed plain text (``paper_text``). Nothing is cut
here: what does not fit a model's context is the scorer's to refuse or, when asked, cut and say so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import paper_explorer.corpus.jsonl as jsonl
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.schema import Paper
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.schema import DOCUMENT_CHARS, DecisionDocument, DecisionQuestion, too_long


@dataclass(frozen=True)
class Asked:
    """One question with the text of its document, ready to score."""

    question: DecisionQuestion
    document_id: str
    document: str
    line: int  # the file's line it is on (1-based)


@dataclass(frozen=True)
class DecisionSet:
    path: Path
    sha256: str  # of the file's bytes
    asked: list[Asked]

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.asked:
            counts[item.question.kind] = counts.get(item.question.kind, 0) + 1
        return counts


def paper_text(paper: Paper) -> str:
    """A corpus paper as one text: its benchmark context as given, else title, abstract and each
    section under its name, paragraphs separated by blank lines."""
    if paper.context is not None:
        return paper.context
    parts = [paper.title.strip()]
    if paper.abstract.strip():
        parts.append(paper.abstract.strip())
    for section in paper.sections:
        body = "\n\n".join(paragraph.strip() for paragraph in section.paragraphs if paragraph.strip())
        heading = f"## {section.name.strip()}" if section.name and section.name.strip() else ""
        parts.append("\n\n".join(part for part in (heading, body) if part))
    return "\n\n".join(part for part in parts if part)


def load_decisions(path: Path, corpus: Corpus | None = None) -> DecisionSet:
    """The questions of the file at ``path``, in file order, each with its document's text."""
    try:
        data = jsonl.read_bytes(path, "typed decision file")
    except FileNotFoundError:
        raise DecisionError(f"{path}: no such decision file; write one as docs/decisions.md shows (explorer schema decision)") from None
    except jsonl.JsonLinesError as error:  # a directory, a FIFO, a binary file, one over the size limit
        raise DecisionError(str(error)) from None
    lines = jsonl.every_line(data)
    if not lines:
        raise DecisionError(f"{path}: holds no document; write one JSON object per line (explorer schema decision)")
    documents: list[tuple[int, DecisionDocument]] = []
    for line in lines:
        try:
            documents.append((line.number, jsonl.parse(path, line, DecisionDocument, "typed decision document")))
        except jsonl.JsonLinesError as error:
            raise DecisionError(str(error)) from None
    return DecisionSet(path, hashlib.sha256(data).hexdigest(), _resolved(path, documents, corpus))


def _resolved(path: Path, documents: list[tuple[int, DecisionDocument]], corpus: Corpus | None) -> list[Asked]:
    document_lines: dict[str, int] = {}
    question_lines: dict[str, tuple[int, DecisionQuestion, str]] = {}
    for number, document in documents:
        if document.id in document_lines:
            raise DecisionError(
                f"{path}:{number}: document id {document.id!r} is also on line {document_lines[document.id]}; give each document its own id"
            )
        document_lines[document.id] = number
        for question in document.questions:
            if question.id in question_lines:
                raise DecisionError(
                    f"{path}:{number}: question id {question.id!r} is also on line {question_lines[question.id][0]}; question ids are unique across the file"
                )
            question_lines[question.id] = (number, question, document.id)
    for number, question, document_id in question_lines.values():
        if question.negation_of is None:
            continue
        negated = question_lines.get(question.negation_of)
        if negated is None or negated[2] != document_id or negated[1].kind != "noul":
            raise DecisionError(
                f"{path}:{number}: question {question.id!r} negates {question.negation_of!r}, which is no noul question of document {document_id!r}"
            )
    asked: list[Asked] = []
    for number, document in documents:
        text = document.own_text()
        if text is None:
            text = paper_text(_paper(path, number, document, corpus))
            if len(text) > DOCUMENT_CHARS:
                raise DecisionError(f"{path}:{number}: document {document.id!r}, paper {document.paper!r}: {too_long(len(text))}")
        asked.extend(Asked(question, document.id, text, number) for question in document.questions)
    return asked


def _paper(path: Path, number: int, document: DecisionDocument, corpus: Corpus | None) -> Paper:
    if corpus is None:
        raise DecisionError(
            f"{path}:{number}: document {document.id!r} names paper {document.paper!r}; give the corpus it is in with --corpus"
        )
    if document.paper not in corpus:
        raise DecisionError(
            f"{path}:{number}: document {document.id!r} names paper {document.paper!r}, which is not in the corpus given with --corpus"
        )
    return corpus.paper(document.paper or "")


__all__ = ["Asked", "DecisionSet", "load_decisions", "paper_text"]
