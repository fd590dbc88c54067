"""``explorer exec``: run action files in one episode's sandbox and print each result as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from agent.terminal_text import json_visible
from cli.errors import UsageError
from cli.options import CorpusOption, open_corpus
from tools.modules import DEFAULT_MODULES, VETTED_MODULES
from tools.sandbox import Limits, Sandbox


def read_action(path: Path) -> str:
    """The action text of a file (``-`` is standard input), or one clear line saying why not."""
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such action file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory; name action files (.py)") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not UTF-8 (byte {error.start}); save the action as UTF-8") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror})") from None


def json_line(result: dict, pretty: bool = False) -> str:
    """One result as JSON whose strings escape every control, format character, line separator and
    lone surrogate the worker printed (agent.terminal_text.json_visible): safe on a terminal, and one
    result is exactly one line even for readers that split on U+2028 or U+0085."""
    return json_visible(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, allow_nan=False))


def build_limits(wall_seconds: float, cpu_seconds: int, memory_mb: int, output_chars: int, modules: list[str],
                 host_seconds: float = 5.0) -> Limits:
    try:
        return Limits(
            wall_seconds=wall_seconds,
            cpu_seconds=cpu_seconds,
            host_seconds=host_seconds,
            memory_bytes=memory_mb * 2**20,
            output_chars=output_chars,
            allowed_modules=tuple(modules) if modules else DEFAULT_MODULES,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def exec_command(
    files: List[Path] = typer.Argument(..., help="Action files, run in order in one sandbox; '-' reads standard input."),
    corpus_path: Optional[Path] = CorpusOption,
    wall_seconds: float = typer.Option(10.0, "--wall-seconds", help="Wall-clock limit per action."),
    cpu_seconds: int = typer.Option(10, "--cpu-seconds", help="CPU-time limit per action, the worker's and the host's for its tool calls."),
    host_seconds: float = typer.Option(5.0, "--host-seconds", help="Time the host may spend serving one action's tool calls."),
    memory_mb: int = typer.Option(2048, "--memory-mb", help="Memory an action may add to the worker, in MiB."),
    output_chars: int = typer.Option(20_000, "--output-chars", help="Printed characters allowed per action."),
    allow_module: List[str] = typer.Option(
        [], "--allow-module", help=f"A module actions may import (repeat; default {', '.join(DEFAULT_MODULES)}; "
        f"choose from {', '.join(VETTED_MODULES)})."
    ),
    pretty: bool = typer.Option(False, "--pretty", help="Indent each result instead of one JSON object per line."),
) -> None:
    """Run action files in one episode's sandbox; print each result as a JSON line.

    Each result holds stdout, value, error, limit hit, tool calls and outcome. Variables persist from one file to the next, like notebook cells. The exit code is 0 when
    every action ran, even if an action raised: the error is part of its result.
    """
    if sum(1 for path in files if str(path) == "-") > 1:
        raise UsageError("'-' (standard input) can be named only once")
    limits = build_limits(wall_seconds, cpu_seconds, memory_mb, output_chars, allow_module, host_seconds)
    actions = [(str(path), read_action(path)) for path in files]  # every file read before any runs
    corpus = open_corpus(corpus_path)
    with Sandbox(corpus, limits) as sandbox:
        for name, code in actions:
            result = {"file": name, **sandbox.execute(code).to_json(), "isolation": sandbox.isolation}
            typer.echo(json_line(result, pretty))
