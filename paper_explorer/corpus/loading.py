"""Read a corpus from QASPER v0.3 JSON, Hugging Face ``allenai/qasper`` rows, our JSONL, or a
long-context benchmark's records (LongBench QA lines, MemAgent's HotpotQA eval files).

The layout is recognised from the content, not the file name:

* a JSON object keyed by paper id whose values have ``full_text`` -> QASPER v0.3;
* JSON rows (a list, or one object per line) with ``full_text`` as columns -> Hugging Face;
* one ``{"schema_version": 1, "paper": {...}, "questions": [...]}`` object per line -> ours,
  written by ``explorer corpus export`` and ``explorer corpus generate``;
* records (a list, or one object per line) with a ``context`` or an ``input`` -> LongBench or MemAgent
  (``corpus.benchmarks``): each is one question and the paper that is its own document set.

A questions file (``questions=``, ``with_questions``) holds questions, one per line, or such
benchmark records: their papers join the corpus beside its own.

Each file's SHA-256 (of its bytes as stored) is taken from the bytes read, for ``corpus stats``
and a run's manifest to pin the files.

A directory loads every ``*.json`` and ``*.jsonl`` file in it, in name order (so the official
train, dev and test files load together). Any problem raises ``CorpusError`` with one line
that names the file, the line or paper, and the field.

Gold answers are checked at load: a question whose answers say nothing (none, or only empty
ones) would be scored as a missed abstention, so our own formats (explorer JSONL, questions
files, questions built in code) refuse it. QASPER's layouts only warn (``no_gold_answer``): a
loader must not reject the official release for a question its annotators left empty. A
questions file is also refused while it still holds a template's placeholders
(``corpus.questions_file``).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import ValidationError

import paper_explorer.corpus.benchmarks as benchmarks
import paper_explorer.corpus.files as files
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.errors import CorpusError, LoadWarning, from_validation_error, where
from paper_explorer.corpus.gold_checks import evidence_warnings, gold_warnings
from paper_explorer.corpus.jsonl import every_line
from paper_explorer.corpus.qasper import RawHfRow, RawQasperPaper, from_hf_row, from_qasper_v03
from paper_explorer.corpus.questions_file import refuse_unfilled
from paper_explorer.corpus.schema import Items, Paper, Question, Record
from paper_explorer.corpus.splits import ALIASES, SPLITS, split_from_name

SCHEMA_VERSION = 1
SUPPORTED = (
    "QASPER v0.3 JSON, Hugging Face allenai/qasper rows (JSON or JSONL), explorer JSONL, "
    "LongBench QA lines, or MemAgent's HotpotQA eval files"
)
QUESTIONS = "one question per line (`explorer schema question` shows the format), or LongBench or MemAgent records"


class _Duplicates:
    """object_pairs_hook that remembers keys seen twice in one object (json keeps the last)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, pairs: list[tuple[str, object]]) -> dict:
        result = dict(pairs)
        if len(result) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    self.keys.append(key)
                seen.add(key)
        return result


class _FileText(NamedTuple):
    data: bytes  # without a UTF-8 byte order mark
    text: str
    sha256: str  # of the bytes as stored: what sha256sum prints


def _read_text(path: Path, inside: Path | None = None) -> _FileText:
    """The file's bytes without a UTF-8 byte order mark, its text and its SHA-256; one line if it is not a
    regular file (``corpus.files``: bounded, not a link out of ``inside``), not UTF-8, or binary."""
    try:
        data = files.read_bytes(path, limit=files.DATA_BYTES, inside=inside, what="corpus")
        return _FileText(data.removeprefix(codecs.BOM_UTF8), files.decode(data, path), hashlib.sha256(data).hexdigest())
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file; check the path") from None
    except files.FileRefused as error:
        raise CorpusError(str(error)) from None


class _ExtraData(Exception):
    """A whole-file parse found a second JSON value after the first."""


