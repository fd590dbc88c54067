"""One renderer for serving and training: messages -> the model's own chat format as token ids,
message by message, with the assistant mask.

The layout comes from the tokenizer's chat template (``agent.chat_template``), never from a copy
of one family's format in code: ChatML (Qwen, SmolLM), Llama 3, Gemma and any template whose
conversation has the usual shape. A conversation is

    head(system, first user message)
    then per step: generation prompt, action + end of turn, [between, observation, after_user]
    and, when it ends with the assistant, the template's tail

* Observations are **user** turns: the trajectory's messages are exactly what is rendered.
* Every assistant turn is rendered **as it was served**: the generation prompt the policy was
  prompted with (Qwen3's empty think block included), then what the model wrote. Where a
  template re-renders earlier turns differently (Qwen3 drops their think blocks), we do not
  follow it, so the prompt at step t is always a prefix of the training sequence; ``verify``
  finds such templates at load and says so (``TemplateCheck.rewrites_history``).
* The assistant mask covers what the model generates: the action and the control token that
  ends its turn (and, when asked, its think block). Role headers, the generation prompt and
  the template's text after the end of turn are never trained on.
* Text is tokenised as the tokenizer does a whole rendered string: each span between two
  control tokens is encoded as one piece (a role header's text and the content together). The
  one span we end on purpose is the generation prompt's: it was served on its own.
* A control token's spelling inside a message is encoded as ordinary characters, never as the
  control token: a paper cannot end a turn.
* Thinking exists only where the template has it (its generation prompt differs with
  ``enable_thinking``): the model then writes ``<think>{reasoning}</think>{action}`` itself.
  A model that ends its turn without ``</think>`` wrote no think block that closed: its whole
  text is the content (``thinking_unclosed``), rendered after the thinking-mode generation
  prompt with the ``<think>`` it opened with as the control token.

``verify`` renders a probe conversation both ways, ours and the template's text tokenised whole,
and refuses a template the renderer cannot reproduce, in one line, before any weights load.

Why one module: the template's layout, the assembly of ids from it and the check at load share
one table of control tokens and one rule for where a span of text ends; the check is only worth
something because it runs the same assembly that serving and training run.
"""

from __future__ import annotations

import functools
import hashlib
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paper_explorer.corpus.files as files
from paper_explorer.agent.chat_template import (
    Piece,
    TemplateRefused,
    TemplateSource,
    placeholder,
    read_template,
    render,
    split_at_placeholders,
)
from paper_explorer.agent.errors import AgentError
from paper_explorer.corpus.setting_names import setting

THINK, END_THINK = "<think>", "</think>"
TEXT_CACHE = 4096  # texts whose ids a renderer remembers (8 bytes an id: at most ~35 MB for 1k-token texts)
# A longer text is encoded each time, never remembered: a served document (explorer serve) or a
# benchmark's context would keep its text and ids alive, 4096 of them growing into gigabytes.
REMEMBERED_CHARS = 32_768
BREAK = object()  # ends the current span of text: what follows is encoded as a piece of its own
MARK = object()  # records the position it is reached at (always a boundary: after a BREAK or a control token)
FOLD_SEPARATOR = "\n\n"  # a template without a system role gets the system prompt before the first user message

# The probe conversation ``verify`` renders both ways: code, punctuation, newlines at both ends.
PROBE = [
    {"role": "system", "content": "You answer questions about papers with Python actions."},
    {"role": "user", "content": "Question: What learning rate is used?"},
    {"role": "assistant", "content": '```python\nhits = search("learning rate", k=3)\nprint(hits)\n```'},
    {"role": "user", "content": "Out: [{'paper_id': 'p1', 'score': 2.5}]\n"},
    {"role": "assistant", "content": '```python\nsubmit("0.001")\n```'},
]


@dataclass
class Rendered:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 where the token is trained on (assistant output)
    turns: list[tuple[int, int, int]] = field(default_factory=list)  # per assistant message: (first trained, end, end of turn)

    def extend(self, ids: list[int], trained: bool) -> None:
        self.ids.extend(ids)
        self.mask.extend([int(trained)] * len(ids))


