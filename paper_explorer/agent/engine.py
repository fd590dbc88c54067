"""Many episodes in flight in one host process: ``explorer eval --concurrency N``.

Against a served model an episode spends almost all its time waiting for the server's tokens. So
each episode in flight gets a thread (which releases the interpreter lock while it waits on its
socket) and its own sandbox: a worker, forked from the zygote like every other, where its actions
run, and an episode host process, where its tool calls are served (``tools.episode_host``), so
that no episode's tool work holds the interpreter lock the others' threads need. What an episode
in flight holds: its thread (a stack whose untouched pages cost nothing), its conversation
(bounded by ``context_chars``), its policy's per-episode state (a shallow copy of the run's policy:
the tokenizer and the server pool are shared), and those two processes. Finished trajectories go back to the caller's thread,
which alone writes the log, so the log stays append-only and one line per episode.

Past one interpreter's lock: ``EpisodeProcesses`` forks ``workers`` processes, each keeping
``concurrency`` episodes in flight with its own threads, sandboxes and fork servers (``tools.zygote``
and ``tools.episode_host`` start a forked child's own). The processes take units from one shared
counter (no process idles while another has a queue) and send each batch of finished results
back over a pipe to the caller's process, which alone writes the log.

The same config gives the same trajectories at any concurrency and any number of processes (order
aside): an episode's seed comes from the run's seed, the question and the sample number, never
from which thread or process runs it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence, Sized
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar, cast

from paper_explorer.agent.errors import AgentError
from paper_explorer.corpus.setting_names import setting

Unit = TypeVar("Unit")
Result = TypeVar("Result")

DESCRIPTORS_PER_EPISODE = 4  # its episode host's link, the worker's channel while it starts, a kept server connection, a spare
DESCRIPTORS_BASE = 256  # the host's own: corpus files, the log, the zygote, Python's


def raise_descriptor_limit(concurrency: int, replicas: int = 1) -> int:
    """Raise this process's open-file limit to what ``concurrency`` episodes in flight need (up to
    the hard limit); one clear error when the hard limit is too low. Returns the limit now set."""
    needed = DESCRIPTORS_BASE + concurrency * (DESCRIPTORS_PER_EPISODE + replicas - 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise AgentError(
                f"{setting('concurrency', concurrency)} needs about {needed} open files; this system allows {hard} "
                f"(ulimit -Hn); lower {setting('concurrency')} or raise the limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return needed
    return soft


class _Failed:
    """An exception raised in a thread, carried to the caller's thread."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class EpisodeThreads(Generic[Unit, Result]):
    """``run_one`` on every unit, ``concurrency`` at a time, results in the order they finish.

    Closing the iterator (``break``, an exception, Ctrl-C in the caller) stops new units from
    starting; the episodes in flight are abandoned with their threads (daemons: they never hold
    the process open), and their sandbox workers end with the process. Nothing of theirs is
    written, so a resumed run runs them again, as after a kill."""

    def __init__(self, run_one: Callable[[Unit], Result], concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.run_one, self.concurrency = run_one, concurrency

    def run(self, units: Iterable[Unit]) -> Iterator[Result]:
        for finished in self.run_batches(units):
            yield from finished

    def run_batches(self, units: Iterable[Unit]) -> Generator[list[Result], None, None]:
        """As ``run``, but each time the results that have finished since the last batch (at
        least one): the caller can write them with one disk flush. Units are taken from
        ``units`` one at a time as threads come free, so it may be a lazy iterator."""
        source, taking = iter(units), threading.Lock()
        threads_needed = min(self.concurrency, len(units)) if isinstance(units, Sized) else self.concurrency
        if threads_needed == 0:
            return
        finished: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        threads = [
            threading.Thread(target=self._work, args=(source, taking, finished, stop), daemon=True, name=f"episode-{number}")
            for number in range(threads_needed)
        ]
        for thread in threads:
            thread.start()
        running = len(threads)
        try:
            while running:
                batch, failure, item = [], None, finished.get()
                while True:
                    if item is _DONE:
                        running -= 1
                    elif isinstance(item, _Failed):
                        failure = failure or item.error
                    else:
                        batch.append(item)
                    try:
                        item = finished.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    yield batch  # what finished is written before a failure ends the run
                if failure is not None:
                    raise failure
        finally:
            stop.set()

    def _work(self, source: Iterator[Unit], taking: threading.Lock, finished: queue.SimpleQueue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    with taking:  # a generator must not be advanced by two threads at once
                        unit = next(source, _DONE)
                    if unit is _DONE:
                        return
                    result = self.run_one(cast(Unit, unit))
                except BaseException as error:  # the caller's thread raises it: a bug must not vanish with its thread
                    finished.put(_Failed(error))
                    return
                if not stop.is_set():
                    finished.put(result)
        finally:
            finished.put(_DONE)


PR_SET_PDEATHSIG = 1  # linux prctl: a signal for this process when the one that forked it dies


class EpisodeProcesses(Generic[Unit, Result]):
    """``run_one`` on every unit in ``workers`` forked processes with ``concurrency`` in flight in
    each (``EpisodeThreads``), results in the caller's process in the order their batches arrive.

    ``run_one`` and the units reach the processes by the fork, never pickled; results come back
    pickled, one message per batch. Closing the iterator (a stop, an exception, Ctrl-C in the
    caller) kills the processes; what they had in flight is abandoned and runs again on resume,
    as after a kill. The processes ignore Ctrl-C (the caller decides) and are killed by the
    kernel if the caller dies, so a ``kill -9`` of the caller leaves none running."""

    def __init__(self, run_one: Callable[[Unit], Result], workers: int, concurrency: int = 1) -> None:
        if workers < 1 or concurrency < 1:
            raise ValueError("workers and concurrency must be at least 1")
        self.run_one, self.workers, self.concurrency = run_one, workers, concurrency

    def run(self, units: Sequence[Unit]) -> Iterator[Result]:
        for finished in self.run_batches(units):
            yield from finished

    def run_batches(self, units: Sequence[Unit]) -> Generator[list[Result], None, None]:
        """As ``EpisodeThreads.run_batches``. The processes are forked before this returns, so
        that a thread the caller starts next (a progress bar's) cannot hold a lock at the fork."""
        context = multiprocessing.get_context("fork")
        next_unit = context.Value("q", 0)  # the index of the next unit to take, shared by every process
        readers = {}
        for number in range(min(self.workers, len(units))):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=self._serve, args=(units, next_unit, writer), name=f"episodes-{number}")
            process.start()
            writer.close()  # the child holds the only writing end: its death is the reader's end of file
            readers[reader] = process
        return self._collect(readers)

    def _collect(self, readers: dict[Connection, Any]) -> Generator[list[Result], None, None]:
        processes = list(readers.values())
        try:
            while readers:
                for reader in cast(list[Connection], wait(list(readers))):
                    kind, payload = _receive(reader, readers[reader])
                    if kind == "batch":
                        yield cast(list[Result], payload)
                    elif kind == "failed":
                        raise cast(BaseException, payload)
                    else:
                        del readers[reader]
                        reader.close()
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
            for process in processes:
                process.join()
            for reader in readers:
                reader.close()

    def _serve(self, units: Sequence[Unit], next_unit, writer) -> None:
        """A forked process: take units until none is left, send each batch of results."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() == 1:  # the caller died before the line above
                os._exit(1)
        try:
            for batch in EpisodeThreads(self.run_one, self.concurrency).run_batches(_taken(units, next_unit)):
                writer.send(("batch", batch))
        except BaseException as error:  # the caller raises it: a bug must not vanish with this process
            _send_failure(writer, error)
        else:
            writer.send(("end", None))
        finally:
            writer.close()


def _taken(units: Sequence[Unit], next_unit) -> Iterator[Unit]:
    """The units no process has taken yet, one at a time (each is taken by one process only)."""
    while True:
        with next_unit.get_lock():
            number = next_unit.value
            if number >= len(units):
                return
            next_unit.value = number + 1
        yield units[number]


def _receive(reader, process) -> tuple[str, object]:
    try:
        return reader.recv()
    except EOFError:  # the pipe closed without an end: the process was killed or crashed
        process.join()
        return "failed", AgentError(
            f"an episode process (pid {process.pid}) ended without finishing, exit code {process.exitcode}; resume the run to finish it"
        )


def _send_failure(writer, error: BaseException) -> None:
    error.add_note("in an episode process:\n" + "".join(traceback.format_exception(error)).rstrip())
    try:
        writer.send(("failed", error))
    except Exception:  # an exception that cannot be pickled: its words
        writer.send(("failed", AgentError(f"{type(error).__name__}: {error}")))
