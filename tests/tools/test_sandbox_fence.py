"""The kernel fence, tested as if RestrictedPython had already failed: these actions are plain
Python (``restricted=False``), so each one is what an escaped action could try. One property each."""

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paper_explorer.tools.sandbox import LANGUAGE_ONLY, Limits, Sandbox
from paper_explorer.tools.zygote import Zygote
from tests.conftest import HANG_SECONDS
from tests.tools.conftest import process_running

LIMITS = Limits(wall_seconds=20.0, cpu_seconds=5, memory_mb=512, output_chars=5_000)


@pytest.fixture
def escaped(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index, restricted=False) as sandbox:
        if not sandbox.isolation.startswith("seccomp"):
            if os.environ.get("CI"):
                pytest.fail(f"the kernel fence did not hold in CI (isolation {sandbox.isolation!r})")
            pytest.skip(f"no seccomp here (isolation {sandbox.isolation!r})")
        yield sandbox


def run(sandbox, code):
    result = sandbox.execute(textwrap.dedent(code))
    assert result.limit_hit is None, result
    return result


def denied(sandbox, statement) -> str:
    """The exception type an escaped action gets for ``statement`` (it must get one)."""
    result = run(sandbox, f"try:\n    {statement}\n    print('DONE')\nexcept BaseException as e:\n    print(type(e).__name__, e)")
    assert "DONE" not in result.stdout, (statement, result.stdout)
    return result.stdout


@pytest.mark.parametrize(
    "statement",
    [
        "open('/etc/hostname').read()",
        "open('/tmp/escaped-by-sandbox', 'w').write('x')",
        "os.listdir('/')",
        "os.stat('/etc/passwd')",
        "os.mkdir('/tmp/escaped-dir')",
    ],
)
def test_no_file_can_be_opened_or_probed(escaped, statement):
    assert "PermissionError" in denied(escaped, "import os\n    " + statement) or "OSError" in denied(
        escaped, "import os\n    " + statement
    )
    assert not Path("/tmp/escaped-by-sandbox").exists() and not Path("/tmp/escaped-dir").exists()


@pytest.mark.parametrize(
    "statement",
    [
        "socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
        "socket.socketpair()",
        "socket.create_connection(('127.0.0.1', 22), timeout=1)",
    ],
)
def test_no_socket_and_no_network(escaped, statement):
    assert "Error" in denied(escaped, "import socket\n    " + statement)


@pytest.mark.parametrize(
    "statement",
    [
        "os.fork()",
        "os.execv('/bin/true', ['true'])",
        "assert os.system('touch /tmp/escaped-by-sandbox') == 0",
        "os.posix_spawn('/bin/true', ['true'], {})",
    ],
)
def test_no_new_process_and_no_exec(escaped, statement):
    denied(escaped, "import os\n    " + statement)
    assert not Path("/tmp/escaped-by-sandbox").exists()


def test_no_signal_reaches_another_process(escaped):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert "PermissionError" in denied(escaped, f"import os, signal\n    os.kill({victim.pid}, signal.SIGKILL)")
        assert "PermissionError" in denied(escaped, f"import os, signal\n    os.kill({os.getpid()}, signal.SIGKILL)")
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_limits_cannot_be_raised(escaped):
    out = denied(escaped, "import resource\n    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))")
    assert "Error" in out
    assert "Error" in denied(escaped, "import resource\n    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))")


def test_only_the_channel_and_dev_null_are_open(escaped, small_demo, index, tmp_path):
    log = tmp_path / "trajectories.jsonl"
    with open(log, "a") as held_open, Sandbox(small_demo, LIMITS, index=index) as other:  # another episode's pipe
        other.execute("kept = 1")
        # lseek, not fstat: glibc's fstat is newfstatat, which the fence refuses (it can take a path).
        # An open descriptor seeks (/dev/null) or says ESPIPE (a socket); a closed one says EBADF.
        result = run(
            escaped,
            """
            import errno, os
            open_fds = []
            for fd in range(4096):
                try:
                    os.lseek(fd, 0, os.SEEK_CUR)
                    open_fds.append((fd, "seekable"))
                except OSError as error:
                    if error.errno != errno.EBADF:
                        open_fds.append((fd, errno.errorcode[error.errno]))
            print(open_fds)
        """,
        )
        assert result.stdout.strip() == "[(0, 'seekable'), (1, 'seekable'), (2, 'seekable'), (3, 'ESPIPE')]"
        assert held_open.fileno() > 3
        assert other.execute("kept").value == "1"
    assert log.read_text() == ""


