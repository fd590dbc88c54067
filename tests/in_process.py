"""`explorer ARGS` run inside the test process, as a fresh process would run it (pytester's model).

A call in a subprocess costs an interpreter start and the imports, about a second; here it costs
the command. Each call gives the command what a fresh ``python -m paper_explorer.cli.main ARGS`` would get, and puts
the test process back afterwards:

- ``sys.argv``, the environment (the caller's, as ``tests.conftest.checkout_environment`` builds it
  for a subprocess) and the working directory;
- stdout and stderr as pipes: UTF-8 text that is not a terminal, read back as ``subprocess.run(...,
  text=True)`` reads it (``\\r`` becomes ``\\n``); stdin empty, as pytest's /dev/null is to a child;
- the ``cli`` package imported afresh, so its module globals start as a new process's do (a rich
  Console sized by this call's COLUMNS, ``_RUNNER``); the modules a test imported are put back;
- logging unconfigured (the root logger's handlers, pytest's among them, are set aside, so the
  command's ``basicConfig`` takes effect), and stream handlers a library bound to stderr or stdout
  when it was imported (transformers does) write to this call's pipes;
- a fresh interpreter's warning filters, warnings printed to stderr (not to pytest's recorder);
- signal handlers as they were, and what ``gc.freeze`` froze unfrozen and collected: a run's
  episode-host servers close when their corpus is collected, as they would when a process exits.

Not isolated: modules outside ``cli`` stay imported, so a library that reads an environment variable
when imported (``HF_HUB_CACHE``) or a ``PYTHONPATH`` change does not see this call's value; the
shared sandbox zygote stays up between calls (it inherits nothing from its caller: a minimal
environment, cwd ``/``); a thread the command left running keeps running, and a raised limit on
open files stays raised; what another thread of the test process prints during a call (a fake
server's log) lands in the call's output; ``os.fork`` copies the test process; atexit handlers run
when pytest exits; no timeout bounds a hang; one call runs at a time. Where the process matters -
kill -9, signals, forked episode processes, commands at once, start-up imports, an environment read
at import - tests use ``tests.conftest.run_cli_process``.
"""

from __future__ import annotations

import gc
import importlib
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_one_at_a_time = threading.Lock()
# What sys.argv[0] is under `python -m paper_explorer.cli.main`.
MAIN_SCRIPT = str(ROOT / "cli" / "main.py")
# Signals a command or a library it loads may take over; SIGKILL and SIGSTOP cannot be.
RESTORED_SIGNALS = tuple(
    getattr(signal, name)
    for name in (
        "SIGINT",
        "SIGTERM",
        "SIGHUP",
        "SIGQUIT",
        "SIGALRM",
        "SIGPROF",
        "SIGUSR1",
        "SIGUSR2",
        "SIGCHLD",
        "SIGPIPE",
    )
    if hasattr(signal, name)
)


class _KeptBytes(io.BytesIO):
    """A pipe's bytes, still readable after the command closed its end."""

    def close(self) -> None:
        pass


class Pipe(io.TextIOWrapper):
    """What a child's stdout or stderr is: UTF-8 text written into a pipe, not a terminal."""

    def __init__(self, errors: str) -> None:
        self.received = _KeptBytes()
        super().__init__(self.received, encoding="utf-8", errors=errors, write_through=True)

    def text(self) -> str:
        """As ``subprocess.run(..., text=True)`` decodes a pipe: universal newlines."""
        if not self.closed:
            self.flush()
        return self.received.getvalue().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def run_in_process(args: tuple[str, ...], cwd: Path | None, environment: dict) -> subprocess.CompletedProcess:
    if not _one_at_a_time.acquire(blocking=False):  # argv, environment and streams are the process's own
        raise RuntimeError("run_cli runs one command at a time in this process; run commands at once with run_cli_process")
    try:
        return _run(args, cwd, environment)
    finally:
        _one_at_a_time.release()


