"""Tool arguments: copied to exact builtin types, then validated by pydantic.

Model-written code can pass a subclass of ``str`` or ``int`` whose ``__eq__``, ``__len__`` or
``__str__`` lie to a check. ``plain`` rebuilds every argument from the builtin types' own
methods (never the value's), so validation sees ordinary data and nothing the action defined
survives into the tools. Anything that is not plain data is refused.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SearchArgs(Arguments):
    query: Annotated[str, Field(min_length=1, max_length=500, description="words to look for")]
    k: Annotated[int, Field(ge=1, le=50, description="number of hits")] = 5
    paper_id: Annotated[str | None, Field(max_length=200, description="search only this paper")] = None


class ReadArgs(Arguments):
    paper_id: Annotated[str, Field(min_length=1, max_length=200, description="the paper to read")]
    section: Annotated[
        int | str | None,
        Field(description="section number or name; omit it for the paper's outline"),
    ] = None
    page: Annotated[int, Field(ge=0, le=10_000, description="page of a long section")] = 0


class ExtractArgs(Arguments):
    paper_id: Annotated[str, Field(min_length=1, max_length=200, description="the paper to extract from")]
    query: Annotated[str, Field(min_length=1, max_length=500, description="words to match, or a pattern if regex=True")]
    k: Annotated[int, Field(ge=1, le=20, description="number of sentences")] = 5
    regex: Annotated[bool, Field(description="treat query as a case-insensitive RE2 regular expression")] = False


class SubmitArgs(Arguments):
    answer: Annotated[str, Field(min_length=1, max_length=2000, description="the answer, as short as the question allows")]
    evidence: Annotated[
        list[Any],
        Field(
            max_length=20,
            description="paragraphs that support the answer: hits from search/extract, "
            "[paper_id, section, paragraph] triples, or exact quotes",
        ),
    ] = []


class AbstainArgs(Arguments):
    reason: Annotated[str, Field(min_length=1, max_length=1000, description="why the corpus does not answer the question")]


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
