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

Preflight asks each replica, before anything is written: its model list (the served name must be
there; its ``max_model_len`` becomes the context budget, and a ``--max-context`` above it is
refused), then one tiny prompt in the run's format with ``return_token_ids``. A server that
refuses the prompt (``transformers serve`` takes no ids) is one line naming ``--api chat`` or
``--prompt-format text``; one that returns the prompt's ids (vLLM) is asked for them at every step,
so ``check-parity`` compares ids, not only counts. The capability is recorded in the settings.

A prompt that leaves less room than ``--max-new-tokens`` gets ``max_tokens`` lowered to the room
left, recorded as ``clamped_max_tokens`` (``hit_cap`` is the policy's own cap only); a prompt that
leaves none, or that the server refuses as over its context length (HTTP 400), ends the episode
as ``context_limit``.

Thinking mode (``--thinking``): the model writes its think block; the request allows
``thinking_budget`` more tokens and asks for control tokens in the text. A reply cut at the token
limit with its think block open is recorded as ``thinking_budget_hit`` and holds no action. A
reply that ended its turn without ``</think>`` is recorded as ``thinking_unclosed``, and its whole
text is the action, as Qwen3's chat template reads such a turn back.

Greedy (temperature 0) unless ``Sampling`` says otherwise, with the episode's seed in every
request; stopped at ``<|im_end|>``. 429 and 5xx answers and network errors are
retried with exponential backoff; each retry is counted on the step, and a request that still
fails ends the episode as ``policy_error`` (counted in the run's metrics).

Recording draws (``episode.record_sampled``, what ``explorer rl`` trains on): each request also
asks for the completion's ids and their log-probabilities, stops on the stop tokens rather than
stop strings, and sends every sampling setting the server would otherwise take from the model; the
ids must decode to the text the server wrote, and the draw records the temperature the server's
log-probabilities are at (vLLM's default: 1, whatever the sampling temperature). See
``server_sampling``; without record_sampled nothing of this is asked.

Option probes (``probe``, ``agent.probes``): one request of the probe's prompt for one token with
the top ``PROBE_TOP_LOGPROBS`` log-probabilities labelled by token id (vLLM's
``return_tokens_as_token_ids``: "token_id:N"); an option outside them is read by a second request
of the prompt followed by that option, with ``prompt_logprobs`` (the log-probability of each prompt
token), recorded as a fallback. An answer that omits them or holds what is not a log-probability
is recorded as not measured, with the reason.

Why one module of this size: the request, its retries and the parity checks of what the server
saw are one exchange, and a probe is one more request through them; split, a reader of one would
miss what the other checks.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from pathlib import Path
from typing import Any

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import ContextExceeded, Policy, PolicyError, ProbeReading, Reply, Sampling
from paper_explorer.agent.policies.records import EndpointRecord, Inline, PolicySettings, SamplingRecord, TemplateRecord, omitted_when_none
from paper_explorer.agent.policies.server_sampling import MODE_PROBE_TOP, ServerLogprobs, drawn, recording
from paper_explorer.agent.policies.servers import HTTPStatus, ServerPool, api_base, api_key, read_capped
from paper_explorer.agent.renderer import ChatRenderer, split_thinking
from paper_explorer.agent.trajectory import Generation
from paper_explorer.corpus.setting_names import setting

MODELS_LISTING_BYTES = 4 << 20  # a /v1/models answer larger than this is not a model list
DEFAULT_MAX_CONTEXT = 32_768  # without --max-context: lowered to a server's max_model_len, where an explicit one above it is refused
PROBE_TEXT = "Hello"  # preflight's prompt: a few tokens, one generated
REFUSED_PROMPT_STATUS = {400, 422}  # what vLLM, SGLang and transformers serve answer a prompt they cannot take
NO_COMPLETIONS_STATUS = {404, 405, 501}
PROBE_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs: the most a probe may ask for without a server flag
FALLBACK_SLACK = 1e-3  # the two requests run as separate batches: their log-probabilities may differ this much
TOKEN_ID_LABEL = re.compile(r"token_id:(\d+)")
CONTEXT_REFUSAL = re.compile(r"HTTP 400\b.*(context length|context window|input_tokens)", re.IGNORECASE | re.DOTALL)

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


def number(value: Any) -> float | None:
    """A log-probability as the server sent it, or None when it is not a number a float holds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past a float's range (JSON allows -10**400)
        return None


def top_logprobs(response: Any) -> tuple[dict[int, float], str | None]:
    """The first generated position's top log-probabilities by token id, or why the answer holds
    none: no logprobs, labels that are not "token_id:N" (a server that ignores
    return_tokens_as_token_ids labels tokens as text, which no id can be read from), or values that
    are not numbers."""
    choice = response["choices"][0]
    logprobs = choice.get("logprobs")
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    first = tops[0] if isinstance(tops, list) and tops else None
    if not isinstance(first, dict) or not first:
        return {}, "the server returned no top log-probabilities for the next token"
    found: dict[int, float] = {}
    for key, value in first.items():
        matched = TOKEN_ID_LABEL.fullmatch(key)
        if matched is None:
            return {}, f"the server labelled a token {label(key)!r}, not token_id:N (does it take return_tokens_as_token_ids?)"
        logprob = number(value)
        if logprob is None:
            return {}, f"the server gave token {matched[1]} the log-probability {label(str(value)[:40])!r}, not a number"
        found[int(matched[1])] = logprob
    return found, None


def last_prompt_logprob(response: Any, prompt_length: int, token: int) -> tuple[float | None, str | None]:
    """The log-probability of ``token``, the last of a prompt of ``prompt_length`` ids, from vLLM's
    ``prompt_logprobs`` (one entry per prompt token, keyed by token id), or why there is none."""
    entries = response["choices"][0].get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != prompt_length:
        shown = f"{len(entries)} entries" if isinstance(entries, list) else "none"
        return None, f"the server returned prompt log-probabilities for a prompt of {prompt_length} tokens as {shown}"
    entry = entries[-1]
    value = entry.get(str(token), entry.get(f"token_id:{token}")) if isinstance(entry, dict) else None
    logprob = number(value.get("logprob") if isinstance(value, dict) else value)
    if logprob is None:
        return None, f"the server's prompt log-probabilities hold no number for token {token}"
    return logprob, None


class OpenAISettings(PolicySettings):
    """What a trajectory records of the openai policy (completions API): the server, the decoding,
    the template that rendered its prompts, and what preflight found the server does."""

    where: Inline[EndpointRecord]
    model: str
    prompt_format: str
    tokenizer: str
    sampling: Inline[SamplingRecord]
    max_new_tokens: int
    max_context: int  # the server's max_model_len once preflight has read it, unless given
    timeout: float
    retries: int
    template: Inline[TemplateRecord]
    thinking: bool
    thinking_budget: int | None = omitted_when_none()
    server_max_model_len: int | None  # read at preflight (the smallest of the replicas')
    server_prompt_ids: bool  # every replica returns the prompt's ids when asked


class ReplicaDown(Exception):
    """One of several replicas did not answer the preflight."""


class OpenAIPolicy(Policy):
    name = "openai"
    renderer: ChatRenderer  # always for the completions API: it renders what the server is sent
    tokenizer_path: Path | None

    def __init__(
        self,
        *,
        base_url: str | list[str],
        model: str,
        tokenizer: Path,
        prompt_format: str = "ids",
        max_new_tokens: int = 512,
        max_context: int | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 1.0,
        thinking: bool = False,
        thinking_budget: int = 1024,
        sampling: Sampling = Sampling(),
    ) -> None:
        """Keyword-only (the openai factory passes its config's fields by name): two numbers
        swapped by position would pass silently. ``max_context`` None: the server's max_model_len."""
        if prompt_format not in ("ids", "text"):
            raise AgentError(f"unknown {setting('policy.prompt_format')} {prompt_format!r}; choose ids (vLLM) or text")
        self.api_key = api_key()
        self.servers = ServerPool(base_url, self.api_key, timeout, retries, backoff)
        self.endpoint = "/completions"
        self.model, self.prompt_format = model, prompt_format
        self.renderer = ChatRenderer.from_directory(tokenizer)
        if thinking and not self.renderer.thinking_supported:
            raise AgentError(f"{tokenizer}: this model's chat template has no thinking mode; drop {setting('policy.thinking')}")
        self.tokenizer_path = tokenizer
        # None: the server's max_model_len once preflight has read it (DEFAULT_MAX_CONTEXT until then)
        self.max_context_given = max_context is not None
        self.max_new_tokens, self.max_context = max_new_tokens, max_context if max_context is not None else DEFAULT_MAX_CONTEXT
        self.timeout, self.retries = timeout, retries
        self.thinking, self.thinking_budget, self.sampling = thinking, thinking_budget, sampling
        self.server_max_model_len: int | None = None  # read at preflight (the smallest of the replicas')
        self.server_prompt_ids = False  # preflight found that every replica returns the prompt's ids when asked
        self.server_logprobs = ServerLogprobs()  # which log-probabilities the server draws with, found when a draw is first recorded

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

    def _where(self) -> EndpointRecord:
        if len(self.servers) == 1:
            return EndpointRecord(url=self.url)
        return EndpointRecord(url=self.url, replicas=[base + self.endpoint for base in self.servers.bases])

    def settings(self) -> PolicySettings:
        return OpenAISettings(
            where=self._where(),
            model=self.model,
            prompt_format=self.prompt_format,
            tokenizer=str(self.tokenizer_path),
            sampling=self.sampling.settings(),
            max_new_tokens=self.max_new_tokens,
            max_context=self.max_context,
            timeout=self.timeout,
            retries=self.retries,
            template=TemplateRecord.of(self.renderer),
            thinking=self.thinking,
            thinking_budget=self.thinking_budget if self.thinking else None,
            server_max_model_len=self.server_max_model_len,
            server_prompt_ids=self.server_prompt_ids,
        )

    def preflight(self) -> str | None:
        """GET /v1/models of each replica once: a server that serves no model of our name stops the
        run here, as does a run whose every replica is down; a replica that does not answer is
        taken out (and retried later), and said. A server without that endpoint (404, 405, 501) is
        let through, and said. Then the served context length becomes the budget, and (for the
        completions API) one tiny prompt finds whether the server takes it and returns its ids."""
        notes, down, limits, returns_ids = [], {}, [], []
        for base in self.servers.bases:
            try:
                note, limit = self._preflight_one(base)
            except ReplicaDown as error:
                down[base] = str(error)
                continue
            if note is not None:
                notes.append(note)
            if limit is not None:
                limits.append(limit)
            if self.endpoint == "/completions":
                ids, note = self._probe(base)
                returns_ids.append(ids)
                if note is not None:
                    notes.append(note)
        if len(down) == len(self.servers):
            raise AgentError(f"{setting('policy.base_url')}: no replica answers ({'; '.join(down.values())}); start them or fix the URLs")
        for base, reason in down.items():
            self.servers.take_out(base, reason)
        notes = [
            f"{base} does not answer ({reason}); it is taken out and tried again during the run" for base, reason in down.items()
        ] + notes
        if limits:
            self._use_server_limit(min(limits))
        self.server_prompt_ids = bool(returns_ids) and all(returns_ids)
        return "; ".join(notes) or None

    def _use_server_limit(self, limit: int) -> None:
        """The served context length as the budget: the default budget is lowered to it, an
        explicit one above it is refused (the server would refuse or shorten what we send)."""
        self.server_max_model_len = limit
        if self.max_context <= limit:
            return
        if self.max_context_given:
            raise AgentError(
                f"{setting('policy.max_context', self.max_context)} is more than the server's max_model_len of {limit}; "
                f"give at most {limit}, or leave it out to use {limit}"
            )
        self.max_context = limit

    def _preflight_one(self, base: str) -> tuple[str | None, int | None]:
        """A note (or None) and the served model's max_model_len (None when not said)."""
        url = base + "/models"
        timeout = min(self.timeout, 30)
        try:
            listing = self.servers.get(base, "/models", MODELS_LISTING_BYTES, timeout)
        except HTTPStatus as error:
            if error.status in (404, 405, 501):
                return f"{url} answered HTTP {error.status}, so the served model's name was not checked", None
            raise AgentError(f"{setting('policy.base_url')}: {url} answered HTTP {error.status}; check the URL and the API key") from None
        except (OSError, http.client.HTTPException) as error:
            if len(self.servers) == 1:
                raise AgentError(f"{setting('policy.base_url')}: no server answers at {url} ({error}); start it or fix the URL") from None
            raise ReplicaDown(f"{type(error).__name__}: {error}") from None
        except ValueError as error:
            raise AgentError(
                f"{setting('policy.base_url')}: {url} did not answer a model list ({str(error)[:80]}); is it an OpenAI-compatible server?"
            ) from None
        data = listing.get("data") if isinstance(listing, dict) else None
        entries = [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
        models = [item.get("id") for item in entries]
        if self.model not in models:
            raise AgentError(
                f"{setting('policy.model')} {self.model!r}: the server at {url} serves {', '.join(map(str, models)) or 'no model'}; "
                "pass one of those (vLLM: the --served-model-name)"
            )
        served = next(item for item in entries if item.get("id") == self.model)
        parent = next((item for item in entries if item.get("id") == served.get("parent")), {})  # vLLM: a LoRA adapter's base
        limit = count(served.get("max_model_len")) or count(parent.get("max_model_len"))
        return None, limit if limit else None

    def _probe(self, base: str) -> tuple[bool, str | None]:
        """One tiny prompt in the run's format, asking for its ids back: whether they come back,
        and a note when they do not. A server that refuses the prompt stops the run in one line."""
        ids = self.renderer.text(PROBE_TEXT)
        body = {"model": self.model, "prompt": ids if self.prompt_format == "ids" else PROBE_TEXT, "max_tokens": 1, "temperature": 0}
        url, timeout = base + self.endpoint, min(self.timeout, 60)
        try:
            try:
                answer = self.servers.post_once(base, self.endpoint, {**body, "return_token_ids": True}, timeout)
            except HTTPStatus as error:
                if error.status not in REFUSED_PROMPT_STATUS:
                    raise
                self.servers.post_once(base, self.endpoint, body, timeout)  # refused the flag, or the prompt itself?
                return False, f"{url} refuses return_token_ids, so check-parity can compare prompt counts only"
        except HTTPStatus as error:
            if error.status in NO_COMPLETIONS_STATUS:
                raise AgentError(
                    f"{setting('policy.base_url')}: {url} answered HTTP {error.status} (no completions endpoint); use {setting('policy.api', 'chat')}"
                ) from None
            if error.status in REFUSED_PROMPT_STATUS:
                chat = f"use {setting('policy.api', 'chat')}"
                other = f"{chat}, or {setting('policy.prompt_format', 'text')}" if self.prompt_format == "ids" else chat
                raise AgentError(
                    f"{setting('policy.prompt_format', self.prompt_format)}: the server at {url} refuses a {self.prompt_format} prompt ({error}); {other}"
                ) from None
            return False, f"the test prompt to {url} failed ({error}), so the prompt's ids are not asked for"
        except (OSError, http.client.HTTPException, ValueError) as error:
            return False, f"the test prompt to {url} failed ({type(error).__name__}: {error}), so the prompt's ids are not asked for"
        if answer_problem(answer, "text") is not None:
            raise AgentError(
                f"{setting('policy.base_url')}: {url} answered a test prompt with no completion ({answer_problem(answer, 'text')}); "
                "is it an OpenAI-compatible server?"
            )
        returned = answer["choices"][0].get("prompt_token_ids")
        if not isinstance(returned, list):
            return False, f"{url} does not return the prompt's token ids, so check-parity can compare prompt counts only"
        return True, None

    def act(self, messages: list[dict[str, str]]) -> Reply:
        prompt = self.renderer.prompt(messages, thinking=self.thinking)
        return self._request(prompt, self.max_new_tokens + (self.thinking_budget if self.thinking else 0), thinking=self.thinking)

    def complete(self, prompt: list[int], *, max_new_tokens: int) -> Reply:
        """One completion of ``prompt`` (ids, non-thinking) of at most ``max_new_tokens``: the memory
        reader's call (``agent.memory_reader``), through the same request, checks and records as an action."""
        return self._request(prompt, max_new_tokens, thinking=False)

    def _request(self, prompt: list[int], cap: int, *, thinking: bool) -> Reply:
        room = self.max_context - len(prompt)
        if room < 1:
            raise ContextExceeded(f"a prompt of {len(prompt)} tokens leaves no room for new ones in the context of {self.max_context}")
        max_tokens = min(cap, room)
        body = {
            "model": self.model,
            "prompt": prompt if self.prompt_format == "ids" else self._text_prompt(prompt),
            "max_tokens": max_tokens,
            "temperature": self.sampling.temperature,
            "stop": [self.renderer.end_of_turn_text],
            "seed": self.episode.seed,
        }
        if self.server_prompt_ids:
            body["return_token_ids"] = True  # vLLM: the ids it received, in choices[0].prompt_token_ids
        if not self.sampling.greedy:
            body["top_p"] = self.sampling.top_p
            if self.sampling.top_k:
                body["top_k"] = self.sampling.top_k  # vLLM and SGLang take it; OpenAI's API has none
        if thinking:
            body["skip_special_tokens"] = False  # vLLM: keep <think> and </think> in the text
        temperature = None
        if self.episode.record_sampled:  # explorer rl: the ids drawn and their log-probabilities (server_sampling)
            body = recording(body, self.sampling, self.renderer)
            temperature = self.server_logprobs.temperature(self.sampling, self._top_logprobs_at, self.url)
        started = time.perf_counter()
        answer = self._post(body)
        response = answer.body
        choice = response["choices"][0]
        text = choice["text"]
        sampled = None
        if temperature is not None:
            sampled, text = drawn(choice, self.renderer, temperature, answer.replica + self.endpoint, answer.retries)
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        server_ids = choice.get("prompt_token_ids")
        server_ids = list(server_ids) if isinstance(server_ids, list) and all(count(i) is not None for i in server_ids) else None
        server_tokens = count(usage.get("prompt_tokens"))
        generated = count(usage.get("completion_tokens"))
        finish = label(choice.get("finish_reason"))
        seconds = time.perf_counter() - started
        text = text.removesuffix(self.renderer.end_of_turn_text)
        reasoning: str | None = None
        thought: dict[str, Any] = {}
        if thinking:
            reasoning, text, thought = self._thinking(text, finish)
        generation = Generation(
            prompt_tokens=len(prompt),
            server_prompt_tokens=server_tokens,
            generated_tokens=generated,
            hit_cap=self._hit_cap(finish, generated, max_tokens, cap),
            finish_reason=finish,
            clamped_max_tokens=max_tokens if max_tokens < cap else None,
            api_retries=answer.retries,
            seconds=seconds,
            parity_warning=self._parity_warning(prompt, server_tokens, server_ids),
            **self._replica_record(answer),
            **thought,
        )
        return Reply(
            text,
            generation=generation,
            reasoning=reasoning,
            prompt_ids=prompt,
            server_prompt_ids=server_ids,
            server_prompt_tokens=server_tokens,
            sampled=sampled,
        )

    def _top_logprobs_at(self, temperature: float) -> dict[int, float]:
        """The server's top log-probabilities (by token id) of the next token of a short prompt,
        drawn at ``temperature`` with nothing cut: how ``ServerLogprobs`` finds which ones it returns."""
        body = {
            "model": self.model,
            "prompt": self._probe_prompt(self.renderer.text(PROBE_TEXT)),
            "max_tokens": 1,
            "temperature": temperature,
            "seed": 0,
        }
        body = {
            **recording(body, Sampling(temperature=temperature), self.renderer),
            "logprobs": MODE_PROBE_TOP,
            "return_tokens_as_token_ids": True,
        }
        answer = self._post(body)
        found, problem = top_logprobs(answer.body)
        if problem is not None:
            raise PolicyError(f"{answer.replica + self.endpoint}, asked which log-probabilities it returns: {problem}", answer.retries)
        return found

    def probe_unavailable(self) -> str | None:
        if self.endpoint != "/completions":
            return f"the chat API returns no log-probabilities of token ids; probe through the completions API (no {setting('policy.api', 'chat')})"
        return None

    def probe(self, prompt_ids: list[int], option_ids: list[int]) -> ProbeReading:
        """Each option's log-probability after ``prompt_ids``: from the top log-probabilities of one
        token, and for an option outside them from a second request with ``prompt_logprobs``. A
        request that fails or an answer that omits or lies: a reading that says why, never a crash."""
        body = {
            "model": self.model,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": PROBE_TOP_LOGPROBS,
            "return_tokens_as_token_ids": True,
        }
        try:
            answer = self._post({**body, "prompt": self._probe_prompt(prompt_ids)})
        except (ContextExceeded, PolicyError) as error:
            return ProbeReading([None] * len(option_ids), source="server", not_measured=f"the probe's request failed: {error}")
        top, problem = top_logprobs(answer.body)
        logprobs: list[float | None] = [top.get(token) for token in option_ids]
        missing = tuple(position for position, value in enumerate(logprobs) if value is None)
        if problem is not None or not missing:
            return ProbeReading(logprobs, source="server", not_measured=problem)
        for position in missing:
            logprobs[position], problem = self._fallback_logprob(prompt_ids, option_ids[position])
            if problem is not None:
                break
        floor = min(top.values()) if top else None
        beyond = [value for position in missing if (value := logprobs[position]) is not None]
        if problem is None and floor is not None and any(value > floor + FALLBACK_SLACK for value in beyond):
            # a token outside the top k cannot be likelier than the least likely token inside it
            problem = f"the fallback's log-probability ({max(beyond):.4f}) is above the top-{len(top)}'s least ({floor:.4f}): the answers contradict"
        return ProbeReading(logprobs, source="server+fallback", fallback=missing, not_measured=problem)

    def _fallback_logprob(self, prompt_ids: list[int], token: int) -> tuple[float | None, str | None]:
        """``token``'s log-probability after ``prompt_ids``, read as the last prompt token's
        (vLLM's ``prompt_logprobs``): for an option outside the top log-probabilities."""
        prompt = [*prompt_ids, token]
        if len(prompt) + 1 > self.max_context:
            return None, f"the fallback's prompt of {len(prompt)} tokens leaves no room in the context of {self.max_context}"
        body = {"model": self.model, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}
        try:
            answer = self._post({**body, "prompt": self._probe_prompt(prompt)})
        except (ContextExceeded, PolicyError) as error:
            return None, f"the fallback request for token {token} failed: {error}"
        return last_prompt_logprob(answer.body, len(prompt), token)

    def _probe_prompt(self, prompt: list[int]) -> list[int] | str:
        return prompt if self.prompt_format == "ids" else self._text_prompt(prompt)

    def _post(self, body: dict):
        """The request; a server that refuses the prompt as longer than its context ends the
        episode as context_limit, as our own budget would have."""
        try:
            return self.servers.post(self.endpoint, body, accept=lambda response: answer_problem(response, self.answer_field))
        except PolicyError as error:
            if CONTEXT_REFUSAL.search(str(error)):
                raise ContextExceeded(f"the server refused the prompt as over its context: {str(error)[:300]}") from None
            raise

    answer_field = "text"  # where the completion is in an answer (the chat API: "message")

    @staticmethod
    def _hit_cap(finish: str | None, generated: int | None, max_tokens: int, cap: int) -> bool:
        """Cut at the policy's own cap: not at a max_tokens we lowered to the room left, nor
        where a server shortened the request itself (fewer tokens than asked for)."""
        if finish != "length" or max_tokens < cap:
            return False
        return generated is None or generated >= max_tokens

    def _thinking(self, text: str, finish: str | None) -> tuple[str | None, str, dict[str, Any]]:
        """(reasoning, action, what to record) of a thinking-mode reply: see ``split_thinking``."""
        reasoning, action, closed = split_thinking(text)
        if closed:
            return reasoning, action, {"thinking_tokens": len(self.renderer.text(reasoning)), "thinking_budget_hit": False}
        if finish == "length":  # still thinking when the tokens ran out: no action was written
            return reasoning, action, {"thinking_tokens": len(self.renderer.text(reasoning)), "thinking_budget_hit": True}
        return None, text, {"thinking_unclosed": True, "thinking_budget_hit": False}

    def _text_prompt(self, prompt: list[int]) -> str:
        """The prompt as text, only if the tokenizer reads that text back as the same ids."""
        text = self.renderer.decode(prompt)
        read = self.renderer.as_server_reads(prompt)
        if read != prompt:
            position = next((i for i, (a, b) in enumerate(zip(read, prompt)) if a != b), min(len(read), len(prompt)))
            shown = self.renderer.decode(prompt[max(position - 8, 0) : position + 8])
            raise PolicyError(
                f"refused to send a text prompt the server would read as other tokens (from token {position}, "
                f"near {shown!r}): text spelling a control token, or a split the tokenizer does not make; "
                f"use {setting('policy.prompt_format', 'ids')}"
            )
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