def _run(args: tuple[str, ...], cwd: Path | None, environment: dict) -> subprocess.CompletedProcess:
    stdout, stderr = Pipe("strict"), Pipe("backslashreplace")  # a child's own stdio error handlers
    with ExitStack() as restore:
        restore.enter_context(_environment(environment))
        restore.enter_context(_working_directory(cwd))
        restore.enter_context(_argv([MAIN_SCRIPT, *args]))
        restore.enter_context(_unconfigured_logging(stdout, stderr))
        restore.enter_context(_standard_streams(stdout, stderr))
        restore.enter_context(_fresh_warnings())
        restore.enter_context(_signal_handlers())
        restore.enter_context(_unfrozen_afterwards())
        restore.enter_context(_fresh_cli_modules())
        returncode = _exit_status()
    return subprocess.CompletedProcess(["explorer", *args], returncode, stdout.text(), stderr.text())


def _exit_status() -> int:
    """Run ``cli.main.main`` and return the status a process running it would exit with."""
    try:
        importlib.import_module("paper_explorer.cli.main").main()
    except SystemExit as exit:
        return _status(exit.code)
    except BaseException:  # an uncaught exception: the interpreter prints it and exits 1
        traceback.print_exc()
        return 1
    return 0


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"): printed, exit 1
    return 1


@contextmanager
def _environment(environment: dict):
    before = dict(os.environ)
    _set_environment(environment)
    try:
        yield
    finally:
        _set_environment(before)


def _set_environment(wanted: dict) -> None:
    for name in [name for name in os.environ if name not in wanted]:
        del os.environ[name]
    for name, value in wanted.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@contextmanager
def _working_directory(cwd: Path | None):
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


@contextmanager
def _argv(argv: list[str]):
    before = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = before


@contextmanager
def _standard_streams(stdout: Pipe, stderr: Pipe):
    before = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")  # /dev/null
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = before


@contextmanager
def _unconfigured_logging(stdout: Pipe, stderr: Pipe):
    """Entered before the pipes replace ``sys.stdout`` and ``sys.stderr``."""
    root = logging.getLogger()
    handlers, level, disabled = root.handlers[:], root.level, logging.root.manager.disable
    root.handlers = []  # basicConfig configures only a root logger without handlers
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    ours = {id(sys.stdout): stdout, id(sys.__stdout__): stdout, id(sys.stderr): stderr, id(sys.__stderr__): stderr}
    theirs = {id(stdout): sys.stdout, id(stderr): sys.stderr}
    _rebind_stream_handlers(ours)
    try:
        yield
    finally:
        _rebind_stream_handlers(theirs)  # bound to the call's pipes, before it or during it
        root.handlers = handlers
        root.setLevel(level)
        logging.disable(disabled)


def _rebind_stream_handlers(streams: dict[int, object]) -> None:
    """Stream handlers a library bound to one of ``streams`` (by id) write to its replacement."""
    loggers = [
        logging.getLogger(),
        *(logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)),
    ]
    for handler in (handler for logger in loggers for handler in logger.handlers):
        if type(handler) is logging.StreamHandler and id(handler.stream) in streams:  # not a FileHandler
            handler.stream = streams[id(handler.stream)]


@contextmanager
def _fresh_warnings():
    """A fresh interpreter's filters (no -W, no PYTHONWARNINGS), shown on stderr as it shows them."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        warnings.showwarning = _show_warning  # pytest's recorder would keep them from stderr
        yield


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


@contextmanager
def _signal_handlers():
    before = {number: signal.getsignal(number) for number in RESTORED_SIGNALS}
    try:
        yield
    finally:
        for number, handler in before.items():
            if handler is not None and signal.getsignal(number) is not handler:
                signal.signal(number, handler)


@contextmanager
def _unfrozen_afterwards():
    frozen = gc.get_freeze_count()
    try:
        yield
    finally:
        if frozen == 0 and gc.get_freeze_count():
            gc.unfreeze()
        gc.collect()  # what the command held goes now, and with it the processes it started


@contextmanager
def _fresh_cli_modules():
    def ours(name: str) -> bool:
        return name == "paper_explorer.cli" or name.startswith("paper_explorer.cli.")

    kept = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in kept:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(kept)
