"""Random code and random tool arguments never crash the host or outlive the limits."""

import json
import resource
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paper_explorer.corpus import BM25Index
from paper_explorer.tools import registry
from paper_explorer.tools.paper_tools import PaperTools
from paper_explorer.tools.sandbox import Limits, Sandbox

LIMITS = Limits(wall_seconds=2.0, cpu_seconds=1, memory_mb=512, output_chars=2_000)

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
@given(
    tool=st.sampled_from(["search", "read", "extract", "submit", "abstain"]),
    args=st.lists(plain_values, max_size=4),
    kwargs=st.dictionaries(
        st.sampled_from(["k", "query", "paper_id", "section", "page", "regex", "evidence", "x"]), plain_values, max_size=3
    ),
)
def test_random_tool_arguments(small_demo, sandbox, tool, args, kwargs):
    code = f"{tool}(*{args!r}, **{kwargs!r})"
    result = sandbox.execute(code)
    assert result.seconds < LIMITS.wall_seconds + 1
    assert result.limit_hit is None, result
    assert result.error is None or "internal error" not in result.error
    if result.outcome is not None:  # an accidental valid submit: start a fresh episode
        sandbox.close()
        sandbox.start()


# -- frames: a worker that has escaped the language layer writes whatever it likes on its channel --


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


frames = st.one_of(
    st.builds(
        lambda tool, args, kwargs: _frame(json.dumps({"op": "call", "tool": tool, "args": args, "kwargs": kwargs}).encode()),
        st.sampled_from(["search", "read", "submit", "abstain", "open", ""]),
        st.lists(plain_values, max_size=3),
        st.dictionaries(st.text(max_size=6), plain_values, max_size=2),
    ),
    st.builds(
        lambda fields: _frame(json.dumps({"op": "done", **fields}).encode()),
        st.dictionaries(st.sampled_from(["stdout", "value", "error", "traceback", "deferred_output_chars", "outcome"]), plain_values),
    ),
    st.builds(lambda size, body: struct.pack(">I", size) + body, st.integers(0, 2**32 - 1), st.binary(max_size=64)),
    st.builds(_frame, st.binary(max_size=200)),
    st.binary(min_size=1, max_size=64),
)
endings = st.sampled_from(["os.read(3, 1)", "os._exit(0)", "None", "while True:\n    pass"])


@pytest.fixture(scope="module")
def escaped(small_demo):
    limits = Limits(wall_seconds=0.3, cpu_seconds=0.25, memory_mb=512, output_chars=2_000)
    with Sandbox(small_demo, limits, index=BM25Index.build(small_demo), restricted=False) as sb:
        yield sb


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(frames, min_size=1, max_size=4), ending=endings)
def test_random_frames_from_the_worker_never_break_the_host(escaped, pieces, ending):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = b"".join(pieces)
    result = escaped.execute(f"import os\nos.write(3, {data!r})\n{ending}")
    assert result.limit_hit in (None, "output", "protocol", "wall_clock", "cpu_time", "crash"), result
    assert len(result.stdout) <= 2_000 and all(call.name in registry.names() for call in result.tool_calls)
    if escaped.outcome is not None:  # only a well-formed submit/abstain call frame can end the episode
        assert any(call.name in ("submit", "abstain") and call.error is None for call in result.tool_calls)
        escaped.close()
        escaped.tools = PaperTools(escaped.corpus, escaped.index)
        escaped.start()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000
    after = escaped.execute("print(6 * 7)")
    if after.limit_hit is not None:  # a worker that left bytes of a reply unread is out of step: it ends, once
        after = escaped.execute("print(6 * 7)")
    assert after.stdout == "42\n", after


@pytest.mark.parametrize("header", [2**32 - 1, 2**31, 64 << 20])
def test_a_frame_announcing_gigabytes_costs_the_host_four_bytes(escaped, header):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = escaped.execute(f"import os, struct\nos.write(3, struct.pack('>I', {header}))\nos.write(3, b'x' * (1 << 20))\nos.read(3, 1)")
    assert result.limit_hit == "output" and result.variables_lost
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000


def test_a_truncated_frame_ends_at_the_wall_clock_not_never(escaped):
    result = escaped.execute("import os\nos.write(3, b'\\x00\\x00\\x01\\x00{\"op\"')\nos.read(3, 1)")
    assert result.limit_hit == "wall_clock"


def test_a_worker_that_never_reads_cannot_block_the_host(small_demo):
    """The host's writes have deadlines too: a reply the worker never reads ends at the wall clock."""
    limits = Limits(wall_seconds=2.0, cpu_seconds=1.5, memory_mb=512)
    with Sandbox(small_demo, limits, index=BM25Index.build(small_demo), restricted=False) as sb:
        call = json.dumps({"op": "call", "tool": "read", "args": ["demo-00000", 0], "kwargs": {}}).encode()
        result = sb.execute(f"import os\nfor i in range(100000):\n    os.write(3, {_frame(call)!r})\nwhile True:\n    pass")
        assert result.limit_hit in ("wall_clock", "cpu_time")
