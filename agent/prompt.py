"""What the policy is shown: the system prompt (once), the question, and each observation.

The observation format is part of the prompt template: changing it changes
``prompt_template_sha256`` and therefore every trajectory's recorded hash.
"""

from __future__ import annotations

import hashlib

from tools.page import tool_page
from tools.sandbox import ActionResult

SYSTEM_INTRO = """\
You are a research assistant. You answer a question about a collection of scientific papers by \
writing Python code. Each of your turns is one action: a single ```python block. The code runs in \
a sandbox; you then see what it printed and the value of its last expression. Variables persist \
from one action to the next. Search and read before you answer, cite the paragraphs your answer \
rests on, and abstain when the papers do not contain the answer."""

FORMAT_ERROR = "Format error: write your action as Python code in one ```python block, e.g.\n```python\nhits = search(\"learning rate QuantLens\", k=3)\nhits\n```"
EMPTY_OBSERVATION = "(no output)"
CUT_MARKER = "\n[observation cut: {omitted} of {total} characters omitted]"


def system_prompt() -> str:
    return f"{SYSTEM_INTRO}\n\n{tool_page()}"


def question_message(question: str) -> str:
    return f"Question: {question}"


def observation(result: ActionResult) -> str:
    """The notebook-style text of one action's result, before any cut."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.value is not None:
        parts.append(f"Out: {result.value}")
    if result.error:
        parts.append(result.traceback or f"Error: {result.error}")
    if result.limit_hit:
        lost = " The sandbox was restarted and your variables were lost." if result.variables_lost else ""
        parts.append(f"Limit hit: {result.limit_hit}.{lost}")
    elif result.variables_lost:  # its worker died between actions and was replaced before this one ran
        parts.append("The sandbox was restarted before this action ran; your earlier variables were lost.")
    return "\n".join(parts) or EMPTY_OBSERVATION


def cut(text: str, budget: int) -> tuple[str, int]:
    """``text`` within ``budget`` characters (the marker included) and how many were omitted."""
    if len(text) <= budget:
        return text, 0
    marker = CUT_MARKER.format(omitted="0" * len(str(len(text))), total=len(text))
    keep = max(budget - len(marker), 0)
    omitted = len(text) - keep
    return text[:keep] + CUT_MARKER.format(omitted=omitted, total=len(text)), omitted


def prompt_template_sha256() -> str:
    """Everything that shapes a prompt apart from the question and the observations' content."""
    template = "\x00".join([system_prompt(), question_message("{question}"), FORMAT_ERROR, EMPTY_OBSERVATION, CUT_MARKER,
                            observation(ActionResult(stdout="{stdout}", value="{value}", error="{error}", limit_hit="{limit}", variables_lost=True))])
    return hashlib.sha256(template.encode()).hexdigest()
