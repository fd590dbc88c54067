"""Command-line flags made from the config models' fields: each setting is declared once, as a field.

A field of a config model (``agent.config.EvalConfig`` and the ``EpisodeConfig`` in it,
``tools.limits.SandboxSettings``, ``sft.config``'s ``TrainConfig``, ``BuildConfig`` and
``ImproveSettings``, ``sft.teach.TeachConfig``, ``evaluation.preregister.PreregisterConfig``, and
every registered policy's config: ``agent.policy_registry``) declares its
type, default, bounds and description. ``config_flags(Model)`` adds one typer option per field to
a command's signature (typer reads ``__signature__`` and the annotations), and hands the command
the values given as one dict of dotted overrides (``{"episode.wall_seconds": 2.0}``) for
``agent.config.load_config``. From the field, and from nowhere else, a flag takes:

- its name: ``--field-name`` (a bool: ``--field-name/--no-field-name``), unless ``FLAG_NAMES``
  gives another or a short option;
- its help: the field's description, then its default and its bounds (``[default: 10; x>0]``);
- its check: a given value goes through the field's own type and constraints, so the flag refuses
  exactly what the model refuses, as one line (exit 2) before anything runs;
- its help panel: ``FIELD_PANELS``, else the panel of the model that declares the field
  (``MODEL_PANELS``, or a policy config's own ``panel``), else the one the command names.

The ``[policy]`` table is one of several models (a union on ``name``): its flags are the union of
their fields, one flag per setting, whose help says which policies take it (``policy_flags``); a
setting given for a policy that lacks it is refused when the config is built (agent.policy_registry).

Every flag of a field with a default defaults to None and a flag not given overrides nothing, so the
values of a ``--config`` file, or on ``eval --resume`` those of the run's manifest, stay; a field
without a default is a required option. A new field gets its flag with no
other edit; a field that must not have one is named in ``NOT_FLAGS`` with the reason, and a field
of a type no flag can carry (a table) fails at import until it is.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import shlex
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard, Union, get_args, get_origin, get_type_hints

import annotated_types
import typer
from pydantic import AfterValidator, BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.markup import escape

from paper_explorer.agent.policy_registry import (
    DEFAULT_POLICY,
    PolicyConfig,
    known_policy,
    policy_names,
    registered,
    said_list,
    setting_fields,
)
from paper_explorer.cli.help_layout import FIELD_PANELS, MODEL_PANELS, PANEL_ORDER, panel_rank
from paper_explorer.corpus.setting_names import UNSET

# Flags whose name is not the field's, or that have a short option too (dotted field -> names).
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "policy.name": ("--policy", "-p"),
    "policy.model": ("--model", "-m"),
    "workers": ("--workers", "-w"),
    "model": ("--model", "-m"),  # explorer train's base model
    "episode.probes": ("--probe",),  # repeated: one probe a flag
    "keep_correct_abstentions": ("--keep-abstentions/--drop-abstentions",),  # sft build's: off is the flag one gives
}

# Fields without a flag, and why (dotted field -> reason).
NOT_FLAGS: dict[str, str] = {
    "policy.served_adapter": "eval sets it from --adapter when it loads the adapter into the server; a resume checks it",
    "split_of": "a table: the commands take it as --split-of FILE=SPLIT, repeated",
    "corpus": "explorer improve records the --corpus option it shares with every command (-c, $EXPLORER_CORPUS)",
    "reward": "a table of parts and weights: explorer rl takes it as --reward PART=WEIGHT, repeated, or [reward] in --config",
    "gradient_checkpointing": "a memory trade of the recipe, set in the --config file: a --no-gradient-checkpointing "
    "switch beside it would not fit the help at 80 columns",
}

SCALARS = (bool, int, float, str, Path)


@dataclass(frozen=True)
class Flag:
    """One field of a config model as one command-line option."""

    dotted: str  # the field, as overrides and config errors name it: "episode.wall_seconds"
    field: FieldInfo
    kind: Any  # what the flag parses: one of SCALARS, or list[str] for a repeated option
    panel: str

    @property
    def identifier(self) -> str:
        """The command's parameter: unlike any name a command gives its own (``policy__model``)."""
        return "flag__" + self.dotted.replace(".", "__")

    @property
    def names(self) -> tuple[str, ...]:
        names = flag_names(self.dotted)
        if self.kind is bool and "/" not in names[0]:
            return (f"{names[0]}/--no-{names[0].removeprefix('--')}", *names[1:])
        return names

    @property
    def bounds(self) -> dict[str, Any]:
        """The field's bounds: {"ge": 1, "le": 64}, as pydantic checks them."""
        found: dict[str, Any] = {}
        for item in self.field.metadata:
            if isinstance(item, annotated_types.Gt):
                found["gt"] = item.gt
            elif isinstance(item, annotated_types.Ge):
                found["ge"] = item.ge
            elif isinstance(item, annotated_types.Lt):
                found["lt"] = item.lt
            elif isinstance(item, annotated_types.Le):
                found["le"] = item.le
        return found

    @property
    def default(self) -> Any:
        default = self.field.get_default(call_default_factory=True, validated_data={})
        return None if default is PydanticUndefined else default

    @property
    def help(self) -> str:
        """The field's description, then its default and its bounds, as typer shows its own."""
        facts = [f"default: {shown(self.default)}"] if self.default not in (None, []) else []
        if self.bounds:
            facts.append(bounds_text(self.bounds))
        if self.kind == list[str]:
            facts.append("repeatable")
        text = self.field.description or ""
        return escape(f"{text} [{'; '.join(facts)}]" if facts else text)  # typer reads help as rich markup

    @property
    def metavar(self) -> str | None:
        """Typer's own (``<int>``), but none for a switch and ``<str>`` for a repeated option: a
        narrower type column leaves the names room at 80 columns (``--no-record-prompt-ids``)."""
        if self.kind is bool:
            return ""
        return "<str>" if self.kind == list[str] else None

    def parameter(self) -> inspect.Parameter:
        # a field without a default is a required option; any other flag given overrides, not given keeps
        option = typer.Option(
            ... if self.field.is_required() else None,
            *self.names,
            help=self.help,
            rich_help_panel=self.panel,
            callback=self.check,
            show_default=False,
            metavar=self.metavar,
        )
        return inspect.Parameter(self.identifier, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=self.kind | None)

    @functools.cached_property
    def _adapter(self) -> TypeAdapter:
        metadata = tuple(self.field.metadata)
        annotation: Any = self.field.annotation
        return TypeAdapter(Annotated[(annotation, *metadata)] if metadata else annotation)

    def check(self, value: Any) -> Any:
        """The value given, if the field takes it; else typer's BadParameter, one line."""
        if value is None or value == []:
            return None  # not given: overrides nothing
        try:
            self._adapter.validate_python(value)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            if first["type"] == "literal_error":  # a choice: name the flag, as a mistyped word is named
                choices = first.get("ctx", {}).get("expected", "")
                raise typer.BadParameter(f"unknown {self.names[0].split('/')[0]} {value!r}; choose {choices}") from None
            if first["type"] == "value_error":  # a check of our own says what was wrong in a whole line
                raise typer.BadParameter(refusal(error)) from None
            raise typer.BadParameter(f"{self.dotted} {refusal(error)}, got {shown(value)}") from None
        return value


