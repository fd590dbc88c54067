"""What the policy is shown: the system prompt (once), the question, and each observation.

The words are data, in ``agent/prompts/prompts.toml``; this module only fills them in. The file
and the generated tool page are what ``prompt_template_sha256`` hashes, so changing either
changes every new trajectory's recorded hash.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from paper_explorer.tools.page import tool_page
from paper_explorer.tools.sandbox import ActionResult

PROMPTS_FILE = Path(__file__).parent / "prompts" / "prompts.toml"
PROMPTS = tomllib.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
FORMAT_ERROR = PROMPTS["format_error"]
EMPTY_OBSERVATION = PROMPTS["empty_observation"]
CUT_MARKER = PROMPTS["cut_marker"]


def system_prompt() -> str:
    return PROMPTS["system"].format(tool_page=tool_page())


def question_message(question: str) -> str:
    return PROMPTS["question"].format(question=question)


def observation(result: ActionResult) -> str:
    """The notebook-style text of one action's result, before any cut."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.value is not None:
        parts.append(PROMPTS["value"].format(value=result.value))
    if result.error:
        parts.append(result.traceback or PROMPTS["error"].format(error=result.error))
    if result.limit_hit:
        lost = PROMPTS["variables_lost"] if result.variables_lost else ""
        parts.append(PROMPTS["limit_hit"].format(limit=result.limit_hit) + lost)
    elif result.variables_lost:  # its worker died between actions and was replaced before this one ran
        parts.append(PROMPTS["restarted_before"])
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
    """Everything that shapes a prompt apart from the question and the observations' content: the
    template file, byte for byte, and the tool page generated from the tools' argument models."""
    digest = hashlib.sha256(PROMPTS_FILE.read_bytes())
    digest.update(b"\x00" + tool_page().encode())
    return digest.hexdigest()
