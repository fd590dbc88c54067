"""What goes wrong while reading a corpus, said in one line a user can act on."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


class CorpusError(Exception):
    """Bad input: the message names the file, the paper, the field and how to fix it."""


@dataclass(frozen=True)
class LoadWarning:
    """Something suspicious that does not stop loading; counted and reported, never silent."""

    kind: str
    file: str
    paper_id: str
    detail: str
    place: str | None = None  # "file:line" (or "file: paper 'id'") for a reader that points at it
    question_id: str | None = None  # the question it is about, if any

    def __str__(self) -> str:
        return f"{self.file}: paper {self.paper_id!r}: {self.detail}"


def where(file: str, line: int | None = None, paper_id: str | None = None) -> str:
    place = f"{file}:{line}" if line is not None else file
    return f"{place}: paper {paper_id!r}" if paper_id is not None else place


def format_location(loc: tuple) -> str:
    """('qas', 3, 'answers', 0, 'yes_no') -> 'qas[3].answers[0].yes_no'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the record itself)"


def from_validation_error(error: ValidationError, place: str, field_prefix: str = "") -> CorpusError:
    """The first problem of a pydantic error as one line, with a count of the others."""
    problems = error.errors(include_url=False)
    first = problems[0]
    field = format_location(tuple(first["loc"]))
    if field_prefix:
        field = f"{field_prefix}.{field}" if first["loc"] else field_prefix
    got = repr(first.get("input"))
    if len(got) > 60:
        got = got[:57] + "..."
    more = f" (and {len(problems) - 1} more problems in this record)" if len(problems) > 1 else ""
    message = first["msg"][0].lower() + first["msg"][1:]
    if first["type"] == "missing":
        return CorpusError(f"{place}: field {field!r} is missing; add it{more}")
    return CorpusError(f"{place}: field {field!r}: {message}, got {got}; fix the value{more}")
