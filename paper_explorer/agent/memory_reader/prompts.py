"""The memory reader's prompts, built as token ids: the words are data (``prompts/memory_reader.toml``).

Guaranteed:

* A prompt is ONE chat user turn then the generation prompt (non-thinking), laid out by the
  model's own chat template exactly as ``ChatRenderer.prompt`` lays out a conversation of one
  user message (``ChatRenderer.user_prompt``): whatever the template puts around it (a BOS, a
  default system turn) included.
* Values given as ids (the problem, the memory, a page) are spliced in unchanged, so a page's
  ids in a prompt are exactly the document's ids; the template's text around them, with any
  values given as strings filled in, is encoded piece by piece between the spliced ids. The same
  inputs give the same ids, so a check can rebuild a prompt from its record.
* The memory in a prompt never exceeds its cap (``memory_ids``).
* ``ReaderPrompts.sha256`` is the SHA-256 of the file's bytes: any change to the words changes it.
* A prompts file with a missing or unknown key, or a placeholder a key does not take, is refused
  with one line naming the file and the key.

Not guaranteed: that the ids equal the tokenizer's encoding of the whole prompt as one string
(they differ at most at the edges of spliced ids, where a whole-string encoding could merge across).
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError

PROMPTS_FILE = Path(__file__).parent / "prompts" / "memory_reader.toml"
# The packaged prompts, by the name the recipe's ``prompts`` setting gives.
PROMPTS_FILES = {"explorer": PROMPTS_FILE, "memagent": Path(__file__).parent / "prompts" / "memagent.toml"}

# Each key of the prompts file and the placeholders it must hold (no more, no fewer; OPTIONAL ones may be left out).
PLACEHOLDERS: dict[str, frozenset[str]] = {
    "update": frozenset({"problem", "memory", "section", "keep_instruction"}),
    "keep_instruction": frozenset({"sentinel"}),
    "final": frozenset({"problem", "memory"}),
    "no_memory": frozenset(),
    "outline": frozenset({"lines"}),
    "outline_line": frozenset({"heading"}),
    "outline_continued": frozenset(),
    "document_section": frozenset({"heading", "text"}),
}
# An update prompt may tell the model of no keep sentinel (MemAgent's does not); then the file has
# no keep_instruction, and a recipe with a sentinel is refused (ReaderRecipe).
OPTIONAL: dict[str, frozenset[str]] = {"update": frozenset({"keep_instruction"})}


class Renderer(Protocol):
    """What these functions use of ``agent.renderer.ChatRenderer``."""

    def text(self, text: str) -> list[int]: ...

    def user_prompt(self, parts: list[str | list[int]]) -> list[int]: ...


@dataclass(frozen=True)
class ReaderPrompts:
    """The words of the memory reader's prompts (see the file for what each key is)."""

    update: str
    keep_instruction: str | None  # None: the update prompt tells of no keep sentinel
    final: str
    no_memory: str
    outline: str
    outline_line: str
    outline_continued: str
    document_section: str
    path: Path
    sha256: str  # of the file's bytes

    @classmethod
    def named(cls, name: str) -> ReaderPrompts:
        """The packaged prompts the recipe's ``prompts`` setting names (explorer or memagent)."""
        if name not in PROMPTS_FILES:
            raise AgentError(f"no packaged reader prompts named {name!r}; the names are {', '.join(PROMPTS_FILES)}")
        return cls.load(PROMPTS_FILES[name])

    @classmethod
    def load(cls, path: Path = PROMPTS_FILE) -> ReaderPrompts:
        """The prompts in the TOML file at ``path`` (default: the packaged one), every key checked."""
        try:
            data = files.read_bytes(path, limit=files.DOCUMENT_BYTES, what="prompts .toml")
            table = files.parse_toml(files.decode(data, path), path)
        except FileNotFoundError:
            raise AgentError(f"{path}: no such file; cannot read the memory reader's prompts") from None
        except files.FileRefused as error:
            raise AgentError(f"{error}; cannot read the memory reader's prompts") from None
        unknown = sorted(set(table) - set(PLACEHOLDERS))
        if unknown:
            raise AgentError(f"{path}: unknown key {unknown[0]!r}; the keys are {', '.join(PLACEHOLDERS)}")
        keeps = isinstance(table.get("update"), str) and "keep_instruction" in _names(table["update"])
        for key, expected in PLACEHOLDERS.items():
            if key == "keep_instruction" and not keeps:
                if key in table:
                    raise AgentError(f"{path}: key 'keep_instruction' is given, but 'update' has no {{keep_instruction}} to take it")
                continue
            _check_template(path, key, table.get(key), expected, OPTIONAL.get(key, frozenset()))
        values: dict[str, Any] = {key: table.get(key) for key in PLACEHOLDERS}  # each checked above, keep_instruction may be None
        return cls(**values, path=path, sha256=hashlib.sha256(data).hexdigest())


