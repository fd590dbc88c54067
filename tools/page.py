"""The one-page tool documentation shown to the policy, generated from ``tools.TOOLS``.

Signatures, defaults, bounds and descriptions come from the same pydantic argument models that
validate every call, so the page cannot promise what the tools do not do.
"""

from __future__ import annotations

import annotated_types
from pydantic.fields import FieldInfo

from tools.paper_tools import TOOLS, Tool

INTRODUCTION = """\
You answer questions about a collection of research papers by writing Python code.
Write one ```python block per turn; it runs in a notebook whose variables persist between
turns. Printed output and the value of a final bare expression come back to you. These
functions are the only way to reach the papers:"""

CLOSING = """\
Paragraphs are addressed as (paper_id, section, paragraph) numbers. Cite the paragraphs you
used as evidence when you submit. If the papers do not contain the answer, abstain."""


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
            parts.append(f"at most {constraint.max_length} {'items' if field.annotation is list or 'list' in str(field.annotation) else 'characters'}")
    return f" ({', '.join(parts)})" if parts else ""


def signature(tool: Tool) -> str:
    fields = tool.arguments.model_fields
    return f"{tool.name}({', '.join(name + _default(field) for name, field in fields.items())})"


def tool_page() -> str:
    blocks = [INTRODUCTION]
    for tool in TOOLS:
        lines = [f"{signature(tool)}", f"    {tool.summary}"]
        for name, field in tool.arguments.model_fields.items():
            lines.append(f"    {name}: {field.description}{_bounds(field)}")
        lines.append(f"    returns {tool.returns}")
        lines.append(f"    e.g. {tool.example}")
        blocks.append("\n".join(lines))
    blocks.append(CLOSING)
    return "\n\n".join(blocks) + "\n"
