"""The policy registry: a policy is one module that declares its config model and its factory, once.

```python
class EchoConfig(PolicyConfig):
    name: Literal["echo"] = "echo"
    words: int = Field(3, ge=1, description="Words of the question to submit.")

@register_policy(EchoConfig)
def echo(config: EchoConfig, max_steps: int) -> Policy:
    return Echo(words=config.words)
```

The built-in policies are the modules of ``paper_explorer.agent.policies``, found by listing that
package (as inspect_ai registers a solver by decorating it): a new policy is one new module there,
with no Literal, list or if-chain to edit elsewhere. A policy of your own registers when its module
is imported (docs/extending.md).

The configs of the registered policies are a discriminated union on ``name``: a run config's
``[policy]`` table is validated by the model its name picks (``policy_config``). A setting that
model lacks is refused in one line naming it (``corpus.setting_names``: the CLI's flag, the API's
argument) and the policies it is for; one at the default of the policies that have it is dropped
instead, so a manifest written when every policy shared one flat config (every setting recorded)
still loads. The command line's flags are made from the
union of the models' fields (``cli.flags``).

Nothing here imports a policy's implementation: a policy module imports torch or a server client
only inside its factory, so listing the policies (``explorer --help``) stays light.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from paper_explorer.agent.errors import AgentError
from paper_explorer.corpus import setting_names

if TYPE_CHECKING:
    from paper_explorer.agent.policies.base import Policy

POLICIES_PACKAGE = "paper_explorer.agent.policies"
DEFAULT_POLICY = "scripted"


class PolicyConfig(BaseModel):
    """The settings every policy has: its name. A policy's own config subclasses this with
    ``name: Literal["its-name"] = "its-name"`` and a described field per setting (each becomes a flag)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str = Field(DEFAULT_POLICY, description="Which policy acts.")

    # The help panel of this policy's own settings (cli.flags), and settings it refuses with a reason
    # worth more than "it is for other policies" (setting -> why).
    panel: ClassVar[str] = "Policy"
    refusals: ClassVar[dict[str, str]] = {}

    @classmethod
    def run_defaults(cls, policy: dict[str, Any], episode: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The ``[policy]`` and ``[episode]`` settings given for a run, with this policy's own
        defaults under them (a preset, budgets its episodes need); None: it has none."""
        return None

    @property
    def serving(self) -> str:
        """The policy whose model serves this one: the policy itself, unless it reads through another's."""
        return self.name

    @property
    def greedy(self) -> bool:
        """Whether the policy's actions are a function of what it was shown (no sampling)."""
        return True


ConfigT = TypeVar("ConfigT", bound=PolicyConfig)
Factory = Callable[[ConfigT, int], "Policy"]  # (its config, the episode's max_steps) -> the policy


class SettingRefused(AgentError, ValueError):
    """A policy table that names no registered policy or gives a setting its policy does not take:
    the message is one whole line (``agent.config.build_config`` shows it without a field path). A
    ValueError too, so that pydantic reports it where a config is validated."""


@dataclass(frozen=True)
class Registered:
    config: type[PolicyConfig]
    factory: Callable[[Any, int], Policy]
    module: str  # where it was declared: the same module registering again (a reload) replaces it


_registry: dict[str, Registered] = {}
_checked: set[str] = set()  # the names whose settings were checked against every other policy's


def register_policy(config: type[ConfigT]) -> Callable[[Factory[ConfigT]], Factory[ConfigT]]:
    """A decorator: the factory makes the policy that ``config``'s name names, from a validated ``config``."""
    name = declared_name(config)
    _check_fields(config)

    def register(factory: Factory[ConfigT]) -> Factory[ConfigT]:
        known = _registry.get(name)
        if known is not None and known.module != factory.__module__:
            raise TypeError(f"policy {name!r} is registered twice: by {known.module} and by {factory.__module__}")
        _registry[name] = Registered(config, factory, factory.__module__)
        _checked.clear()
        union_adapter.cache_clear()
        return factory

    return register


def declared_name(config: type[PolicyConfig]) -> str:
    """The name a policy config declares: ``name: Literal["x"] = "x"``."""
    field = config.model_fields["name"]
    values = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
    if len(values) != 1 or field.default != values[0]:
        raise TypeError(f'{config.__name__}: declare the policy\'s name as name: Literal["its-name"] = "its-name"')
    return str(values[0])


def _check_fields(config: type[PolicyConfig]) -> None:
    for name, field in config.model_fields.items():
        if name != "name" and not field.description:  # the name's flag (--policy) lists the policies
            raise TypeError(f"{config.__name__}.{name} has no description: it is the help of its flag")


def _check_compatible(configs: list[type[PolicyConfig]]) -> None:
    """Two policies may share a setting (one flag serves both) only with the same type and bounds."""
    seen: dict[str, type[PolicyConfig]] = {}
    for config in configs:
        for name, ours in config.model_fields.items():
            other = seen.setdefault(name, config)
            theirs = other.model_fields[name]
            if name != "name" and (ours.annotation, ours.metadata) != (theirs.annotation, theirs.metadata):
                raise TypeError(
                    f"{config.__name__}.{name} and {other.__name__}.{name} share one flag ({flag_of(name)}) "
                    "but differ in type or bounds: give one of them another name"
                )


@functools.cache
def _load_builtin_policies() -> None:
    """Import every module of the policies package: each built-in policy registers itself there."""
    package = importlib.import_module(POLICIES_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{POLICIES_PACKAGE}.{module.name}")


def registered() -> dict[str, Registered]:
    """Every policy by name, in name order: the built-in ones and any whose module was imported."""
    _load_builtin_policies()
    if _checked != set(_registry):
        _check_compatible([entry.config for entry in _registry.values()])
        _checked.update(_registry)
    return dict(sorted(_registry.items()))


def policy_names() -> list[str]:
    return list(registered())


def known_policy(name: str) -> str:
    """``name`` if a policy has it; else SettingRefused saying which are (and the nearest, if one is near)."""
    names = policy_names()
    if name in names:
        return name
    near = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise SettingRefused(
        f"unknown policy {name!r}{hint}; choose one of {', '.join(names)} (a policy of your own registers when its module "
        "is imported: for explorer, name the module in EXPLORER_PLUGINS)"
    )


def policy_entry(name: str) -> Registered:
    return registered()[known_policy(name)]


def setting_fields() -> dict[str, dict[str, FieldInfo]]:
    """Every setting of every policy (the union of their fields): setting -> {policy: its field}."""
    fields: dict[str, dict[str, FieldInfo]] = {}
    for policy, entry in registered().items():
        for setting, field in entry.config.model_fields.items():
            fields.setdefault(setting, {})[policy] = field
    return fields


def flag_of(setting: str) -> str:
    return f"--{setting.replace('_', '-')}"


def said_list(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _refusal(name: str, config: type[PolicyConfig], policy: str) -> str:
    """Why ``name`` is refused for ``policy``, naming settings as the caller does (the CLI: flags)."""
    owners = setting_fields().get(name)
    if owners is None:
        near = difflib.get_close_matches(name, list(setting_fields()), n=1)
        hint = f" (did you mean {setting_names.setting(f'policy.{near[0]}')}?)" if near else ""
        return f"{setting_names.setting(f'policy.{name}')} is no setting of any policy{hint}"
    reason = config.refusals.get(name)
    owned_by = f"{setting_names.setting('policy.name')} {said_list(sorted(owners))}"
    return f"{setting_names.setting(f'policy.{name}')} is for {owned_by}, not {policy!r}" + (f": {reason}" if reason else "")


def at_default(setting: str, value: Any) -> bool:
    """Whether ``value`` is the default of ``setting`` in every policy that has it (so not given)."""
    owners = setting_fields().get(setting, {})
    return bool(owners) and all(field.default == value for field in owners.values())


def policy_config(data: Any) -> PolicyConfig:
    """The config of the policy ``data`` (a ``[policy]`` table, or a config already made) names.

    A setting the policy lacks is dropped where it is at the other policies' default (an older
    manifest records every setting of every policy) and refused otherwise, naming it."""
    if isinstance(data, PolicyConfig):
        entry = policy_entry(data.name)
        if not isinstance(data, entry.config):
            raise SettingRefused(f"policy {data.name!r} is configured by {entry.config.__name__}, not {type(data).__name__}")
        return data
    if not isinstance(data, Mapping):
        raise SettingRefused(f"the policy's settings must be a table (name = ..., ...), not {type(data).__name__}")
    name = data.get("name", DEFAULT_POLICY)
    if not isinstance(name, str):
        raise SettingRefused(f"the policy's name must be a string, not {name!r}")
    entry = policy_entry(name)
    fields = entry.config.model_fields
    for setting, value in data.items():
        if setting not in fields and not at_default(setting, value):
            raise SettingRefused(_refusal(str(setting), entry.config, name))
    return entry.config.model_validate({setting: value for setting, value in data.items() if setting in fields})


def make_config(name: str = DEFAULT_POLICY, **settings: Any) -> PolicyConfig:
    """A policy's config from keywords, as a researcher writes one: ``make_config("hf", model="m")``;
    a setting it refuses is an AgentError naming it."""
    try:
        return policy_config({"name": name, **settings})
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise AgentError(f"{name} policy setting {where!r}: {first['msg'].removeprefix('Value error, ')}") from None


@functools.cache
def union_adapter() -> TypeAdapter:
    """The discriminated union of the registered configs (for JSON Schema: ``explorer schema``)."""
    configs = tuple(entry.config for entry in registered().values())
    member: Any = configs[0] if len(configs) == 1 else Union[configs]  # noqa: UP007 (a union made at run time)
    return TypeAdapter(Annotated[member, Field(discriminator="name")])
