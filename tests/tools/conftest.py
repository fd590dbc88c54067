import pytest

from corpus import BM25Index


@pytest.fixture(scope="module")
def index(small_demo):
    """The small demo corpus's index, built once per test module."""
    return BM25Index.build(small_demo)
