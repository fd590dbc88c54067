"""Policies by name: each is one module of this package that registers its config model and its
factory (``agent.policy_registry``). Language-model policies import torch only inside their factories, when chosen.

Each policy takes its settings by keyword, never by position, and builds its step records typed
(``Reply.generation``, ``.info``).
"""

from __future__ import annotations

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import ContextExceeded, EpisodeStart, NoAnswer, Policy, PolicyError, Reply
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import PolicyConfig, make_config, policy_config, policy_entry, policy_names, register_policy


def require_llm_extra() -> None:
    """One clear line instead of an ImportError when the model packages are missing."""
    import importlib.util

    missing = [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None]
    if missing:
        raise AgentError(f"this needs {', '.join(missing)}: install the model extra with pip install -e '.[llm]'")


def make_policy(config: PolicyConfig, max_steps: int = 10) -> Policy:
    """The policy ``config`` configures, made by its registered factory; what it lacks is one clear line."""
    policy = policy_entry(config.name).factory(policy_config(config), max_steps)
    if isinstance(config, PromptRecording) and config.tokenizer is not None:
        from paper_explorer.agent.renderer import ChatRenderer

        policy.renderer = ChatRenderer.from_directory(config.tokenizer)  # records the prompts it would have served
    return policy


__all__ = [
    "ContextExceeded",
    "EpisodeStart",
    "NoAnswer",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "Reply",
    "make_config",
    "make_policy",
    "policy_config",
    "policy_names",
    "register_policy",
    "require_llm_extra",
]
