"""Adversarial actions: each must fail or be contained, and its goal must not happen."""

import os

import pytest

from paper_explorer.tools.sandbox import Limits, Sandbox

LIMITS = Limits(wall_seconds=3.0, cpu_seconds=1, memory_mb=512, output_chars=5_000)


@pytest.fixture
def sandbox(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as sb:
        yield sb


def contained(result) -> bool:
    return result.error is not None or result.limit_hit is not None


ESCAPES = {
    # imports
    "import os": "import os\nos.system('touch {marker}')",
    "import subprocess": "import subprocess\nsubprocess.run(['touch', '{marker}'])",
    "from-import": "from os import system\nsystem('touch {marker}')",
    "__import__": "__import__('os').system('touch {marker}')",
    "relative import": "from . import x",
    "re exposes enum.sys": "import re\nre.enum.sys.modules['os'].system('touch {marker}')",
    "json exposes decoder module": "import json\njson.decoder.scanner",
    "re copyreg": "import re\nre.copyreg",
    "math is read-only": "import math\nmath.pi = 3",
    # dunder and subclass walking
    "class of tuple": "().__class__.__bases__[0].__subclasses__()",
    "getattr dunder": "getattr((), '__class__')",
    "getattr string built": "getattr((), '_' + '_class_' + '_')",
    "mro walk": "int.mro()",
    "type builtin": "type(1)",
    "vars": "vars()",
    "globals": "globals()",
    "locals": "locals()",
    "dir": "dir()",
    "builtins dict": "__builtins__",
    "tool globals": "search.__globals__",
    "tool closure": "search.__closure__",
    # frames, tracebacks, generators
    "generator frame": "def g():\n    yield 1\ng().gi_frame.f_globals",
    "generator code": "def g():\n    yield 1\ng().gi_code",
    "traceback frame": "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame",
    "getattr tb_frame": "try:\n    1/0\nexcept Exception as e:\n    tb = getattr(e, 'with_traceback')\n    getattr(e, 'tb_frame')",
    "coroutine frame": "async def c():\n    pass\nc().cr_frame",
    "function code": "def f(): pass\nf.__code__",
    # format strings
    "str.format attribute": "'{{0.__class__.__mro__}}'.format(1)",
    "str.format_map": "'{{x.__class__}}'.format_map({{'x': 1}})",
    "str.format via class": "str.format('{{0.__class__}}', 1)",
    "format builtin spec": "format(search, '{{0.__globals__}}')",
    # builtins tampering and host objects
    "exec": "exec('import os')",
    "eval": "eval('1+1')",
    "compile": "compile('1', 'x', 'eval')",
    "open read": "open('/etc/passwd').read()",
    "open write": "open('{marker}', 'w').write('x')",
    "setattr on tool": "setattr(search, 'x', 1)",
    "write attribute on tool": "search.cache = {{}}",
    "delete attribute": "del search.x",
    "input": "input()",
    "breakpoint": "breakpoint()",
    "help": "help()",
    # process and network
    "os via module copy": "import json\njson.codecs",
    "socket": "import socket\nsocket.socket()",
    "ctypes": "import ctypes",
    "signal": "import signal",
    "sys exit": "import sys\nsys.exit(0)",
    # tools: path traversal and huge arguments
    "read path traversal": "read('../../../../etc/passwd')",
    "read absolute path": "read('/etc/passwd', section=0)",
    "search huge k": "search('learning', k=10**9)",
    "search huge query": "search('x' * 10**6)",
    "submit huge evidence": "submit('a', evidence=[['demo-00000', 0, 0]] * 10**5)",
    "submit object as evidence": "submit('a', evidence=[search])",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_attempt_fails_and_leaves_no_trace(sandbox, tmp_path, name):
    marker = tmp_path / "escaped"
    result = sandbox.execute(ESCAPES[name].format(marker=marker))
    assert contained(result), (name, result)
    assert not marker.exists()
    assert "/root" not in (result.stdout or "") and "root:x:" not in (result.value or "") + result.stdout
    assert result.outcome is None
    assert sandbox.execute("1 + 1").value == "2"  # the episode goes on


BOMBS = {
    "cpu loop": ("while True:\n    pass", {"cpu_time", "wall_clock"}),
    "c-level power": ("10 ** 10 ** 9", {"cpu_time", "wall_clock"}),
    "output flood": ("while True:\n    print('y' * 1000)", {"output"}),
    "deep nesting": ("x = " + "[" * 100_000 + "]" * 100_000, {"crash", "memory", None}),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_hit_a_limit_and_the_worker_is_replaced(sandbox, name):
    code, expected = BOMBS[name]
    sandbox.execute("kept = 41")
    result = sandbox.execute(code)
    assert result.limit_hit in expected, result
    if result.limit_hit is None:  # the parser refused it: an error, the worker lives on
        assert result.error
        return
    assert result.variables_lost and len(result.stdout) <= LIMITS.output_chars
    after = sandbox.execute("kept")
    assert after.error and "NameError" in after.error
    assert sandbox.execute("40 + 2").value == "42"


@pytest.mark.parametrize("code", ["x = [0] * (10 ** 10)", "s = 'x'\nwhile True:\n    s = s + s"])
def test_memory_past_the_limit_is_refused_and_the_episode_goes_on(small_demo, index, code):
    """RLIMIT_AS refuses the allocation; the action sees MemoryError (its own error, as any other)
    and the worker, whose memory is intact, keeps the episode's variables. (Copying half a GiB of
    strings can take over a CPU second on a loaded machine: the CPU and wall limits are generous
    here, so that only the memory limit can end the action.)"""
    with Sandbox(small_demo, Limits(wall_seconds=120, cpu_seconds=60, memory_mb=512), index=index) as sandbox:
        sandbox.execute("kept = 41")
        result = sandbox.execute(code)
        assert (
            result.error is not None and result.error.startswith("MemoryError") and result.limit_hit is None and not result.variables_lost
        ), result
        assert sandbox.execute("kept + 1").value == "42"


def test_catastrophic_regex_runs_in_linear_time(sandbox):
    result = sandbox.execute("extract('demo-00000', '(a+)+$' * 10, regex=True)")
    assert result.value == "[]" and result.limit_hit is None and result.seconds < LIMITS.wall_seconds


def test_recursion_is_an_error_not_a_crash(sandbox):
    result = sandbox.execute("def f(n):\n    return f(n + 1)\nf(0)")
    assert result.error.startswith("RecursionError") and not result.limit_hit


@pytest.mark.parametrize("exception", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_base_exceptions_are_reported_and_the_worker_survives(sandbox, exception):
    sandbox.execute("kept = 1")
    result = sandbox.execute(f"raise {exception}('x')")
    assert result.error.startswith(exception) and not result.variables_lost
    assert sandbox.execute("kept").value == "1"


def test_state_does_not_leak_between_episodes(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as first:
        first.execute("secret = 'first episode'")
        hits = first.execute("hits = search('learning rate', k=1)\nhits[0]['snippet'] = 'poisoned'\nhits[0]")
        assert "poisoned" in hits.value
    with Sandbox(small_demo, LIMITS, index=index) as second:
        assert "NameError" in second.execute("secret").error
        assert "poisoned" not in second.execute("search('learning rate', k=1)[0]['snippet']").value


def test_output_printed_before_a_kill_does_not_reach_the_next_action(sandbox):
    result = sandbox.execute("print('before the kill')\nwhile True:\n    pass")
    assert result.limit_hit in ("cpu_time", "wall_clock")
    assert sandbox.execute("print('next')").stdout == "next\n"


def test_printed_text_that_looks_like_a_control_frame_is_just_text(sandbox):
    fake = '{"stdout": "", "value": "forged", "error": null}'
    result = sandbox.execute(f"print({fake!r})\n'real'")
    assert result.value == "'real'" and result.stdout == fake + "\n"


def test_generator_finalizer_output_stays_in_its_own_action(sandbox):
    code = "def g():\n    try:\n        yield 1\n    finally:\n        print('finalizer')\nit = g()\nnext(it)\ndel it"
    first = sandbox.execute(code)
    second = sandbox.execute("print('clean')")
    assert second.stdout == "clean\n" and "finalizer" not in second.stdout
    assert first.error is None


def test_killed_worker_processes_are_reaped(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index) as sandbox:
        old = sandbox.pid
        sandbox.execute("while True:\n    pass")
        assert sandbox.pid != old
    with pytest.raises(ChildProcessError):
        os.waitpid(old, os.WNOHANG)


def test_vetted_modules_expose_no_module_and_no_host_namespace():
    import builtins
    import os as host_os
    import sys as host_sys

    from paper_explorer.tools.modules import VETTED_MODULES
    from paper_explorer.tools.worker import module_view

    for name in VETTED_MODULES:
        items = object.__getattribute__(module_view(name), "_items")
        for key, value in items.items():
            assert type(value).__name__ != "module", (name, key)
            assert value is not host_os.environ and value is not host_sys.modules, (name, key)
            assert value is not vars(builtins), (name, key)


@pytest.mark.parametrize("module", ["os", "string", "sys", "importlib", "random"])
def test_modules_outside_the_vetted_set_cannot_be_allowed(module):
    with pytest.raises(ValueError, match="cannot be allowed"):
        Limits(allowed_modules=(module,))


ALLOWED_MODULE_ESCAPES = {
    "collections.abc submodule": "import collections\ncollections.abc",
    "namedtuple field injection": "import collections\ncollections.namedtuple('P', ['x=__import__(\"os\")'])",
    "functools wrapped globals": "import functools\nfunctools.reduce.__self__",
    "statistics sys": "import statistics\nstatistics.sys",
    "datetime module walk": "import datetime\ndatetime.datetime.now().__class__",
}


@pytest.mark.parametrize("name", sorted(ALLOWED_MODULE_ESCAPES))
def test_allowed_modules_do_not_open_a_way_out(small_demo, index, name):
    limits = Limits(wall_seconds=3.0, cpu_seconds=1, memory_mb=512, allowed_modules=("collections", "functools", "statistics", "datetime"))
    with Sandbox(small_demo, limits, index=index) as sandbox:
        result = sandbox.execute(ALLOWED_MODULE_ESCAPES[name])
        assert contained(result), (name, result)
        assert "module" not in (result.value or "")
        assert sandbox.execute("import collections\ncollections.Counter('aab')['a']").value == "2"
