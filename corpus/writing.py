"""Write corpora as our JSONL (one paper and its questions per line), or as QASPER v0.3 JSON.

Files appear whole or not at all (``corpus.atomic``): an interrupted export never leaves half a
corpus behind.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator

from corpus.atomic import atomic_file
from corpus.collection import Corpus
from corpus.loading import SCHEMA_VERSION
from corpus.qasper import to_qasper_v03
from corpus.schema import Question


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
    with atomic_file(path) as handle:
        handle.writelines(explorer_lines(corpus))


def write_qasper(corpus: Corpus, path: str | os.PathLike) -> None:
    by_paper: dict[str, list[Question]] = defaultdict(list)
    for question in corpus.questions:
        by_paper[question.paper_id].append(question)
    document = {paper.id: to_qasper_v03(paper, by_paper[paper.id]) for paper in corpus.papers}
    with atomic_file(path) as handle:
        json.dump(document, handle, ensure_ascii=False)


def write_questions(questions: Iterable[Question], path: str | os.PathLike) -> None:
    with atomic_file(path) as handle:
        for question in questions:
            handle.write(json.dumps(question.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) + "\n")
