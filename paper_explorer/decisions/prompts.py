"""A typed question's prompt, as token ids, and each option's continuation.

The prompt is one user turn of the model's own chat template (``agent.renderer``): the kind's
``before`` text, the document's tokens, the kind's ``after`` text with the question and the options
as listed, then the generation prompt with an empty think block where the template has one. An
option's continuation is its text and the token that ends the model's turn (``renderer.action``):
without that end, "1" would also count every reply that starts with it ("10").

A document longer than the room left (the context less the rest of the prompt and the longest
option) is never cut silently: ``cut="none"`` reports the overflow; ``"start"`` or ``"end"`` drops
that many tokens from the document's start or end, and the prompt records how many (``Cut``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import paper_explorer.corpus.files as files
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.schema import KINDS

if TYPE_CHECKING:
    from paper_explorer.agent.renderer import ChatRenderer

PROMPTS_FILE = Path(__file__).parent / "prompts.toml"
CUTS = ("none", "start", "end")
CutSide = Literal["none", "start", "end"]


@dataclass(frozen=True)
class Cut:
    side: str  # "start" or "end": where the document's tokens were dropped
    tokens: int  # how many were dropped
    kept: int  # how many were kept


@dataclass(frozen=True)
class PromptTexts:
    before: dict[str, str]
    after: dict[str, str]
    sha256: str


@dataclass(frozen=True)
class Built:
    prompt: list[int] | None  # None: the document does not fit and was not to be cut
    options: list[list[int]]  # each option's continuation ids
    document_tokens: int
    cut: Cut | None = None
    overflow: str | None = None  # why there is no prompt


def load_prompts(path: Path | None = None) -> PromptTexts:
    """The prompts file (the project's unless ``path``), checked: each kind's before and after,
    with the fields its kind fills; one DecisionError line otherwise."""
    path = path or PROMPTS_FILE
    table, sha256 = read_table(path, "decision prompts")
    before, after = {}, {}
    for kind in KINDS:
        entry = table.get(kind)
        if not isinstance(entry, dict) or set(entry) != {"before", "after"} or not all(isinstance(v, str) for v in entry.values()):
            raise DecisionError(f"{path}: [{kind}] must hold a before and an after text, nothing else")
        needed = ["{question}"] + ([] if kind == "noul" else ["{options}"])
        missing = [field for field in needed if field not in entry["after"]]
        if missing:
            raise DecisionError(f"{path}: [{kind}] after must hold {' and '.join(missing)}")
        before[kind], after[kind] = entry["before"], entry["after"]
    return PromptTexts(before, after, sha256)


def read_table(path: Path, what: str) -> tuple[dict, str]:
    """A prompts .toml file's table and the sha256 of its bytes (what a run records); one
    DecisionError line for a file that is missing or not one to read."""
    try:
        data = files.read_bytes(path, limit=files.DOCUMENT_BYTES, what=f"{what} .toml")
        table = files.parse_toml(files.decode(data, path), path)
    except FileNotFoundError:
        raise DecisionError(f"{path}: no such {what} file") from None
    except files.FileRefused as error:
        raise DecisionError(str(error)) from None
    return table, hashlib.sha256(data).hexdigest()


def indistinct(renderer: ChatRenderer, options: tuple[str, ...] | list[str]) -> str | None:
    """Why two of ``options`` cannot be told apart by the model (their continuations are the same
    ids: a tokenizer that normalises Unicode reads "café" and "cafe\u0301" alike), or None. Scored,
    they would split one option's probability between them."""
    seen: dict[tuple[int, ...], str] = {}
    for option in options:
        ids = tuple(renderer.action(option))
        if ids in seen:
            return (
                f"options {seen[ids]!r} and {option!r} are the same tokens to this model (its tokenizer normalises them alike), "
                "so it cannot tell them apart; make them differ"
            )
        seen[ids] = option
    return None


def listed(options: tuple[str, ...] | list[str]) -> str:
    return "\n".join(f"- {option}" for option in options)


def build(
    renderer: ChatRenderer,
    texts: PromptTexts,
    kind: str,
    question: str,
    document: str | list[int],
    options: list[str],
    *,
    context: int,
    cut: CutSide = "none",
) -> Built:
    """The prompt of one question (its options listed in the order given) and each option's
    continuation, fitted to ``context``: the document is cut only where ``cut`` says."""
    continuations = [renderer.action(option) for option in options]
    after = texts.after[kind].replace("{question}", question).replace("{options}", listed(options))
    document_ids = renderer.text(document) if isinstance(document, str) else list(document)
    frame = renderer.user_prompt([texts.before[kind], [], after])
    room = context - len(frame) - max(len(option) for option in continuations)
    made_cut = None
    if len(document_ids) > room:
        over = len(document_ids) - max(room, 0)
        if cut == "none" or room <= 0:
            reason = (
                f"the prompt is {len(frame) + len(document_ids)} tokens with the longest option's {max(map(len, continuations))}, "
                f"{over} over the context of {context}"
            )
            hint = (
                "; pass --cut start or --cut end to drop that many document tokens"
                if room > 0
                else "; the rest of the prompt and the longest option leave no room for any of the document"
            )
            return Built(None, continuations, len(document_ids), overflow=reason + hint)
        kept = document_ids[over:] if cut == "start" else document_ids[: len(document_ids) - over]
        made_cut = Cut(cut, over, len(kept))
        document_ids = kept
    prompt = renderer.user_prompt([texts.before[kind], document_ids, after])
    return Built(prompt, continuations, len(document_ids) + (made_cut.tokens if made_cut else 0), made_cut)


__all__ = ["CUTS", "PROMPTS_FILE", "Built", "Cut", "PromptTexts", "build", "indistinct", "listed", "load_prompts", "read_table"]
