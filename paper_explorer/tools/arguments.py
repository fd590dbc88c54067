"""Tool arguments: copied to exact builtin types, then validated by pydantic.

Model-written code can pass a subclass of ``str`` or ``int`` whose ``__eq__``, ``__len__`` or
``__str__`` lie to a check. ``plain`` rebuilds every argument from the builtin types' own
methods (never the value's), so validation sees ordinary data and nothing the action defined
survives into the tools. Anything that is not plain data is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.wire import Marker

MAX_DEPTH = 6
MAX_ITEMS = 1000


def plain(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` built only from exact str/int/float/bool/None/list/dict."""
    if depth > MAX_DEPTH:
        raise ToolError("arguments are nested too deeply; pass plain strings, numbers, lists and dicts")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return "".join((value,)) if type(value) is not str else value  # join copies the characters
    if isinstance(value, int):
        return int.__add__(value, 0) if type(value) is not int else value
    if isinstance(value, float):
        return float.__add__(value, 0.0) if type(value) is not float else value
    if isinstance(value, (list, tuple)):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        copied: list[Any] = []
        for item in items:
            if len(copied) >= MAX_ITEMS:
                raise ToolError(f"a list argument holds more than {MAX_ITEMS} items")
            copied.append(plain(item, depth + 1))
        return copied
    if isinstance(value, dict):
        copied_dict = {}
        for key, item in dict.items(value):
            if not isinstance(key, str):
                raise ToolError("dict keys in arguments must be strings")
            copied_dict[plain(key, depth + 1)] = plain(item, depth + 1)
        return copied_dict
    if isinstance(value, Marker):  # an argument the worker could not send (tools.wire.to_wire)
        raise ToolError(value.message())
    raise ToolError(f"arguments must be plain data (str, int, float, bool, None, list, dict), not {type(value).__name__}")


class Arguments(BaseModel):
    """A tool's arguments (each tool's own subclass, in its module: ``tools.catalog``): exact types,
    no extra fields; the tool page shows each field's description and bounds (``tools.page``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def validate(model: type[Arguments], name: str, args: tuple, kwargs: dict) -> Arguments:
    """Bind positional and keyword arguments to ``model``'s fields, copy them plain, validate."""
    fields = list(model.model_fields)
    if len(args) > len(fields):
        raise ToolError(f"{name}() takes at most {len(fields)} arguments ({', '.join(fields)}), got {len(args)}")
    bound: dict[str, Any] = {}
    for field_name, value in zip(fields, args):
        bound[field_name] = value
    for key, value in dict.items(kwargs):
        if key in bound:
            raise ToolError(f"{name}() got two values for {key!r}")
        bound[key] = value
    bound = {key: plain(value) for key, value in bound.items()}
    try:
        return model.model_validate(bound)
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"]) or "arguments"
        if problem["type"] == "extra_forbidden":
            raise ToolError(f"{name}() has no argument {where!r}; it takes {', '.join(fields)}") from None
        if problem["type"] == "missing":
            raise ToolError(f"{name}() needs the argument {where!r}") from None
        got = repr(problem.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise ToolError(f"{name}(): {where}: {problem['msg'][0].lower()}{problem['msg'][1:]}, got {got}") from None
