"""Append-only trajectory logs: one episode per line, written whole, flushed and fsynced.

A kill (even ``kill -9``) can leave at most one torn last line: the bytes after the final
newline. ``TrajectoryLog`` cuts that tail off - logged, never silent - before appending again;
``read_whole_lines`` reads around it (for showing a log while a run may still be writing it).
Lines are cut and written by ``corpus.jsonl`` (bytes split on ``\\n`` only: an answer holding
U+2028 stays one line); this module says what a line holds (a ``Trajectory``) and words the errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus.files import FileRefused
from paper_explorer.corpus.jsonl import AppendOnlyLines, JsonLinesError, Record, TornLine, read_numbered, repair

__all__ = ["TrajectoryLog", "TornLine", "read_log", "read_trajectories", "read_whole_lines", "repair"]

WHAT = "trajectory"  # as the reader's errors name a line: "not a trajectory", "no such trajectory file"


class TrajectoryLog(AppendOnlyLines):
    """``with TrajectoryLog(path) as out: out.append(trajectory)``; ``append_all`` writes several
    with one fsync (a group commit), ``torn_bytes`` says what the opening repair cut off. A log that
    is a symbolic link, a FIFO or a device is refused in one AgentError line (``corpus.files``)."""

    def __init__(self, path: Path, **dump: Any) -> None:
        try:
            super().__init__(path, **dump)
        except FileRefused as error:
            raise AgentError(str(error)) from None


def read_trajectories(path: Path) -> list[Trajectory]:
    """Every episode in a trajectory file; a bad line is one clear error naming file and line."""
    numbered, torn = read_whole_lines(path)
    if torn is not None:
        raise AgentError(f"{path}:{torn.number}: torn last line (an interrupted run); resume the run or delete the line")
    return [trajectory for _, trajectory in numbered]


def read_whole_lines(path: Path) -> tuple[list[tuple[int, Trajectory]], TornLine | None]:
    """Every episode of the file's whole lines with its line number, and the torn last line it
    skipped (None when there is none).

    Only the last line may be torn; any other bad line is one clear error naming file and line,
    as in ``read_trajectories``. Lines are split as bytes, so a kill in the middle of a UTF-8
    character tears one line instead of making the whole file unreadable."""
    records, torn = read_log(path)
    return [(record.number, record.value) for record in records], torn


def read_log(path: Path) -> tuple[list[Record[Trajectory]], TornLine | None]:
    """``read_whole_lines`` with each line's bytes as written, for code that copies lines (a
    rewrite or a merge) and must copy exactly what it read, from one read of the file."""
    try:
        return read_numbered(path, Trajectory, what=WHAT)
    except FileNotFoundError:
        raise AgentError(f"{path}: no such {WHAT} file") from None
    except JsonLinesError as error:
        raise AgentError(str(error)) from None
