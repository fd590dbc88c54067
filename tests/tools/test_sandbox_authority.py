"""The host alone decides outcomes, tool-call records and limits; output from every path is captured.
One property each; the actions are RestrictedPython, as a policy writes them."""

import resource

import pytest

from paper_explorer.tools.sandbox import Limits, Sandbox
from tests.tools.conftest import BrokenIndex

LIMITS = Limits(wall_seconds=5.0, cpu_seconds=2, memory_mb=512, output_chars=2_000)
FINALIZER = """
def armed():
    try:
        yield 1
    finally:
        print('printed by a finalizer')
        submit('forged by a finalizer', evidence=[])
it = armed()
next(it)
cycle = [it]
cycle.append(cycle)
del it
del cycle
"""


@pytest.fixture
def sandbox(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as sb:
        yield sb


def test_a_finalizer_cannot_submit_and_its_output_is_dropped_and_counted(sandbox):
    armed = sandbox.execute(FINALIZER)
    later = sandbox.execute("x = [[] for i in range(50000)]\n'later'")
    assert armed.outcome is None and later.outcome is None and sandbox.outcome is None
    assert "finalizer" not in armed.stdout + later.stdout
    # the print, and the report of the ToolError that refused the finalizer's submit
    assert armed.deferred_output_chars > len("printed by a finalizer\n")
    assert not any(call.name == "submit" for call in armed.tool_calls + later.tool_calls)


def test_raising_memory_error_is_an_error_not_a_limit(sandbox):
    sandbox.execute("kept = 7")
    result = sandbox.execute("raise MemoryError('pretend')")
    assert result.error == "MemoryError: pretend" and result.limit_hit is None and not result.variables_lost
    assert sandbox.execute("kept").value == "7"


def test_finally_return_does_not_swallow_the_output_limit(sandbox):
    code = "def flood():\n    try:\n        while True:\n            print('y' * 100)\n    finally:\n        return 1\nflood()"
    result = sandbox.execute(code)
    assert result.limit_hit == "output" and len(result.stdout) == LIMITS.output_chars and result.variables_lost


def test_a_submission_survives_the_error_that_follows_it(sandbox):
    result = sandbox.execute("submit('an answer', evidence=[])\nraise ValueError('x' * 10**6)")
    assert result.outcome.answer == "an answer" and result.error.startswith("ValueError")
    assert len(result.error) < 3_000 and sandbox.outcome.answer == "an answer"


def test_a_submission_survives_running_into_the_wall_clock(small_demo, index):
    limits = Limits(wall_seconds=1.0, cpu_seconds=30, memory_mb=512)
    with Sandbox(small_demo, limits, index=index) as sandbox:
        result = sandbox.execute("submit('before the loop', evidence=[])\nwhile True:\n    pass")
        assert result.limit_hit == "wall_clock" and result.outcome.answer == "before the loop"
        assert sandbox.outcome.answer == "before the loop"


def test_a_submission_survives_running_into_the_cpu_limit(small_demo, index):
    """(The wall limit is far above the CPU limit: on a loaded machine the worker gets a fraction of a
    core, and only the CPU limit may end this action.)"""
    with Sandbox(small_demo, Limits(wall_seconds=300, cpu_seconds=2), index=index) as sandbox:
        result = sandbox.execute("submit('before the loop', evidence=[])\nwhile True:\n    pass")
    assert result.limit_hit == "cpu_time" and result.outcome.status == "submitted"


def test_the_first_valid_submission_is_the_outcome(sandbox):
    first = sandbox.execute("submit('first', evidence=[])")
    second = sandbox.execute("submit('second', evidence=[])")
    assert first.outcome.answer == "first" and second.outcome is None
    assert "already ended" in second.error and sandbox.outcome.answer == "first"


def test_calls_at_the_recursion_limit_are_recorded_as_they_happened(sandbox):
    code = """
ok = []
def deep(n):
    try:
        return deep(n + 1)
    except Exception:
        hits = search('learning rate', k=1)
        ok.append(1)
        return hits
deep(0)
print(len(ok))
"""
    result = sandbox.execute(code)
    assert result.error is None and result.limit_hit is None, result
    clean = [call for call in result.tool_calls if call.error is None]
    assert result.stdout.strip() == str(len(clean)) != "0"  # every recorded call was answered, and only those
    follow = sandbox.execute("search('learning rate', k=1)[0]['paper_id']")
    assert follow.error is None and follow.tool_calls[0].name == "search"


def test_a_failure_inside_a_tool_is_recorded_as_an_internal_error(small_demo):
    """The tools run in the episode's host process, so the bug is planted in what that process is
    given: an index whose search raises."""
    with Sandbox(small_demo, LIMITS, index=BrokenIndex.build(small_demo)) as sandbox:
        result = sandbox.execute("try:\n    search('learning rate')\nexcept ToolError as e:\n    print('tool error')")
    assert result.stdout == "tool error\n"
    assert result.tool_calls[0].error.startswith("internal error: ValueError")


@pytest.mark.parametrize(
    "code",
    [
        "submit('a', evidence=[{'paper_id': 'x' * 10**6, 'section': 0, 'paragraph': 0}] * 20)",
        "s = 'x' * 10**6\nsubmit('a', evidence=[{'paper_id': s, 'section': 0, 'paragraph': 0}] * 20)",
        "submit('a', evidence=[{str(i): i for i in range(10**6)}])",
        "read('demo-00000', section='x' * 10**6)",
        "search('q', k=[list(range(1000))] * 1000)",
    ],
)
def test_huge_arguments_are_refused_by_the_host_and_recorded(sandbox, code):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = sandbox.execute(code)
    assert result.error and "ToolError" in result.error and result.outcome is None
    assert len(result.tool_calls) == 1 and result.tool_calls[0].error
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: the host did not hold it


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import re\nre.compile('a+b', 128)\nNone", "LITERAL 98"),
        ("x = 1 is 1", "SyntaxWarning"),
        (
            "def g():\n    try:\n        yield 1\n    finally:\n        raise ValueError('late')\nit = g()\nnext(it)\ndel it",
            "Exception ignored",
        ),
    ],
)
def test_output_from_every_path_lands_in_the_capture(sandbox, capfd, code, expected):
    result = sandbox.execute(code)
    out, err = capfd.readouterr()
    assert expected in result.stdout and out == "" and err == ""


