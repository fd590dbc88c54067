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
    for workflow in ("evaluate", "run", "teach", "preregister", "compare", "report", "build_dataset", "train", "improve"):
        assert callable(getattr(paper_explorer, workflow)), workflow
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


def test_run_asks_one_question_and_appends_it_where_the_command_does(tmp_path):
    from paper_explorer import RunConfig, run
    from paper_explorer.agent.writer import read_trajectories

    seen = []
    episode = run(RunConfig(episode={"max_steps": 6}), out=tmp_path / "api", on_step=seen.append)
    assert episode.written_to == tmp_path / "api" / "trajectories.jsonl"
    assert len(seen) == len(episode.trajectory.steps) > 0
    assert episode.question is not None and episode.gold_answer  # the demo question: answerable, of the test split

    by_command = run_cli("run", "--question-id", episode.question.id, "--max-steps", "6", "--out", str(tmp_path / "cli"))
    assert by_command.returncode == 0, by_command.stderr
    (logged,) = read_trajectories(tmp_path / "cli" / "trajectories.jsonl")
    assert [s.code for s in logged.steps] == [s.code for s in episode.trajectory.steps]
    assert logged.outcome.answer == episode.trajectory.outcome.answer
    assert read_trajectories(episode.written_to)[0].episode_id == episode.trajectory.episode_id


def test_run_refuses_an_eval_run_directory_naming_the_argument(tmp_path):
    from paper_explorer import EvalConfig, RunConfig, evaluate, run
    from paper_explorer.evaluation.errors import EvaluationError

    evaluate(EvalConfig(limit=1), out=tmp_path / "eval")
    with pytest.raises(EvaluationError, match=r"explorer run appends its episode only to a log of its own: choose another out \("):
        run(RunConfig(), question="Which datasets?", out=tmp_path / "eval")


def test_teach_appends_only_the_questions_its_file_lacks(tmp_path):
    from paper_explorer import TeachConfig, teach

    first = teach(TeachConfig(limit=3), out=tmp_path / "teacher.jsonl")
    assert (first.questions, first.written, first.already_written) == (3, 3, 0)
    assert sum(first.statuses.values()) == 3 and set(first.statuses) <= {"submitted", "abstained"}
    again = teach(TeachConfig(limit=4), out=tmp_path / "teacher.jsonl")
    assert (again.questions, again.written, again.already_written) == (4, 1, 3)
    assert len((tmp_path / "teacher.jsonl").read_text().splitlines()) == 4


def test_a_preregistration_written_by_the_api_is_the_one_evaluate_checks(tmp_path):
    from paper_explorer import EvalConfig, PreregisterConfig, evaluate, preregister
    from paper_explorer.evaluation.errors import EvaluationError

    rule = PreregisterConfig(limit=6, min_correct_abstentions=0, max_false_abstentions=6)
    written = preregister(rule, out=tmp_path / "prereg.toml")
    assert written.frozen.questions == 6 and written.rule.max_false_abstentions == 6
    with pytest.raises(EvaluationError, match=r"already exists; pass force=True to overwrite it$"):
        preregister(rule, out=tmp_path / "prereg.toml")
    run = evaluate(EvalConfig(limit=6, preregistration=tmp_path / "prereg.toml"), out=tmp_path / "run")
    assert run.metrics.preregistration is not None and run.metrics.preregistration.passed
    with pytest.raises(EvaluationError, match="questions_sha256 is pinned"):
        evaluate(EvalConfig(limit=5, preregistration=tmp_path / "prereg.toml"), out=tmp_path / "other")


def test_compare_and_report_take_the_runs_evaluate_returned(tmp_path):
    from paper_explorer import EvalConfig, compare, evaluate, report
    from paper_explorer.evaluation.errors import EvaluationError

    base = evaluate(EvalConfig(limit=5), out=tmp_path / "base")
    shortcut = evaluate(EvalConfig(limit=5, policy={"name": "direct-submit"}), out=tmp_path / "shortcut")
    comparison = compare(base, tmp_path / "shortcut")
    assert comparison.paired_questions == 5
    by_command = run_cli("compare", str(tmp_path / "base"), str(tmp_path / "shortcut"), "--json")
    assert by_command.returncode == 0, by_command.stderr
    assert json.loads(by_command.stdout) == json.loads(comparison.model_dump_json())

    assert report(base, out=tmp_path / "base.html") == tmp_path / "base.html"
    assert "<html" in (tmp_path / "base.html").read_text()
    report(base, shortcut, out=tmp_path / "compared.html")
    assert (tmp_path / "compared.html").stat().st_size > 0
    with pytest.raises(EvaluationError, match=r"already exists; pass force=True to overwrite it"):
        report(base, out=tmp_path / "base.html")
    refused = run_cli("report", str(tmp_path / "base"), "--out", str(tmp_path / "base.html"))
    assert refused.returncode == 2 and "pass --force to overwrite it" in refused.stderr
