"""Append-only trajectory logs: one episode per line, written whole, flushed and fsynced.

A kill (even ``kill -9``) can leave at most one torn last line: the bytes after the final
newline. ``TrajectoryLog`` cuts that tail off - logged, never silent - before appending again;
``read_whole_lines`` reads around it (for showing a log while a run may still be writing it).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agent.errors import AgentError
from agent.trajectory import Trajectory

log = logging.getLogger(__name__)


class TrajectoryLog:
    """``with TrajectoryLog(path) as out: out.append(trajectory)``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.torn_bytes = repair(path) if path.exists() else 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, trajectory: Trajectory) -> None:
        self.append_all([trajectory])

    def append_all(self, trajectories: list[Trajectory]) -> None:
        """Each a whole line, then one fsync for them all (a group commit: episodes that finish
        together, as many in flight do, cost one disk flush, not one each)."""
        for trajectory in trajectories:
            view = memoryview((trajectory.model_dump_json() + "\n").encode())
            while view:  # O_APPEND and one write call per line; loop only for a short write
                view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TrajectoryLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def repair(path: Path) -> int:
    """Cut an unterminated last line (an episode torn by a kill); return how many bytes went."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as handle:
        handle.seek(max(size - 1, 0))
        if handle.read(1) == b"\n":
            return 0
        # scan back for the last newline
        position, block = size, 1 << 16
        keep = 0
        while position > 0:
            start = max(position - block, 0)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    log.warning("%s: removed a torn last line (%d bytes) left by an interrupted run", path, size - keep)
    return size - keep


def read_trajectories(path: Path) -> list[Trajectory]:
    """Every episode in a trajectory file; a bad line is one clear error naming file and line."""
    numbered, torn = read_whole_lines(path)
    if torn is not None:
        raise AgentError(f"{path}:{torn.number}: torn last line (an interrupted run); resume the run or delete the line")
    return [trajectory for _, trajectory in numbered]


@dataclass(frozen=True)
class TornLine:
    """The unterminated last line of a log (what a kill leaves), skipped by ``read_whole_lines``."""

    number: int  # 1-based, as an editor counts lines
    size: int  # bytes


def read_whole_lines(path: Path) -> tuple[list[tuple[int, Trajectory]], TornLine | None]:
    """Every episode of the file's whole lines with its line number, and the torn last line it
    skipped (None when there is none).

    Only the last line may be torn; any other bad line is one clear error naming file and line,
    as in ``read_trajectories``. Lines are split as bytes, so a kill in the middle of a UTF-8
    character tears one line instead of making the whole file unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise AgentError(f"{path}: no such trajectory file") from None
    except IsADirectoryError:
        raise AgentError(f"{path}: is a directory; name a trajectories .jsonl file") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # the bytes after the last newline: empty unless the last line is torn
    numbered = []
    offset = 0
    for number, raw in enumerate(lines, 1):
        start, offset = offset, offset + len(raw) + 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise AgentError(f"{path}: not UTF-8 (byte {start + error.start}); is this a trajectories file?") from None
        if not line.strip():
            continue
        try:
            numbered.append((number, Trajectory.model_validate(json.loads(line))))
        except json.JSONDecodeError as error:
            raise AgentError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno})") from None
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise AgentError(f"{path}:{number}: not a trajectory: field '{where}': {first['msg']}") from None
    return numbered, (TornLine(len(lines) + 1, len(tail)) if tail.strip() else None)
