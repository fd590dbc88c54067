"""The limits of one sandbox's actions, and of its worker's whole life (set by the host, never by the worker)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools import worker
from tools.modules import DEFAULT_MODULES, check_allowed

MAX_MEMORY_BYTES = 2**40


@dataclass(frozen=True)
class Limits:
    """Per-action limits, and the worker's CPU budget for its whole life. Every breach replaces the
    worker (the episode's variables are lost), and the result names the budget that ran out:

    - ``wall_seconds`` (``wall_clock``): the action's wall time, the worker's and the host's work for it;
    - ``cpu_seconds`` (``cpu_time``): the action's CPU time, the worker's plus the host's serving its calls;
    - ``host_seconds`` (``host_time``): the host's own wall time in one action (reading its frames, serving its calls);
    - ``tool_calls``, ``output_chars``, ``memory_bytes``: what their names say."""

    wall_seconds: float = 10.0
    cpu_seconds: float = 10
    host_seconds: float = 5.0
    memory_bytes: int = 2 * 2**30
    output_chars: int = 20_000
    allowed_modules: tuple[str, ...] = DEFAULT_MODULES
    episode_cpu_seconds: int = 600
    tool_calls: int = 500  # per action: each is recorded, so the trajectory stays bounded

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "host_seconds", "memory_bytes", "output_chars", "episode_cpu_seconds", "tool_calls"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"sandbox limit {name} must be a positive finite number, got {value!r}")
        if self.memory_bytes > MAX_MEMORY_BYTES:
            raise ValueError(f"sandbox limit memory_bytes can be at most {MAX_MEMORY_BYTES:,} (1 TiB), got {self.memory_bytes:,}")
        check_allowed(self.allowed_modules)

    def frame_cap(self) -> int:
        """The largest frame a worker may send: a result with stdout and value at their caps, every
        character escaped (12 bytes for an astral one), plus error and traceback."""
        text = 2 * (self.output_chars + 200) + worker.ERROR_CHARS + worker.TRACEBACK_CHARS + 200
        return max(12 * text + (64 << 10), worker.REQUEST_CAP)
