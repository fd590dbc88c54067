"""The loaded corpus: papers, their questions, load warnings and content hashes."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from paper_explorer.corpus.errors import LoadWarning
from paper_explorer.corpus.schema import Paper, Paragraph, Question, Split


def canonical_json(record) -> str:
    """A record as JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(record.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(lines: Iterator[str]) -> str:
    sha = hashlib.sha256()
    for line in lines:
        sha.update(line.encode("utf-8", "surrogatepass"))  # a lone surrogate (JSON's "\ud800") hashes too
        sha.update(b"\n")
    return sha.hexdigest()


def questions_sha256(questions) -> str:
    """The hash of a list of questions, in order (a run's frozen question set)."""
    return _digest(canonical_json(question) for question in questions)


@dataclass(frozen=True, eq=False)
class Corpus:
    """Papers in file order and the questions about them.

    The hashes cover the parsed content, so they do not change with the source file's key
    order, whitespace or layout (QASPER v0.3, Hugging Face rows, our JSONL): the same papers
    give the same ``papers_sha256`` in all three. Paper order is part of the content, because
    it fixes the order of ``paragraphs()`` and of BM25 scores.
    """

    papers: tuple[Paper, ...]
    questions: tuple[Question, ...] = ()
    warnings: tuple[LoadWarning, ...] = ()
    sources: tuple[str, ...] = ()
    file_sha256: dict[str, str] = field(default_factory=dict)
    """The SHA-256 of each file read (the corpus files, a questions file), by its name as given:
    for a user to pin the files. Not part of ``sha256``, which covers the parsed content."""
    _by_id: dict[str, Paper] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {paper.id: paper for paper in self.papers})

    def __len__(self) -> int:
        return len(self.papers)

    def __contains__(self, paper_id: object) -> bool:
        return paper_id in self._by_id

    def paper(self, paper_id: str) -> Paper:
        """The paper with this id; KeyError if there is none."""
        return self._by_id[paper_id]

    @property
    def paper_ids(self) -> list[str]:
        return list(self._by_id)

    def paragraphs(self) -> Iterator[Paragraph]:
        """Every indexed (non-empty) paragraph, in the order BM25 scores use."""
        for paper in self.papers:
            for section_index, section in enumerate(paper.sections):
                for paragraph_index, text in enumerate(section.paragraphs):
                    if text:
                        yield Paragraph(paper.id, section_index, paragraph_index, text)

    def own_documents(self, paper_id: str | None) -> Paper | None:
        """The document set a question about ``paper_id`` is answered over, when it brings its own:
        that paper, when it holds a benchmark's context (``Paper.own_documents``); None when the
        question is answered over the shared papers (``shared``), as is a question about a paper
        this corpus does not hold, or one of the caller's own (``paper_id`` None)."""
        paper = self._by_id.get(paper_id) if paper_id is not None else None
        return paper if paper is not None and paper.own_documents else None

    @property
    def shared(self) -> Corpus:
        """The papers every question without documents of its own is answered over (QASPER's and
        users' papers): all but those holding a question's own documents, and their questions. The
        corpus itself when it holds none, so its hashes, its index cache and its identity stay."""
        # Never cached on itself: a corpus that held a reference to itself would be freed only by the
        # garbage collector, whose finalizers (an episode host's fork server's) then run at any point.
        return self._shared_part if any(paper.own_documents for paper in self.papers) else self

    @cached_property
    def _shared_part(self) -> Corpus:
        papers = tuple(paper for paper in self.papers if not paper.own_documents)
        ids = {paper.id for paper in papers}
        return Corpus(papers=papers, questions=tuple(q for q in self.questions if q.paper_id in ids), sources=self.sources)

    def questions_for(self, paper_id: str) -> list[Question]:
        return [question for question in self.questions if question.paper_id == paper_id]

    def split(self, name: Split) -> Corpus:
        """The same papers (search still covers all of them) with only this split's questions."""
        in_split = {paper.id for paper in self.papers if paper.split == name}
        return Corpus(
            papers=self.papers,
            questions=tuple(q for q in self.questions if q.paper_id in in_split),
            warnings=self.warnings,
            sources=self.sources,
            file_sha256=self.file_sha256,
        )

    def warning_counts(self) -> dict[str, int]:
        return dict(Counter(warning.kind for warning in self.warnings))

    @cached_property
    def papers_sha256(self) -> str:
        return _digest(canonical_json(paper) for paper in self.papers)

    @cached_property
    def questions_sha256(self) -> str:
        return questions_sha256(self.questions)

    @cached_property
    def sha256(self) -> str:
        """One hash for papers and questions together."""
        return _digest(iter((self.papers_sha256, self.questions_sha256)))
