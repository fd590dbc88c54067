"""Policies by name. Language-model policies are imported only when chosen (torch is heavy)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError
from agent.policies.base import ContextExceeded, EpisodeStart, Policy, PolicyError, Reply
from agent.policies.baselines import DirectSubmit, ReadAll, SingleShotRag
from agent.policies.replay import Replay
from agent.policies.scripted import Scripted

POLICY_NAMES = ("scripted", "direct-submit", "single-shot-rag", "read-all", "replay", "hf", "openai")
MODEL_POLICIES = ("hf", "openai")


@dataclass(frozen=True)
class PolicyOptions:
    """Everything a policy may be configured with from the command line."""

    max_steps: int = 10
    replay: Path | None = None
    model: str | None = None  # hf: a model directory or hub id; openai: the served model's name
    adapter: Path | None = None
    quantization: str = "auto"
    max_new_tokens: int = 512
    max_context: int = 32_768
    base_url: str | None = None
    tokenizer: Path | None = None
    prompt_format: str = "ids"
    timeout: float = 120.0
    retries: int = 4


def require_llm_extra() -> None:
    """One clear line instead of an ImportError when the model packages are missing."""
    import importlib.util

    missing = [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None]
    if missing:
        raise AgentError(f"this needs {', '.join(missing)}: install the model extra with pip install -e '.[llm]'")


def make_policy(name: str, options: PolicyOptions = PolicyOptions()) -> Policy:
    """The named policy; bad names and missing or stray options are one clear line."""
    if name not in POLICY_NAMES:
        raise AgentError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    if options.replay is not None and name != "replay":
        raise AgentError(f"--replay is only for --policy replay, not {name!r}")
    if name not in MODEL_POLICIES and (options.model or options.adapter or options.base_url):
        raise AgentError(f"--model, --adapter and --base-url are for --policy hf or openai, not {name!r}")
    if name == "replay":
        if options.replay is None:
            raise AgentError("--policy replay needs --replay TRAJECTORIES.jsonl (the episodes to replay)")
        from agent.writer import read_trajectories

        return Replay(read_trajectories(options.replay), source=options.replay)
    if name == "hf":
        if options.model is None:
            raise AgentError("--policy hf needs --model (a model directory such as `explorer tiny-model` writes, or a hub id)")
        require_llm_extra()
        from agent.policies.hf import HFPolicy

        return HFPolicy(options.model, options.adapter, options.quantization, options.max_new_tokens, options.max_context)
    if name == "openai":
        if options.base_url is None or options.model is None or options.tokenizer is None:
            raise AgentError("--policy openai needs --base-url, --model (the served name) and --tokenizer (its tokenizer directory)")
        if options.adapter is not None:
            raise AgentError("--adapter is for --policy hf; serve the adapter with the server (see the README's vLLM command)")
        from agent.policies.openai_server import OpenAIPolicy

        return OpenAIPolicy(options.base_url, options.model, options.tokenizer, options.prompt_format,
                            options.max_new_tokens, options.max_context, options.timeout, options.retries)
    return {
        "scripted": Scripted, "direct-submit": DirectSubmit, "single-shot-rag": SingleShotRag,
        "read-all": lambda: ReadAll(max_steps=options.max_steps),
    }[name]()


__all__ = ["ContextExceeded", "EpisodeStart", "POLICY_NAMES", "Policy", "PolicyError", "PolicyOptions", "Reply", "make_policy",
           "require_llm_extra"]
