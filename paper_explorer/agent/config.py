"""One frozen config per entry point: what ``explorer run`` and ``explorer eval`` do.

A config is read from a TOML file (``--config``), then the command line's flags override single
fields (``{"policy.model": "m", "episode.max_steps": 6}``), then pydantic validates the whole.
The run manifest stores it verbatim, and ``eval --resume`` rebuilds it from there.

```toml
split = "validation"
concurrency = 128     # episodes in flight against the server(s)

[policy]
name = "openai"
base_url = "http://localhost:8000/v1"
model = "policy"
tokenizer = "/models/Qwen3-8B"

[episode]            # agent.trajectory.EpisodeConfig: steps, budgets and sandbox limits
max_steps = 12
wall_seconds = 20
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus.splits import named_split, parse_shard

PolicyName = Literal["scripted", "direct-submit", "single-shot-rag", "read-all", "replay", "hf", "openai", "memory-reader"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)
Split = Literal["train", "validation", "test", "all"]
SPLITS: tuple[str, ...] = get_args(Split)


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class ServedAdapter(Config):
    """An adapter as a server serves it (agent.policies.adapters): eval and improve set it, from --adapter."""

    name: str  # the name requests ask for: <run id>[-r<round>]-<sha12>
    path: str  # the absolute directory the server loaded it from
    sha256: str  # one hash over the adapter's files (agent.policies.adapters.adapter_sha256)


# One setting for the torch threads of every model this project runs on a CPU (hf policies, their
# probes, training): measured on a loaded 2-core machine, 1 thread decoded 10x faster than 2.
THREADS_HELP = (
    "torch CPU threads for the model (default: half the CPUs this process may use, at least 1; "
    "on a shared or loaded machine more threads decode slower, not faster). Recorded."
)


class PolicyConfig(Config):
    """Which policy acts, and its backend's settings (each one matters only to the policies its
    description names first: ``hf:``, ``openai:``)."""

    name: str = Field("scripted", description=f"Which policy acts: {', '.join(POLICY_NAMES)}.")
    replay: Path | None = Field(None, description="replay: the trajectories (.jsonl) whose actions are re-run.")
    model: str | None = Field(None, description="hf: model directory or hub id; openai: the served model's name.")
    adapter: Path | None = Field(
        None,
        description="hf: a LoRA adapter directory to load on the model; openai (eval): loaded "
        "into the vLLM server at runtime under a name of the run's, sampled, unloaded at the end.",
    )
    served_adapter: ServedAdapter | None = Field(
        None, description="openai: the adapter as eval loaded it into the server (eval sets it from adapter; a resume checks it)."
    )
    quantization: Literal["auto", "4bit", "none"] = Field(
        "auto", description="hf: auto (4bit on CUDA, none on CPU), 4bit (NF4, double quantization) or none."
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="hf: " + THREADS_HELP,
    )
    max_new_tokens: int = Field(512, ge=1, description="hf/openai: tokens per action before it is cut (recorded as hit_cap).")
    max_context: int | None = Field(
        None,
        ge=256,
        description="hf/openai: prompt plus new tokens allowed, else context_limit "
        "(default: the server's max_model_len for openai, else 32768 or the model's max_position_embeddings if less; above "
        "the server's, refused).",
    )
    base_url: list[str] | None = Field(
        None,
        description="openai: the server, e.g. http://localhost:8000/v1; several are replicas "
        "of one model (each request goes to the least busy).",
    )
    tokenizer: Path | None = Field(
        None, description="openai: directory with the served model's tokenizer.json; other policies: record the prompts it would serve."
    )
    api: Literal["completions", "chat"] = Field(
        "completions", description="openai: completions (our renderer's prompt) or chat (messages to /v1/chat/completions: a teacher)."
    )
    prompt_format: Literal["ids", "text"] = Field(
        "ids", description="openai completions: ids (token ids, vLLM) or text (servers that take only text)."
    )
    timeout: float = Field(120.0, ge=1, allow_inf_nan=False, description="openai: seconds per request.")
    retries: int = Field(4, ge=0, description="openai: retries with backoff on 429/5xx and network errors.")
    temperature: float = Field(0.0, ge=0, le=10, allow_inf_nan=False, description="hf/openai: sampling temperature (0: greedy).")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="hf/openai: nucleus sampling (1: off).")
    top_k: int = Field(0, ge=0, description="hf/openai: sample among the k likeliest tokens (0: off).")
    thinking: bool = Field(
        False, description="hf/openai: Qwen3 thinking mode (the model writes a think block before its action; the blocks are kept)."
    )
    thinking_budget: int = Field(1024, ge=1, description="hf/openai: tokens a think block may take (hitting it is recorded).")
    # The memory reader (agent.memory_reader): the recipe. The defaults are MemAgent's published one.
    backend: Literal["hf", "openai"] | None = Field(
        None, description="memory-reader: the model that reads, hf (--model, --adapter) or openai (--base-url, --model, --tokenizer)."
    )
    scope: str = Field(
        "search:3",
        description="memory-reader: what it reads: search:K (the top K papers a BM25 search for the "
        "question finds) or paper (the question's own paper: an oracle, reported as such).",
    )
    page_tokens: int = Field(5000, ge=16, le=1_000_000, description="memory-reader: tokens of document text per page.")
    memory_tokens: int = Field(1024, ge=1, le=1_000_000, description="memory-reader: tokens a memory update may write (the memory's cap).")
    answer_tokens: int = Field(
        256, ge=1, le=1_000_000, description="memory-reader: tokens the final answer may take (cut: no answer, scored 0)."
    )
    passes: int = Field(
        1, ge=1, le=2, description="memory-reader: 1 reads once (ReadAll); 2 reads again from the first memory (ReadTwice)."
    )
    outlines: bool = Field(True, description="memory-reader: each page opens with the headings of the sections it holds.")
    outline_sections: int = Field(24, ge=1, description="memory-reader: sections a page may hold (with outlines).")
    keep_sentinel: str = Field(
        "<KEEP_MEMORY>", max_length=100, description="memory-reader: what an update writes to keep its memory as it is (empty: none)."
    )
    token_budget: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="memory-reader: model tokens (prompts and outputs, every call) an episode may spend; pages past it are left unread, counted.",
    )
    preset: Literal["memagent-readall", "memagent-readtwice"] | None = Field(
        None, description="memory-reader: MemAgent's recipe, memagent-readall or memagent-readtwice (a setting given wins)."
    )

    @field_validator("base_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        """One URL (as TOML files, older manifests and `improve` give it) is a list of one."""
        if isinstance(value, str):
            return [value]
        return value or None

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
        return name

    @field_validator("scope")
    @classmethod
    def _scope(cls, scope: str) -> str:
        parse_scope(scope)
        return scope

    @field_validator("keep_sentinel")
    @classmethod
    def _sentinel(cls, sentinel: str) -> str:
        if sentinel != sentinel.strip() or "\n" in sentinel:
            raise ValueError(f"{sentinel!r}: write the keep sentinel without spaces around it and on one line (empty: none)")
        return sentinel

    @property
    def serving(self) -> str:
        """The policy whose model serves this one: the memory reader's backend, else the policy itself."""
        return self.backend if self.name == "memory-reader" and self.backend is not None else self.name


