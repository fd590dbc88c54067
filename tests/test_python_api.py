"""The library API (``paper_explorer``): the calls the commands are thin layers over.

Each test uses it as a researcher's script would; the command's own tests hold its output."""

import json
import subprocess
import sys

import pytest

import paper_explorer
from tests.conftest import ROOT, checkout_environment, run_cli


def test_evaluate_returns_the_run_the_command_would_write(tmp_path):
    from paper_explorer import EvalConfig, Run, evaluate

    run = evaluate(EvalConfig(policy={"name": "scripted"}, limit=4), out=tmp_path / "api")
    by_command = run_cli("eval", "--out", str(tmp_path / "cli"), "--limit", "4")
    assert by_command.returncode == 0, by_command.stderr

    written = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    assert run.metrics.episodes == written["episodes"] == 4
    assert run.metrics.answer_f1 == written["answer_f1"]
    assert [t.question_id for t in run.trajectories] == [t.question_id for t in Run.load(tmp_path / "cli").trajectories]


def test_a_run_loads_into_one_pandas_row_per_scored_episode(tmp_path):
    from paper_explorer import EvalConfig, Run, evaluate

    evaluate(EvalConfig(policy={"name": "direct-submit"}, limit=3), out=tmp_path / "run")
    frame = Run.load(tmp_path / "run").to_pandas()
    assert len(frame) == 3
    assert set(frame["policy"]) == {"direct-submit"}
    assert {"question_id", "answer_f1", "flags", "run"} <= set(frame.columns)


def test_evaluate_on_a_directory_that_holds_a_run_is_refused_with_the_resume_hint(tmp_path):
    from paper_explorer import EvalConfig, evaluate
    from paper_explorer.evaluation.errors import EvaluationError

    evaluate(EvalConfig(limit=1), out=tmp_path / "run")
    with pytest.raises(EvaluationError, match="resume"):
        evaluate(EvalConfig(limit=1), out=tmp_path / "run")
    assert evaluate(EvalConfig(limit=1), out=tmp_path / "run", resume=True).metrics.episodes == 1


def test_every_name_the_api_lists_resolves_and_nothing_else_does():
    assert sorted(paper_explorer.__all__) == sorted(paper_explorer._EXPORTS)
    for name in paper_explorer.__all__:
        assert getattr(paper_explorer, name) is not None, name
    assert callable(paper_explorer.build_dataset) and callable(paper_explorer.train) and callable(paper_explorer.improve)
    with pytest.raises(AttributeError, match="no attribute 'evaluat'"):
        paper_explorer.evaluat  # noqa: B018 - the attribute access is the test


def test_importing_the_api_loads_neither_torch_nor_the_index():
    """A script that only reads runs pays for no model library (a fresh interpreter: imports are process state)."""
    probe = "import sys, paper_explorer; print(json.dumps(sorted(m for m in ('torch', 'transformers', 'scipy') if m in sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", "import json; " + probe], capture_output=True, text=True, cwd=ROOT, env=checkout_environment(), timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
