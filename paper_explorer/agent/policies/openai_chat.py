"""The ``openai`` policy with ``--api chat``: a teacher behind any OpenAI-compatible
``/v1/chat/completions`` endpoint (a large model on vLLM or SGLang, or a hosted API).

It sends the conversation as messages - the same messages our renderer trains on (system
prompt, question, each action as an assistant turn, each observation as a user turn) - and
keeps the first python block of the answer as the action (anything after it is cut, counted
in ``generation.cut_chars``), so one turn is one action. The teacher's own tokenization is not
ours and is irrelevant to training: ``sft build`` renders the messages with the student's
tokenizer. Given ``--tokenizer`` (the student's), each step records the prompt the student
would be served, so ``check-parity`` and ``sft build`` check teacher data as any other.

The key comes from ``OPENAI_API_KEY`` and is never written anywhere. Usage (prompt and
completion tokens as the API counts them) is recorded on each step. Requests carry
``chat_template_kwargs`` with ``enable_thinking`` false (a Qwen3 template otherwise renders the
thinking-mode generation prompt, which our renderer does not serve); a server that ignores unknown
fields ignores it. Preflight records the served ``max_model_len``; a prompt the server refuses as
over its context ends the episode as ``context_limit``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from paper_explorer.agent.actions import FENCED
from paper_explorer.agent.policies.base import Reply, Sampling
from paper_explorer.agent.policies.openai_server import OpenAIPolicy, count, label
from paper_explorer.agent.policies.records import EndpointRecord, Inline, PolicySettings, SamplingRecord
from paper_explorer.agent.policies.servers import ServerPool, api_key
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.trajectory import Generation


class OpenAIChatSettings(PolicySettings):
    """What a trajectory records of the openai policy with ``--api chat``: the teacher's server and
    decoding, and the student's tokenizer that recorded the prompts it would be served."""

    api: Literal["chat"] = "chat"
    where: Inline[EndpointRecord]
    model: str
    sampling: Inline[SamplingRecord]
    max_new_tokens: int
    timeout: float
    retries: int
    student_tokenizer: str | None
    tokenizer_sha256: str | None
    teacher_tokenization: str = "the API's own; not what is trained (sft build renders the messages with the student's tokenizer)"
    server_max_model_len: int | None


class OpenAIChatPolicy(OpenAIPolicy):
    name = "openai"

    def __init__(
        self,
        *,
        base_url: str | list[str],
        model: str,
        tokenizer: Path | None = None,
        max_new_tokens: int = 512,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 1.0,
        sampling: Sampling = Sampling(),
    ) -> None:
        """Keyword-only, as ``OpenAIPolicy``: ``tokenizer`` is the student's (it records the prompts it would serve)."""
        self.api_key = api_key()
        self.servers = ServerPool(base_url, self.api_key, timeout, retries, backoff)
        self.endpoint = "/chat/completions"
        self.model, self.tokenizer_path = model, tokenizer
        # The chat API renders nothing itself: the student's renderer only records the prompts it would serve.
        self.renderer = ChatRenderer.from_directory(tokenizer) if tokenizer is not None else None  # type: ignore[assignment]
        self.max_new_tokens, self.timeout, self.retries = max_new_tokens, timeout, retries
        self.sampling, self.thinking = sampling, False
        self.server_max_model_len, self.server_prompt_ids = None, False

    def settings(self) -> OpenAIChatSettings:
        return OpenAIChatSettings(
            where=self._where(),
            model=self.model,
            sampling=self.sampling.settings(),
            max_new_tokens=self.max_new_tokens,
            timeout=self.timeout,
            retries=self.retries,
            student_tokenizer=str(self.tokenizer_path) if self.tokenizer_path else None,
            tokenizer_sha256=self.renderer.fingerprint if self.renderer else None,
            server_max_model_len=self.server_max_model_len,
        )

    answer_field = "message"

    def _use_server_limit(self, limit: int) -> None:
        self.server_max_model_len = limit  # recorded: the prompt is counted in the teacher's tokens, which we do not make

    def act(self, messages: list[dict[str, str]]) -> Reply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": self.max_new_tokens,
            "temperature": self.sampling.temperature,
            "seed": self.episode.seed,
            "chat_template_kwargs": {"enable_thinking": False},  # the generation prompt our renderer serves
        }
        if not self.sampling.greedy:
            body["top_p"] = self.sampling.top_p
            if self.sampling.top_k:
                body["top_k"] = self.sampling.top_k  # vLLM and SGLang take it; a hosted API may refuse it
        started = time.perf_counter()
        answer = self._post(body)
        response = answer.body
        choice = response["choices"][0]
        text = choice["message"]["content"]
        action = FENCED.search(text)  # the block extract_code runs: what follows it is another action
        kept = text[: action.end()] if action else text
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        counted = {name: count(usage.get(name)) for name in ("prompt_tokens", "completion_tokens")}
        generation = Generation(
            api="chat",
            generated_tokens=counted.get("completion_tokens"),
            hit_cap=choice.get("finish_reason") == "length",
            finish_reason=label(choice.get("finish_reason")),
            api_retries=answer.retries,
            seconds=time.perf_counter() - started,
            usage_prompt_tokens=counted.get("prompt_tokens"),
            cut_chars=len(text) - len(kept),
            **self._replica_record(answer),
        )
        return Reply(kept, generation=generation)
