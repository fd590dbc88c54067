"""Policies by name. Language-model policies are imported only when chosen (torch is heavy).

Each policy takes its settings by keyword (``make_policy`` passes a ``PolicyConfig``'s fields by
name), never by position, and builds its step records typed (``Reply.generation``, ``.info``).
"""

from __future__ import annotations

from collections.abc import Callable

from paper_explorer.agent.config import POLICY_NAMES, READER_FIELDS, PolicyConfig
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import ContextExceeded, EpisodeStart, NoAnswer, Policy, PolicyError, Reply, Sampling
from paper_explorer.agent.policies.baselines import DirectSubmit, ReadAll, SingleShotRag
from paper_explorer.agent.policies.replay import Replay
from paper_explorer.agent.policies.scripted import Scripted

MODEL_POLICIES = ("hf", "openai")


def require_llm_extra() -> None:
    """One clear line instead of an ImportError when the model packages are missing."""
    import importlib.util

    missing = [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None]
    if missing:
        raise AgentError(f"this needs {', '.join(missing)}: install the model extra with pip install -e '.[llm]'")


def make_policy(config: PolicyConfig, max_steps: int = 10) -> Policy:
    """The policy ``config`` names; missing or stray settings are one clear line."""
    name = config.name
    if name == "memory-reader":
        return _memory_reader(config, max_steps)
    # a manifest records every field, so a setting counts as given where it is not the default
    stray = [field for field in READER_FIELDS if getattr(config, field) != PolicyConfig.model_fields[field].default]
    if stray:
        raise AgentError(f"--{stray[0].replace('_', '-')} is for --policy memory-reader, not {name!r}")
    if config.replay is not None and name != "replay":
        raise AgentError(f"--replay is only for --policy replay, not {name!r}")
    if name not in MODEL_POLICIES and (config.model or config.adapter or config.base_url):
        raise AgentError(f"--model, --adapter and --base-url are for --policy hf, openai or memory-reader, not {name!r}")
    if config.served_adapter is not None and (config.serving != "openai" or config.adapter is None):
        raise AgentError("policy.served_adapter is set by explorer eval from --adapter with --policy openai; remove it from the config")
    if config.thinking and name not in MODEL_POLICIES:
        raise AgentError(f"--thinking is for --policy hf or openai, not {name!r}")
    if (config.temperature, config.top_p, config.top_k) != (0.0, 1.0, 0) and name not in MODEL_POLICIES:
        raise AgentError(f"--temperature, --top-p and --top-k are for --policy hf, openai or memory-reader; {name!r} is deterministic")
    policy = _make(config, max_steps)
    if name not in MODEL_POLICIES and config.tokenizer is not None:
        from paper_explorer.agent.renderer import ChatRenderer

        policy.renderer = ChatRenderer.from_directory(config.tokenizer)  # records the prompts it would have served
    return policy


def _memory_reader(config: PolicyConfig, max_steps: int) -> Policy:
    """The memory reader around its backend, the hf or openai policy its settings describe."""
    if config.backend is None:
        raise AgentError("--policy memory-reader needs --backend: hf (with --model) or openai (with --base-url, --model and --tokenizer)")
    if config.replay is not None:
        raise AgentError("--replay is only for --policy replay, not 'memory-reader'")
    if config.thinking:
        raise AgentError("--thinking is not for --policy memory-reader: it writes memories and an answer, not actions")
    if config.api == "chat":
        raise AgentError("--api chat is not for --policy memory-reader: its prompts are token ids (use the completions API)")
    if config.served_adapter is not None and (config.backend != "openai" or config.adapter is None):
        raise AgentError("policy.served_adapter is set by explorer eval from --adapter with --backend openai; remove it from the config")
    from paper_explorer.agent.memory_reader.policy import MemoryReader, Recipe

    try:
        backend = _make(config.model_copy(update={"name": config.backend}), max_steps)
    except AgentError as error:  # what the backend lacks, said as this policy's settings
        said = str(error).replace(f"--policy {config.backend}", f"--policy memory-reader --backend {config.backend}")
        raise AgentError(said) from None
    return MemoryReader(backend, recipe=Recipe.of(config))


def _make(config: PolicyConfig, max_steps: int) -> Policy:
    name = config.name
    if name == "replay":
        if config.replay is None:
            raise AgentError("--policy replay needs --replay TRAJECTORIES.jsonl (the episodes to replay)")
        from paper_explorer.agent.writer import read_trajectories

        return Replay(read_trajectories(config.replay), source=config.replay)
    if name == "hf":
        if config.tokenizer is not None:
            raise AgentError("--tokenizer is not for --policy hf: it serves with its model's own tokenizer")
        if config.model is None:
            raise AgentError("--policy hf needs --model (a model directory such as `explorer tiny-model` writes, or a hub id)")
        require_llm_extra()
        from paper_explorer.agent.policies.hf import HFPolicy

        return HFPolicy.load(
            config.model,
            adapter=config.adapter,
            quantization=config.quantization,
            max_new_tokens=config.max_new_tokens,
            max_context=config.max_context,
            thinking=config.thinking,
            thinking_budget=config.thinking_budget,
            sampling=Sampling.of(config),
            threads=config.threads,
        )
    if name == "openai" and config.api == "chat":
        if config.base_url is None or config.model is None:
            raise AgentError(
                "--policy openai --api chat needs --base-url and --model (the teacher's name); --tokenizer (the student's) records its prompts"
            )
        if config.adapter is not None or config.thinking:
            raise AgentError("--adapter and --thinking are not for --api chat: the teacher is served as it is")
        from paper_explorer.agent.policies.openai_chat import OpenAIChatPolicy

        return OpenAIChatPolicy(
            base_url=config.base_url,
            model=config.model,
            tokenizer=config.tokenizer,
            max_new_tokens=config.max_new_tokens,
            timeout=config.timeout,
            retries=config.retries,
            sampling=Sampling.of(config),
        )
    if name == "openai":
        if config.base_url is None or config.model is None or config.tokenizer is None:
            raise AgentError("--policy openai needs --base-url, --model (the served name) and --tokenizer (its tokenizer directory)")
        if config.adapter is not None and config.served_adapter is None:
            raise AgentError(
                "--adapter with --policy openai is for explorer eval (it loads the adapter into the server); "
                "here pass the name the server serves it under as --model"
            )
        from paper_explorer.agent.policies.openai_server import OpenAIPolicy

        # With an adapter, requests name it as the server serves it (eval loads it first; agent.policies.adapters).
        served = config.served_adapter.name if config.served_adapter is not None else config.model
        return OpenAIPolicy(
            base_url=config.base_url,
            model=served,
            tokenizer=config.tokenizer,
            prompt_format=config.prompt_format,
            max_new_tokens=config.max_new_tokens,
            max_context=config.max_context,
            timeout=config.timeout,
            retries=config.retries,
            thinking=config.thinking,
            thinking_budget=config.thinking_budget,
            sampling=Sampling.of(config),
        )
    baselines: dict[str, Callable[[], Policy]] = {
        "scripted": Scripted,
        "direct-submit": DirectSubmit,
        "single-shot-rag": SingleShotRag,
        "read-all": lambda: ReadAll(max_steps=max_steps),
    }
    return baselines[name]()


__all__ = [
    "ContextExceeded",
    "EpisodeStart",
    "NoAnswer",
    "POLICY_NAMES",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "Reply",
    "make_policy",
    "require_llm_extra",
]
