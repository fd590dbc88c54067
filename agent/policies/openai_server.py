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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.errors import AgentError
from agent.policies.base import ContextExceeded, Policy, PolicyError, Reply, Sampling
from agent.renderer import IM_END, ChatRenderer, split_thinking

RETRIED_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MODELS_LISTING_BYTES = 4 << 20  # a /v1/models answer larger than this is not a model list
ANSWER_BYTES = 64 << 20  # nor is a completion this large (prompt ids echoed back included)


def api_base(base_url: str) -> str:
    """The server's ``.../v1`` root, from a --base-url given with or without it."""
    if not base_url.startswith(("http://", "https://")):
        raise AgentError(f"--base-url {base_url!r} must start with http:// or https://")
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def read_capped(answer, limit: int, deadline: float) -> bytes:
    """The body, refused past ``limit`` bytes or ``deadline`` (the socket timeout bounds each
    read, not a server that drips a byte at a time)."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
        chunk = answer.read1(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"an answer over {limit} bytes")
        chunks.append(chunk)


class OpenAIPolicy(Policy):
    name = "openai"

    def __init__(
        self, base_url: str, model: str, tokenizer: Path, prompt_format: str = "ids", max_new_tokens: int = 512,
        max_context: int = 32_768, timeout: float = 120.0, retries: int = 4, backoff: float = 1.0,
        thinking: bool = False, thinking_budget: int = 1024, sampling: Sampling = Sampling(),
    ) -> None:
        if prompt_format not in ("ids", "text"):
            raise AgentError(f"unknown --prompt-format {prompt_format!r}; choose ids (vLLM) or text")
        self.base = api_base(base_url)
        self.url = self.base + "/completions"
        self.model, self.prompt_format = model, prompt_format
        self.renderer = ChatRenderer.from_directory(tokenizer)
        self.tokenizer_path = tokenizer
        self.max_new_tokens, self.max_context = max_new_tokens, max_context
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.thinking, self.thinking_budget, self.sampling = thinking, thinking_budget, sampling
        self.api_key = os.environ.get("OPENAI_API_KEY", "EMPTY")

    def settings(self) -> dict[str, Any]:
        return {
            "url": self.url, "model": self.model, "prompt_format": self.prompt_format, "tokenizer": str(self.tokenizer_path),
            **self.sampling.settings(), "max_new_tokens": self.max_new_tokens, "max_context": self.max_context,
            "timeout": self.timeout, "retries": self.retries, "tokenizer_sha256": self.renderer.fingerprint,
            "thinking": self.thinking, **({"thinking_budget": self.thinking_budget} if self.thinking else {}),
        }

    def preflight(self) -> str | None:
        """GET /v1/models once: a server that does not answer, or serves no model of our name, stops
        the run here. A server without that endpoint (404, 405, 501) is let through, and said."""
        url = self.base + "/models"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.api_key}"})
        deadline = time.monotonic() + min(self.timeout, 30)
        try:
            with urllib.request.urlopen(request, timeout=min(self.timeout, 30)) as answer:
                listing = json.loads(read_capped(answer, MODELS_LISTING_BYTES, deadline))
        except urllib.error.HTTPError as error:
            if error.code in (404, 405, 501):
                return f"{url} answered HTTP {error.code}, so the served model's name was not checked"
            raise AgentError(f"--base-url: {url} answered HTTP {error.code}; check the URL and the API key") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
            raise AgentError(f"--base-url: no server answers at {url} ({getattr(error, 'reason', error)}); start it or fix the URL") from None
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
        response, retries = self._post(body)
        try:
            choice = response["choices"][0]
            text = choice["text"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.url}: answer without choices[0].text: {json.dumps(response)[:200]}") from None
        if not isinstance(text, str):
            raise PolicyError(f"{self.url}: choices[0].text is not a string: {json.dumps(response)[:200]}")
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        server_ids = choice.get("prompt_token_ids")
        server_ids = list(server_ids) if isinstance(server_ids, list) and all(isinstance(i, int) for i in server_ids) else None
        server_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
        generation: dict[str, Any] = {
            "prompt_tokens": len(prompt), "server_prompt_tokens": server_tokens,
            "generated_tokens": usage.get("completion_tokens"), "hit_cap": choice.get("finish_reason") == "length",
            "finish_reason": choice.get("finish_reason"), "api_retries": retries, "seconds": time.perf_counter() - started,
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

    def _post(self, body: dict) -> tuple[dict, int]:
        data = json.dumps(body).encode()
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}",
            })
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return json.loads(read_capped(answer, ANSWER_BYTES, time.monotonic() + self.timeout)), attempt
            except urllib.error.HTTPError as error:
                detail = error.read()[:200].decode(errors="replace")
                last_error = f"HTTP {error.code}: {detail}"
                if error.code not in RETRIED_STATUS:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
                last_error = f"{type(error).__name__}: {getattr(error, 'reason', error)}"  # incl. a truncated answer
            except ValueError as error:  # not JSON, not UTF-8, or too large
                last_error = f"the answer was not JSON ({str(error)[:80]})"
        if self.api_key not in ("", "EMPTY"):  # a server may echo the key back in its error
            last_error = last_error.replace(self.api_key, "[OPENAI_API_KEY]")
        raise PolicyError(f"{self.url}: request failed after {attempt + 1} attempt(s): {last_error}", retries=attempt)
