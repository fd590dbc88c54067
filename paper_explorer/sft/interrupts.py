"""Ctrl-C while training: the first asks for a checkpoint at the end of the current step and a
stop, the second exits at once. Training then raises ``TrainingInterrupted``; ``interrupted_message``
is the line that says where the checkpoint is and the command that resumes it (the caller prints
it and exits 130).

Under torchrun / accelerate launch the launcher kills its workers some seconds after forwarding
a Ctrl-C; ``launcher_warning`` says so at interrupt time. Nothing here can stop that kill.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

# What signal.signal takes and returns: a function, SIG_DFL or SIG_IGN, or None (set outside Python).
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# torchrun (and accelerate launch) kill their workers this many seconds after forwarding a Ctrl-C,
# unless TORCH_ELASTIC_SHUTDOWN_TIMEOUT (or torchrun --shutdown-timeout) says otherwise.
LAUNCHER_SHUTDOWN_SECONDS = 30


class Interrupt:
    """Ctrl-C while training: the first asks for a checkpoint at the end of the current step and a
    stop (the callbacks read ``requested``), the second raises KeyboardInterrupt at once. Installed
    only in the main thread (the only one Python delivers signals to)."""

    def __init__(self, announce: bool) -> None:
        self.requested = False
        self.announce = announce
        self.previous: SignalHandler = None  # the handler ours replaced, restored on exit

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:  # os.write: a print could re-enter a stream the interrupted code is writing
            os.write(
                2, b"\nCtrl-C: saving a checkpoint at the end of this step, then stopping (Ctrl-C again to exit at once, without it)\n"
            )
            warning = launcher_warning(os.environ)
            if warning:
                os.write(2, warning.encode() + b"\n")


def launcher_warning(environment) -> str | None:
    """Under torchrun / accelerate launch the launcher SIGKILLs every worker some seconds after it
    forwards a Ctrl-C: a step and a save that take longer are lost. Said at interrupt time, unless
    the timeout was raised through the environment (torchrun's --shutdown-timeout is not visible here)."""
    if int(environment.get("WORLD_SIZE", "1")) <= 1 or "TORCHELASTIC_RUN_ID" not in environment:
        return None
    if environment.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") or environment.get("PET_SHUTDOWN_TIMEOUT"):
        return None
    return (
        f"warning: the launcher kills these {environment['WORLD_SIZE']} processes {LAUNCHER_SHUTDOWN_SECONDS} s after Ctrl-C; "
        "if this step and its save take longer, the checkpoint is lost and --resume continues from the one before. "
        "Launch with TORCH_ELASTIC_SHUTDOWN_TIMEOUT=3600 in the environment to give them an hour"
    )


class TrainingInterrupted(Exception):
    """Training stopped on Ctrl-C after saving a resumable checkpoint: not validated, unless the
    step was one that saves a checkpoint anyway (a --save-steps multiple or an epoch's end)."""

    def __init__(self, checkpoint: Path, step: int, max_steps: int, main: bool, validated: bool = False) -> None:
        super().__init__(f"interrupted at step {step} of {max_steps}; checkpoint saved to {checkpoint}")
        self.checkpoint, self.step, self.max_steps, self.main, self.validated = checkpoint, step, max_steps, main, validated


def interrupted_message(stop: TrainingInterrupted, again: list[str]) -> str | None:
    """Where the checkpoint a Ctrl-C saved is, and ``again``, the command that resumes it; None on
    the processes other than the main one (under accelerate launch it is said once)."""
    if not stop.main:
        return None
    judged = "validated" if stop.validated else "not validated"
    return (
        f"interrupted at step {stop.step} of {stop.max_steps}: checkpoint saved to {stop.checkpoint} "
        f"({judged}); resume with: {shlex.join(again)}"
    )
