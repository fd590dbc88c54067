"""One renderer for serving and training: messages -> Qwen3 ChatML token ids, message by message.

Layout (Qwen3, non-thinking mode)::

    <|im_start|>system\n{system prompt}<|im_end|>\n
    <|im_start|>user\nQuestion: ...<|im_end|>\n
    <|im_start|>assistant\n<think>\n\n</think>\n\n{action}<|im_end|>\n
    <|im_start|>user\n{observation}<|im_end|>\n
    ...

In thinking mode the generation prompt stops after ``<|im_start|>assistant\n`` and the model
writes ``<think>{reasoning}</think>{action}<|im_end|>`` itself; an assistant message then carries
its ``reasoning`` beside its ``content`` and is rendered exactly so. A model that ends its turn
without ``</think>`` wrote no think block that closed: as Qwen3's template reads such a turn back,
its whole text is the content (``thinking_unclosed`` on the message), rendered after the
thinking-mode generation prompt with the ``<think>`` it opened with as the control token.

* Observations are **user** turns (not Qwen's tool role): the trajectory's messages are
  exactly what is rendered, and nothing re-wraps them.
* Every assistant turn keeps its think block - the empty one the generation prompt put before
  it, or the reasoning the model wrote. Qwen3's own chat template drops think blocks from
  earlier turns when it re-renders history; we never re-render, so the prompt at step t is
  always a prefix of the training sequence.
* The model stops at ``<|im_end|>``; the newline after it is the renderer's, added the same way
  when the next prompt is built and when the training sequence is.
* The assistant mask covers the action's tokens and its ``<|im_end|>``: the tokens a model
  generates (and, when asked, its think block). Role headers, the generation prompt's think
  block and the newline are never trained on.
* Text is tokenised as Qwen3's tokenizer does a whole rendered string: each span between two
  control tokens is encoded as one piece (``user\n`` and the content together), so wherever
  Qwen3's template renders the same text the ids are the same. The one span we split on purpose
  is the generation prompt's ``\n\n`` before an action: it was served on its own.
* A special token's spelling inside text is encoded as ordinary characters, never as the
  control token: a paper cannot end a turn.
"""

from __future__ import annotations

import functools
import hashlib
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import AgentError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
END_OF_TEXT_TOKEN = "<|endoftext|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
SPECIAL_TOKENS = (IM_START, IM_END, "<think>", "</think>")
TEXT_CACHE = 4096  # texts whose ids a renderer remembers (8 bytes an id: at most ~35 MB for 1k-token texts)


@dataclass
class Rendered:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 where the token is trained on (assistant output)

    def extend(self, ids: list[int], trained: bool) -> None:
        self.ids.extend(ids)
        self.mask.extend([int(trained)] * len(ids))