# The memory reader's recipe: a field another policy refuses when it is given.
READER_FIELDS = (
    "backend",
    "scope",
    "page_tokens",
    "memory_tokens",
    "answer_tokens",
    "passes",
    "outlines",
    "outline_sections",
    "keep_sentinel",
    "token_budget",
    "preset",
)
MAX_SCOPE_PAPERS = 50  # search() returns at most 50 hits


def parse_scope(scope: str) -> int | None:
    """``search:K`` -> K; ``paper`` -> None; anything else is a ValueError saying what is allowed."""
    if scope == "paper":
        return None
    kind, _, count = scope.partition(":")
    if kind == "search" and count.isascii() and count.isdigit() and not count.startswith("0") and int(count) <= MAX_SCOPE_PAPERS:
        return int(count)  # written one way only (no "03", no other scripts' digits), as the manifest records it
    raise ValueError(f"scope {scope!r}: write search:K (K from 1 to {MAX_SCOPE_PAPERS}) or paper")


class RunConfig(Config):
    """``explorer run``: one episode."""

    policy: PolicyConfig = PolicyConfig()
    episode: EpisodeConfig = EpisodeConfig()

    @model_validator(mode="before")
    @classmethod
    def _memory_reader_defaults(cls, data: Any) -> Any:
        """The memory reader's preset, then its episode defaults, under what was given (recorded as
        the values they set, so a manifest or a resume needs neither again)."""
        from paper_explorer.agent.memory_reader.settings import with_reader_defaults

        return with_reader_defaults(data)