def _parse_json(path: Path, text: str, line: int | None = None) -> object:
    duplicates = _Duplicates()
    try:
        value = files.parse_json(text, path, line, object_pairs_hook=duplicates)
    except files.FileRefused as error:
        raise CorpusError(str(error)) from None
    except json.JSONDecodeError as error:
        if line is None and error.msg == "Extra data":
            raise _ExtraData from None
        at = f"{path}:{line if line is not None else error.lineno}"
        raise CorpusError(f"{at}: not valid JSON ({error.msg} at column {error.colno})") from None
    if duplicates.keys:
        key = duplicates.keys[0]
        if isinstance(value, dict) and key in value and line is None:
            raise CorpusError(f"{path}: duplicate paper id {key!r}; each paper may appear once")
        raise CorpusError(f"{where(str(path), line)}: key {key!r} appears twice in one JSON object; keep one")
    return value


def _json_documents(
    path: Path, expected: str = SUPPORTED, inside: Path | None = None, digests: dict[str, str] | None = None
) -> Iterator[tuple[int | None, object]]:
    """(line number or None, parsed value): one value for a JSON file, one per line for JSONL.
    ``inside``: the corpus directory the file was found in (a link out of it is refused);
    ``digests`` gets the file's SHA-256 under its name. The file's bytes and text are let go
    before the first value is yielded (a benchmark file may hold hundreds of megabytes)."""
    read = _read_text(path, inside)
    if digests is not None:
        digests[str(path)] = read.sha256
    data, text = read.data, read.text
    del read
    if not text or text.isspace():  # not text.strip(): that copies the whole text
        raise CorpusError(f"{path}: the file is empty; expected {expected}")
    if path.suffix != ".jsonl":
        try:
            value = _parse_json(path, text)
        except _ExtraData:
            pass  # more than one value: JSONL under another name
        else:
            del data, text
            yield None, value
            return
    del text
    lines = every_line(data)  # bytes split on \n only: a paper's text may hold U+2028, which splitlines() splits
    del data
    for line in lines:
        yield line.number, _parse_json(path, line.data.decode("utf-8"), line.number)


def _records(
    path: Path, inside: Path | None = None, digests: dict[str, str] | None = None
) -> Iterator[tuple[int | None, str | None, object]]:
    """(line, paper id if known from the layout, raw record) for every paper in the file."""
    for line, value in _json_documents(path, inside=inside, digests=digests):
        if isinstance(value, dict) and line is None and not _is_row(value):
            for paper_id, raw in value.items():
                yield None, paper_id, raw
        elif isinstance(value, list) and line is None:
            for index, row in enumerate(value):
                yield None, f"#{index}", row
        else:
            yield line, None, value


def _is_row(value: dict) -> bool:
    return "paper" in value or ("id" in value and "full_text" in value) or benchmarks.layout(value) is not None


def _record_place(path: Path, line: int | None, key: str | None) -> str:
    """Where a record is: its line, or its position in a JSON array (``record #3``, counted from 0)."""
    if line is None and key is not None and key.startswith("#"):
        return f"{path}: record {key}"
    return where(str(path), line)


class _Placed(NamedTuple):
    """A question and where it was read; ``official``: from one of QASPER's layouts, whose gold is
    taken as published (an empty annotation is warned about, not refused)."""

    place: str
    question: Question
    official: bool = False


def _paper_from_record(path: Path, line: int | None, key: str | None, raw: object) -> tuple[Paper, list[Question]]:
    """Recognise the record's layout and convert it; raise CorpusError naming the field."""
    if not isinstance(raw, dict):
        place = where(str(path), line, key) if key and not key.startswith("#") else where(str(path), line)
        kind = type(raw).__name__
        raise CorpusError(f"{place}: expected a JSON object for a paper, got {kind}; the file should hold {SUPPORTED}")
    if line is None and key is not None and not key.startswith("#"):
        return _validated(path, line, key, lambda: from_qasper_v03(key, RawQasperPaper.model_validate(raw)))
    paper_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    if "paper" in raw:
        inner = raw.get("paper")
        paper_id = inner.get("id") if isinstance(inner, dict) and isinstance(inner.get("id"), str) else None
        paper, questions = _validated(path, line, paper_id, lambda: _from_explorer_record(raw))
        problem = benchmarks.own_documents_problem(paper)
        if problem is not None:
            raise CorpusError(f"{where(str(path), line, paper.id)}: {problem}")
        return paper, questions
    if "full_text" in raw:
        if isinstance(raw["full_text"], list):
            raise CorpusError(
                f"{where(str(path), line, paper_id)}: a single QASPER v0.3 paper without its id; "
                "wrap papers in one object keyed by paper id, as the official files do"
            )
        return _validated(path, line, paper_id, lambda: from_hf_row(RawHfRow.model_validate(raw)))
    if benchmarks.layout(raw) is not None:
        return benchmarks.from_record(raw, _record_place(path, line, key))
    shown = ", ".join(sorted(raw)[:6]) or "no keys"
    raise CorpusError(f"{where(str(path), line, paper_id)}: unrecognised record with {shown}; expected {SUPPORTED}")


