"""Append-only trajectory logs: one episode per line, written whole, flushed and fsynced.

A kill (even ``kill -9``) can leave at most one torn last line: the bytes after the final
newline. ``open_log`` cuts that tail off - logged, never silent - before appending again.
"""

from __future__ import annotations

import json
import logging
import os
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
        line = (trajectory.model_dump_json() + "\n").encode()
        view = memoryview(line)
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
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise AgentError(f"{path}: no such trajectory file") from None
    except IsADirectoryError:
        raise AgentError(f"{path}: is a directory; name a trajectories .jsonl file") from None
    trajectories = []
    with handle:
        try:
            lines = list(handle)
        except UnicodeDecodeError as error:
            raise AgentError(f"{path}: not UTF-8 (byte {error.start}); is this a trajectories file?") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                raise AgentError(f"{path}:{number}: torn last line (an interrupted run); resume the run or delete the line")
            try:
                trajectories.append(Trajectory.model_validate(json.loads(line)))
            except json.JSONDecodeError as error:
                raise AgentError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno})") from None
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise AgentError(f"{path}:{number}: not a trajectory: field '{where}': {first['msg']}") from None
    return trajectories