def flag_names(dotted: str) -> tuple[str, ...]:
    """The option names of a setting: ``FLAG_NAMES``'s, else ``--field-name`` of its last part."""
    return FLAG_NAMES.get(dotted) or ("--" + dotted.rpartition(".")[2].replace("_", "-"),)


def flag_spelling(name: str, value: Any = UNSET) -> str:
    """A setting as the CLI names it in an error (``corpus.setting_names``): the flag made from the
    field, or the command's own option of that name (``resume`` -> ``--resume``, ``policy.name`` ->
    ``--policy``), with its value as typed (``--policy replay``; True: the switch alone; a list: the option repeated)."""
    flag = flag_names(name)[0]
    if value is UNSET or value is True:
        return flag
    if value is False:
        return f"--no-{flag.removeprefix('--')}"
    if isinstance(value, (list, tuple)):  # a repeated option
        return " ".join(f"{flag} {shlex.quote(shown(item))}" for item in value)
    return f"{flag} {shlex.quote(shown(value))}"


def shown(value: Any) -> str:
    """A value as help and errors show it: 10 for 10.0, off for False, a list comma-separated."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))  # 10.0 is shown as 10
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def bounds_text(bounds: dict[str, Any]) -> str:
    """``x>=1``, ``x>0``, ``0<x<=1``, ``1<=x<=64``: typer's own notation for a range."""
    low = ("<", bounds["gt"]) if "gt" in bounds else ("<=", bounds["ge"]) if "ge" in bounds else None
    high = ("<", bounds["lt"]) if "lt" in bounds else ("<=", bounds["le"]) if "le" in bounds else None
    if low and high:
        return f"{shown(low[1])}{low[0]}x{high[0]}{shown(high[1])}"
    if low:
        return f"x{'>' if low[0] == '<' else '>='}{shown(low[1])}"
    assert high is not None
    return f"x{high[0]}{shown(high[1])}"