def _validated(path: Path, line: int | None, paper_id: str | None, convert):
    try:
        return convert()
    except ValidationError as error:
        raise from_validation_error(error, where(str(path), line, paper_id)) from None


class ExplorerRecord(Record):
    """One line of explorer JSONL: a paper and the questions about it."""

    schema_version: Literal[1]
    paper: Paper
    questions: Items[Question] = ()


def _from_explorer_record(raw: dict) -> tuple[Paper, list[Question]]:
    record = ExplorerRecord.model_validate(raw)
    return record.paper, list(record.questions)


def corpus_files(path: Path) -> list[Path]:
    """The file named, or a directory's .json and .jsonl files in name order (``corpus.files.files_in``:
    a FIFO, a device or a link out of the directory under such a name is refused, not passed over)."""
    if not path.is_dir():
        return [path]
    try:
        found = files.files_in(path, (".json", ".jsonl"), what="corpus")
    except files.FileRefused as error:
        raise CorpusError(str(error)) from None
    if not found:
        raise CorpusError(f"{path}: directory holds no .json or .jsonl files; point --corpus at a corpus file")
    return found


def load(path: str | os.PathLike, questions: str | os.PathLike | None = None, split_of: dict[str, str] | None = None) -> Corpus:
    """Load a corpus file or directory; ``questions`` optionally replaces its questions.

    ``questions`` is a JSONL file of questions (one ``corpus.Question`` per line, as written by
    ``write_questions``); each must name a paper of the corpus. ``split_of`` states the split of
    the papers of some files ({resolved path: split}); otherwise a paper without its own split
    takes the one its file's name states (``corpus.splits``).
    """
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: no such file or directory; check the --corpus path")
    if not (path.is_file() or path.is_dir()):
        raise CorpusError(f"{path}: not a regular file or directory; name a corpus file or directory")
    papers: list[Paper] = []
    all_questions: list[_Placed] = []
    first_seen: dict[str, str] = {}
    digests: dict[str, str] = {}
    stated = dict(split_of or {})
    found = corpus_files(path)
    inside = path if path.is_dir() else None
    unknown = set(stated) - {str(file.resolve()) for file in found}
    if unknown:
        raise CorpusError(f"--split-of names {sorted(unknown)[0]}, which is not a file of the corpus {path}")
    for file in found:
        named = split_from_name(file)
        for line, key, raw in _records(file, inside, digests):
            paper, paper_questions = _paper_from_record(file, line, key, raw)
            split = stated.get(str(file.resolve())) or paper.split or _row_split(raw) or named
            if split != paper.split:
                paper = paper.model_copy(update={"split": split})
            place = where(str(file), line, paper.id)
            _add_paper(papers, first_seen, paper, place, _record_place(file, line, key))
            for question in paper_questions:
                if question.paper_id != paper.id:
                    raise CorpusError(f"{place}: question {question.id!r} names paper {question.paper_id!r}; fix its paper_id")
            all_questions.extend(_Placed(place, question, _is_qasper(raw)) for question in paper_questions)
    if questions is not None:
        all_questions = _questions_file(Path(questions), papers, first_seen, digests)
    return _assemble(papers, all_questions, sources=tuple(str(p) for p in found), file_sha256=digests)


def _is_qasper(raw: object) -> bool:
    """Whether a record is in one of QASPER's layouts (neither explorer JSONL nor a benchmark's),
    whose gold answers are taken as published."""
    return not (isinstance(raw, dict) and ("paper" in raw or benchmarks.layout(raw) is not None))


