import gc

import pytest

from paper_explorer.corpus import BM25Index


@pytest.fixture(scope="module")
def index(small_demo):
    """The small demo corpus's index, built once per test module."""
    return BM25Index.build(small_demo)


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed and not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class BrokenIndex(BM25Index):
    """An index with a bug: its search raises (a module-level class, so the episode hosts' fork
    server, which unpickles the index, can import it)."""

    def search(self, *args, **kwargs):
        raise ValueError("a bug in the tool")


class CollectingIndex(BM25Index):
    """An index whose pickling (the episode hosts' payload, made while their registry is locked) runs
    the garbage collector, as any allocation there may."""

    def __getstate__(self):
        gc.collect()
        return self.__dict__
