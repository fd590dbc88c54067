"""Random code and random tool arguments never crash the host or outlive the limits."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus import BM25Index
from tools.sandbox import Limits, Sandbox

LIMITS = Limits(wall_seconds=2.0, cpu_seconds=1, memory_bytes=512 * 2**20, output_chars=2_000)

plain_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def sandbox(small_demo):
    with Sandbox(small_demo, LIMITS, index=BM25Index.build(small_demo)) as sb:
        yield sb


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.text(max_size=80))
def test_random_text_as_code(sandbox, code):
    result = sandbox.execute(code)
    assert result.seconds < LIMITS.wall_seconds + 1
    json.dumps(result.to_json())  # plain data only


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=st.sampled_from(["search", "read", "extract", "submit", "abstain"]),
       args=st.lists(plain_values, max_size=4),
       kwargs=st.dictionaries(st.sampled_from(["k", "query", "paper_id", "section", "page", "regex", "evidence", "x"]), plain_values, max_size=3))
def test_random_tool_arguments(small_demo, sandbox, tool, args, kwargs):
    code = f"{tool}(*{args!r}, **{kwargs!r})"
    result = sandbox.execute(code)
    assert result.seconds < LIMITS.wall_seconds + 1
    assert result.limit_hit is None, result
    assert result.error is None or "internal error" not in result.error
    if result.outcome is not None:  # an accidental valid submit: start a fresh episode
        sandbox.close()
        sandbox.start()