def _add_paper(papers: list[Paper], first_seen: dict[str, str], paper: Paper, place: str, seen_as: str, fix: str | None = None) -> None:
    """Append ``paper``, refusing an id already taken (``first_seen``: id -> where it was first;
    ``fix``: how to mend that, when not the general rule)."""
    if paper.id in first_seen:
        raise CorpusError(f"{place}: duplicate paper id (first in {first_seen[paper.id]}); {fix or 'each paper may appear once'}")
    first_seen[paper.id] = seen_as
    papers.append(paper)


def _row_split(raw: object) -> str | None:
    """A Hugging Face row's ``split`` column, when an export kept one."""
    value = raw.get("split") if isinstance(raw, dict) else None
    if isinstance(value, str):
        value = ALIASES.get(value.lower(), value.lower())
        return value if value in SPLITS else None
    return None


def with_questions(corpus: Corpus, questions: str | os.PathLike) -> Corpus:
    """The corpus's papers with the questions of a JSONL file instead of its own (and, for a
    benchmark's records, the papers that are their own documents beside the corpus's)."""
    papers = list(corpus.papers)
    first_seen = {paper.id: "the corpus" for paper in papers}
    digests = dict(corpus.file_sha256)
    placed = _questions_file(Path(questions), papers, first_seen, digests)
    return _assemble(papers, placed, corpus.sources, file_sha256=digests)


def _questions_file(path: Path, papers: list[Paper], first_seen: dict[str, str], digests: dict[str, str]) -> list[_Placed]:
    """The questions of a questions file; a benchmark record's paper is appended to ``papers``."""
    placed: list[_Placed] = []
    for line, value in _json_documents(path, QUESTIONS, digests=digests):
        if line is None and isinstance(value, list) and any(isinstance(item, dict) and benchmarks.layout(item) for item in value):
            records = [(f"{path}: record #{index}", item) for index, item in enumerate(value)]  # MemAgent's eval files
        else:
            records = [(where(str(path), line), value)]
        for place, raw in records:
            if isinstance(raw, dict) and benchmarks.layout(raw) is not None:
                paper, questions = benchmarks.from_record(raw, place)
                held = next((held for held in papers if held.id == paper.id), None) if paper.id in first_seen else None
                fix = None if held is None else benchmarks.given_as_questions_fix(held, paper)
                _add_paper(papers, first_seen, paper, where(str(path), line, paper.id), place, fix)
                placed.extend(_Placed(place, question) for question in questions)
            else:
                placed.append(_question(place, raw))
    return placed


def _question(place: str, value: object) -> _Placed:
    if not isinstance(value, dict):
        raise CorpusError(
            f"{place}: expected one question object per line, got {type(value).__name__}; `explorer schema question` shows the format"
        )
    refuse_unfilled(place, value)
    try:
        return _Placed(place, Question.model_validate(value))
    except ValidationError as error:
        raise from_validation_error(error, place) from None


def _assemble(papers: list[Paper], questions: list[_Placed], sources: tuple[str, ...], file_sha256: dict[str, str] | None = None) -> Corpus:
    by_id = {paper.id: paper for paper in papers}
    seen: dict[str, str] = {}
    warnings: list[LoadWarning] = []
    for place, question, official in questions:
        if question.id in seen:
            raise CorpusError(f"{place}: duplicate question id {question.id!r} (first in {seen[question.id]}); ids must be unique")
        seen[question.id] = place
        paper = by_id.get(question.paper_id)
        if paper is None:
            raise CorpusError(
                f"{place}: question {question.id!r} is about paper {question.paper_id!r}, "
                "which is not in the corpus; add the paper or drop the question"
            )
        file = place.split(":")[0]
        warnings.extend(gold_warnings(file, place, paper, question, official))
        warnings.extend(evidence_warnings(file, place, paper, question))
    return Corpus(
        papers=tuple(papers),
        questions=tuple(placed.question for placed in questions),
        warnings=tuple(warnings),
        sources=sources,
        file_sha256=dict(file_sha256 or {}),
    )


def from_parts(papers: Iterable[Paper], questions: Iterable[Question], source: str = "<memory>") -> Corpus:
    """Check papers and questions built in code (the demo generator) exactly as a file would be."""
    papers = list(papers)
    seen: set[str] = set()
    for paper in papers:
        if paper.id in seen:
            raise CorpusError(f"{source}: paper {paper.id!r}: duplicate paper id")
        seen.add(paper.id)
    return _assemble(papers, [_Placed(source, q) for q in questions], sources=(source,))
