"""One renderer for serving and training: messages -> Qwen3 ChatML token ids, message by message.

Layout (Qwen3, non-thinking mode)::

    <|im_start|>system\\n{system prompt}<|im_end|>\\n
    <|im_start|>user\\nQuestion: ...<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{action}<|im_end|>\\n
    <|im_start|>user\\n{observation}<|im_end|>\\n
    ...

* Observations are **user** turns (not Qwen's tool role): the trajectory's messages are
  exactly what is rendered, and nothing re-wraps them.
* Every assistant turn keeps the empty think block that the generation prompt put before it
  at serving time. Qwen3's own chat template drops think blocks from earlier turns when it
  re-renders history; we never re-render, so the prompt at step t is always a prefix of the
  training sequence.
* The model stops at ``<|im_end|>``; the newline after it is the renderer's, added the same way
  when the next prompt is built and when the training sequence is.
* The assistant mask covers the action's tokens and its ``<|im_end|>``: the tokens a model
  generates. Role headers, the think block and the newline are never trained on.
* Text is encoded segment by segment, never the whole conversation at once, so a token can
  never straddle two messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import AgentError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
END_OF_TEXT_TOKEN = "<|endoftext|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
SPECIAL_TOKENS = (IM_START, IM_END, "<think>", "</think>")


@dataclass
class Rendered:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 where the token is trained on (assistant output)

    def extend(self, ids: list[int], trained: bool) -> None:
        self.ids.extend(ids)
        self.mask.extend([int(trained)] * len(ids))


class ChatRenderer:
    def __init__(self, tokenizer) -> None:
        """``tokenizer``: a ``tokenizers.Tokenizer`` that knows Qwen's special tokens."""
        self.tokenizer = tokenizer
        missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
        if missing:
            raise AgentError(f"the tokenizer lacks Qwen's special tokens {', '.join(missing)}; is it a Qwen3 tokenizer?")
        self._specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        self._special_spelling = re.compile("(" + "|".join(re.escape(t) for t in sorted(self._specials, key=len, reverse=True)) + ")")
        self.im_start = tokenizer.token_to_id(IM_START)
        self.think, self.end_think = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        self.im_end = tokenizer.token_to_id(IM_END)

    @classmethod
    def from_directory(cls, path: Path) -> ChatRenderer:
        """A model or tokenizer directory holding ``tokenizer.json`` (every Qwen3 release ships one)."""
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise AgentError(f"{path}: no tokenizer.json; name a model or tokenizer directory")
        try:
            return cls(Tokenizer.from_file(str(file)))
        except Exception as error:  # the tokenizers library raises plain Exception on a bad file
            raise AgentError(f"{file}: not a tokenizer file ({str(error).splitlines()[0]})") from None

    @classmethod
    def from_pretrained(cls, name: str) -> ChatRenderer:
        """The tokenizer of a hub model id (downloaded by huggingface_hub on the user's machine)."""
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_pretrained(name))
        except Exception as error:
            raise AgentError(f"{name}: cannot load its tokenizer ({str(error).splitlines()[0]})") from None

    def text(self, text: str) -> list[int]:
        """Plain text to ids. A special token's spelling inside text (a paper or an action that
        quotes ``<|im_end|>``) is encoded as ordinary characters, never as the control token."""
        if not any(token in text for token in self._specials):
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        for piece in self._special_spelling.split(text):
            if piece in self._specials:
                ids += self.tokenizer.encode(piece[0], add_special_tokens=False).ids
                ids += self.text(piece[1:])
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def header(self, role: str) -> list[int]:
        return [self.im_start, *self.text(f"{role}\n")]

    def generation_prompt(self) -> list[int]:
        """The assistant header and the empty think block, with <think> and </think> as the
        control tokens Qwen3's template produces (``text`` would spell them out as characters)."""
        return [*self.header("assistant"), self.think, *self.text("\n\n"), self.end_think, *self.text("\n\n")]

    def action(self, content: str) -> list[int]:
        """What the model generates for an action: its text and the closing ``<|im_end|>``."""
        return [*self.text(content), self.im_end]

    def render(self, messages: list[dict[str, str]]) -> Rendered:
        rendered = Rendered()
        for message in messages:
            role, content = message["role"], message["content"]
            if role == "assistant":
                rendered.extend(self.generation_prompt(), trained=False)
                rendered.extend(self.action(content), trained=True)
            else:
                rendered.extend([*self.header(role), *self.text(content), self.im_end], trained=False)
            rendered.extend(self.text("\n"), trained=False)
        return rendered

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The ids a policy is prompted with: the conversation so far, then the generation prompt."""
        return [*self.render(messages).ids, *self.generation_prompt()]
