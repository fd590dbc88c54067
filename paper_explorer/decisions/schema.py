"""The typed decision file: documents, and closed questions about each with a kind.

One JSON object per line (JSONL), one document each:

    {"id": "d1", "text": "...", "questions": [
        {"id": "q1", "kind": "noul", "text": "Does the paper release its code?", "label": "yes"},
        {"id": "q2", "kind": "choice", "text": "Which licence?", "options": ["MIT", "BSD-3-Clause", "GPL-3.0"]},
        {"id": "q3", "kind": "score", "text": "How complete is the documentation?", "options": ["1", "2", "3", "4", "5"]}]}

A document is given one way: ``text`` (used verbatim), ``paragraphs`` (joined by blank lines) or
``paper`` (a corpus paper id, read from ``--corpus``). The kinds:

- ``noul``: yes / no / unknown, in that order ("unknown": the document cannot answer). Its options
  are those three; a file may spell them out, in that order, or leave them out.
- ``choice``: one of 2 to 160 options, each any text. ``ordered: true`` says they run from the
  least to the most severe (the severity check reads only ordered questions).
- ``score``: a rubric of 2 to 160 levels, lowest first; always ordered.

``label`` is the right option where known (else the question is scored without it: probabilities,
no calibration). ``negation_of`` names a ``noul`` question of the same document that this
``noul`` question negates: yes here should be no there (the negation check).

Question ids are unique across the file: a run records one line per question id.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints, model_validator

KINDS = ("noul", "choice", "score")
NOUL_OPTIONS = ("yes", "no", "unknown")
MAX_OPTIONS = 160
ID_CHARS = 200
# Tokenising costs some 200 bytes of memory a character, and 16 Mi characters are millions of
# tokens, over any model's context: a longer document is refused before it is tokenised.
DOCUMENT_CHARS = 16 * 2**20

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=ID_CHARS, pattern=r"^[^\s\x00-\x1f\x7f]+$")]
Text = Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]


class DecisionQuestion(BaseModel):
    """One typed question about its document."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Identifier
    kind: Literal["noul", "choice", "score"]
    text: Text
    options: list[Text] | None = Field(
        default=None, description="choice: 2-160 options; score: the rubric's levels, lowest first; noul: yes, no, unknown or none"
    )
    label: str | None = Field(default=None, description="The right option, where known.")
    ordered: StrictBool = Field(default=False, description="choice: the options run from least to most severe (score: always).")
    negation_of: Identifier | None = Field(
        default=None, description="A noul question of the same document that this noul question negates."
    )

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> DecisionQuestion:
        options = self.options
        if self.kind == "noul":
            if options is not None and tuple(options) != NOUL_OPTIONS:
                raise ValueError(f"a noul question's options are {', '.join(NOUL_OPTIONS)} in that order; leave options out")
            if self.ordered:
                raise ValueError("a noul question is not ordered; drop ordered")
        else:
            if options is None or not 2 <= len(options) <= MAX_OPTIONS:
                raise ValueError(f"a {self.kind} question needs 2 to {MAX_OPTIONS} options, got {0 if options is None else len(options)}")
            broken = next((option for option in options if _breaks_the_listing(option)), None)
            if broken is not None:
                raise ValueError(
                    f"option {broken!r} holds a line break or control character; the prompt lists one option a line, so write each on one line"
                )
            if len(set(options)) != len(options):
                twice = next(option for option in options if options.count(option) > 1)
                raise ValueError(f"option {twice!r} is given twice")
            if self.negation_of is not None:
                raise ValueError("only a noul question can be the negation of another; drop negation_of")
        if self.label is not None and self.label not in self.choices:
            raise ValueError(
                f"label {self.label!r} is not one of the options ({', '.join(map(repr, self.choices[:5]))}{', ...' if len(self.choices) > 5 else ''})"
            )
        if self.negation_of == self.id:
            raise ValueError("a question cannot be its own negation")
        return self

    @property
    def choices(self) -> tuple[str, ...]:
        """The options in the file's order (noul: yes, no, unknown)."""
        return NOUL_OPTIONS if self.kind == "noul" else tuple(self.options or ())

    @property
    def is_ordered(self) -> bool:
        return self.kind == "score" or self.ordered


class DecisionDocument(BaseModel):
    """A document and the questions asked about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Identifier
    text: Text | None = Field(default=None, description="The document, verbatim.")
    paragraphs: list[Text] | None = Field(default=None, description="The document as paragraphs, joined by blank lines.")
    paper: Identifier | None = Field(default=None, description="A paper of --corpus, by id.")
    questions: list[DecisionQuestion] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> DecisionDocument:
        given = [name for name in ("text", "paragraphs", "paper") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give the document one way: text, paragraphs or paper (got {', '.join(given) or 'none'})")
        if self.paragraphs is not None and not self.paragraphs:
            raise ValueError("paragraphs is empty")
        text = self.own_text()
        if text is not None and len(text) > DOCUMENT_CHARS:
            raise ValueError(too_long(len(text)))
        return self

    def own_text(self) -> str | None:
        """The document's text when the file holds it (None: a corpus paper)."""
        if self.text is not None:
            return self.text
        return "\n\n".join(self.paragraphs) if self.paragraphs is not None else None


def too_long(characters: int) -> str:
    return (
        f"the document is {characters:,} characters, over the {DOCUMENT_CHARS:,} a decision document may hold "
        "(more than any model's context, and gigabytes to tokenise); cut it to the part the questions are about"
    )


def _breaks_the_listing(option: str) -> bool:
    """A line break (U+2028 and U+0085 too) or a control character other than tab: in the prompt's
    list of options ("- A\\n- B") it would make one option read as two, or hide part of it."""
    return any(character != "\t" and unicodedata.category(character) in ("Cc", "Zl", "Zp") for character in option)


__all__ = ["KINDS", "MAX_OPTIONS", "NOUL_OPTIONS", "DecisionDocument", "DecisionQuestion"]
