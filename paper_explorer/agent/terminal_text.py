"""Text from outside, shown in a terminal as data: never as markup, never as a terminal command.

Whatever a worker, a model, a server or a corpus or questions file wrote (actions, observations,
answers, reasons, evidence and paper text, tool arguments and errors, a server's error messages)
is shown through ``visible`` (a plain string) or ``untrusted`` (a rich ``Text`` of it). Our own
words keep their rich markup; only the parts from outside are data.

Protected:

- rich markup and emoji codes are never interpreted: ``untrusted`` builds a ``Text`` object, not a
  markup string, so ``[/x]`` (which crashes rich's markup parser), ``[link=...]`` and ``:smile:``
  are shown as written. Strings handed to ``console.print`` or a table cell *are* markup: data
  goes in as ``Text``.
- characters a terminal acts on are shown, never sent: C0 controls other than newline and tab,
  DEL and the C1 controls (U+0080-U+009F, U+0085 among them) as ``\\x1b``; every other format
  character (Unicode category Cf: the bidirectional controls U+202A-202E, U+2066-2069, U+200E,
  U+200F and U+061C, zero-width characters, the soft hyphen, tag characters), the line and
  paragraph separators U+2028 and U+2029, and lone surrogates (which cannot even be encoded) as
  ``<U+202E>``. An escape sequence therefore shows as its characters (``\\x1b]8;;...``), and text
  cannot reorder, hide, overwrite or link the text around it.
- ``json_visible`` does the same for JSON printed on a terminal (``--json``, ``explorer exec``):
  each such character becomes a ``\\uXXXX`` escape, so the value read back is unchanged and one
  record stays one line for readers that split on U+2028 or U+0085.

Not protected, shown as they are: printable characters of every script (letters, emoji, wide
characters), combining marks, private-use and unassigned code points, and look-alike letters
(homoglyphs). Text that itself contains a backslash sequence (the four characters ``\\x1b``)
looks like an escaped control: harmless, and shown as written. An emoji sequence joined by
U+200D shows its joiners (``<U+200D>``), as every format character does.
"""

from __future__ import annotations

import re
import unicodedata

from rich.text import Text

# Control (C0, DEL, C1), format, line separator, paragraph separator, surrogate.
SHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# A cheap first pass: only characters outside printable ASCII (newline and tab kept) are looked up.
_MAYBE_SHOWN = re.compile(r"[^\t\n\x20-\x7e]")


def _is_shown(character: str) -> bool:
    """Whether a terminal could act on ``character`` (newline and tab never reach here)."""
    return unicodedata.category(character) in SHOWN_CATEGORIES


def _as_escape(match: re.Match) -> str:
    character = match.group()
    category = unicodedata.category(character)
    if category not in SHOWN_CATEGORIES:
        return character
    if category == "Cc":  # C0, DEL, C1: as Python writes them
        return f"\\x{ord(character):02x}"
    return f"<U+{ord(character):04X}>"


def visible(text: str) -> str:
    """``text`` with every character a terminal could act on written out visibly; the rest unchanged."""
    return _MAYBE_SHOWN.sub(_as_escape, text)


def untrusted(text: str, style: str = "") -> Text:
    """``text`` from outside as a rich ``Text`` in ``style``: no markup, no emoji codes, no controls."""
    return Text(visible(text), style=style)


def _as_json_escape(match: re.Match) -> str:
    character = match.group()
    if not _is_shown(character):
        return character
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON writes a character beyond the BMP as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_visible(json_text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)`` or pydantic) with each character
    ``visible`` would show written as a ``\\uXXXX`` escape: the same value when parsed.

    Such characters can only stand inside JSON strings (the rest of the syntax is ASCII), where an
    escape means the same character; newline and tab are the JSON text's own layout and stay."""
    return _MAYBE_SHOWN.sub(_as_json_escape, json_text)
