"""A tokenizer's own chat template, read from its files and rendered as transformers renders it,
then taken apart into the pieces the renderer (``agent.renderer``) concatenates.

The template is the source of truth for every string the model was trained to see around a
message: role headers, the generation prompt, what ends a turn. We never copy a family's layout
into code. We render the template once per shape of conversation with *placeholder* contents
(private-use characters no template transforms), and split the output at the placeholders:

* ``head``: everything up to the first assistant turn (system and first user message, with what
  the template adds: a BOS, a default system prompt, a date header, a system folded into the
  user turn), with slots for the messages' contents;
* ``generation``: the generation prompt, per thinking mode where the template has one;
* ``end``: what follows an assistant message up to and including the first control token (the
  token the model writes to end its turn: ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``...);
* ``between`` / ``after_user``: the text from that end to a following user message's content,
  and after it; ``tail``: what follows ``end`` when the conversation ends with the assistant.

Templates run in jinja2's immutable sandbox with transformers' globals (``raise_exception``,
``strftime_now``, ``tojson``, loop controls). ``strftime_now`` is given a fixed date, 2025-01-01:
a template that prints today's date would otherwise make the same run render differently on
another day (DESIGN invariant 4).

What is *not* taken from the template: a transformation of the content itself (``| trim``,
Qwen3's splitting of ``</think>`` out of history). Contents are rendered as written, so what is
trained is exactly what the model wrote; the renderer's check at load (``ChatRenderer.verify``)
says where this differs from the template on a probe conversation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError

FIXED_DATE = datetime(2025, 1, 1)
TEMPLATE_FILE = "chat_template.jinja"  # what transformers >= 4.50 writes beside tokenizer_config.json
CONFIG_FILE = "tokenizer_config.json"
MAX_TEMPLATE_BYTES = 1 << 20


def placeholder(index: int) -> str:
    """A content no template changes: private-use characters, no whitespace, no markup."""
    return f"\ue000{index}\ue001"


@dataclass(frozen=True)
class TemplateSource:
    text: str
    special: dict[str, str]  # bos_token, eos_token, ... as the template reads them
    origin: str  # the file it came from, for messages

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]  # an AddedToken serialised by transformers
    return None


def read_template(directory: Path) -> TemplateSource:
    """The chat template of a tokenizer directory: ``chat_template.jinja`` if present, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or the list of named templates whose
    ``default`` transformers uses). One clear line when there is none."""
    config_path = directory / CONFIG_FILE
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = files.parse_json(_bounded_read(config_path), config_path)
        except (ValueError, files.FileRefused) as error:  # ValueError: invalid JSON
            raise AgentError(f"{config_path}: not valid JSON ({error}); the tokenizer directory is damaged") from None
        if not isinstance(config, dict):
            raise AgentError(f"{config_path}: not a JSON object; the tokenizer directory is damaged")
    special = {key: text for key in ("bos_token", "eos_token", "pad_token", "unk_token") if (text := _token_text(config.get(key)))}
    template_path = directory / TEMPLATE_FILE
    if template_path.is_file():
        return TemplateSource(_bounded_read(template_path), special, str(template_path))
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        raise AgentError(
            f"{directory}: the tokenizer has no chat template (no {TEMPLATE_FILE}, no chat_template in {CONFIG_FILE}); "
            "name an instruction-tuned (chat) model's directory"
        )
    return TemplateSource(template, special, str(config_path))


def _bounded_read(path: Path) -> str:
    """A tokenizer file's text (``corpus.files``: a regular file, bounded, UTF-8). Links are followed:
    a hub snapshot's files are links to its blobs."""
    try:
        return files.read_text(path, limit=MAX_TEMPLATE_BYTES, what="tokenizer")
    except files.FileRefused as error:
        raise AgentError(f"{error}; not a tokenizer file") from None


@lru_cache(maxsize=16)
def compile_template(text: str):
    """The template compiled as transformers compiles it (sandboxed; its globals and filters)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = FIXED_DATE.strftime
    try:
        return environment.from_string(text)
    except jinja2.exceptions.TemplateError as error:
        raise AgentError(f"the chat template does not compile: {error}") from None


class TemplateRefused(AgentError):
    """The template raised on a conversation (``raise_exception``), e.g. one that has no system role."""


def render(source: TemplateSource, messages: list[dict[str, str]], *, generation: bool, thinking: bool | None) -> str:
    """``messages`` as the template renders them. ``thinking`` is passed as ``enable_thinking``
    (None: not passed, the template's own default)."""
    import jinja2

    arguments: dict[str, Any] = {**source.special, "messages": messages, "add_generation_prompt": generation}
    if thinking is not None:
        arguments["enable_thinking"] = thinking
    try:
        return compile_template(source.text).render(**arguments)
    except jinja2.exceptions.TemplateError as error:
        raise TemplateRefused(f"the chat template ({source.origin}) refused the conversation: {error}") from None
    except Exception as error:  # a template is code: anything it raises is a fault of the template
        raise TemplateRefused(f"the chat template ({source.origin}) failed: {type(error).__name__}: {error}") from None


@dataclass(frozen=True)
class Piece:
    """A part of a rendered conversation: the template's own text (its control-token spellings
    are control tokens) or a slot for message ``slot``'s content."""

    text: str = ""
    slot: int | None = None


def split_at_placeholders(rendered: str, slots: int) -> list[Piece]:
    """``rendered`` cut at the placeholders 0..slots-1, each of which must occur exactly once, in order."""
    pieces: list[Piece] = []
    rest = rendered
    for index in range(slots):
        mark = placeholder(index)
        if rest.count(mark) != 1:
            found = "not at all" if mark not in rest else f"{rest.count(mark)} times"
            raise AgentError(f"the chat template shows message {index + 1} {found}; the renderer needs each message exactly once")
        before, _, rest = rest.partition(mark)
        if before:
            pieces.append(Piece(before))
        pieces.append(Piece(slot=index))
    if "\ue000" in rest:
        raise AgentError("the chat template shows a message out of order; the renderer needs the messages in order")
    if rest:
        pieces.append(Piece(rest))
    return pieces
