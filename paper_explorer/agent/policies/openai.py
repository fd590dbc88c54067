"""``--policy openai``: a model an OpenAI-compatible server serves (vLLM), asked for completions of
our renderer's prompts (``openai_server``), or a teacher asked through the chat API (``openai_chat``)."""

from __future__ import annotations

from typing import Literal

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import Policy
from paper_explorer.agent.policies.openai_chat import OpenAIChatPolicy
from paper_explorer.agent.policies.openai_server import OpenAIPolicy
from paper_explorer.agent.policies.settings import ServerSettings, ThinkingSettings
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.corpus.setting_names import setting


class OpenAIConfig(ServerSettings, ThinkingSettings):
    """``--policy openai``: a served model."""

    name: Literal["openai"] = "openai"


@register_policy(OpenAIConfig)
def openai(config: OpenAIConfig, max_steps: int) -> Policy:
    if config.served_adapter is not None and config.adapter is None:
        raise AgentError(
            f"policy.served_adapter is set by explorer eval from {setting('policy.adapter')} with {setting('policy.name', 'openai')}; "
            "remove it from the config"
        )
    if config.api == "chat":
        return _chat(config)
    if config.base_url is None or config.model is None or config.tokenizer is None:
        raise AgentError(
            f"{setting('policy.name', 'openai')} needs {setting('policy.base_url')}, {setting('policy.model')} (the served name) "
            f"and {setting('policy.tokenizer')} (its tokenizer directory)"
        )
    if config.adapter is not None and config.served_adapter is None:
        raise AgentError(
            f"{setting('policy.adapter')} with {setting('policy.name', 'openai')} is for explorer eval (it loads the adapter into the server); "
            f"here pass the name the server serves it under as {setting('policy.model')}"
        )
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
        sampling=config.sampling,
    )


def _chat(config: OpenAIConfig) -> Policy:
    if config.base_url is None or config.model is None:
        raise AgentError(
            f"{setting('policy.name', 'openai')} {setting('policy.api', 'chat')} needs {setting('policy.base_url')} and "
            f"{setting('policy.model')} (the teacher's name); {setting('policy.tokenizer')} (the student's) records its prompts"
        )
    if config.adapter is not None or config.thinking:
        raise AgentError(
            f"{setting('policy.adapter')} and {setting('policy.thinking')} are not for {setting('policy.api', 'chat')}: "
            "the teacher is served as it is"
        )
    return OpenAIChatPolicy(
        base_url=config.base_url,
        model=config.model,
        tokenizer=config.tokenizer,
        max_new_tokens=config.max_new_tokens,
        timeout=config.timeout,
        retries=config.retries,
        sampling=config.sampling,
    )
