"""Where option log-likelihoods come from: a local transformers model (``LocalBackend``), or any
backend with the same four members (``Backend``: an OpenAI-compatible server is one).

A local model is loaded as the hf policy loads it (``HFPolicy.load``: the tokenizer and its chat
template checked first, quantization, a LoRA adapter refused in one line when it does not fit), so
a decision is scored by exactly the model an episode runs; its settings are recorded the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from paper_explorer.decisions.likelihood import DEFAULT_BATCH_TOKENS, LocalScorer, Mode, OptionLikelihoods

if TYPE_CHECKING:
    from paper_explorer.agent.renderer import ChatRenderer


class Backend(Protocol):
    name: str  # "hf" or "openai", as the manifest records it
    renderer: ChatRenderer
    max_context: int

    def settings(self) -> dict[str, Any]: ...
    def score(self, prompt: list[int], options: list[list[int]], mode: Mode = "shared") -> OptionLikelihoods: ...


class LocalBackend:
    name = "hf"

    def __init__(self, policy: Any, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        self.policy = policy
        self.renderer: ChatRenderer = policy.renderer
        self.max_context: int = policy.max_context
        self.scorer = LocalScorer(policy.model, policy.device, batch_tokens=batch_tokens)

    @classmethod
    def load(
        cls,
        model: str,
        *,
        adapter: Path | None = None,
        quantization: str = "auto",
        max_context: int | None = None,
        threads: int | None = None,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
    ) -> LocalBackend:
        from paper_explorer.agent.policies import require_llm_extra
        from paper_explorer.agent.policies.hf import HFPolicy

        require_llm_extra()
        policy = HFPolicy.load(model, adapter=adapter, quantization=quantization, max_context=max_context, threads=threads)
        return cls(policy, batch_tokens)

    def settings(self) -> dict[str, Any]:
        recorded = self.policy.settings().model_dump(
            mode="json", exclude={"sampling", "overridden_generation_config", "max_new_tokens", "reuse_cache"}
        )
        return {**recorded, "batch_tokens": self.scorer.batch_tokens}

    def score(self, prompt: list[int], options: list[list[int]], mode: Mode = "shared") -> OptionLikelihoods:
        return self.scorer.score(prompt, options, mode)


__all__ = ["Backend", "LocalBackend"]
