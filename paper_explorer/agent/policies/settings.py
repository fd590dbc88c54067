"""Settings several policies share, as config bases their own configs inherit (each still one
model per policy, registered in its own module): the prompts a policy without a model would be
served, a model's decoding, and the two ways a model runs (in this process, or on a server).

A setting declared here is one flag for every policy that inherits it (``cli.flags``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from paper_explorer.agent.config import THREADS_HELP, ServedAdapter
from paper_explorer.agent.policies.base import Sampling
from paper_explorer.agent.policy_registry import PolicyConfig


class PromptRecording(PolicyConfig):
    """A policy without a model that can still record the prompts a model would have been served."""

    refusals = {setting: "it is deterministic" for setting in ("temperature", "top_p", "top_k")}

    tokenizer: Path | None = Field(
        None, description="A tokenizer directory: record the prompts a model with it would have been served (no model runs)."
    )


class ModelSettings(PolicyConfig):
    """A language model's settings: which model, how many tokens, how it samples."""

    model: str | None = Field(None, description="The model: a directory or hub id (hf), the name the server serves it under (openai).")
    adapter: Path | None = Field(
        None,
        description="A LoRA adapter directory: hf loads it on the model; openai (eval) loads it into the "
        "vLLM server under a name of the run's, samples it, and unloads it at the end.",
    )
    max_new_tokens: int = Field(512, ge=1, description="Tokens per action before it is cut (recorded as hit_cap).")
    max_context: int | None = Field(
        None,
        ge=256,
        description="Prompt plus new tokens allowed, else context_limit (default: the server's max_model_len for "
        "openai, else 32768 or the model's max_position_embeddings if less; above the server's, refused).",
    )
    temperature: float = Field(0.0, ge=0, le=10, allow_inf_nan=False, description="Sampling temperature (0: greedy).")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="Nucleus sampling (1: off).")
    top_k: int = Field(0, ge=0, description="Sample among the k likeliest tokens (0: off).")

    @property
    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy


class ThinkingSettings(PolicyConfig):
    """Qwen3's thinking mode, for a model that writes actions."""

    thinking: bool = Field(
        False, description="Qwen3 thinking mode (the model writes a think block before its action; the blocks are kept)."
    )
    thinking_budget: int = Field(1024, ge=1, description="Tokens a think block may take (hitting it is recorded).")


class LocalModelSettings(ModelSettings):
    """A model loaded in this process (transformers)."""

    quantization: Literal["auto", "4bit", "none"] = Field(
        "auto", description="auto (4bit on CUDA, none on CPU), 4bit (NF4, double quantization) or none."
    )
    threads: int | None = Field(None, ge=1, le=1024, description=THREADS_HELP)


class ServerSettings(ModelSettings):
    """A model an OpenAI-compatible server serves (vLLM)."""

    base_url: list[str] | None = Field(
        None,
        description="The server, e.g. http://localhost:8000/v1; several are replicas of one model (each request goes to the least busy).",
    )
    served_adapter: ServedAdapter | None = Field(
        None, description="The adapter as eval loaded it into the server (eval sets it from adapter; a resume checks it)."
    )
    tokenizer: Path | None = Field(None, description="Directory with the served model's tokenizer.json.")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions (our renderer's prompt) or chat (messages to /v1/chat/completions: a teacher)."
    )
    prompt_format: Literal["ids", "text"] = Field(
        "ids", description="For the completions API: ids (token ids, vLLM) or text (servers that take only text)."
    )
    timeout: float = Field(120.0, ge=1, allow_inf_nan=False, description="Seconds per request.")
    retries: int = Field(4, ge=0, description="Retries with backoff on 429/5xx and network errors.")

    @field_validator("base_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        """One URL (as TOML files, older manifests and `improve` give it) is a list of one."""
        if isinstance(value, str):
            return [value]
        return value or None


def server_urls(config: PolicyConfig) -> list[str]:
    """The servers a policy's requests go to (none: it has no server)."""
    return list(config.base_url or ()) if isinstance(config, ServerSettings) else []


def model_of(config: PolicyConfig) -> str | None:
    """The model a policy runs, as given (none: a policy without a model)."""
    return config.model if isinstance(config, ModelSettings) else None


def adapter_of(config: PolicyConfig) -> Path | None:
    """The adapter a policy's model runs with, as given (none: none, or no model)."""
    return config.adapter if isinstance(config, ModelSettings) else None


def served_adapter_of(config: PolicyConfig) -> ServedAdapter | None:
    """The adapter as eval loaded it into the policy's server (none: none, or no server)."""
    return config.served_adapter if isinstance(config, ServerSettings) else None
