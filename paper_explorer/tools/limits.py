"""The limits of one sandbox's actions, and of its worker's whole life (set by the host, never by the worker).

Two layers, each limit declared once:

- ``SandboxSettings``: the limits a user sets, in the units they give them (``explorer exec``'s flags,
  and ``episode.*`` of ``explorer run`` and ``eval``, whose ``agent.trajectory.EpisodeConfig`` takes
  these fields). Each field's default, bounds and description are the only ones: the command-line
  flags and their help are generated from them (``cli.flags``).
- ``Limits``: what the host enforces, in its own units (bytes), plus what no user sets (the worker's
  lifetime CPU, tool calls per action, the modules actions may import). Its defaults are
  ``SandboxSettings``'s; it only checks that each limit is one a kernel can set, so tests may use
  smaller ones than a user may.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.tools import worker
from paper_explorer.tools.modules import DEFAULT_MODULES, check_allowed

MAX_MEMORY_BYTES = 2**40
MIB = 2**20
# The longest a time limit may be: a day. poll() takes a 32-bit count of milliseconds (about 24.8
# days), and a limit no one would wait out is no limit; the same cap keeps CPU time a real budget.
MAX_LIMIT_SECONDS = 86_400
# Printed characters per action: beyond this an observation could not be kept or shown anyway.
MAX_OUTPUT_CHARS = 10_000_000
KIB = 2**10
# Tool-call records per action or per episode: a GiB of them is more than any trajectory line should hold.
MAX_RECORD_KB = 2**20
# The widest a character of a string gets in a frame (tools.wire.dumps: an escaped control character
# or lone surrogate, \uXXXX; an astral character is 4 bytes).
WIRE_BYTES_PER_CHAR = 6
# What an outcome carries besides its cited paragraphs' ids (their text is not sent; the policy's
# process has the corpus): an answer or a reason (tools.arguments: 2,000 and 1,000 characters at most).
OUTCOME_CHARS = 3_000
MAX_EVIDENCE = 20  # paragraphs a submit may cite (tools.arguments.SubmitArgs)


class SandboxSettings(BaseModel):
    """The per-action limits a user sets. A breach of a time or output limit replaces the worker
    (the episode's variables are lost) and the step names the budget (``wall_clock``, ``cpu_time``,
    ``host_time``, ``output``). Memory is an address-space limit: an allocation past it fails inside
    the action as ``MemoryError``, recorded as the action's error; only a worker that dies of it
    is recorded as ``memory``."""

    model_config = ConfigDict(extra="forbid")

    wall_seconds: float = Field(
        10.0,
        gt=0,
        le=MAX_LIMIT_SECONDS,
        allow_inf_nan=False,
        description="Wall-clock limit per action, in seconds: the worker's time and the host's work for it.",
    )
    cpu_seconds: int = Field(
        10, ge=1, le=MAX_LIMIT_SECONDS, description="CPU-time limit per action, in seconds: the worker's and the host's for its tool calls."
    )
    host_seconds: float = Field(
        5.0,
        gt=0,
        le=MAX_LIMIT_SECONDS,
        allow_inf_nan=False,
        description="Time the host may spend serving one action's tool calls, in seconds.",
    )
    # at most 1 TiB (MAX_MEMORY_BYTES): beyond that, no limit the kernel can set
    memory_mb: int = Field(2_048, ge=64, le=MAX_MEMORY_BYTES // MIB, description="Memory an action may add, in MiB.")
    output_chars: int = Field(20_000, ge=100, le=MAX_OUTPUT_CHARS, description="Printed characters per action.")
    record_kb: int = Field(
        1_024,
        ge=64,
        le=MAX_RECORD_KB,
        description="Tool-call records one action may add to its trajectory, in KiB as sent (arguments, errors, kept results): "
        "a call past it is not run and the action is cut (records).",
    )
    episode_record_kb: int = Field(
        16_384,
        ge=64,
        le=MAX_RECORD_KB,
        description="Tool-call records one episode may add to its trajectory, in KiB as sent: past it, as past an action's (episode_records).",
    )


_DEFAULT = SandboxSettings()


@dataclass(frozen=True)
class Limits:
    """Per-action limits, and the worker's CPU budget for its whole life. Every breach replaces the
    worker (the episode's variables are lost), and the result names the budget that ran out:

    - ``wall_seconds`` (``wall_clock``): the action's wall time, the worker's and the host's work for it;
    - ``cpu_seconds`` (``cpu_time``): the action's CPU time, the worker's plus the host's serving its calls;
    - ``host_seconds`` (``host_time``): the host's own wall time in one action (reading its frames, serving its calls);
    - ``record_bytes`` (``records``) and ``episode_record_bytes`` (``episode_records``): the bytes of
      tool-call records (arguments, errors, kept results, as ``tools.wire`` sends them) one action and
      one episode may add; a call whose record would not fit is not run, and the action is cut;
    - ``tool_calls``, ``output_chars``, ``memory_bytes``: what their names say.

    What the host sends the policy's process for one action is bounded by them (``reply_cap``)."""

    wall_seconds: float = _DEFAULT.wall_seconds
    cpu_seconds: float = _DEFAULT.cpu_seconds
    host_seconds: float = _DEFAULT.host_seconds
    memory_bytes: int = _DEFAULT.memory_mb * MIB
    output_chars: int = _DEFAULT.output_chars
    allowed_modules: tuple[str, ...] = DEFAULT_MODULES
    record_bytes: int = _DEFAULT.record_kb * KIB
    episode_record_bytes: int = _DEFAULT.episode_record_kb * KIB
    episode_cpu_seconds: int = 600
    tool_calls: int = 500  # per action: each is recorded, so the trajectory stays bounded

    def __post_init__(self) -> None:
        names = ("wall_seconds", "cpu_seconds", "host_seconds", "memory_bytes", "output_chars", "record_bytes", "episode_record_bytes")
        for name in (*names, "episode_cpu_seconds", "tool_calls"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"sandbox limit {name} must be a positive finite number, got {value!r}")
        if self.memory_bytes > MAX_MEMORY_BYTES:
            raise ValueError(f"sandbox limit memory_bytes can be at most {MAX_MEMORY_BYTES:,} (1 TiB), got {self.memory_bytes:,}")
        check_allowed(self.allowed_modules)

    @classmethod
    def from_settings(cls, settings: SandboxSettings, allowed_modules: tuple[str, ...] = DEFAULT_MODULES) -> Limits:
        """The limits a user's settings (an ``EpisodeConfig`` is one) set, in the host's units."""
        return cls(
            wall_seconds=settings.wall_seconds,
            cpu_seconds=settings.cpu_seconds,
            host_seconds=settings.host_seconds,
            memory_bytes=settings.memory_mb * MIB,
            output_chars=settings.output_chars,
            record_bytes=settings.record_kb * KIB,
            episode_record_bytes=settings.episode_record_kb * KIB,
            allowed_modules=allowed_modules,
        )

    def frame_cap(self) -> int:
        """The largest frame a worker may send: a result with stdout and value at their caps, every
        character escaped (12 bytes for an astral one), plus error and traceback."""
        text = 2 * (self.output_chars + 200) + worker.ERROR_CHARS + worker.TRACEBACK_CHARS + 200
        return max(12 * text + (64 << 10), worker.REQUEST_CAP)

    def reply_cap(self, longest_paper_id: int) -> int:
        """The largest reply the episode host sends the policy's process for one action: its
        records at their budget (and a comma between two: a record is over 64 bytes);
        its output, value, error, traceback and outcome at their caps, each character at its widest
        in a frame; the ids of the paragraphs an outcome cites."""
        text = 2 * (self.output_chars + 200) + worker.ERROR_CHARS + worker.TRACEBACK_CHARS + OUTCOME_CHARS + 400
        evidence = MAX_EVIDENCE * (WIRE_BYTES_PER_CHAR * longest_paper_id + 200)
        return self.record_bytes + self.record_bytes // 64 + WIRE_BYTES_PER_CHAR * text + evidence + (64 << 10)
