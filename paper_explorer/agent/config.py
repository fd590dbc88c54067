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
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue

import paper_explorer.corpus.files as files
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policy_registry import (
    DEFAULT_POLICY,
    PolicyConfig,
    SettingRefused,
    make_config,
    policy_config,
    policy_entry,
    union_adapter,
)
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus.splits import named_split, parse_shard

SPLITS: tuple[str, ...] = ("train", "validation", "test", "all")
# A split as a user names it: dev (QASPER's name), val and valid are validation; another name says the nearest.
Split = Annotated[str, AfterValidator(lambda name: named_split(name, SPLITS))]


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


class _OneOfThePolicies:
    """The JSON Schema of a ``[policy]`` table: one of the registered policies' configs (``explorer schema``)."""

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(union_adapter().core_schema)


# The ``[policy]`` table: the config of the policy its ``name`` picks (agent.policy_registry),
# written whole, with every setting of that policy and no other.
PolicySettings = Annotated[SerializeAsAny[PolicyConfig], BeforeValidator(policy_config), _OneOfThePolicies()]


class RunConfig(Config):
    """``explorer run``: one episode."""

    policy: PolicySettings = Field(default_factory=make_config, description="The policy that acts and its settings.")
    episode: EpisodeConfig = EpisodeConfig()

    @model_validator(mode="before")
    @classmethod
    def _policy_defaults(cls, data: Any) -> Any:
        """The chosen policy's own defaults for the run (the memory reader's preset and episode
        budgets) under what was given, recorded as the values they set, so a manifest or a resume
        needs neither again."""
        if not isinstance(data, dict):
            return data
        policy, episode = _given(data.get("policy")), _given(data.get("episode"))
        name = policy.get("name", DEFAULT_POLICY)
        defaults = policy_entry(name).config.run_defaults(policy, episode) if isinstance(name, str) else None
        if defaults is None:
            return data  # nothing of its own: the tables stay as they were given
        policy, episode = defaults
        return {**data, "policy": policy, "episode": episode}


class EvalConfig(RunConfig):
    """``explorer eval``: every question of a split."""

    split: Split | None = Field(
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
    ray: str | None = Field(
        None,
        min_length=1,
        pattern=r"^\S+$",
        description="Run the episodes as tasks on this Ray cluster (HOST:PORT, ray://HOST:10001, auto); this process writes the run.",
    )
    samples: int = Field(1, ge=1, le=1000, description="Episodes per question, each with its own seed (pass@k, majority vote).")
    max_consecutive_errors: int = Field(5, ge=1, description="Stop the run after this many episodes in a row end in policy_error.")
    preregistration: Path | None = Field(None, description="TOML with frozen hashes and a pass rule (explorer preregister writes one).")

    @field_validator("shard")
    @classmethod
    def _shard(cls, shard: str | None) -> str | None:
        if shard is None:
            return None
        index, count = parse_shard(shard)
        return f"{index}/{count}"


def _given(value: Any) -> dict[str, Any]:
    """The settings given in a table or a model instance (an instance: only those set explicitly)."""
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in value.model_fields_set}
    return dict(value) if isinstance(value, dict) else {}


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
        refused = first.get("ctx", {}).get("error")
        if isinstance(refused, SettingRefused):  # a whole line of its own: the setting's flag and its policies
            raise AgentError(f"{source}: {refused}") from None
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