def _names(template: str) -> set[str]:
    try:
        return {name for name, _, _ in _fields(template)}
    except ValueError:
        return set()  # refused, saying why, by _check_template


def _check_template(path: Path, key: str, template: object, expected: frozenset[str], optional: frozenset[str] = frozenset()) -> None:
    if template is None:
        raise AgentError(f"{path}: missing key {key!r}")
    if not isinstance(template, str):
        raise AgentError(f"{path}: key {key!r} must be a string, not {type(template).__name__}")
    try:
        fields = _fields(template)
    except ValueError as error:
        raise AgentError(f"{path}: key {key!r} is not a valid template ({error}); write {{{{ and }}}} for a literal brace") from None
    names = [name for name, _, _ in fields]
    unknown = sorted(set(names) - expected)
    if unknown:
        raise AgentError(f"{path}: key {key!r} has an unknown placeholder {{{unknown[0]}}}; it takes {_listed(expected)}")
    missing = sorted(expected - optional - set(names))
    if missing:
        raise AgentError(f"{path}: key {key!r} lacks the placeholder {{{missing[0]}}}; it takes {_listed(expected)}")
    dressed = next((name for name, spec, conversion in fields if spec or conversion), None)
    if dressed is not None:
        raise AgentError(f"{path}: key {key!r}: placeholder {{{dressed}}} takes no format spec or conversion")


def _listed(names: frozenset[str]) -> str:
    return ", ".join(f"{{{name}}}" for name in sorted(names)) or "no placeholders"


def _fields(template: str) -> list[tuple[str, str, str | None]]:
    """(name, format spec, conversion) of each placeholder of ``template``, in order."""
    return [(name, spec or "", conversion) for _, name, spec, conversion in string.Formatter().parse(template) if name is not None]


def build(renderer: Renderer, template: str, values: dict[str, list[int] | str]) -> list[int]:
    """The chat prompt of one user turn whose content is ``template`` filled with ``values``, as ids.

    A value that is a list of ids is spliced in as those ids; a string value is formatted into
    the text around it. Each stretch of text between spliced ids (the first one opened with
    the template's role header) is encoded as one piece. Raises AgentError for a placeholder
    without a value."""
    parts: list[str | list[int]] = []
    text = ""
    for literal, name, _, _ in string.Formatter().parse(template):
        text += literal
        if name is None:
            continue
        if name not in values:
            raise AgentError(f"the memory reader's prompt has a placeholder {{{name}}} that was given no value")
        value = values[name]
        if isinstance(value, str):
            text += value
        else:
            parts += [text, value]
            text = ""
    return renderer.user_prompt([*parts, text])


def update_prompt(
    renderer: Renderer,
    prompts: ReaderPrompts,
    *,
    problem_ids: list[int],
    memory_ids: list[int],
    outline_ids: list[int],
    page_ids: list[int],
    sentinel: str | None,
) -> list[int]:
    """The prompt of one memory update: the problem, the memory so far, then the section (the
    page-local outline's ids, then the page's). The keep instruction is filled only with a sentinel."""
    if sentinel and prompts.keep_instruction is None:
        raise AgentError(f"{prompts.path}: the update prompt tells of no keep sentinel, so {sentinel!r} cannot be used with it")
    keep = prompts.keep_instruction.format(sentinel=sentinel) if sentinel and prompts.keep_instruction is not None else ""
    values: dict[str, list[int] | str] = {
        "problem": problem_ids,
        "memory": memory_ids,
        "section": [*outline_ids, *page_ids],
        "keep_instruction": keep,
    }
    return build(renderer, prompts.update, values)


def final_prompt(renderer: Renderer, prompts: ReaderPrompts, *, problem_ids: list[int], memory_ids: list[int]) -> list[int]:
    """The prompt of the final answer: the problem and the memory, no page text."""
    return build(renderer, prompts.final, {"problem": problem_ids, "memory": memory_ids})


