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

The same config gives the same trajectories at any concurrency (order aside): an episode's seed
comes from the run's seed, the question and the sample number, never from which thread runs it.
"""

from __future__ import annotations

import queue
import resource
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from agent.errors import AgentError

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
            raise AgentError(f"--concurrency {concurrency} needs about {needed} open files; this system allows {hard} "
                             "(ulimit -Hn); lower --concurrency or raise the limit")
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

    def run_batches(self, units: Iterable[Unit]) -> Iterator[list[Result]]:
        """As ``run``, but each time the results that have finished since the last batch (at
        least one): the caller can write them with one disk flush."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        count = 0
        for unit in units:
            pending.put(unit)
            count += 1
        if count == 0:
            return
        finished: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        threads = [threading.Thread(target=self._work, args=(pending, finished, stop), daemon=True,
                                    name=f"episode-{number}") for number in range(min(self.concurrency, count))]
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

    def _work(self, pending: queue.SimpleQueue, finished: queue.SimpleQueue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    unit = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    result = self.run_one(unit)
                except BaseException as error:  # the caller's thread raises it: a bug must not vanish with its thread
                    finished.put(_Failed(error))
                    return
                if not stop.is_set():
                    finished.put(result)
        finally:
            finished.put(_DONE)
