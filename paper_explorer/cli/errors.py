"""Errors the CLI reports as one line with exit code 2, and how such a line is written."""

from __future__ import annotations

from paper_explorer.agent.terminal_text import visible


class UsageError(Exception):
    """A bad argument or an unsafe request (overwriting a file) found by the CLI's own checks."""


ERROR_LINE_CHARACTERS = 2_000  # an error line quoting a 10 MB key shows its start, and says how much is cut


def error_line(message: str) -> str:
    """``error: MESSAGE`` as one line a terminal shows as data: controls written out (``visible``),
    a newline as ``\\n`` (a path or a key holding one cannot start a forged ``error:`` line; U+2028,
    U+2029, U+0085 and CR are written out by ``visible`` already), and at most ERROR_LINE_CHARACTERS
    of it, the rest counted."""
    shown = visible(message).replace("\n", "\\n")
    if len(shown) > ERROR_LINE_CHARACTERS:
        shown = f"{shown[:ERROR_LINE_CHARACTERS]}... ({len(shown) - ERROR_LINE_CHARACTERS:,} more characters cut)"
    return f"error: {shown}"
