"""The ``hf`` policy: a causal LM (Qwen3, optionally with a LoRA adapter) run with transformers.

* Prompts are the shared renderer's token ids (``agent.renderer``), so what is served is what
  is trained.
* Greedy decoding by default: the model's generation_config may ask for sampling (Qwen3's
  does); we override it and record what we overrode in the policy settings. Sampling is ours
  to ask for (``Sampling``: temperature, top-p, top-k), drawn from a generator seeded with the
  episode's seed, so the same config gives the same trajectories.
* Multi-turn KV cache reuse: the cache holds every token fed so far. Each step keeps the
  longest prefix the new prompt shares with it and prefills only the rest, so an episode
  prefills about its final length once instead of the O(steps^2) sum of re-encoding every
  prompt. When the renderer's re-encoding of an action differs from the ids the model
  generated, the cache is cut back to the shared prefix (counted as ``cache_cut_tokens``).
* Option probes (``probe``, ``agent.probes``) read the next-token distribution after the episode
  from the same cache, and leave it as they found it (up to the prefix they shared), so that
  cached and uncached probes can be compared (the reload check).
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any, Literal

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.models import file_hashes, load_causal_lm, load_renderer, resolve_model, set_threads
from paper_explorer.agent.policies import require_llm_extra
from paper_explorer.agent.policies.base import ContextExceeded, EpisodeStart, Policy, ProbeReading, Reply, Sampling
from paper_explorer.agent.policies.records import Inline, PolicySettings, SamplingRecord, TemplateRecord, omitted_when_none
from paper_explorer.agent.policies.settings import LocalModelSettings, ThinkingSettings
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.agent.renderer import ChatRenderer, split_thinking
from paper_explorer.agent.served import common_prefix
from paper_explorer.agent.trajectory import Generation, Sampled
from paper_explorer.corpus.setting_names import setting


class HFConfig(LocalModelSettings, ThinkingSettings):
    """``--policy hf``: a model run in this process with transformers."""

    name: Literal["hf"] = "hf"
    refusals = {"tokenizer": "it serves with its model's own tokenizer"}


@register_policy(HFConfig)
def hf(config: HFConfig, max_steps: int) -> Policy:
    if config.model is None:
        raise AgentError(
            f"{setting('policy.name', 'hf')} needs {setting('policy.model')} (a model directory such as `explorer tiny-model` writes, or a hub id)"
        )
    require_llm_extra()
    return HFPolicy.load(
        config.model,
        adapter=config.adapter,
        quantization=config.quantization,
        max_new_tokens=config.max_new_tokens,
        max_context=config.max_context,
        thinking=config.thinking,
        thinking_budget=config.thinking_budget,
        sampling=config.sampling,
        threads=config.threads,
    )


class HFSettings(PolicySettings):
    """What a trajectory records of the hf policy: the model as loaded, its decoding and its template."""

    model: str
    adapter: str | None
    adapter_sha256: dict[str, str] | None  # every adapter file's, by relative path
    quantization: str
    dtype: str
    device: str
    threads: int
    sampling: Inline[SamplingRecord]
    overridden_generation_config: dict[str, Any]  # the model's own sampling defaults, which the decoding above replaced
    max_new_tokens: int
    max_context: int
    reuse_cache: bool
    template: Inline[TemplateRecord]
    thinking: bool
    thinking_budget: int | None = omitted_when_none()


SAMPLING_FIELDS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def crop(cache, keep: int) -> None:
    """Keep the first ``keep`` positions of a DynamicCache. A negative argument removes that many
    positions in transformers 4 and 5 alike (5.x refuses a positive one)."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


