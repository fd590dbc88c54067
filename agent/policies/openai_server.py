"""The ``openai`` policy: any server with an OpenAI-compatible ``/v1/completions`` endpoint.

The prompt is the shared renderer's token ids (``--prompt-format ids``, what vLLM accepts), so
the served tokens are the trained ones. For a server that takes only text (``--prompt-format
text``, e.g. ``transformers serve``) the decoded prompt is sent instead; when the server reports
how many prompt tokens it saw (``usage.prompt_tokens``) or which (``prompt_token_ids``), they are
compared with ours and a difference is recorded as a parity warning on the step. A text prompt
that the tokenizer would read back as other ids than the renderer made (text that spells a
control token such as ``<|im_end|>``: a paper could inject a turn boundary) is never sent; the
episode ends as ``policy_error`` saying where.

Every step records the prompt it sent (``Step.served``: digest, length, tokenizer fingerprint,
and the server's own count and ids where it returns them).

Thinking mode (``--thinking``): the model writes its think block; the request allows
``thinking_budget`` more tokens and asks for control tokens in the text. A reply whose think
block is still open is recorded as ``thinking_budget_hit`` and holds no action.

Greedy (temperature 0) unless ``Sampling`` says otherwise, with the episode's seed in every
request; stopped at ``<|im_end|>``. 429 and 5xx answers and network errors are
retried with exponential backoff; each retry is counted on the step, and a request that still
fails ends the episode as ``policy_error`` (counted in the run's metrics).
"""

from __future__ import annotations

import http.client
import json
import os
import time
from pathlib import Path
from typing import Any

from agent.errors import AgentError
from agent.policies.base import ContextExceeded, Policy, PolicyError, Reply, Sampling
from agent.policies.servers import HTTPStatus, ServerPool, api_base, read_capped
from agent.renderer import IM_END, ChatRenderer, split_thinking

MODELS_LISTING_BYTES = 4 << 20  # a /v1/models answer larger than this is not a model list

__all__ = ["OpenAIPolicy", "api_base", "read_capped"]


