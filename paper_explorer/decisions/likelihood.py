"""Each option's log-likelihood as a continuation of one prompt, from a local model.

``shared`` (the default) runs the prompt once and the options together: the prompt's KV cache is
computed once (and its longest prefix shared with the previous prompt kept, so the questions of
one document share the document's), copied to a batch of options, and one forward pass over the
batch gives every option token's log-probability. The options of a batch are padded on the
right, which causal attention never lets an earlier position see, so no mask is needed; batches
hold at most ``batch_tokens`` cached-plus-option positions (a long document and many options
would otherwise copy the cache once per option at once).

``separate`` is the alternative it is measured against (bench/decisions.py) and the check of its
cache (``rescore``): one full forward pass of prompt and option per option, no cache at all.

An option's log-likelihood is the sum over its tokens of log-softmax in float32; the
probabilities are those sums normalised over the options (``normalised``), and ``log_mass`` is
the log of the share of the model's replies the options hold together.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

from paper_explorer.agent.served import common_prefix

Mode = Literal["shared", "separate"]
DEFAULT_BATCH_TOKENS = 65_536


@dataclass(frozen=True)
class OptionLikelihoods:
    loglikelihoods: list[float]  # per option: the sum of its tokens' log-probabilities
    cached_tokens: int | None  # prompt tokens reused from the previous prompt's cache (None: a server's, unseen)
    forward_passes: int  # passes run for this prompt (shared: 1 for the prompt + one per batch)


def normalised(loglikelihoods: list[float]) -> tuple[list[float], float]:
    """(each option's probability among the options, the log of their total mass)."""
    top = max(loglikelihoods)
    if top == -math.inf:
        raise ValueError("the options hold no probability at all")
    weights = [math.exp(value - top) for value in loglikelihoods]
    total = sum(weights)
    return [weight / total for weight in weights], top + math.log(total)


def confidence(probabilities: list[float]) -> float:
    """(K * p_max - 1) / (K - 1): 0 when the options are equally likely, 1 when one holds all."""
    count = len(probabilities)
    return (count * max(probabilities) - 1) / (count - 1)


class LocalScorer:
    """Scores options with a transformers causal LM on this process's device. Not thread-safe:
    one prompt at a time (the server holds a lock around it)."""

    def __init__(self, model: Any, device: Any, *, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        from paper_explorer.agent.policies.hf import cache_argument

        self.model, self.device, self.batch_tokens = model, device, batch_tokens
        self.cache_argument = cache_argument(model)
        self.cache: Any = None
        self.cached_ids: list[int] = []

    def score(self, prompt: list[int], options: list[list[int]], mode: Mode = "shared") -> OptionLikelihoods:
        import torch

        with torch.inference_mode():
            if mode == "separate":
                return OptionLikelihoods([self._alone(prompt, option) for option in options], 0, len(options))
            return self._shared(prompt, options)

    def _alone(self, prompt: list[int], option: list[int]) -> float:
        import torch

        ids = torch.tensor([[*prompt, *option]], device=self.device)
        logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=len(option) + 1).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return float(logprobs[torch.arange(len(option)), torch.tensor(option, device=logprobs.device)].sum())

    def _shared(self, prompt: list[int], options: list[list[int]]) -> OptionLikelihoods:
        import torch
        from transformers import DynamicCache

        keep = min(common_prefix(self.cached_ids, prompt), len(prompt) - 1) if self.cache is not None else 0
        if self.cache is None:
            self.cache = DynamicCache()
        _crop(self.cache, keep)
        self.cached_ids = self.cached_ids[:keep]
        ids = torch.tensor([prompt[keep:]], device=self.device)
        last = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_argument: self.cache}).logits[0, -1]
        self.cached_ids = list(prompt)
        first = torch.log_softmax(last.float(), dim=-1)
        totals = [float(first[option[0]]) for option in options]
        passes = 1
        longer = [index for index, option in enumerate(options) if len(option) > 1]
        for batch in self._batches(longer, options, len(prompt)):
            passes += 1
            rest = [options[index][1:] for index in batch]
            width = max(map(len, rest))
            feed = torch.zeros((len(batch), width), dtype=torch.long, device=self.device)
            for row, index in enumerate(batch):
                feed[row, : len(options[index]) - 1] = torch.tensor(options[index][:-1], device=self.device)
            cache = copy.deepcopy(self.cache)
            cache.batch_repeat_interleave(len(batch))
            logits = self.model(input_ids=feed, use_cache=True, **{self.cache_argument: cache}).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, index in enumerate(batch):
                target = torch.tensor(rest[row], device=logprobs.device)
                totals[index] += float(logprobs[row, torch.arange(len(target)), target].sum())
        return OptionLikelihoods(totals, keep, passes)

    def _batches(self, indices: list[int], options: list[list[int]], prompt_tokens: int) -> list[list[int]]:
        """Options in batches whose copies of the cache and logits stay within ``batch_tokens``
        positions; the longest first, so padding stays small."""
        ordered = sorted(indices, key=lambda index: -len(options[index]))
        batches: list[list[int]] = []
        for index in ordered:
            if batches:
                current = batches[-1]
                width = len(options[current[0]])
                if (len(current) + 1) * (prompt_tokens + width) <= self.batch_tokens:
                    current.append(index)
                    continue
            batches.append([index])
        return batches

    def forget(self) -> None:
        """Drop the cache (a later prompt starts from nothing)."""
        self.cache, self.cached_ids = None, []


def _crop(cache: Any, keep: int) -> None:
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


__all__ = ["DEFAULT_BATCH_TOKENS", "LocalScorer", "Mode", "OptionLikelihoods", "confidence", "normalised"]