def cache_argument(model) -> str:
    """The forward argument a KV cache is passed as: transformers 5.x renamed it; 4.x knows only
    past_key_values."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


DEFAULT_CONTEXT = 32_768  # the default context, unless the model was built for less


def model_context(model) -> int:
    """The default context: 32768, or less where the model's ``max_position_embeddings`` says so
    (SmolLM2's 8192); never past what the model was built for."""
    length = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(length, DEFAULT_CONTEXT) if isinstance(length, int) and length > 0 else DEFAULT_CONTEXT


def _current_threads() -> int:
    import torch

    return torch.get_num_threads()


class HFPolicy(Policy):
    name = "hf"
    renderer: ChatRenderer  # always: it renders what the model is served

    def __init__(
        self,
        model,
        renderer: ChatRenderer,
        *,
        name: str,
        quantization: str,
        dtype,
        adapter: Path | None = None,
        adapter_sha256: dict[str, str] | None = None,
        max_new_tokens: int = 512,
        max_context: int = 32_768,
        reuse_cache: bool = True,
        thinking: bool = False,
        thinking_budget: int = 1024,
        sampling: Sampling = Sampling(),
        threads: int | None = None,
    ) -> None:
        """A policy around a model already in memory: one loaded by ``load``, or the weights being
        trained (sft validation episodes)."""
        self.model, self.renderer, self.model_name = model, renderer, name
        self.thinking, self.thinking_budget, self.sampling = thinking, thinking_budget, sampling
        self.quantization, self.dtype = quantization, dtype
        self.adapter, self.adapter_sha256 = adapter, adapter_sha256
        self.max_new_tokens, self.max_context, self.reuse_cache = max_new_tokens, max_context, reuse_cache
        self.threads = set_threads(threads) if threads is not None else _current_threads()
        generation_config = getattr(model, "generation_config", None)
        # what ends a turn in the template, the tokenizer's eos, and the model's own (Qwen3's lists <|endoftext|> too)
        model_eos = getattr(generation_config, "eos_token_id", None)
        self.stop_ids = set(renderer.stop_ids) | set(
            model_eos if isinstance(model_eos, list) else [model_eos] if model_eos is not None else []
        )
        self.overridden = {
            field: getattr(generation_config, field)
            for field in SAMPLING_FIELDS
            if generation_config is not None and getattr(generation_config, field, None) not in (None, False)
        }
        self.device = next(model.parameters()).device
        self.cache_argument = cache_argument(model)
        self._reset()

    @classmethod
    def load(
        cls,
        model: str,
        *,
        adapter: Path | None = None,
        quantization: str = "auto",
        max_new_tokens: int = 512,
        max_context: int | None = None,
        reuse_cache: bool = True,
        thinking: bool = False,
        thinking_budget: int = 1024,
        sampling: Sampling = Sampling(),
        threads: int | None = None,
    ) -> HFPolicy:
        """Load ``model`` (a directory or hub id) as training does, with an optional LoRA adapter.
        The settings are keyword-only: two numbers swapped by position would pass silently."""
        import torch

        if adapter is not None and not (adapter / "adapter_config.json").exists():
            raise AgentError(f"{adapter}: no adapter_config.json; name a LoRA adapter directory (PeftModel.save_pretrained)")
        renderer = load_renderer(resolve_model(model))  # the tokenizer and its template are checked before any weights load
        if thinking and not renderer.thinking_supported:
            raise AgentError(f"{model}: this model's chat template has no thinking mode; drop {setting('policy.thinking')}")
        loaded = load_causal_lm(model, quantization, device_map="auto" if torch.cuda.is_available() else "cpu", threads=threads)
        network = loaded.model
        if adapter is not None:
            from peft import PeftModel

            try:
                network = PeftModel.from_pretrained(network, str(adapter))
            except (ValueError, KeyError, RuntimeError) as error:  # peft's word on an adapter made for another model
                if isinstance(error, RuntimeError) and "state_dict" not in str(error):  # the machine (CUDA), not the adapter
                    raise
                said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise AgentError(f"{adapter}: this LoRA adapter does not load on {model} ({said})") from None
        network.eval()
        return cls(
            network,
            renderer,
            name=resolve_model(model),
            quantization=loaded.quantization,
            dtype=loaded.dtype,
            adapter=adapter,
            adapter_sha256=file_hashes(adapter) if adapter is not None else None,
            max_new_tokens=max_new_tokens,
            max_context=max_context if max_context is not None else model_context(network),
            reuse_cache=reuse_cache,
            thinking=thinking,
            thinking_budget=thinking_budget,
            sampling=sampling,
            threads=loaded.threads,
        )

    def settings(self) -> HFSettings:
        return HFSettings(
            model=self.model_name,
            adapter=str(self.adapter) if self.adapter else None,
            adapter_sha256=self.adapter_sha256,
            quantization=self.quantization,
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
            threads=self.threads,
            sampling=self.sampling.settings(),
            overridden_generation_config=self.overridden,
            max_new_tokens=self.max_new_tokens,
            max_context=self.max_context,
            reuse_cache=self.reuse_cache,
            template=TemplateRecord.of(self.renderer),
            thinking=self.thinking,
            thinking_budget=self.thinking_budget if self.thinking else None,
        )

    def _reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.cached_ids: list[int] = []

    def start(self, episode: EpisodeStart) -> None:
        import torch

        super().start(episode)
        torch.manual_seed(episode.seed)
        self.generator = torch.Generator(device="cpu").manual_seed(episode.seed)
        self._reset()

    def act(self, messages: list[dict[str, str]]) -> Reply:
        prompt = self.renderer.prompt(messages, thinking=self.thinking)
        return self._reply(prompt, self.max_new_tokens, thinking=self.thinking)

    def complete(self, prompt: list[int], *, max_new_tokens: int) -> Reply:
        """One completion of ``prompt`` (ids, non-thinking) of at most ``max_new_tokens``: the memory
        reader's call (``agent.memory_reader``), with the cache and records of an action."""
        return self._reply(prompt, max_new_tokens, thinking=False)

    def _reply(self, prompt: list[int], max_new_tokens: int, *, thinking: bool) -> Reply:
        import torch

        budget = self.thinking_budget if thinking else 0
        if len(prompt) + budget + max_new_tokens > self.max_context:
            raise ContextExceeded(
                f"a prompt of {len(prompt)} tokens plus {budget + max_new_tokens} new ones exceeds the context of {self.max_context}"
            )
        if not self.reuse_cache:
            self._reset()
        keep = min(common_prefix(self.cached_ids, prompt), len(prompt) - 1)  # feed at least one token
        cut = len(self.cached_ids) - keep
        if cut:
            crop(self.cache, keep)
        self.cached_ids = prompt[:keep]  # true of the cache even if this step fails half-way (a probe reads it after)
        started = time.perf_counter()
        with torch.inference_mode():
            logits = self._forward(prompt[keep:])
            prefill_seconds = time.perf_counter() - started
            generated, logprobs, thought = self._generate(logits, max_new_tokens, thinking=thinking)
        hit_cap = not generated or generated[-1] not in self.stop_ids
        self.cached_ids = prompt + generated[:-1]  # the last token was chosen but never fed
        text = self.renderer.decode(generated if hit_cap else generated[:-1])
        reasoning, action, closed = split_thinking(text) if thinking else (None, text, True)
        unclosed = not closed and not hit_cap  # it ended its turn without </think>: the whole text is the action (agent.renderer)
        generation = Generation(
            prompt_tokens=len(prompt),
            cached_tokens=keep,
            prefill_tokens=len(prompt) - keep,
            cache_cut_tokens=cut,
            generated_tokens=len(generated),
            hit_cap=hit_cap,
            prefill_seconds=prefill_seconds,
            decode_seconds=time.perf_counter() - started - prefill_seconds,
            thinking_unclosed=True if unclosed else None,
            **thought,
        )
        sampled = Sampled(ids=generated, logprobs=logprobs, temperature=self.sampling.temperature or 1.0, source="hf")
        if not thinking or unclosed:
            return Reply(text, generation=generation, prompt_ids=prompt, sampled=sampled)
        return Reply(action, generation=generation, reasoning=reasoning, prompt_ids=prompt, sampled=sampled)

    def _generate(self, logits, max_new_tokens: int, *, thinking: bool) -> tuple[list[int], list[float | None], dict]:
        """Tokens up to a stop token (``_choose``), each with its log-probability under the
        distribution it was drawn from. In thinking mode the think block gets its own budget: a
        model still thinking when it is spent has ``</think>\\n\\n`` written for it (recorded; those
        tokens have no log-probability: they were not drawn) and then writes its action with the
        usual ``max_new_tokens``."""
        generated: list[int] = []
        logprobs: list[float | None] = []
        thinks = thinking
        thinking_tokens, budget_hit, action_tokens = 0, False, 0
        while True:
            next_id, logprob = self._choose(logits[0, -1])
            if thinking and next_id == self.renderer.end_think:
                thinking = False
            elif thinking and thinking_tokens >= self.thinking_budget:
                close = [*self.renderer.thought("")[-1:], *self.renderer.text("\n\n")]  # </think>, as the template has it
                generated += close
                logprobs += [None] * len(close)
                thinking, budget_hit = False, True
                logits = self._forward(close)
                continue
            generated.append(next_id)
            logprobs.append(logprob)
            if thinking:
                thinking_tokens += 1
            else:
                action_tokens += 1
            if next_id in self.stop_ids or action_tokens >= max_new_tokens:
                break
            logits = self._forward([next_id])
        return generated, logprobs, {"thinking_tokens": thinking_tokens, "thinking_budget_hit": budget_hit} if thinks else {}

    def _choose(self, logits) -> tuple[int, float]:
        """The next token: the likeliest, or a draw from the tempered, top-k and top-p cut
        distribution with the episode's generator (on the CPU, so that devices agree); with its
        log-probability under the tempered distribution before the cuts (``Sampled``)."""
        import torch

        if self.sampling.greedy:
            chosen = int(torch.argmax(logits))
            return chosen, float(torch.log_softmax(logits.float(), dim=-1)[chosen])
        scores = logits.float().cpu() / self.sampling.temperature
        logprobs = torch.log_softmax(scores, dim=-1)
        if self.sampling.top_k:
            kth = torch.topk(scores, min(self.sampling.top_k, scores.numel())).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probabilities = torch.softmax(scores, dim=-1)
        if self.sampling.top_p < 1:
            ordered, order = torch.sort(probabilities, descending=True)
            outside = torch.cumsum(ordered, dim=-1) - ordered >= self.sampling.top_p  # keep the smallest set reaching top_p
            probabilities = probabilities.scatter(0, order, ordered.masked_fill(outside, 0.0))
        chosen = int(torch.multinomial(probabilities, 1, generator=self.generator))
        return chosen, float(logprobs[chosen])

    def probe_unavailable(self) -> str | None:
        return None

    def probe(self, prompt_ids: list[int], option_ids: list[int], *, use_cache: bool = True) -> ProbeReading:
        """Each option's log-probability (log-softmax over the whole vocabulary, in float32) as the
        token after ``prompt_ids``, from one forward pass. With the cache: the longest prefix it
        shares with the episode's cache is reused, and the cache is cropped back to that prefix
        afterwards, so a second probe reuses it too. Without (the reload check): a forward pass of
        the whole prompt with no cache at all."""
        import torch

        with torch.inference_mode():
            if use_cache:
                keep = min(common_prefix(self.cached_ids, prompt_ids), len(prompt_ids) - 1)  # feed at least one token
                crop(self.cache, keep)
                self.cached_ids = self.cached_ids[:keep]
                try:
                    logits = self._forward(prompt_ids[keep:])
                finally:
                    crop(self.cache, keep)
            else:
                keep = 0
                input_ids = torch.tensor([prompt_ids], device=self.device)
                logits = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits
            logprobs = torch.log_softmax(logits[0, -1].float(), dim=-1)
            return ProbeReading([float(logprobs[token]) for token in option_ids], source="hf", cached_tokens=keep)

    def _forward(self, ids: list[int]):
        """The logits of the last of ``ids``, fed after the cache: every caller reads only those, and
        a prefill's logits over the whole vocabulary would be large (32k tokens of Qwen3: ~10 GB)."""
        import torch

        input_ids = torch.tensor([ids], device=self.device)
        output = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self.cache_argument: self.cache})
        return output.logits
