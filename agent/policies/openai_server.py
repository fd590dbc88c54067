"""The ``openai`` policy: any server with an OpenAI-compatible ``/v1/completions`` endpoint.

The prompt is the shared renderer's token ids (``--prompt-format ids``, what vLLM accepts), so
the served tokens are the trained ones. For a server that takes only text (``--prompt-format
text``, e.g. ``transformers serve``) the decoded prompt is sent instead; when the server reports
how many prompt tokens it saw (``usage.prompt_tokens``) or which (``prompt_token_ids``), they are
compared with ours and a difference is recorded as a parity warning on the step.

Greedy (temperature 0), stopped at ``<|im_end|>``. 429 and 5xx answers and network errors are
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
from agent.policies.base import ContextExceeded, Policy, PolicyError, Reply
from agent.renderer import IM_END, ChatRenderer

RETRIED_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIPolicy(Policy):
    name = "openai"

    def __init__(
        self, base_url: str, model: str, tokenizer: Path, prompt_format: str = "ids", max_new_tokens: int = 512,
        max_context: int = 32_768, timeout: float = 120.0, retries: int = 4, backoff: float = 1.0,
    ) -> None:
        if prompt_format not in ("ids", "text"):
            raise AgentError(f"unknown --prompt-format {prompt_format!r}; choose ids (vLLM) or text")
        if not base_url.startswith(("http://", "https://")):
            raise AgentError(f"--base-url {base_url!r} must start with http:// or https://")
        self.url = base_url.rstrip("/") + ("/completions" if base_url.rstrip("/").endswith("/v1") else "/v1/completions")
        self.model, self.prompt_format = model, prompt_format
        self.renderer = ChatRenderer.from_directory(tokenizer)
        self.tokenizer_path = tokenizer
        self.max_new_tokens, self.max_context = max_new_tokens, max_context
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.api_key = os.environ.get("OPENAI_API_KEY", "EMPTY")

    def settings(self) -> dict[str, Any]:
        return {
            "url": self.url, "model": self.model, "prompt_format": self.prompt_format, "tokenizer": str(self.tokenizer_path),
            "decoding": "greedy", "temperature": 0, "max_new_tokens": self.max_new_tokens, "max_context": self.max_context,
            "timeout": self.timeout, "retries": self.retries,
        }

    def act(self, messages: list[dict[str, str]]) -> Reply:
        prompt = self.renderer.prompt(messages)
        if len(prompt) + self.max_new_tokens > self.max_context:
            raise ContextExceeded(f"a prompt of {len(prompt)} tokens plus {self.max_new_tokens} new ones exceeds the context of {self.max_context}")
        body = {
            "model": self.model,
            "prompt": prompt if self.prompt_format == "ids" else self.renderer.decode(prompt),
            "max_tokens": self.max_new_tokens, "temperature": 0, "stop": [IM_END], "seed": self.episode.seed,
        }
        started = time.perf_counter()
        response, retries = self._post(body)
        try:
            choice = response["choices"][0]
            text = choice["text"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.url}: answer without choices[0].text: {json.dumps(response)[:200]}") from None
        usage = response.get("usage") or {}
        generation: dict[str, Any] = {
            "prompt_tokens": len(prompt), "server_prompt_tokens": usage.get("prompt_tokens"),
            "generated_tokens": usage.get("completion_tokens"), "hit_cap": choice.get("finish_reason") == "length",
            "finish_reason": choice.get("finish_reason"), "api_retries": retries, "seconds": time.perf_counter() - started,
        }
        warning = self._parity_warning(prompt, usage, choice)
        if warning:
            generation["parity_warning"] = warning
        return Reply(text.removesuffix(IM_END), generation=generation)

    @staticmethod
    def _parity_warning(prompt: list[int], usage: dict, choice: dict) -> str | None:
        served_ids = choice.get("prompt_token_ids")
        if served_ids is not None and list(served_ids) != prompt:
            return "the server's prompt token ids differ from the renderer's"
        served = usage.get("prompt_tokens")
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
                    return json.loads(answer.read()), attempt
            except urllib.error.HTTPError as error:
                detail = error.read()[:200].decode(errors="replace")
                last_error = f"HTTP {error.code}: {detail}"
                if error.code not in RETRIED_STATUS:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
                last_error = f"{type(error).__name__}: {getattr(error, 'reason', error)}"  # incl. a truncated answer
            except ValueError:  # not JSON, or not UTF-8
                last_error = "the answer was not JSON"
        raise PolicyError(f"{self.url}: request failed after {attempt + 1} attempt(s): {last_error}")