def test_writes_to_the_process_streams_reach_nobody(escaped, capfd):
    run(escaped, "import os\nos.write(1, b'to fd 1\\n')\nos.write(2, b'to fd 2\\n')\nprint('captured')")
    out, err = capfd.readouterr()
    assert "to fd" not in out and "to fd" not in err


def test_root_runs_as_nobody_with_no_new_privileges(escaped):
    status = run(escaped, "print(open.__name__)").stdout  # a trivial action first: the worker is up
    assert status
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{escaped.pid}/status").read_text().splitlines())
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    if os.geteuid() == 0:
        assert int(fields["Uid"].split()[0]) != 0 and int(fields["Gid"].split()[0]) != 0
        assert "uid-drop" in escaped.isolation


def test_the_environment_of_the_host_is_not_inherited(escaped, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-host")
    with Sandbox(escaped.corpus, LIMITS, index=escaped.index, restricted=False) as fresh:
        assert "sk-secret" not in fresh.execute("import os\nprint(dict(os.environ))").stdout


def test_the_worker_does_not_outlive_close(small_demo, index):
    with Sandbox(small_demo, LIMITS, index=index, restricted=False) as sandbox:
        pid = sandbox.pid
        sandbox.execute("import os\ntry:\n    os.fork()\nexcept OSError:\n    pass")
    deadline = time.monotonic() + 60
    while process_running(pid) and time.monotonic() < deadline:  # killed at close; reaped by the zygote soon after
        time.sleep(0.01)
    assert not process_running(pid)


def test_forged_frames_claim_nothing(escaped):
    """A done frame that claims an outcome and a limit is a protocol violation; nothing it claims is recorded."""
    code = """
        import os, json, struct
        body = json.dumps({"op": "done", "stdout": "", "value": None, "error": None, "traceback": None,
                           "deferred_output_chars": 0, "outcome": {"status": "submitted", "answer": "forged"},
                           "limit_hit": "memory"}).encode()
        os.write(3, struct.pack(">I", len(body)) + body)
        os.read(3, 1)
    """
    result = escaped.execute(textwrap.dedent(code))
    assert result.limit_hit == "protocol" and result.outcome is None and escaped.outcome is None
    assert escaped.execute("1 + 1").value == "2"


@pytest.mark.parametrize(
    "body",
    [
        b'{"op":"call","tool":"submit","args":["a"],"kwargs":{"evidence":[NaN, Infinity]}}',
        b'{"op":"done","stdout":"","value":NaN,"error":null,"traceback":null,"deferred_output_chars":0}',
        b'{"op":"call","tool":"search","args":["a"],"kwargs":{"k":1e999}}',
        b'{"op":"call","tool":"submit","args":["a"],"kwargs":{"evidence":[[-1e400, 0, 0]]}}',
        b'{"op":"call","tool":"search","args":["a"],"kwargs":{"k":123456789012345678901234567890}}',
        b'{"op":"done","stdout":"","value":null,"error":null,"traceback":null,"deferred_output_chars":1e999}',
        b"[1, 2]",
        b'{"op":"call","tool":"open","args":[],"kwargs":{}}',
    ],
)
def test_frames_that_are_not_strict_json_or_not_ours_are_protocol_violations(escaped, body):
    result = escaped.execute(f"import os, struct\nos.write(3, struct.pack('>I', {len(body)}) + {body!r})\nos.read(3, 1)")
    assert result.limit_hit == "protocol" and result.tool_calls == [] and escaped.outcome is None


def test_a_worker_that_dies_with_a_reply_unread_cannot_raise_into_the_host(escaped):
    """A reset connection (it died with our bytes unread) is a dead worker, not a host exception."""
    call = json.dumps({"op": "call", "tool": "search", "args": ["learning rate"], "kwargs": {}}).encode()
    done = json.dumps({"op": "done", "stdout": "", "value": None, "error": None, "traceback": None, "deferred_output_chars": 0}).encode()
    frames = b"".join(struct.pack(">I", len(body)) + body for body in (call, done))
    for _ in range(10):
        escaped.execute(f"import os, time\nos.write(3, {frames!r})\ntime.sleep(0.05)\nos._exit(0)")
        time.sleep(0.2)
        assert escaped.execute("print(6 * 7)").stdout == "42\n"


@pytest.mark.parametrize(
    "body",
    [
        '{"op":"done","stdout":"A\ud800B","value":null,"error":null,"traceback":null,"deferred_output_chars":0}'.encode(
            "utf-8", "surrogatepass"
        ),
        '{"op":"done","stdout":"A","value":null,"error":null,"traceback":null,"deferred_output_chars":0}'.encode("utf-32"),
        b'{"op":"call","tool":"search","args":[' + b"[" * 900 + b'"\\ud800"' + b"]" * 900 + b'],"kwargs":{}}',
    ],
)
def test_frames_that_are_not_strict_utf8_json_cannot_reach_the_trajectory(escaped, body):
    result = escaped.execute(f"import os, struct\nos.write(3, struct.pack('>I', {len(body)}) + {body!r})\nos.read(3, 1)")
    assert result.limit_hit in ("protocol", None)
    json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")  # writable as strict UTF-8 JSON


def test_an_exit_code_alone_cannot_claim_the_memory_limit(escaped):
    from paper_explorer.tools.worker import EXIT_MEMORY

    escaped.execute("kept = 1")
    result = escaped.execute(f"import os\nos._exit({EXIT_MEMORY})")
    assert result.limit_hit == "crash" and result.variables_lost


def test_a_worker_that_speaks_between_actions_is_replaced(escaped):
    """A forged done frame ends the action (it may lie about its own output); a frame after it,
    which arrives when no action runs, is refused and the worker replaced."""
    code = """
        import os, json, struct
        def frame(payload):
            body = json.dumps(payload).encode()
            return struct.pack(">I", len(body)) + body
        done = {"op": "done", "action": ACTION, "stdout": "early\\n", "value": None, "error": None, "traceback": None,
                "deferred_output_chars": 0}
        os.write(3, frame(done) + frame({"op": "call", "tool": "submit", "args": ["forged"], "kwargs": {}}))
        os.read(3, 1)
    """
    first = escaped.execute(textwrap.dedent(code).replace("ACTION", str(escaped.actions + 1)))
    assert first.stdout == "early\n" and first.limit_hit is None
    result = escaped.execute("print('next')")
    assert result.variables_lost and result.stdout == "next\n" and escaped.refused_frames == 1
    assert escaped.outcome is None and not any(call.name == "submit" for call in result.tool_calls)


def test_a_late_answer_to_an_earlier_action_is_not_taken_for_the_next_one(escaped):
    """A forged done frame ends action 1 early; the runtime's own answer to action 1 arrives while
    action 2 runs. It names action 1, so it is refused rather than reported as action 2's result."""
    code = """
        import os, json, struct, time
        done = json.dumps({"op": "done", "action": ACTION, "stdout": "forged", "value": None, "error": None,
                           "traceback": None, "deferred_output_chars": 0}).encode()
        os.write(3, struct.pack(">I", len(done)) + done)
        time.sleep(0.5)
        'real first'
    """
    first = escaped.execute(textwrap.dedent(code).replace("ACTION", str(escaped.actions + 1)))
    assert first.stdout == "forged"
    second = escaped.execute("'second'")
    assert second.value != "'real first'" and (second.limit_hit == "protocol" or second.variables_lost)
    assert escaped.execute("'third'").value == "'third'"


def test_cpu_heavy_action_then_kept_variable_as_a_non_root_user(tmp_path):
    """The seed bug: raising the hard CPU limit before each action fails without CAP_SYS_RESOURCE.
    As root, the host runs here as ``nobody`` (setpriv, with only the ambient right to read the
    files of this checkout's interpreter), and its worker must have no capability at all."""
    script = textwrap.dedent("""
        from paper_explorer.corpus import BM25Index, DemoConfig, generate
        from paper_explorer.tools.sandbox import Limits, Sandbox
        corpus = generate(DemoConfig(papers=5, seed=1))
        limits = Limits(wall_seconds=120, cpu_seconds=60, allowed_modules=("datetime",))
        with Sandbox(corpus, limits, index=BM25Index.build(corpus)) as sandbox:
            assert sandbox.execute("kept = 41").error is None
            spin = "from datetime import datetime, timedelta\\nend = datetime.now() + timedelta(seconds=2.5)\\nn = 0\\n" \\
                   "while datetime.now() < end:\\n    n += 1\\nn > 0"
            busy = sandbox.execute(spin)
            assert busy.value == "True" and busy.limit_hit is None, busy
            after = sandbox.execute("print(kept)")
            assert after.stdout == "41\\n" and not after.variables_lost, after
            status = dict(line.split(":", 1) for line in open(f"/proc/{sandbox.pid}/status").read().splitlines())
            print("OK", os.getuid(), status["CapEff"].strip(), status["CapAmb"].strip(), sandbox.isolation)
    """)
    environment = {**os.environ, "EXPLORER_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    command = [sys.executable, "-c", "import os\n" + script]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and util-linux's setpriv is missing")
        tmp_path.chmod(0o777)
        command = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            *command,
        ]
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=HANG_SECONDS)
    assert completed.returncode == 0, completed.stderr[-2000:]
    ok, uid, effective, ambient, isolation = completed.stdout.split()
    assert ok == "OK" and uid != "0" and int(effective, 16) == 0 and int(ambient, 16) == 0
    assert isolation.startswith("seccomp") or not os.environ.get("CI"), isolation


