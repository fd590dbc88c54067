"""Which split a corpus file's papers belong to, when the papers do not say.

QASPER's official files are ``qasper-{train,dev,test}-v0.3.json`` (dev is our ``validation``);
files exported from the Hugging Face ``allenai/qasper`` dataset are named after their split
(``train.jsonl``, ``validation-00000-of-00001.json``, ``test.json``); nothing looser, so that
``test_results.json`` is not taken for a test split. A user states what a name
does not say with ``--split-of FILE=SPLIT``. A paper's own ``split`` field (our JSONL, or a
``split`` column in Hugging Face rows) wins over the file name; a stated split wins over both.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path
from typing import get_args

from paper_explorer.corpus.errors import CorpusError
from paper_explorer.corpus.schema import Split

SPLITS: tuple[str, ...] = get_args(Split)
ALIASES = {"dev": "validation", "val": "validation", "valid": "validation"}
OFFICIAL = re.compile(r"^qasper-(train|dev|test)-v[\d.]+\.jsonl?$", re.IGNORECASE)
BY_NAME = re.compile(r"^(train|validation|valid|val|dev|test)(?:-\d{5}-of-\d{5})?\.jsonl?$", re.IGNORECASE)


def split_from_name(file: Path) -> str | None:
    """The split a file's name states (QASPER's official names, Hugging Face's), or None."""
    found = OFFICIAL.match(file.name) or BY_NAME.match(file.name)
    if found is None:
        return None
    word = found.group(1).lower()
    return ALIASES.get(word, word)


def named_split(name: str, choices: tuple[str, ...] = (*SPLITS, "all")) -> str:
    """The split a user named (``--split``, a config's ``split``), as the corpus calls it. QASPER
    calls its validation files dev, so ``dev`` (and ``val``, ``valid``) is ``validation``; any other
    unknown name is a ValueError that says the nearest choice."""
    word = name.strip().lower()
    word = ALIASES.get(word, word)
    if word in choices:
        return word
    near = difflib.get_close_matches(word, [*choices, *ALIASES], n=1, cutoff=0.5)
    hint = f"did you mean {ALIASES.get(near[0], near[0])}? " if near else ""
    raise ValueError(f"unknown split {name!r}; {hint}choose one of {', '.join(choices)} (dev means validation)")


def parse_split_of(values: list[str]) -> dict[str, str]:
    """``FILE=SPLIT`` pairs (``--split-of``) as {file path: split}; one clear line when malformed."""
    stated: dict[str, str] = {}
    for value in values:
        file, sep, split = value.rpartition("=")
        if not sep or not file:
            raise CorpusError(f"--split-of {value!r}: write FILE=SPLIT, e.g. --split-of my-papers.json=test")
        try:
            split = named_split(split, SPLITS)
        except ValueError as error:
            raise CorpusError(f"--split-of {value!r}: {error}") from None
        key = str(Path(file).resolve())
        if stated.get(key, split) != split:
            raise CorpusError(f"--split-of names {file} twice, as {stated[key]} and as {split}; keep one")
        stated[key] = split
    return stated


SHARD = re.compile(r"^(\d{1,5})/(\d{1,5})$")


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (1-based: shard I of N) as (I, N); ValueError with what is wrong."""
    found = SHARD.match(text.strip())
    if found is None:
        raise ValueError(f"shard {text!r} is not I/N (e.g. 2/8: the second of eight shards)")
    index, count = int(found.group(1)), int(found.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"shard {text!r}: I must be between 1 and N")
    return index, count


def shard_of(question_id: str, count: int) -> int:
    """Which of ``count`` shards (1-based) a question belongs to: a hash of its id, so that every
    machine computes the same slice, whatever the corpus's order or the other questions."""
    digest = hashlib.sha256(question_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1