def problem_text(question: str, prompts_name: str) -> str:
    """The question as the prompts hold it: MemAgent's evaluation strips it (``item['input'].strip()``);
    ours keeps it as given, as every reader trajectory before the memagent prompts was served."""
    return question.strip() if prompts_name == "memagent" else question


def memory_ids(renderer: Renderer, prompts: ReaderPrompts, memory: str | None, cap: int) -> list[int]:
    """The memory as spliced into a prompt: ``None`` (before the first update) is the no-memory
    text; otherwise the memory's text re-encoded. Either is cut to its first ``cap`` ids, so the
    memory never exceeds the cap and a check can rebuild it from the recorded text."""
    if cap < 1:
        raise AgentError(f"the memory cap must be at least 1 token, not {cap}")
    return renderer.text(prompts.no_memory if memory is None else memory)[:cap]


BOX = "\\boxed{"


def parse_answer(text: str) -> tuple[str | None, str]:
    """The answer in a final call's text and how it was given.

    The content of the last complete ``\\boxed{...}`` (braces balanced; a box inside a box is part
    of the outer one's content), stripped -> ``(answer, "boxed")``, with ``None`` for an empty box.
    No complete box -> the whole text stripped, ``(text or None, "plain")``. Linear in the text's
    length: a text of many unclosed boxes (a server may write past the cap) is one pass, not one per box."""
    answer = None
    search_from = 0
    closing_of = _closing_braces(text) if BOX in text else {}
    while (opening := text.find(BOX, search_from)) >= 0:
        closing = closing_of.get(opening + len(BOX) - 1)
        if closing is None:  # never closed: a box inside it may still close
            search_from = opening + len(BOX)
            continue
        answer = text[opening + len(BOX) : closing]
        search_from = closing + 1
    if answer is not None:
        return answer.strip() or None, "boxed"
    return text.strip() or None, "plain"


def boxed_only(text: str) -> str | None:
    """The answer as MemAgent's evaluation takes it (``answer_from = "boxed"``): the text after the
    last ``</think>`` if any (its ``extract_solution``), then the content of the LAST ``\\boxed``
    (its ``extract_boxed_answer``: ``\\boxed{...}`` with braces counted from it, or ``\\boxed x``
    up to a ``$``). None where that gives none: no box, the last one never closed, or one the upstream
    code would fail an assertion on (an ``\\fbox``), all of which it scores 0. An empty or blank
    answer is None too: upstream scores it 0 as well. Ported, and tested against upstream's own code."""
    if "</think>" in text:
        text = text.split("</think>")[-1].strip()
    found = _last_boxed(text)
    if found is None:
        return None
    if "\\boxed " in found:
        answer = found[len("\\boxed ") :]
    elif found.startswith(BOX) and found.endswith("}"):
        answer = found[len(BOX) : -1]
    else:
        return None
    return answer.strip() or None


def _last_boxed(text: str) -> str | None:
    """MemAgent's ``last_boxed_only_string``, step for step (taskutils/memory_eval/utils/__init__.py)."""
    index = text.rfind("\\boxed")
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    if index < 0:
        index = text.rfind("\\fbox")
        if index < 0:
            return None
    depth = 0
    for position in range(index, len(text)):
        if text[position] == "{":
            depth += 1
        if text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[index : position + 1]
    return None


def answer_of(text: str, answer_from: str) -> str | None:
    """The final call's answer under the recipe's ``answer_from``: ``boxed`` (MemAgent's rule,
    ``boxed_only``) or ``boxed-or-text`` (``parse_answer``)."""
    if answer_from == "boxed":
        return boxed_only(text)
    return parse_answer(text)[0]


def _closing_braces(text: str) -> dict[int, int]:
    """Where each ``{`` of ``text`` that is closed is closed (braces counted from it, as nesting
    goes), by one pass; a ``{`` never closed is not in it."""
    closing: dict[int, int] = {}
    opened: list[int] = []
    for match in _BRACES.finditer(text):
        if match.group() == "{":
            opened.append(match.start())
        elif opened:  # a "}" before any open "{" closes nothing
            closing[opened.pop()] = match.start()
    return closing


_BRACES = re.compile("[{}]")


def is_keep(text: str, sentinel: str | None) -> bool:
    """Whether a memory update's text is the keep sentinel (surrounding whitespace ignored)."""
    if not sentinel:
        return False
    return text.strip() == sentinel.strip()