class EvalConfig(RunConfig):
    """``explorer eval``: every question of a split."""

    split: str | None = Field(
        None,
        description=f"Questions of which split: {', '.join(SPLITS)} (default test; the corpus's "
        "only split when it has one; all when no paper says its split).",
    )
    split_of: dict[str, str] = Field(default_factory=dict, description="Corpus file -> split, for files whose names do not say.")
    limit: int | None = Field(None, ge=1, description="Only the first N questions of the split.")
    shard: str | None = Field(
        None,
        description="I/N: only the questions whose id hashes to shard I of N, after limit (one "
        "machine each; explorer merge joins the runs).",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes that run episodes, each with concurrency episodes in flight (past one process's interpreter lock).",
    )
    concurrency: int = Field(
        1,
        ge=1,
        le=1024,
        description="Episodes in flight in each process, each waiting on the server (for policy openai, e.g. 256 against vLLM).",
    )
    samples: int = Field(1, ge=1, le=1000, description="Episodes per question, each with its own seed (pass@k, majority vote).")
    max_consecutive_errors: int = Field(5, ge=1, description="Stop the run after this many episodes in a row end in policy_error.")
    preregistration: Path | None = Field(None, description="TOML with frozen hashes and a pass rule (explorer preregister writes one).")

    @field_validator("split")
    @classmethod
    def _known(cls, split: str | None) -> str | None:
        return None if split is None else named_split(split, SPLITS)  # dev is validation, as QASPER names it

    @field_validator("shard")
    @classmethod
    def _shard(cls, shard: str | None) -> str | None:
        if shard is None:
            return None
        index, count = parse_shard(shard)
        return f"{index}/{count}"


ConfigType = TypeVar("ConfigType", bound=BaseModel)  # these configs, and sft.config.TrainConfig


def read_toml(path: Path) -> dict[str, Any]:
    """A config file the user named (``corpus.files``: a regular file, bounded, UTF-8, its values
    bounded); anything wrong is one AgentError line naming the file."""
    try:
        return files.parse_toml(files.read_text(path, limit=files.DOCUMENT_BYTES, what="config .toml"), path)
    except FileNotFoundError:
        raise AgentError(f"{path}: no such config file") from None
    except files.FileRefused as error:
        raise AgentError(str(error)) from None


def build_config(kind: type[ConfigType], base: dict[str, Any], overrides: dict[str, Any], source: str) -> ConfigType:
    """``base`` (from a file or a manifest) with each non-None ``overrides[dotted.key]`` set, validated."""
    data = {key: dict(value) if isinstance(value, dict) else value for key, value in base.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        *sections, field = dotted.split(".")
        target = data
        for section in sections:
            target = target.setdefault(section, {})
            if not isinstance(target, dict):
                raise AgentError(f"{source}: '{section}' must be a table of settings")
        target[field] = value
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        message = first["msg"].removeprefix("Value error, ")
        raise AgentError(f"{source}: field '{where}': {message}") from None


def load_config(kind: type[ConfigType], path: Path | None, overrides: dict[str, Any]) -> ConfigType:
    """The config of ``kind`` from TOML file ``path`` (or the defaults), the flags winning."""
    base = read_toml(path) if path is not None else {}
    return build_config(kind, base, overrides, str(path) if path else "command line")


def dotted(data: dict[str, Any], whole: tuple[str, ...] = (), prefix: str = "") -> dict[str, Any]:
    """Nested config tables as dotted keys (``policy.model``), as the flags name them; the tables
    named in ``whole`` stay one value."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in whole:
            flat.update(dotted(value, whole, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