@dataclass(frozen=True)
class TemplateCheck:
    """What ``verify`` found, recorded with every run and training set."""

    chat_template_sha256: str
    end_of_turn: str
    thinking: bool  # the template has a thinking mode
    system: str  # "template" or "folded": a template without a system role gets it in the first user turn
    rewrites_history: bool  # the template re-renders earlier turns; training sequences keep them as served
    note: str | None = None

    def record(self) -> dict[str, Any]:
        return {
            "chat_template_sha256": self.chat_template_sha256,
            "end_of_turn": self.end_of_turn,
            "thinking": self.thinking,
            "system": self.system,
            "history": "as served" + (" (the template re-renders earlier turns)" if self.rewrites_history else ""),
        }


@dataclass(frozen=True)
class Layout:
    """The template's pieces (see the module docstring); ``generation`` per thinking mode."""

    generation: dict[bool, str]
    end: str
    tail: str
    between: str
    after_user: str
    fold_system: bool


class ChatRenderer:
    def __init__(self, tokenizer, template: TemplateSource, fingerprint: str | None = None) -> None:
        """``tokenizer``: a ``tokenizers.Tokenizer``; ``template``: its chat template.
        ``fingerprint``: the SHA-256 of the tokenizer.json it was read from; for a tokenizer built
        in memory, the SHA-256 of its JSON serialisation. Raises AgentError, in one line, for a
        template the renderer cannot reproduce token for token."""
        self.tokenizer, self.template = tokenizer, template
        self.fingerprint = fingerprint or hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        self._controls = {token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()}
        self._specials = list(self._controls)
        self._special_spelling = re.compile("(" + "|".join(re.escape(t) for t in sorted(self._specials, key=len, reverse=True)) + ")")
        self._remembered = functools.lru_cache(maxsize=TEXT_CACHE)(self._text)  # thread-safe; ids kept compactly
        self._heads: dict[tuple[str, ...], list[Piece]] = {}
        self.layout = self._analyse()
        self.end_of_turn = self._controls[self._first_control(self.layout.end)]
        self.thinking_supported = self.layout.generation[True] != self.layout.generation[False]
        self.think = self._controls.get(THINK) if self.thinking_supported else None
        self.end_think = self._controls.get(END_THINK) if self.thinking_supported else None
        if self.thinking_supported and (self.think is None or self.end_think is None):
            self.thinking_supported = False  # a thinking switch without <think> tokens: we cannot split what it writes
        self._tail_ids = self._tail()
        self.check = self.verify()
        eos = template.special.get("eos_token")
        self.stop_ids = {self.end_of_turn} | ({tokenizer.token_to_id(eos)} - {None} if eos else set())
        pad = template.special.get("pad_token")
        self.pad_id = (tokenizer.token_to_id(pad) if pad else None) or self.end_of_turn  # padding is masked: any id does
        self.end_of_turn_text = self._first_control(self.layout.end)

    @classmethod
    def from_directory(cls, path: Path) -> ChatRenderer:
        """A model or tokenizer directory holding ``tokenizer.json`` and a chat template."""
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise AgentError(f"{path}: no tokenizer.json; name a model or tokenizer directory")
        return cls.from_file(file)

    @classmethod
    def from_file(cls, file: Path) -> ChatRenderer:
        """``file``: a tokenizer.json; the chat template is read from the same directory."""
        from tokenizers import Tokenizer

        try:  # a regular file, bounded (corpus.files); links followed: a hub snapshot's files are links to its blobs
            data = files.read_bytes(file, limit=files.DOCUMENT_BYTES, what="tokenizer.json")
        except files.FileRefused as error:
            raise AgentError(str(error)) from None
        try:
            tokenizer = Tokenizer.from_str(data.decode())
        except Exception as error:  # the tokenizers library raises plain Exception on a bad file
            raise AgentError(f"{file}: not a tokenizer file ({str(error).splitlines()[0]})") from None
        return cls(tokenizer, read_template(file.parent), hashlib.sha256(data).hexdigest())

    # -- the template's layout ------------------------------------------------------------------

    def _probe(self, roles: tuple[str, ...], fold: bool) -> list[dict[str, str]]:
        messages = [{"role": role, "content": placeholder(i)} for i, role in enumerate(roles)]
        if fold and roles[:2] == ("system", "user"):
            return [{"role": "user", "content": placeholder(0) + FOLD_SEPARATOR + placeholder(1)}, *messages[2:]]
        return messages

    def _render(self, roles: tuple[str, ...], fold: bool, generation: bool = False, thinking: bool = False) -> str:
        return render(self.template, self._probe(roles, fold), generation=generation, thinking=thinking)

    def _analyse(self) -> Layout:
        origin = self.template.origin
        try:
            head, fold = self._render(("system", "user"), False), False
        except TemplateRefused:
            head, fold = self._render(("system", "user"), True), True  # e.g. Mistral's and Gemma 2's templates refuse a system role
        generation = {}
        for thinking in (False, True):
            prompted = self._render(("system", "user"), fold, generation=True, thinking=thinking)
            if not prompted.startswith(head):
                raise AgentError(f"{origin}: the chat template's generation prompt changes the turns before it; not supported")
            generation[thinking] = prompted[len(head) :]
        one = self._render(("system", "user", "assistant"), fold)
        if not one.startswith(head):
            raise AgentError(f"{origin}: the chat template renders the first turns differently once the assistant answers; not supported")
        before, _, after = one[len(head) :].partition(placeholder(2))
        end = self._end(after)
        if end is None:
            raise AgentError(f"{origin}: no control token ends the assistant's turn in this chat template; the model could not stop")
        two = self._render(("system", "user", "assistant", "user"), fold)
        split_at_placeholders(two, 4)  # each message once, in order
        middle, _, after_user = two.partition(placeholder(2))[2].partition(placeholder(3))
        if not middle.startswith(end):
            raise AgentError(f"{origin}: the chat template ends an assistant turn differently once a message follows; not supported")
        prompted = self._render(("system", "user", "assistant", "user"), fold, generation=True)
        if prompted != two + generation[False]:
            raise AgentError(f"{origin}: the chat template's generation prompt differs from turn to turn; not supported")
        if before != generation[False]:
            # the model's own turn must open exactly as it was prompted, or serving and training disagree
            raise AgentError(
                f"{origin}: the chat template opens an assistant turn with {before!r} but prompts with {generation[False]!r}; not supported"
            )
        return Layout(generation, end, after[len(end) :], middle[len(end) :], after_user, fold)

    def _first_control(self, text: str) -> str:
        found = self._special_spelling.search(text)
        assert found is not None
        return found.group(0)

    def _end(self, after: str) -> str | None:
        """What ends an assistant turn: the text after it up to and including the first control token."""
        found = self._special_spelling.search(after)
        return after[: found.end()] if found else None

    def _tail(self) -> list[int]:
        """The tail's ids, if they are what the next turn starts with (a control token follows the
        tail there); otherwise no tail, so that a training sequence is always a prefix of the next prompt."""
        tail = self._assemble(self._template_units(self.layout.tail, False)).ids
        following = self._assemble([*self._template_units(self.layout.between, False), ("x", False)]).ids
        return tail if following[: len(tail)] == tail else []

    @functools.cached_property
    def _users(self) -> str:
        """What the template puts between a user message and a second one that follows it."""
        roles = ("system", "user", "assistant", "user", "user")
        try:
            rendered = self._render(roles, self.layout.fold_system)
        except TemplateRefused as error:
            raise AgentError(f"this chat template takes no two user messages in a row ({error})") from None
        split_at_placeholders(rendered, 5)
        middle, _, after = rendered.partition(placeholder(3))[2].partition(placeholder(4))
        if not middle.startswith(self.layout.after_user) or after != self.layout.after_user:
            raise AgentError(f"{self.template.origin}: the chat template lays out two user messages in a row unlike one; not supported")
        return middle[len(self.layout.after_user) :]

    def _head(self, roles: tuple[str, ...]) -> list[Piece]:
        if roles not in self._heads:
            if any(role not in ("system", "user") for role in roles) or roles.count("system") > 1 or "system" in roles[1:]:
                raise AgentError(f"the renderer lays out an optional system message, then user messages: got {', '.join(roles)}")
            fold = self.layout.fold_system and roles[:1] == ("system",)
            if fold and len(roles) < 2:
                raise AgentError("this chat template has no system role, and the conversation has no user message to fold it into")
            self._heads[roles] = split_at_placeholders(self._render(roles, fold), len(roles))
        return self._heads[roles]

    # -- text -----------------------------------------------------------------------------------

    def text(self, text: str) -> list[int]:
        """Plain text to ids, as one piece. A special token's spelling inside text (a paper or an
        action that quotes ``<|im_end|>``) is encoded as ordinary characters, never as the control token.

        Remembered for the last ``TEXT_CACHE`` texts: every step re-renders the conversation, whose
        system prompt is the same in every episode and whose earlier turns were encoded at the
        step before (half of an openai policy's host time per step went to encoding them again).
        A text over ``REMEMBERED_CHARS`` is not remembered."""
        return list(self._remembered(text) if len(text) <= REMEMBERED_CHARS else self._pieces(text))

    def _text(self, text: str) -> array:
        return array("l", self._pieces(text))

    def _pieces(self, text: str) -> list[int]:
        if not any(token in text for token in self._specials):
            return self._encode(text)
        ids: list[int] = []
        for piece in self._special_spelling.split(text):
            if piece in self._controls:
                ids += self._encode(piece[0])
                ids += self._pieces(piece[1:])
            elif piece:
                ids += self._encode(piece)
        return ids

    def _encode(self, text: str) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        except TypeError:  # the tokenizers library refuses a str it cannot encode as UTF-8
            position = next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)
            raise AgentError(
                f"text holding a lone surrogate (at character {position}) cannot be tokenised: "
                f"{text[max((position or 0) - 20, 0) : (position or 0)]!r}...; the record is not valid Unicode"
            ) from None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def as_server_reads(self, ids: list[int]) -> list[int]:
        """The ids a server that takes text would make of ``ids`` sent as their decoded text: the
        tokenizer on the whole string, control-token spellings included."""
        return self.tokenizer.encode(self.decode(ids), add_special_tokens=False).ids

    # -- units: template text (its control tokens are control tokens), content, ids ---------------

    def _template_units(self, text: str, trained: bool) -> list:
        units: list = []
        for part in self._special_spelling.split(text):
            if part in self._controls:
                units.append((self._controls[part], trained))
            elif part:
                units.append((part, trained))
        return units

    def _assemble(self, units: list, marks: list[int] | None = None) -> Rendered:
        """Units -> ids: consecutive texts are encoded as one piece, up to a control token, ids or a BREAK."""
        rendered = Rendered()
        buffer: list[str] = []
        buffered_trained = False

        def flush() -> None:
            if buffer:
                rendered.extend(self.text("".join(buffer)), buffered_trained)
                buffer.clear()

        for unit, trained in units:
            if isinstance(unit, str):
                if buffer and trained != buffered_trained:
                    flush()
                buffer.append(unit)
                buffered_trained = trained
                continue
            flush()
            if isinstance(unit, int):
                rendered.extend([unit], trained)
            elif isinstance(unit, list):
                rendered.extend(unit, trained)
            elif unit is MARK and marks is not None:
                marks.append(len(rendered.ids))
        flush()
        return rendered

    def _generation_units(self, thinking: bool) -> list:
        if thinking and not self.thinking_supported:
            raise AgentError(f"this model's chat template has no thinking mode; drop {setting('policy.thinking')}")
        return [*self._template_units(self.layout.generation[thinking], False), (BREAK, False)]

    def _head_units(self, messages: list[dict[str, str]], contents: list) -> list:
        """The head of ``messages`` (system and user messages before the first assistant turn);
        ``contents``: per message, its units (a str, or str and id lists for spliced prompts)."""
        roles = tuple(message["role"] for message in messages)
        units: list = []
        for piece in self._head(roles):
            units += self._template_units(piece.text, False) if piece.slot is None else contents[piece.slot]
        return units

    def _units(self, messages: list[dict[str, str]], train_thinking: bool = False) -> list:
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        units = self._head_units(messages[:first], [[(m["content"], False)] for m in messages[:first]]) if first else []
        for position in range(first, len(messages)):
            message, role = messages[position], messages[position]["role"]
            if role == "assistant":
                reasoning, unclosed = message.get("reasoning"), bool(message.get("thinking_unclosed"))
                units += self._generation_units(thinking=reasoning is not None or unclosed)
                units.append((MARK, False))
                if reasoning is not None:
                    units += [(self.think, train_thinking), (reasoning, train_thinking), (self.end_think, train_thinking), (BREAK, False)]
                if unclosed and message["content"].startswith(THINK):
                    units += [(self.think, True), (message["content"].removeprefix(THINK), True)]
                else:
                    units.append((message["content"], True))
                units += self._template_units(self.layout.end, True)
                units.append((MARK, False))
                if position == len(messages) - 1:
                    units.append((self._tail_ids, False))
            elif role == "user" and position > 0 and messages[position - 1]["role"] == "assistant":
                units += [*self._template_units(self.layout.between, False), (message["content"], False)]
                units += self._template_units(self.layout.after_user, False)
            elif role == "user" and position > 0:  # a second user message (a probe's question after the last observation)
                units += [*self._template_units(self._users, False), (message["content"], False)]
                units += self._template_units(self.layout.after_user, False)
            else:
                raise AgentError(
                    f"the renderer lays out assistant and user turns alternating after the first: message {position + 1} is {role!r}"
                )
        return units

    # -- the public interface -------------------------------------------------------------------

    def generation_prompt(self, thinking: bool = False) -> list[int]:
        """The ids the model is prompted with to write its turn, as the template writes them."""
        return self._assemble(self._generation_units(thinking)).ids

    def action(self, content: str) -> list[int]:
        """What the model generates for an action: its text and the control token that ends its turn."""
        return self._assemble([(content, True), *self._template_units(self.layout.end, True)]).ids

    def unclosed(self, content: str) -> list[int]:
        """What a model wrote in thinking mode when it ended its turn without ``</think>``: its
        whole text, a leading ``<think>`` being the control token it generated (vLLM spells it
        out with skip_special_tokens false), then the end of turn."""
        if self.think is not None and content.startswith(THINK):
            return [self.think, *self.action(content.removeprefix(THINK))]
        return self.action(content)

    def thought(self, reasoning: str) -> list[int]:
        """A think block as the model writes it in thinking mode."""
        if self.think is None or self.end_think is None:
            raise AgentError("this model's chat template has no thinking mode; a recorded think block cannot be rendered with it")
        return [self.think, *self.text(reasoning), self.end_think]

    def render(self, messages: list[dict[str, str]], train_thinking: bool = False) -> Rendered:
        """The training sequence of ``messages``; ``train_thinking`` also trains the think
        blocks the model wrote (thinking mode), which are otherwise context only. ``turns`` gives,
        per assistant message, its first trained token, the end of its trained tokens and the end
        of its turn (after the template's tail): a cut there is ``render(messages[:i + 1])``."""
        marks: list[int] = []
        rendered = self._assemble(self._units(messages, train_thinking), marks)
        for start, end in zip(marks[::2], marks[1::2]):  # two marks per assistant turn: after its prompt, after its end
            first = next((i for i in range(start, end) if rendered.mask[i]), end)
            rendered.turns.append((first, end, end + len(self._tail_ids)))
        return rendered

    def prompt(self, messages: list[dict[str, str]], thinking: bool = False) -> list[int]:
        """The ids a policy is prompted with: the conversation so far, then the generation prompt."""
        return self._assemble([*self._units(messages), *self._generation_units(thinking)]).ids

    def user_prompt(self, parts: list[str | list[int]]) -> list[int]:
        """A one-message conversation whose user content is ``parts`` (texts, and ids spliced in
        as they are), then the generation prompt: the memory reader's prompts."""
        content = [(part, False) if isinstance(part, str) else (list(part), False) for part in parts]
        return self._assemble([*self._head_units([{"role": "user", "content": ""}], [content]), *self._generation_units(False)]).ids

    # -- the check at load ------------------------------------------------------------------------

    def verify(self) -> TemplateCheck:
        """Render ``PROBE`` both ways - ours, and the template's text tokenised whole - and refuse,
        in one line, where the first prompt, an assistant turn or a thinking prompt differ; find
        whether the template re-renders history (then training keeps each turn as served)."""
        origin = self.template.origin

        def theirs(messages, generation: bool, thinking: bool = False) -> list[int]:
            text = render(self.template, self._folded(messages), generation=generation, thinking=thinking)
            return self.tokenizer.encode(text, add_special_tokens=False).ids

        checks = [(self.prompt(PROBE[:2]), theirs(PROBE[:2], True), "the first prompt")]
        checks.append((self.render(PROBE[:3]).ids, theirs(PROBE[:3], False), "the assistant's turn"))
        if self.thinking_supported:
            checks.append((self.prompt(PROBE[:2], thinking=True), theirs(PROBE[:2], True, True), "the thinking-mode prompt"))
        for ours, template, what in checks:
            if ours != template:
                at = next((i for i, (a, b) in enumerate(zip(ours, template)) if a != b), min(len(ours), len(template)))
                raise AgentError(
                    f"{origin}: the renderer cannot reproduce this chat template token for token ({what} differs at token {at}: "
                    f"ours {self.decode(ours[at : at + 6])!r}, the template's {self.decode(template[at : at + 6])!r}); not supported"
                )
        whole = self.render(PROBE)
        for step in range(2):
            prompt = self.prompt(PROBE[: 2 + 2 * step])
            written = self.action(PROBE[2 + 2 * step]["content"])
            if whole.ids[: len(prompt) + len(written)] != prompt + written:  # by construction; a fault here is ours
                raise AgentError(f"{origin}: step {step + 1}'s prompt is not a prefix of the training sequence; please report this")
        trained = [token for token, kept in zip(whole.ids, whole.mask) if kept]
        if trained != self.action(PROBE[2]["content"]) + self.action(PROBE[4]["content"]):
            raise AgentError(f"{origin}: the assistant mask does not cover exactly what the model wrote; please report this")
        rewrites = whole.ids != theirs(PROBE, False)
        return TemplateCheck(
            chat_template_sha256=self.template.sha256,
            end_of_turn=self._first_control(self.layout.end),
            thinking=self.thinking_supported,
            system="folded" if self.layout.fold_system else "template",
            rewrites_history=rewrites,
            note=(
                f"this chat template re-renders earlier turns ({origin}); training sequences keep every turn as it was served"
                if rewrites
                else None
            ),
        )

    def _folded(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.layout.fold_system and messages and messages[0]["role"] == "system":
            first = messages[1]
            return [{"role": "user", "content": messages[0]["content"] + FOLD_SEPARATOR + first["content"]}, *messages[2:]]
        return messages


def split_thinking(text: str) -> tuple[str, str, bool]:
    """A thinking-mode generation -> (reasoning, action text, whether </think> closed the reasoning)."""
    body = text.removeprefix(THINK)
    reasoning, closed, after = body.partition(END_THINK)
    return (reasoning, after, True) if closed else (body, "", False)
