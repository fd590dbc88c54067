"""Policy text -> the code to run: a ```python block, else text that is itself Python, else nothing."""

from __future__ import annotations

import ast
import re

FENCED = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The first fenced code block; or the whole text when it parses as Python; else None.

    Only the first block runs: an action is one block, and running later ones would execute
    code the policy wrote after (possibly instead of) looking at a result it never saw.
    """
    match = FENCED.search(text)
    if match:
        code = match.group(1).strip("\n")
        return code if code.strip() else None
    bare = text.strip()
    if not bare:
        return None
    try:
        ast.parse(bare)
    except SyntaxError:
        return None
    return bare
