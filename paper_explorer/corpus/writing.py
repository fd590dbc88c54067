"""Write corpora as our JSONL (one paper and its questions per line), or as QASPER v0.3 JSON.

Files appear whole or not at all (``corpus.files.atomic_file``): an interrupted export never leaves half a
corpus behind.

An export keeps the hashes (``corpus_sha256``, ``questions_sha256``) when it can, and
``export_corpus`` says so by reading the file back. QASPER v0.3 has no split field (the official
files name their split); each paper that has one gets a ``"split"`` key, which QASPER's readers
ignore and ours reads back. Both layouts group questions by paper, so a question set that is not
in paper order (a ``--questions`` file may be any order) comes back reordered: same questions,
another ``questions_sha256``. A question without gold answers, which QASPER's layouts may hold
(a load warning), is refused in explorer JSONL, so such a corpus exports only to QASPER's layout.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.errors import CorpusError
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.loading import SCHEMA_VERSION, load
from paper_explorer.corpus.qasper import to_qasper_v03
from paper_explorer.corpus.schema import Question


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
    document = {paper.id: _with_split(to_qasper_v03(paper, by_paper[paper.id]), paper.split) for paper in corpus.papers}
    with atomic_file(path) as handle:
        json.dump(document, handle, ensure_ascii=False)


def _with_split(record: dict, split: str | None) -> dict:
    return record if split is None else {**record, "split": split}


FORMATS = ("jsonl", "qasper")


def export_corpus(corpus: Corpus, path: str | os.PathLike, to: str) -> list[str]:
    """Write ``corpus`` as ``to`` (jsonl or qasper), read it back, and say why a hash changed, if one did."""
    if to not in FORMATS:
        raise CorpusError(f"unknown export format {to!r}; use jsonl or qasper")
    no_gold = [warning for warning in corpus.warnings if warning.kind == "no_gold_answer"]
    if to == "jsonl" and no_gold:  # refused before writing: our JSONL would not load back (corpus.loading)
        raise CorpusError(
            f"{no_gold[0]}; explorer JSONL refuses such questions ({len(no_gold)} here): export --to qasper, "
            "or leave them out with a --questions file"
        )
    (write_jsonl if to == "jsonl" else write_qasper)(corpus, path)
    again = load(path)
    notes = []
    if again.papers_sha256 != corpus.papers_sha256:
        notes.append(f"corpus_sha256 changed ({corpus.papers_sha256[:12]} -> {again.papers_sha256[:12]}): {_papers_changed(corpus, again)}")
    if again.questions_sha256 != corpus.questions_sha256:
        reason = (
            "the questions were not in paper order, and the file groups them by paper"
            if sorted(map(_canonical, again.questions)) == sorted(map(_canonical, corpus.questions))
            else "the questions read back differ"
        )
        notes.append(f"questions_sha256 changed ({corpus.questions_sha256[:12]} -> {again.questions_sha256[:12]}): {reason}")
    return notes


def _canonical(record) -> str:
    return json.dumps(record.model_dump(mode="json"), sort_keys=True)


def _papers_changed(before: Corpus, after: Corpus) -> str:
    """Why papers read back differ; the usual cause is a file name that states a split."""
    for old, new in zip(before.papers, after.papers):
        if old.split != new.split:
            return (
                f"paper {old.id!r} had split {old.split} and reads back as {new.split}, the split the file's "
                "name states; export to a name that states none (e.g. papers.json)"
            )
    return "the format cannot hold every field of the papers"


def write_questions(questions: Iterable[Question], path: str | os.PathLike) -> None:
    with atomic_file(path) as handle:
        for question in questions:
            handle.write(json.dumps(question.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) + "\n")
