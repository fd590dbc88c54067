"""The limits of one sandbox's actions, and of its worker's whole life (set by the host, never by the worker).

Two layers, each limit declared once:

- ``SandboxSettings``: the limits a user sets, in the units they give them (``explorer exec``'s flags,
  and ``episode.*`` of ``explorer run`` and ``eval``, whose ``agent.trajectory.EpisodeConfig`` takes
  these fields). Each field's default, bounds and description are the only ones: the command-line
  flags and their help are generated from them (``cli.flags``).
- ``Limits``: what the host enforces. It *is* a ``SandboxSettings`` (the same fields, defaults and
  bounds; the host reads its byte counts as properties) plus what no user sets: the worker's
  lifetime CPU, tool calls per action, the modules actions may import. It travels to the episode
  host as pydantic's own JSON.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    rerank_url: str | None = Field(
        None,
        max_length=2_000,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="The reranking service that search(..., rerank=K) calls (explorer rerank-serve's http://127.0.0.1:PORT); "
        "without one, rerank is refused to the model.",
    )


class Limits(SandboxSettings):
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

    model_config = ConfigDict(frozen=True)

    # The one bound that differs from the user's: the host measures CPU time to the microsecond, so a
    # budget may be a fraction of a second (the tests of the CPU budget use them); users set whole seconds.
    cpu_seconds: float = Field(  # type: ignore[assignment]
        SandboxSettings.model_fields["cpu_seconds"].default,
        gt=0,
        le=MAX_LIMIT_SECONDS,
        allow_inf_nan=False,
        description=SandboxSettings.model_fields["cpu_seconds"].description,
    )
    allowed_modules: tuple[str, ...] = Field(DEFAULT_MODULES, description="The modules an action may import (tools.modules).")
    episode_cpu_seconds: int = Field(600, ge=1, description="The worker's CPU time for its whole life, an rlimit.")
    tool_calls: int = Field(500, ge=1, description="Tool calls per action: each is recorded, so the trajectory stays bounded.")

    @field_validator("allowed_modules")
    @classmethod
    def _vetted(cls, modules: tuple[str, ...]) -> tuple[str, ...]:
        check_allowed(modules)
        return modules

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * MIB

    @property
    def record_bytes(self) -> int:
        return self.record_kb * KIB

    @property
    def episode_record_bytes(self) -> int:
        return self.episode_record_kb * KIB

    @classmethod
    def from_settings(cls, settings: SandboxSettings, allowed_modules: tuple[str, ...] = DEFAULT_MODULES) -> Limits:
        """The limits a user's settings (an ``EpisodeConfig`` is one) set: their own fields, as given."""
        return cls(**{name: getattr(settings, name) for name in SandboxSettings.model_fields}, allowed_modules=allowed_modules)

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