class ChatRenderer:
    def __init__(self, tokenizer, fingerprint: str | None = None) -> None:
        """``tokenizer``: a ``tokenizers.Tokenizer`` that knows Qwen's special tokens.
        ``fingerprint``: the SHA-256 of the tokenizer.json it was read from; for a tokenizer built
        in memory, the SHA-256 of its JSON serialisation."""
        self.tokenizer = tokenizer
        missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
        if missing:
            raise AgentError(f"the tokenizer lacks Qwen's special tokens {', '.join(missing)}; is it a Qwen3 tokenizer?")
        self.fingerprint = fingerprint or hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        self._specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        self._special_spelling = re.compile("(" + "|".join(re.escape(t) for t in sorted(self._specials, key=len, reverse=True)) + ")")
        self.im_start = tokenizer.token_to_id(IM_START)
        self.think, self.end_think = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        self.im_end = tokenizer.token_to_id(IM_END)
        self._remembered = functools.lru_cache(maxsize=TEXT_CACHE)(self._text)  # thread-safe; ids kept compactly

    @classmethod
    def from_directory(cls, path: Path) -> ChatRenderer:
        """A model or tokenizer directory holding ``tokenizer.json`` (every Qwen3 release ships one)."""
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise AgentError(f"{path}: no tokenizer.json; name a model or tokenizer directory")
        return cls.from_file(file)

    @classmethod
    def from_file(cls, file: Path) -> ChatRenderer:
        from tokenizers import Tokenizer

        data = file.read_bytes()
        try:
            tokenizer = Tokenizer.from_str(data.decode())
        except Exception as error:  # the tokenizers library raises plain Exception on a bad file
            raise AgentError(f"{file}: not a tokenizer file ({str(error).splitlines()[0]})") from None
        return cls(tokenizer, hashlib.sha256(data).hexdigest())

    def text(self, text: str) -> list[int]:
        """Plain text to ids, as one piece. A special token's spelling inside text (a paper or an
        action that quotes ``<|im_end|>``) is encoded as ordinary characters, never as the control token.

        Remembered for the last ``TEXT_CACHE`` texts: every step re-renders the conversation, whose
        system prompt is the same in every episode and whose earlier turns were encoded at the
        step before (half of an openai policy's host time per step went to encoding them again)."""
        return list(self._remembered(text))

    def _text(self, text: str) -> array:
        return array("l", self._pieces(text))

    def _pieces(self, text: str) -> list[int]:
        if not any(token in text for token in self._specials):
            return self._encode(text)
        ids: list[int] = []
        for piece in self._special_spelling.split(text):
            if piece in self._specials:
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

    def generation_prompt(self, thinking: bool = False) -> list[int]:
        """The assistant header and, unless the model is to think, the empty think block, with
        <think> and </think> as the control tokens Qwen3's template produces (``text`` would
        spell them out as characters). Its ``\n\n`` is a piece of its own: so it is served."""
        header = [self.im_start, *self.text("assistant\n")]
        if thinking:
            return header
        return [*header, self.think, *self.text("\n\n"), self.end_think, *self.text("\n\n")]

    def action(self, content: str) -> list[int]:
        """What the model generates for an action: its text and the closing ``<|im_end|>``."""
        return [*self.text(content), self.im_end]

    def unclosed(self, content: str) -> list[int]:
        """What a model wrote in thinking mode when it ended its turn without ``</think>``: its
        whole text, a leading ``<think>`` being the control token it generated (vLLM spells it
        out with skip_special_tokens false), then ``<|im_end|>``."""
        if content.startswith("<think>"):
            return [self.think, *self.text(content.removeprefix("<think>")), self.im_end]
        return self.action(content)

    def thought(self, reasoning: str) -> list[int]:
        """A think block as the model writes it in thinking mode."""
        return [self.think, *self.text(reasoning), self.end_think]

    def render(self, messages: list[dict[str, str]], train_thinking: bool = False) -> Rendered:
        """The training sequence of ``messages``; ``train_thinking`` also trains the think
        blocks the model wrote (thinking mode), which are otherwise context only."""
        rendered = Rendered()
        for message in messages:
            role, content = message["role"], message["content"]
            if role == "assistant":
                reasoning, unclosed = message.get("reasoning"), bool(message.get("thinking_unclosed"))
                rendered.extend(self.generation_prompt(thinking=reasoning is not None or unclosed), trained=False)
                if reasoning is not None:
                    rendered.extend(self.thought(reasoning), trained=train_thinking)
                rendered.extend(self.unclosed(content) if unclosed else self.action(content), trained=True)
            else:
                rendered.extend([self.im_start, *self.text(f"{role}\n{content}"), self.im_end], trained=False)
            rendered.extend(self.text("\n"), trained=False)
        return rendered

    def prompt(self, messages: list[dict[str, str]], thinking: bool = False) -> list[int]:
        """The ids a policy is prompted with: the conversation so far, then the generation prompt."""
        return [*self.render(messages).ids, *self.generation_prompt(thinking)]


def split_thinking(text: str) -> tuple[str, str, bool]:
    """A thinking-mode generation -> (reasoning, action text, whether </think> closed the reasoning)."""
    body = text.removeprefix("<think>")
    reasoning, closed, after = body.partition("</think>")
    return (reasoning, after, True) if closed else (body, "", False)