def answer_problem(response: Any, field: str) -> str | None:
    """What makes ``response`` no answer of the completions (``field`` "text") or chat
    (``field`` "message") API, or None: such an answer is retried on another replica, like one
    that is not JSON."""
    choices = response.get("choices") if isinstance(response, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    value = choice.get(field) if isinstance(choice, dict) else None
    if field == "message":
        value = value.get("content") if isinstance(value, dict) else None
    where = "choices[0].text" if field == "text" else "choices[0].message.content"
    if not isinstance(value, str):
        return f"an answer without {where} as a string: {json.dumps(response)[:160]}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"{where} holds a lone surrogate (at character {error.start}), which no tokenizer reads"
    return None


def count(value: Any) -> int | None:
    """A token count as the server reported it, or None when it is not a count at all."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def label(value: Any) -> str | None:
    """A short string field (finish_reason), or None when it is not one; a lone surrogate (which no
    UTF-8 log holds) becomes U+FFFD."""
    if not isinstance(value, str):
        return None
    return "".join("\ufffd" if 0xD800 <= ord(character) <= 0xDFFF else character for character in value[:64])


class ReplicaDown(Exception):
    """One of several replicas did not answer the preflight."""


class OpenAIPolicy(Policy):
    name = "openai"

    def __init__(
        self, base_url: str | list[str], model: str, tokenizer: Path, prompt_format: str = "ids", max_new_tokens: int = 512,
        max_context: int = 32_768, timeout: float = 120.0, retries: int = 4, backoff: float = 1.0,
        thinking: bool = False, thinking_budget: int = 1024, sampling: Sampling = Sampling(),
    ) -> None:
        if prompt_format not in ("ids", "text"):
            raise AgentError(f"unknown --prompt-format {prompt_format!r}; choose ids (vLLM) or text")
        self.api_key = os.environ.get("OPENAI_API_KEY", "EMPTY")
        self.servers = ServerPool(base_url, self.api_key, timeout, retries, backoff)
        self.endpoint = "/completions"
        self.model, self.prompt_format = model, prompt_format
        self.renderer = ChatRenderer.from_directory(tokenizer)
        self.tokenizer_path = tokenizer
        self.max_new_tokens, self.max_context = max_new_tokens, max_context
        self.timeout, self.retries = timeout, retries
        self.thinking, self.thinking_budget, self.sampling = thinking, thinking_budget, sampling

    @property
    def url(self) -> str:
        """The endpoint, as said in errors and settings (the first replica's when there are several)."""
        return self.servers.bases[0] + self.endpoint

    @property
    def backoff(self) -> float:
        return self.servers.backoff

    @backoff.setter
    def backoff(self, seconds: float) -> None:
        self.servers.backoff = seconds

    def _where(self) -> dict[str, Any]:
        if len(self.servers) == 1:
            return {"url": self.url}
        return {"url": self.url, "replicas": [base + self.endpoint for base in self.servers.bases]}

    def settings(self) -> dict[str, Any]:
        return {
            **self._where(), "model": self.model, "prompt_format": self.prompt_format, "tokenizer": str(self.tokenizer_path),
            **self.sampling.settings(), "max_new_tokens": self.max_new_tokens, "max_context": self.max_context,
            "timeout": self.timeout, "retries": self.retries, "tokenizer_sha256": self.renderer.fingerprint,
            "thinking": self.thinking, **({"thinking_budget": self.thinking_budget} if self.thinking else {}),
        }

    def preflight(self) -> str | None:
        """GET /v1/models of each replica once: a server that serves no model of our name stops the
        run here, as does a run whose every replica is down; a replica that does not answer is
        taken out (and retried later), and said. A server without that endpoint (404, 405, 501) is
        let through, and said."""
        notes, down = [], {}
        for base in self.servers.bases:
            try:
                note = self._preflight_one(base)
            except ReplicaDown as error:
                down[base] = str(error)
                continue
            if note is not None:
                notes.append(note)
        if len(down) == len(self.servers):
            raise AgentError(f"--base-url: no replica answers ({'; '.join(down.values())}); start them or fix the URLs")
        for base, reason in down.items():
            self.servers.take_out(base, reason)
            notes.append(f"{base} does not answer ({reason}); it is taken out and tried again during the run")
        return "; ".join(notes) or None

    def _preflight_one(self, base: str) -> str | None:
        url = base + "/models"
        timeout = min(self.timeout, 30)
        try:
            listing = self.servers.get(base, "/models", MODELS_LISTING_BYTES, timeout)
        except HTTPStatus as error:
            if error.status in (404, 405, 501):
                return f"{url} answered HTTP {error.status}, so the served model's name was not checked"
            raise AgentError(f"--base-url: {url} answered HTTP {error.status}; check the URL and the API key") from None
        except (OSError, http.client.HTTPException) as error:
            if len(self.servers) == 1:
                raise AgentError(f"--base-url: no server answers at {url} ({error}); start it or fix the URL") from None
            raise ReplicaDown(f"{type(error).__name__}: {error}") from None
        except ValueError as error:
            raise AgentError(f"--base-url: {url} did not answer a model list ({str(error)[:80]}); is it an OpenAI-compatible server?") from None
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [item.get("id") for item in data if isinstance(item, dict)] if isinstance(data, list) else []
        if self.model not in models:
            raise AgentError(f"--model {self.model!r}: the server at {url} serves {', '.join(map(str, models)) or 'no model'}; "
                             "pass one of those (vLLM: the --served-model-name)")
        return None

    def act(self, messages: list[dict[str, str]]) -> Reply:
        prompt = self.renderer.prompt(messages, thinking=self.thinking)
        new_tokens = self.max_new_tokens + (self.thinking_budget if self.thinking else 0)
        if len(prompt) + new_tokens > self.max_context:
            raise ContextExceeded(f"a prompt of {len(prompt)} tokens plus {new_tokens} new ones exceeds the context of {self.max_context}")
        body = {
            "model": self.model, "prompt": prompt if self.prompt_format == "ids" else self._text_prompt(prompt),
            "max_tokens": new_tokens, "temperature": self.sampling.temperature, "stop": [IM_END], "seed": self.episode.seed,
        }
        if not self.sampling.greedy:
            body["top_p"] = self.sampling.top_p
            if self.sampling.top_k:
                body["top_k"] = self.sampling.top_k  # vLLM and SGLang take it; OpenAI's API has none
        if self.thinking:
            body["skip_special_tokens"] = False  # vLLM: keep <think> and </think> in the text
        started = time.perf_counter()
        answer = self.servers.post(self.endpoint, body, accept=lambda response: answer_problem(response, "text"))
        response = answer.body
        choice = response["choices"][0]
        text = choice["text"]
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        server_ids = choice.get("prompt_token_ids")
        server_ids = list(server_ids) if isinstance(server_ids, list) and all(count(i) is not None for i in server_ids) else None
        server_tokens = count(usage.get("prompt_tokens"))
        generation: dict[str, Any] = {
            "prompt_tokens": len(prompt), "server_prompt_tokens": server_tokens,
            "generated_tokens": count(usage.get("completion_tokens")), "hit_cap": choice.get("finish_reason") == "length",
            "finish_reason": label(choice.get("finish_reason")), "api_retries": answer.retries, "seconds": time.perf_counter() - started,
            **self._replica_record(answer),
        }
        warning = self._parity_warning(prompt, server_tokens, server_ids)
        if warning:
            generation["parity_warning"] = warning
        text = text.removesuffix(IM_END)
        reasoning = None
        if self.thinking:
            reasoning, text, closed = split_thinking(text)
            generation["thinking_tokens"] = len(self.renderer.text(reasoning))
            generation["thinking_budget_hit"] = not closed
        return Reply(text, generation=generation, reasoning=reasoning, prompt_ids=prompt,
                     server_prompt_ids=server_ids, server_prompt_tokens=server_tokens)

    def _text_prompt(self, prompt: list[int]) -> str:
        """The prompt as text, only if the tokenizer reads that text back as the same ids."""
        text = self.renderer.decode(prompt)
        read = self.renderer.as_server_reads(prompt)
        if read != prompt:
            position = next((i for i, (a, b) in enumerate(zip(read, prompt)) if a != b), min(len(read), len(prompt)))
            shown = self.renderer.decode(prompt[max(position - 8, 0):position + 8])
            raise PolicyError(f"refused to send a text prompt the server would read as other tokens (from token {position}, "
                              f"near {shown!r}): text spelling a control token, or a split the tokenizer does not make; "
                              "use --prompt-format ids")
        return text

    @staticmethod
    def _parity_warning(prompt: list[int], served: int | None, served_ids: list[int] | None) -> str | None:
        if served_ids is not None and served_ids != prompt:
            return "the server's prompt token ids differ from the renderer's"
        if served is not None and served != len(prompt):
            return f"the server counted {served} prompt tokens; the renderer made {len(prompt)}"
        return None

    def _replica_record(self, answer) -> dict[str, Any]:
        """Which replica answered and what failed on the way (only when there are several)."""
        if len(self.servers) == 1:
            return {}
        return {"replica": answer.replica, "replica_errors": answer.failures or None}
