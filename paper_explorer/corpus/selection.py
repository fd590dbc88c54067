"""Which questions of a corpus a command asks: a split, a replay's recording, the first N, a shard.

The one rule for a missing ``--split``: the command's default split - unless no paper says
which split it is in (then all questions), or every question is in one other split (then that
split, as ``explorer eval --corpus qasper-dev-v0.3.json`` means). A training default (``train``)
never moves to a held-out split on its own: teaching on evaluation questions by accident is the
leak ``sft build``'s split check exists to catch, so there the user names the split.

Notes (what was chosen and why) go to ``note``, one line each without a "note:" prefix; the default logs them as
warnings, so a script using the Python API sees them too. Bad requests raise ``CorpusError``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.errors import CorpusError
from paper_explorer.corpus.schema import Question, Split
from paper_explorer.corpus.setting_names import setting
from paper_explorer.corpus.splits import SPLITS, named_split, parse_shard, shard_of

log = logging.getLogger(__name__)

SELECTABLE: tuple[str, ...] = (*SPLITS, "all")  # "all": every question, whatever its paper's split
NEVER_LEAVES = frozenset({"train"})  # defaults that do not fall back to the corpus's only split

Note = Callable[[str], None]


def log_note(line: str) -> None:
    log.warning("%s", line)


def question_splits(corpus: Corpus) -> Counter[str | None]:
    """How many questions each split holds (None: their paper says no split)."""
    split_of = {paper.id: paper.split for paper in corpus.papers}
    return Counter(split_of.get(question.paper_id) for question in corpus.questions)


def resolve_split(corpus: Corpus, split: str | None, default: str, note: Note = log_note) -> str:
    """The split a command runs: the one given, else ``default`` - or all questions when no paper
    of the corpus says which split it belongs to, or the only split that holds questions."""
    has_splits = any(paper.split is not None for paper in corpus.papers)
    if split is None:
        if not has_splits:
            note(
                f"no paper of the corpus says which split it belongs to, so all {len(corpus.questions)} questions "
                "are used; state splits with {setting('split_of')} (QASPER's official file names need none)"
            )
            return "all"
        only = _only_split(corpus)
        if only is not None and only != default and default not in NEVER_LEAVES:
            note(
                f"every question of the corpus is in the {only} split, so the {only} split runs "
                f"(not the default, {default}); pass {setting('split')} to choose"
            )
            return only
        return default
    try:
        split = named_split(split, SELECTABLE)
    except ValueError as error:
        raise CorpusError(str(error)) from None
    if split != "all" and not has_splits:
        raise CorpusError(
            f"{setting('split', split)}: no paper of the corpus says which split it belongs to; use {setting('split', 'all')}, or state "
            f"splits with {setting('split_of')} (QASPER's official qasper-{{train,dev,test}}-v0.3.json names need none)"
        )
    unsplit = sum(1 for paper in corpus.papers if paper.split is None)
    if split != "all" and unsplit:
        note(f"{unsplit} papers of the corpus say no split, so their questions are in no split's; state theirs with {setting('split_of')}")
    return split


def _only_split(corpus: Corpus) -> str | None:
    """The one split every question is in, if there is one (and the questions say which)."""
    counts = question_splits(corpus)
    if len(counts) == 1:
        (only,) = counts
        return only
    return None


def select_questions(
    corpus: Corpus,
    split: str | None,
    limit: int | None,
    recorded: Sequence[str] | None = None,
    default: str = "test",
    shard: str | None = None,
    note: Note = log_note,
) -> list[Question]:
    """The questions a run asks, in corpus order: a split (``resolve_split``), those a replay
    recording holds, the first N, then those of one shard (``I/N``)."""
    split = resolve_split(corpus, split, default, note)
    questions = list((corpus if split == "all" else corpus.split(cast(Split, split))).questions)
    if recorded is not None:
        wanted = set(recorded)
        questions = [q for q in questions if q.id in wanted]
    if limit is not None:
        questions = questions[:limit]
    if shard is not None and questions:
        index, count = _shard(shard)
        selected = len(questions)
        questions = [q for q in questions if shard_of(q.id, count) == index]
        if not questions:
            raise CorpusError(f"shard {shard} holds none of the {selected} questions selected; use fewer shards")
    if not questions:
        raise CorpusError(
            f"no questions to run in split {split!r}{_where_questions_are(corpus, split)}; choose another {setting('split')} or "
            f"{setting('questions')} file"
        )
    return questions


def _shard(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ValueError as error:
        raise CorpusError(f"{setting('shard')}: {error}") from None


def _where_questions_are(corpus: Corpus, split: str) -> str:
    """' (the corpus's questions are in validation: 120)', or '' when that says nothing new."""
    counts = question_splits(corpus)
    if split == "all" or not counts:
        return "" if counts else " (the corpus holds no questions)"
    shown = ", ".join(f"{name or 'no split'}: {n}" for name, n in sorted(counts.items(), key=lambda item: str(item[0])))
    return f" (the corpus's questions are in {shown})"
