"""Write corpora as our JSONL (one paper and its questions per line), or as QASPER v0.3 JSON.

Files appear whole or not at all: we write a temporary file beside the target, fsync it and
rename it over the target, so an interrupted export never leaves half a corpus behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from corpus.collection import Corpus
from corpus.loading import SCHEMA_VERSION
from corpus.qasper import to_qasper_v03
from corpus.schema import Question


@contextmanager
def atomic_text_file(path: str | os.PathLike) -> Iterator[IO[str]]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def explorer_lines(corpus: Corpus) -> Iterator[str]:
    by_paper: dict[str, list[Question]] = defaultdict(list)
    for question in corpus.questions:
        by_paper[question.paper_id].append(question)
    for paper in corpus.papers:
        record = {
            "schema_version": SCHEMA_VERSION,
            "paper": paper.model_dump(mode="json"),
            "questions": [q.model_dump(mode="json") for q in by_paper[paper.id]],
        }
        yield json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def write_jsonl(corpus: Corpus, path: str | os.PathLike) -> None:
    with atomic_text_file(path) as handle:
        handle.writelines(explorer_lines(corpus))


def write_qasper(corpus: Corpus, path: str | os.PathLike) -> None:
    by_paper: dict[str, list[Question]] = defaultdict(list)
    for question in corpus.questions:
        by_paper[question.paper_id].append(question)
    document = {paper.id: to_qasper_v03(paper, by_paper[paper.id]) for paper in corpus.papers}
    with atomic_text_file(path) as handle:
        json.dump(document, handle, ensure_ascii=False)


def write_questions(questions: Iterable[Question], path: str | os.PathLike) -> None:
    with atomic_text_file(path) as handle:
        for question in questions:
            handle.write(json.dumps(question.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) + "\n")
