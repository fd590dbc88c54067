"""`explorer exec` as a user runs it: action files in one sandbox, results as JSON lines."""

import json

from tests.conftest import run_cli


def test_actions_share_one_namespace_and_print_json_lines(tmp_path):
    (tmp_path / "1.py").write_text('hits = search("learning rate", k=2)\nlen(hits)\n')
    (tmp_path / "2.py").write_text('print(hits[0]["paper_id"])\nsubmit("3e-5", evidence=[hits[0]])\n')
    done = run_cli("exec", str(tmp_path / "1.py"), str(tmp_path / "2.py"))
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["file"].endswith("1.py") and first["value"] == "2"
    assert first["tool_calls"][0]["name"] == "search" and first["tool_calls"][0]["arguments"]["k"] == 2
    assert second["stdout"].startswith("demo-") and second["outcome"]["status"] == "submitted"
    assert second["outcome"]["answer"] == "3e-5"
    assert first["isolation"] == second["isolation"] and first["isolation"]


def test_output_stays_one_json_object_per_line_whatever_the_action_does(tmp_path):
    actions = {
        "debug.py": "import re\nre.compile('(a|b)+c', 128)\nNone\n",
        "warn.py": "x = 1 is 1\n",
        "unraisable.py": "def g():\n    try:\n        yield 1\n    finally:\n        raise ValueError('late')\n"
        "for i in range(3000):\n    it = g()\n    next(it)\n    del it\n",
        "flood.py": "while True:\n    print('\\n{\\\"forged\\\": 1}')\n",
        "newlines.py": "print('a\\nb\\r\\n\\u2028c')\n'\\n'.join(['x', 'y'])\n",
        "surrogate.py": "print(chr(0xd800))\nsubmit(chr(0xdfff) + 'answer', evidence=[])\n",
    }
    for name, code in actions.items():
        (tmp_path / name).write_text(code)
    done = run_cli("exec", *(str(tmp_path / name) for name in actions), "--output-chars", "3000")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["file"].rsplit("/", 1)[-1] for r in results] == list(actions)
    assert "LITERAL" in results[0]["stdout"] and "SyntaxWarning" in results[1]["stdout"]
    assert results[2]["limit_hit"] == "output" and results[3]["limit_hit"] == "output"
    assert results[5]["stdout"] == "\ufffd\n" and results[5]["outcome"]["answer"] == "\ufffdanswer"
    assert done.stderr == ""


def test_an_action_error_is_a_result_not_a_failure(tmp_path):
    (tmp_path / "bad.py").write_text("import os\n")
    done = run_cli("exec", str(tmp_path / "bad.py"), "--allow-module", "collections")
    assert done.returncode == 0
    result = json.loads(done.stdout)
    assert result["error"].startswith("ImportError") and "collections" in result["error"]


def test_limit_breach_is_reported_and_variables_are_lost(tmp_path):
    (tmp_path / "a.py").write_text("kept = 1\n")
    (tmp_path / "b.py").write_text("while True:\n    pass\n")
    (tmp_path / "c.py").write_text("kept\n")
    done = run_cli("exec", *(str(tmp_path / f"{n}.py") for n in "abc"), "--wall-seconds", "1", "--cpu-seconds", "1")
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert results[1]["limit_hit"] in ("cpu_time", "wall_clock") and results[1]["variables_lost"]
    assert "NameError" in results[2]["error"]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "ok.py").write_text("1\n")
    (tmp_path / "latin1.py").write_bytes(b"x = '\xe9'\n")
    cases = {
        (str(tmp_path / "missing.py"),): "no such action file",
        (str(tmp_path / "latin1.py"),): "not UTF-8",
        (str(tmp_path),): "is a directory",
        (str(tmp_path / "ok.py"), "--allow-module", "os"): "cannot be allowed",
        (str(tmp_path / "ok.py"), "--wall-seconds", "0"): "must be a positive",
        ("-", "-"): "only once",
    }
    for args, message in cases.items():
        done = run_cli("exec", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""  # nothing ran before the bad input was found
