"""``--policy memory-reader``: MemAgent's paged memory reader (``agent.memory_reader``) around a
backend model, the hf or openai policy made from the same settings (``--backend``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.memory_reader.settings import ReaderRecipe
from paper_explorer.agent.policies.base import Policy
from paper_explorer.agent.policies.settings import LocalModelSettings, ServerSettings
from paper_explorer.agent.policy_registry import SettingRefused, policy_entry, register_policy
from paper_explorer.corpus.setting_names import setting

# The settings only one backend has: given for the other, they are refused.
BACKEND_SETTINGS = {
    "hf": set(LocalModelSettings.model_fields) - set(ServerSettings.model_fields),
    "openai": set(ServerSettings.model_fields) - set(LocalModelSettings.model_fields),
}


class MemoryReaderConfig(ReaderRecipe, LocalModelSettings, ServerSettings):
    """``--policy memory-reader``: the recipe, and the settings of the backend model that reads."""

    name: Literal["memory-reader"] = "memory-reader"
    backend: Literal["hf", "openai"] | None = Field(
        None, description="The model that reads, hf (--model, --adapter) or openai (--base-url, --model, --tokenizer)."
    )
    refusals = {"thinking": "it writes memories and an answer, not actions"}

    @model_validator(mode="after")
    def _one_backend(self) -> MemoryReaderConfig:
        for backend, settings in BACKEND_SETTINGS.items():
            given = sorted(name for name in settings if getattr(self, name) != type(self).model_fields[name].default)
            if given and self.backend != backend:
                raise SettingRefused(
                    f"{setting('policy.' + given[0])} is for {setting('policy.backend', backend)}, not {self.backend or 'none'}"
                )
        if self.api == "chat":
            raise SettingRefused(
                f"{setting('policy.api', 'chat')} is not for {setting('policy.name', 'memory-reader')}: "
                "its prompts are token ids (use the completions API)"
            )
        return self

    @property
    def serving(self) -> str:
        return self.backend or self.name


@register_policy(MemoryReaderConfig)
def memory_reader(config: MemoryReaderConfig, max_steps: int) -> Policy:
    if config.backend is None:
        raise AgentError(
            f"{setting('policy.name', 'memory-reader')} needs {setting('policy.backend')}: hf (with {setting('policy.model')}) or openai "
            f"(with {setting('policy.base_url')}, {setting('policy.model')} and {setting('policy.tokenizer')})"
        )
    if config.served_adapter is not None and (config.backend != "openai" or config.adapter is None):
        raise AgentError(
            f"policy.served_adapter is set by explorer eval from {setting('policy.adapter')} with {setting('policy.backend', 'openai')}; "
            "remove it from the config"
        )
    # imported here: the reader reads through the tools' page layout, which loads the corpus index (numpy, scipy)
    from paper_explorer.agent.memory_reader.policy import MemoryReader

    entry = policy_entry(config.backend)
    settings = {name: getattr(config, name) for name in entry.config.model_fields if name in type(config).model_fields and name != "name"}
    try:
        backend = entry.factory(entry.config.model_validate(settings), max_steps)
    except AgentError as error:  # what the backend lacks, said as this policy's settings
        reader = f"{setting('policy.name', 'memory-reader')} {setting('policy.backend', config.backend)}"
        said = str(error).replace(setting("policy.name", config.backend), reader)
        raise AgentError(said) from None
    return MemoryReader(backend, recipe=config, max_steps=max_steps)
