"""``explorer decide --backend openai``: option log-likelihoods from an OpenAI-compatible server
that returns prompt log-probabilities (vLLM's ``prompt_logprobs``).

Each option is scored as the server's log-probability of its tokens when they end the prompt: the
request's ``prompt`` is a list holding prompt+option for every option (the server batches them),
``max_tokens`` 1 (the completion is thrown away),
``prompt_logprobs`` 0 (the log-probability of each prompt token itself, nothing more), and an
option's log-likelihood is the sum over its tokens. ``shared`` sends the options in requests of
at most ``chunk`` prompts; ``separate`` sends one request per option. Either way the server
computes each option's whole prompt: vLLM (v1) never reads its prefix cache for a request that asks
for prompt_logprobs (``SamplingParams.skip_reading_prefix_cache``; cached tokens would have none),
so the list saves requests, not prompt passes (bench/decisions.py measures both). ``forward_passes`` records the
requests made; ``cached_tokens`` is None (the server keeps its cache; we cannot see what it reused).

The requests go through the openai policy's own plumbing (``agent.policies.openai_server``): its
replicas, retries and backoff, preflight (the served name, ``max_model_len``, whether the server
returns the prompt's ids), the ``OPENAI_API_KEY`` and the ids-or-text prompt with its refusal of a
text the tokenizer would read back otherwise. The context is the server's less the one token a
completion must leave room for.

A server that lies is never a silent number and never a crash: an answer without prompt
log-probabilities, with another number of entries than the prompt's tokens, fewer answers than
prompts sent, a log-probability above 0 or not a number, an entry for another token than the one
sent, or prompt ids other than ours, raises ``UnusableAnswer`` for that question, which the run
records as ``not_measured`` with the reason (as it does a server that is down by then).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from paper_explorer.agent.policies.base import ContextExceeded, PolicyError
from paper_explorer.agent.policies.openai_server import OpenAIPolicy, count, label, number
from paper_explorer.decisions.likelihood import Mode, OptionLikelihoods

DEFAULT_CHUNK = 32  # prompts per request: a 160-option question is five requests, each a batch the server can hold


class UnusableAnswer(RuntimeError):
    """The server did not answer, or answered what is no option log-likelihood: this question is not measured."""


class ServerBackend:
    name = "openai"

    def __init__(self, policy: OpenAIPolicy, chunk: int = DEFAULT_CHUNK, note: str | None = None) -> None:
        self.policy = policy
        self.renderer = policy.renderer
        self.chunk = chunk
        self.note = note  # what preflight found worth saying (a replica down, no prompt ids returned)
        # The policy's context once preflight has read the server's, less the one token the server generates.
        self.max_context: int = policy.max_context - 1

    @classmethod
    def load(
        cls,
        base_url: str | list[str],
        model: str,
        tokenizer: Path,
        *,
        prompt_format: str = "ids",
        max_context: int | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        chunk: int = DEFAULT_CHUNK,
    ) -> ServerBackend:
        """The backend after the policy's preflight: a server that serves no such model, or no
        replica answering, is one AgentError line here, before anything is written."""
        policy = OpenAIPolicy(
            base_url=base_url,
            model=model,
            tokenizer=tokenizer,
            prompt_format=prompt_format,
            max_new_tokens=1,
            max_context=max_context,
            timeout=timeout,
            retries=retries,
        )
        return cls(policy, chunk, policy.preflight())

    def settings(self) -> dict[str, Any]:
        recorded = self.policy.settings().model_dump(mode="json", exclude={"sampling", "max_new_tokens", "thinking", "thinking_budget"})
        return {**recorded, "scored_by": "prompt_logprobs", "chunk": self.chunk}

    def score(self, prompt: list[int], options: list[list[int]], mode: Mode = "shared") -> OptionLikelihoods:
        size = 1 if mode == "separate" else self.chunk
        totals: list[float] = []
        requests = 0
        for start in range(0, len(options), size):
            group = options[start : start + size]
            totals += self._request(prompt, group, listed=mode == "shared")
            requests += 1
        return OptionLikelihoods(totals, None, requests)

    def _request(self, prompt: list[int], options: list[list[int]], *, listed: bool) -> list[float]:
        """One request for ``options`` after ``prompt``: each option's summed log-probability."""
        sent = [[*prompt, *option] for option in options]
        body: dict[str, Any] = {"model": self.policy.model, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
        if self.policy.server_prompt_ids:
            body["return_token_ids"] = True  # vLLM: the ids it read, in choices[i].prompt_token_ids
        try:
            # The policy's own prompt (ids, or a text refused where it would read back otherwise) and request.
            prompts = [self.policy._probe_prompt(ids) for ids in sent]
            answer = self.policy._post({**body, "prompt": prompts if listed else prompts[0]})
        except (ContextExceeded, PolicyError) as error:
            raise UnusableAnswer(f"the request failed: {error}") from None
        choices = answer.body["choices"]
        if len(choices) != len(sent):
            raise UnusableAnswer(f"{len(sent)} prompts sent, {len(choices)} answered")
        by_index = _by_index(choices)
        return [_option_logprob(by_index[position], ids, len(prompt), position) for position, ids in enumerate(sent)]


def _by_index(choices: list[Any]) -> list[dict]:
    """The answers in the order of the prompts sent, by their ``index`` (each once, 0 to n-1)."""
    indices = [count(choice.get("index")) if isinstance(choice, dict) else None for choice in choices]
    if sorted(index for index in indices if index is not None) != list(range(len(choices))):
        shown = [choice.get("index") if isinstance(choice, dict) else None for choice in choices[:8]]
        raise UnusableAnswer(f"the answers' indices are {str(shown)[:80]}, not each of 0 to {len(choices) - 1} once")
    return [choices[indices.index(position)] for position in range(len(choices))]


def _option_logprob(choice: dict, sent: list[int], prompt_length: int, position: int) -> float:
    """The sum of the log-probabilities of ``sent``'s tokens after the first ``prompt_length``."""
    where = f"prompt {position + 1}"
    returned = choice.get("prompt_token_ids")
    if returned is not None and returned != sent:
        raise UnusableAnswer(f"{where}: the server read other token ids than were sent")
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list):
        raise UnusableAnswer(f"{where}: the answer holds no prompt log-probabilities (does the server take prompt_logprobs?)")
    if len(entries) != len(sent):
        raise UnusableAnswer(f"{where}: {len(entries)} prompt log-probabilities for a prompt of {len(sent)} tokens")
    total = 0.0
    for offset in range(prompt_length, len(sent)):
        token, entry = sent[offset], entries[offset]
        value = entry.get(str(token), entry.get(f"token_id:{token}")) if isinstance(entry, dict) else None
        if value is None:
            held = ", ".join(str(label(key)) for key in list(entry)[:3]) if isinstance(entry, dict) else "nothing"
            raise UnusableAnswer(f"{where}, token {offset}: no log-probability for token {token}, which was sent (the entry holds {held})")
        logprob = number(value.get("logprob") if isinstance(value, dict) else value)
        if logprob is None or math.isnan(logprob) or logprob > 0:
            raise UnusableAnswer(f"{where}, token {offset}: the log-probability {str(value)[:40]!r} is not a log-probability")
        total += logprob
    return total


__all__ = ["DEFAULT_CHUNK", "ServerBackend", "UnusableAnswer"]
