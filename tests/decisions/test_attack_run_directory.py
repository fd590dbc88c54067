"""Attacks on a decide run directory: --force on what is not a decide run, --out a file, and two
runs writing one directory at once."""

from __future__ import annotations

import fcntl
import json
import os

from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions


def test_force_never_deletes_an_evaluation_runs_files(tmp_path, tiny_model):
    """An eval run has a manifest.json and a metrics.json too: --force took them for a decide
    run's and deleted them, leaving its trajectories without their manifest."""
    run = tmp_path / "eval-run"
    run.mkdir()
    kept = {
        "manifest.json": json.dumps({"run_version": 3, "policy": "code"}),
        "metrics.json": "{}",
        "scores.jsonl": "",
        "trajectories.jsonl": "",
    }
    for name, text in kept.items():
        (run / name).write_text(text)
    file = write_decisions(tmp_path / "decisions.jsonl")
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(run), "--force")
    assert result.returncode == 2 and "--force replaces only a decide run" in result.stderr
    assert {path.name: path.read_text() for path in run.iterdir()} == kept


def test_out_that_is_a_file_is_one_line(tmp_path, tiny_model):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    file = write_decisions(tmp_path / "decisions.jsonl")
    for flags in ((), ("--force",), ("--resume",)):
        result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out), *flags)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert out.read_text() == "mine"


def test_resume_of_a_directory_that_is_not_there_creates_nothing(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "decisions.jsonl")
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "none"), "--resume")
    assert result.returncode == 2 and "no manifest.json to resume" in result.stderr
    assert not (tmp_path / "none").exists()


def test_a_run_another_decide_is_writing_is_refused(tmp_path, tiny_model):
    """Two decide runs into one directory would each write a manifest and interleave their lines;
    the second is refused while the first holds the directory."""
    file = write_decisions(tmp_path / "decisions.jsonl")
    out = tmp_path / "run"
    out.mkdir()
    descriptor = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # as the first run holds it
        for flags in ((), ("--force",)):
            result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out), *flags)
            assert result.returncode == 2 and "another explorer decide is writing this run now" in result.stderr
        assert list(out.iterdir()) == []
    finally:
        os.close(descriptor)
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(out)).returncode == 0  # let go, it runs