def refusal(error: ValidationError) -> str:
    """Why the field refused a value, phrased for a person: "must be at least 1"."""
    first = error.errors(include_url=False)[0]
    context = first.get("ctx", {})
    phrases = {
        "greater_than": lambda: "must be a positive number" if context["gt"] == 0 else f"must be more than {shown(context['gt'])}",
        "greater_than_equal": lambda: f"must be at least {shown(context['ge'])}",
        "less_than": lambda: f"must be less than {shown(context['lt'])}",
        "less_than_equal": lambda: f"must be at most {shown(context['le'])}",
        "finite_number": lambda: "must be a finite number",
    }
    if first["type"] in phrases:
        return phrases[first["type"]]()
    message = first["msg"].removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def flag_kind(annotation: Any, dotted: str) -> Any:
    """What a flag parses for a field of this type: a scalar (a Literal's choices as str, checked
    by the field), or list[str] for a list of strings (a repeated option)."""
    origin = get_origin(annotation)
    if origin is Annotated:  # a type with its own validator (the field checks the value)
        return flag_kind(get_args(annotation)[0], dotted)
    if origin in (Union, types.UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return flag_kind(members[0], dotted)
    elif origin is Literal:
        values = get_args(annotation)
        if all(isinstance(value, str) for value in values):
            return str
    elif origin is list and get_args(annotation) == (str,):
        return list[str]
    elif annotation in SCALARS:
        return annotation
    raise TypeError(f"config field {dotted} ({annotation}) cannot be a command-line flag; name it in cli.flags.NOT_FLAGS with the reason")


def is_section(annotation: Any) -> TypeGuard[type[BaseModel]]:
    """A nested config model (``policy``, ``episode``): its fields become flags of their own."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def declaring_model(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The class of ``model``'s bases that declares field ``name`` (EpisodeConfig's limits: SandboxSettings)."""
    return next(cls for cls in model.__mro__ if name in getattr(cls, "__annotations__", {}))


def model_flags(model: type[BaseModel], panel: str = "Options", prefix: str = "") -> list[Flag]:
    """One flag per field of ``model``, its sections' fields included, in panel order."""
    flags = []
    for name, field in model.model_fields.items():
        dotted = prefix + name
        if dotted in NOT_FLAGS:
            continue
        if field.annotation is PolicyConfig:
            chosen = field.get_default(call_default_factory=True)  # the command's own policy (explorer rl: hf)
            flags += policy_flags(f"{dotted}.", chosen.name if isinstance(chosen, PolicyConfig) else DEFAULT_POLICY)
            continue
        if is_section(field.annotation):
            flags += model_flags(field.annotation, panel, f"{dotted}.")
            continue
        if not field.description:
            raise TypeError(f"config field {dotted} has no description: it is its flag's help")
        owner = declaring_model(model, name)
        flags.append(Flag(dotted, field, flag_kind(field.annotation, dotted), FIELD_PANELS.get(dotted) or MODEL_PANELS.get(owner, panel)))
    if prefix:
        return flags
    order = {name: position for position, name in enumerate(PANEL_ORDER)}
    return sorted(flags, key=lambda flag: order.get(flag.panel, len(order)))  # stable: field order within a panel


def policy_flags(prefix: str, default: str = DEFAULT_POLICY) -> list[Flag]:
    """One flag per setting of any registered policy: its type and bounds are the same in every
    policy that has it (the registry checks), its help says which policies take it and what each
    does with it, and its panel is the panel of the config that declares it."""
    flags = []
    for setting, owners in setting_fields().items():
        dotted = prefix + setting
        if dotted in NOT_FLAGS:
            continue
        if setting == "name":
            field = FieldInfo(annotation=str, description=f"Which policy acts: {', '.join(policy_names())}.", default=default)
            field.metadata = [AfterValidator(known_policy)]
            flags.append(Flag(dotted, field, str, "Policy"))
            continue
        first = next(iter(owners.values()))
        field = copy.copy(first)
        field.description = settings_help(owners)
        declared_by = declaring_model(next(entry.config for name, entry in registered().items() if name in owners), setting)
        own_panel = declared_by.panel if issubclass(declared_by, PolicyConfig) else "Policy"  # declared by a plain BaseModel mixin
        panel = FIELD_PANELS.get(dotted) or own_panel
        flags.append(Flag(dotted, field, flag_kind(field.annotation, dotted), panel))
    return flags


def settings_help(owners: dict[str, FieldInfo]) -> str:
    """One setting's help across the policies that take it: "hf, openai: Tokens per action." (each
    wording once, with the policies it is for)."""
    wordings: dict[str, list[str]] = {}
    for policy, field in owners.items():
        wordings.setdefault(field.description or "", []).append(policy)
    return "; ".join(f"{said_list(policies)}: {wording.rstrip('.')}" for wording, policies in wordings.items()) + "."


def config_flags(model: type[BaseModel], *, panel: str = "Options", into: str = "overrides") -> Callable:
    """A decorator: the command gets a flag for each field of ``model`` after its own options, and
    its parameter ``into`` receives the dotted overrides they give (None where not given)."""
    flags = model_flags(model, panel)

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        if into not in signature.parameters:
            raise TypeError(f"{command.__name__} takes no parameter {into!r} for the overrides of its flags")
        hints = get_type_hints(command)  # its own annotations are strings (from __future__ import annotations)
        own = [
            parameter.replace(annotation=hints.get(name, parameter.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
            for name, parameter in signature.parameters.items()
            if name != into
        ]
        # typer shows the panels in the order their first option comes: the command's own options
        # join the panels by theirs (rich_help_panel), stable within each
        parameters = sorted(own + [flag.parameter() for flag in flags], key=panel_rank)

        @functools.wraps(command)
        def with_flags(**given: Any) -> Any:
            overrides = {flag.dotted: given.pop(flag.identifier) for flag in flags}
            return command(**given, **{into: overrides})

        with_flags.__doc__ = reflowed(command.__doc__)

        with_flags.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        with_flags.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        with_flags.flags = flags  # type: ignore[attr-defined]
        return with_flags

    return decorate


def reflowed(doc: str | None) -> str | None:
    """A docstring with each paragraph on one line: typer's rich help keeps the line breaks of
    every paragraph but the first, which at 80 columns leaves lines cut short mid-sentence."""
    if doc is None:
        return None
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs)