def test_a_flood_of_unraisable_exceptions_is_capped_like_print(sandbox, capfd):
    code = (
        "def g():\n    try:\n        yield 1\n    finally:\n        raise ValueError('late')\n"
        "for i in range(10000):\n    it = g()\n    next(it)\n    del it"
    )
    result = sandbox.execute(code)
    assert result.limit_hit == "output" and len(result.stdout) == LIMITS.output_chars
    assert capfd.readouterr() == ("", "")


def test_records_of_calls_stay_small_whatever_the_arguments(sandbox):
    result = sandbox.execute(
        "big = 'q' * 12000\nfor i in range(30):\n    try:\n        submit('a', evidence=[big + str(i)] * 20)\n"
        "    except ToolError:\n        pass"
    )
    assert len(result.tool_calls) == 30 and all(len(repr(call)) < 3_000 for call in result.tool_calls)
    assert "arguments_not_recorded" in result.tool_calls[0].arguments
    cut = sandbox.execute("search('q' * 400)")  # within the tool's own bounds: recorded, cut and marked
    assert "characters not recorded" not in repr(cut.tool_calls)


def test_an_action_may_make_only_so_many_tool_calls(small_demo, index):
    with Sandbox(small_demo, Limits(tool_calls=20), index=index) as sandbox:
        sandbox.execute("kept = 1")
        result = sandbox.execute("for i in range(1000):\n    read('demo-00000')")
        assert result.limit_hit == "tool_calls" and len(result.tool_calls) == 20 and result.variables_lost
        assert sandbox.execute("read('demo-00000')[:10]").error is None


@pytest.mark.parametrize("section", ["'\u00b2'", "'9' * 5000", "'x' * 100000", "'  12  '"])
def test_odd_section_arguments_are_tool_errors_not_internal_ones(sandbox, section):
    result = sandbox.execute(f"read('demo-00000', section={section})")
    assert result.error.startswith("ToolError") and len(result.error) < 400
    assert "internal error" not in (result.tool_calls[0].error or "")


def test_a_regex_too_large_to_compile_is_refused_not_built(sandbox):
    result = sandbox.execute("extract('demo-00000', '.{0,1000}' * 49 + 'x', regex=True)")
    assert result.error.startswith("ToolError") and "too large" in result.error


def test_calls_with_star_arguments_work(sandbox):
    assert sandbox.execute("d = {'k': 2}\nmax(*[1, 3], **{}) + dict(**d)['k']").value == "5"


def test_datetime_formatting_works_and_time_stays_out(small_demo, index):
    with Sandbox(small_demo, Limits(allowed_modules=("datetime",)), index=index) as sandbox:
        assert sandbox.execute("import datetime\nf'{datetime.date(2020, 1, 2):%Y-%m}'").value == "'2020-01'"
        assert sandbox.execute("import datetime\ndatetime.date(2021, 5, 6).strftime('%d')").value == "'06'"
        assert sandbox.execute("import time").error.startswith("ImportError")


def test_classes_can_be_defined(sandbox):
    assert sandbox.execute("class Box:\n    def size(self):\n        return 3\nBox().size()").value == "3"


def test_denied_module_import_names_what_is_allowed(sandbox):
    assert "allowed: math, re, json" in sandbox.execute("import functools").error


def test_cycles_dropped_in_later_actions_do_not_fill_the_memory_budget(small_demo, index):
    """Survivors of an action are frozen (later collections skip them); cycles dropped afterwards
    must still be collected before they exhaust the budget and fail an innocent action."""
    with Sandbox(small_demo, Limits(memory_mb=200, wall_seconds=60, cpu_seconds=30), index=index) as sandbox:
        errors = [sandbox.execute("g = [0] * (5 * 10**6)\ng.append(g)\nlen(g)").error for _ in range(12)]
        assert errors == [None] * 12


@pytest.mark.parametrize("code", ['search(**{"\\x00deep": 1})', 'submit(**{"\\x00x": "a"})', 'search("q", k={"\\x00toolarge": ""})'])
def test_keys_that_look_like_wire_markers_are_a_refused_call_not_a_protocol_breach(sandbox, code):
    """A dict key starting with NUL is how the wire marks an argument that could not cross: one in
    the action's own arguments is refused and recorded like any bad argument, and the episode goes on."""
    sandbox.execute("kept = 1")
    result = sandbox.execute(code)
    assert result.limit_hit is None and not result.variables_lost and "ToolError" in result.error
    assert len(result.tool_calls) == 1 and "NUL" in result.tool_calls[0].error and result.outcome is None
    assert sandbox.execute("kept").value == "1"
