"""What a policy records about itself: every trajectory's ``policy.settings``.

``Policy.settings()`` returns a typed record: the policy's config, when the config is all there
is to record (docs/extending.md), else a ``PolicySettings`` of what the policy was made with and
what it found (a model's dtype and device, a server's context length). The trajectory keeps it
as one JSON object (``recorded``) with the keys trajectories have always had, so that older ones
load and every reader of ``policy.settings`` reads the same keys.

A record made of others (a model's decoding, its chat template; the memory reader's backend)
declares them ``Inline``: their keys are written in the field's place, beside the record's own,
as the settings were written when they were dicts merged with ``**``. A key written twice is a
TypeError, never a silent overwrite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from paper_explorer.agent.policy_registry import PolicyConfig

if TYPE_CHECKING:  # tokenizers is loaded only by the policies that serve prompts
    from paper_explorer.agent.renderer import ChatRenderer


class _Inline:
    """``Annotated`` metadata: the field's record is written as its keys, in the field's place."""


T = TypeVar("T")
Inline: TypeAlias = Annotated[T, _Inline()]


def _unset(value: Any) -> bool:
    return value is None


def omitted_when_none(**options: Any) -> Any:
    """A field left out of the record when None: a key older trajectories have only in some runs."""
    return Field(None, exclude_if=_unset, **options)


class PolicySettings(BaseModel):
    """A policy's record of its settings: subclass it with one field per key."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    @model_serializer(mode="wrap")
    def _with_inlined_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        inlined = {name for name, field in type(self).model_fields.items() if any(isinstance(m, _Inline) for m in field.metadata)}
        written: dict[str, Any] = {}
        for key, value in handler(self).items():
            if key in inlined and isinstance(getattr(self, key), PolicyConfig):
                value = {name: item for name, item in value.items() if name != "name"}  # a config's name is the policy's
            for name, item in value.items() if key in inlined else [(key, value)]:
                if name in written:
                    raise TypeError(f"{type(self).__name__} records {name!r} twice")
                written[name] = item
        return written


SettingsRecord: TypeAlias = PolicySettings | PolicyConfig


def recorded(settings: SettingsRecord) -> dict[str, Any]:
    """The JSON object a trajectory records for ``settings``: a config without its name (the
    trajectory records the policy's name beside it), a record with its inlined records' keys."""
    if isinstance(settings, PolicyConfig):
        return settings.model_dump(mode="json", exclude={"name"})
    return settings.model_dump(mode="json")


class SamplingRecord(PolicySettings):
    """A model's decoding (``base.Sampling``); top_p and top_k are recorded only when it samples."""

    decoding: Literal["greedy", "sampling"]
    do_sample: bool
    temperature: float
    top_p: float | None = omitted_when_none()
    top_k: int | None = omitted_when_none()


class TemplateRecord(PolicySettings):
    """The prompts a model is served: its tokenizer's and chat template's digests and the template's
    rules, as ``renderer.verify`` found them. Whether the policy thinks is the policy's own key."""

    tokenizer_sha256: str
    chat_template_sha256: str
    end_of_turn: str
    system: str  # "template" or "folded"
    history: str

    @classmethod
    def of(cls, renderer: ChatRenderer) -> TemplateRecord:
        found = {key: value for key, value in renderer.check.record().items() if key != "thinking"}
        return cls(tokenizer_sha256=renderer.fingerprint, **found)


class EndpointRecord(PolicySettings):
    """Where a server policy's requests go: the first replica's URL, and every replica's when there are several."""

    url: str
    replicas: list[str] | None = omitted_when_none()