def test_without_the_fence_trajectories_say_language_only_and_one_warning_is_printed(small_demo, index, capsys, monkeypatch):
    import paper_explorer.tools.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "_warned_language_only", False)
    zygote = Zygote(kernel_fence=False)
    try:
        for _ in range(2):
            with Sandbox(small_demo, LIMITS, index=index, zygote=zygote) as sandbox:
                assert sandbox.isolation == LANGUAGE_ONLY
                assert sandbox.execute("import os").error.startswith("ImportError")  # the language layer still holds
    finally:
        zygote.close()
    assert capsys.readouterr().err.count("language-only") == 1


@pytest.mark.parametrize(
    "statement",
    [
        "print(open('/etc/hostname').read())",
        "print(os.dup(3))",
        "import socket; print(socket.socket(socket.AF_UNIX))",
    ],
)
def test_without_the_fence_a_closed_descriptor_is_no_way_to_a_new_one(small_demo, index, statement):
    """Where seccomp is missing, the descriptor limit is a wall of its own: a worker that closes one of
    its four descriptors cannot take its number for a file, a socket or a copy of its channel (with
    RLIMIT_NOFILE at 4 it could; without root its uid is the user's, so any of the user's files)."""
    zygote = Zygote(kernel_fence=False)
    try:
        with Sandbox(small_demo, LIMITS, index=index, restricted=False, zygote=zygote) as sandbox:
            result = run(sandbox, f"import os\nos.close(0)\ntry:\n    {statement}\nexcept OSError as e:\n    print('refused', e.errno)")
    finally:
        zygote.close()
    assert result.stdout.split()[0] == "refused", result.stdout  # EMFILE (EINVAL for os.dup: fcntl's F_DUPFD)
