"""The one-page tool documentation shown to the policy, generated from the registered tools
(``tools.registry``).

Signatures, defaults, bounds and descriptions come from the same pydantic argument models that
validate every call, so the page cannot promise what the tools do not do.
"""

from __future__ import annotations

import annotated_types
from pydantic.fields import FieldInfo

from paper_explorer.tools import registry
from paper_explorer.tools.registry import Tool


def _default(field: FieldInfo) -> str:
    return "" if field.is_required() else f"={field.default!r}"


def _bounds(field: FieldInfo) -> str:
    parts = []
    for constraint in field.metadata:
        if isinstance(constraint, annotated_types.Ge):
            parts.append(f">= {constraint.ge}")
        elif isinstance(constraint, annotated_types.Le):
            parts.append(f"<= {constraint.le}")
        elif isinstance(constraint, annotated_types.MaxLen):
            parts.append(
                f"at most {constraint.max_length} {'items' if field.annotation is list or 'list' in str(field.annotation) else 'characters'}"
            )
    return f" ({', '.join(parts)})" if parts else ""


def signature(tool: Tool) -> str:
    fields = tool.arguments.model_fields
    return f"{tool.name}({', '.join(name + _default(field) for name, field in fields.items())})"


def tool_page() -> str:
    """The reference of every tool: signature, contract, arguments with bounds, result, example.
    The instructions around it are the system prompt's (``agent/prompts/prompts.toml``)."""
    blocks = []
    for tool in registry.tools():
        lines = [f"{signature(tool)}", f"    {tool.summary}"]
        for name, field in tool.arguments.model_fields.items():
            lines.append(f"    {name}: {field.description}{_bounds(field)}")
        lines.append(f"    returns {tool.returns}")
        lines.append(f"    e.g. {tool.example}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
