"""What a run tells whoever called it: notes and progress while it runs (``Reporter``), and how it
stopped when it did not finish as asked (``EvaluationInterrupted``, ``EvaluationFailed``).

The run (``evaluation.run``) decides what to say; a reporter decides where it goes: ``LogReporter``
(the Python API's default) logs notes as warnings and shows no progress, the CLI's
(``cli.display.ConsoleReporter``) prints them and draws a progress bar.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import RunMetrics

log = logging.getLogger("paper_explorer.evaluation.run")  # the run's notes, named for the module that makes them


class Reporter(Protocol):
    """What a run says while it runs."""

    def note(self, line: str) -> None:
        """A choice the run made or a warning, one line without a "note:" prefix (it may quote a server)."""

    def say(self, line: str) -> None:
        """How far the run is (resuming, a repaired log, replaced episodes), one line."""

    def progress(self, total: int, done: int) -> contextlib.AbstractContextManager[Callable[[int], None]]:
        """For the episodes' loop: a function called with how many more episodes were written."""


class LogReporter:
    """The default: notes as warnings of the evaluation.run logger, the rest at INFO, no progress shown."""

    def note(self, line: str) -> None:
        log.warning("%s", line)

    def say(self, line: str) -> None:
        log.info("%s", line)

    @contextlib.contextmanager
    def progress(self, total: int, done: int) -> Iterator[Callable[[int], None]]:
        yield lambda episodes: None


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C: every episode that finished is in the log; a resume runs the rest."""

    def __init__(self, directory: Path, written: int, total: int) -> None:
        super().__init__(f"interrupted: {written} of {total} episodes written to {directory}")
        self.directory, self.written, self.total = directory, written, total


class EvaluationFailed(EvaluationError):
    """The run ran but did not measure what it was asked to (every episode a policy_error, too many
    in a row, or a failed preregistered rule); ``metrics`` when they were written."""

    def __init__(self, message: str, directory: Path, metrics: RunMetrics | None = None) -> None:
        super().__init__(message)
        self.directory, self.metrics = directory, metrics
