"""How an error names a setting: as a Python caller sets it, or, under the CLI, as its flag.

Core code raises errors that say what to change - "pass resume=True to finish it" - and the
same error reaches two kinds of reader: a script that called ``evaluate(..., resume=False)`` and
a user who typed ``explorer eval``. So a message names a setting through ``setting``, never by a
spelling of its own:

    raise EvaluationError(f"{out}: already holds a run; pass {setting('resume', True)} to finish it")

which reads ``pass resume=True`` from Python and ``pass --resume`` from the CLI. A setting is
named by its Python name: a keyword argument of the call (``resume``, ``out``, ``corpus``) or a
field of its config, dotted below a section (``policy.name``, ``episode.max_steps``), the names
the config's flags are made from. The CLI (``cli.main``) installs its spelling, made from the
same table as the flags (``cli.flags.flag_spelling``), for the duration of a command.

Why a process-wide spelling and not a context variable: the CLI's episodes run in threads and
forked processes, which must name settings as their command does; a context variable would not
follow a new thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # a setting named without a value: "choose another out" / "choose another --out"

Spelling = Callable[[str, Any], str]  # (python name, value or UNSET) -> how the message shows it


def python_spelling(name: str, value: Any = UNSET) -> str:
    """``resume=True``, ``policy.name='replay'``, ``out``: as a Python caller writes the setting."""
    if value is UNSET:
        return name
    if isinstance(value, PurePath):
        value = str(value)
    return f"{name}={value!r}"


_spelling: Spelling = python_spelling


def setting(name: str, value: Any = UNSET) -> str:
    """The setting ``name`` (given ``value``, if one is named) as the caller spells it."""
    return _spelling(name, value)


@contextmanager
def spelled(spelling: Spelling) -> Iterator[None]:
    """Messages made inside name settings by ``spelling`` (the CLI's: its flags); restored after."""
    global _spelling
    before, _spelling = _spelling, spelling
    try:
        yield
    finally:
        _spelling = before
