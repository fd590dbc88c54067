"""An error names the setting to change as its reader spells it: a Python caller reads the
argument (``resume=True``), a user of the CLI the flag (``--resume``) - the same error of the core
(``corpus.setting_names``), spelled by whoever called."""

import pytest

from paper_explorer.cli.flags import flag_spelling
from paper_explorer.corpus.setting_names import python_spelling, setting, spelled
from tests.conftest import run_cli


def error_line(done) -> str:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    return line


def test_a_second_evaluate_into_a_run_names_the_argument_and_the_command_names_the_flag(tmp_path):
    from paper_explorer import EvalConfig, evaluate
    from paper_explorer.evaluation.errors import EvaluationError

    evaluate(EvalConfig(limit=1), out=tmp_path / "run")
    with pytest.raises(EvaluationError) as raised:
        evaluate(EvalConfig(limit=1), out=tmp_path / "run")
    assert str(raised.value) == f"{tmp_path / 'run'}: already holds a run; pass resume=True to finish it, or choose another out"

    line = error_line(run_cli("eval", "--out", str(tmp_path / "run"), "--limit", "1"))
    assert line == f"error: {tmp_path / 'run'}: already holds a run; pass --resume to finish it, or choose another --out"


def test_a_resume_of_nothing_names_the_argument_to_drop(tmp_path):
    from paper_explorer import EvalConfig, evaluate
    from paper_explorer.evaluation.errors import EvaluationError

    with pytest.raises(EvaluationError, match=r"no run to resume; start one without resume=True$"):
        evaluate(EvalConfig(limit=1), out=tmp_path / "new", resume=True)
    line = error_line(run_cli("eval", "--out", str(tmp_path / "new"), "--resume"))
    assert line.endswith("no run to resume; start one without --resume")


def test_a_run_given_two_questions_names_both_arguments_or_both_flags(tmp_path):
    from paper_explorer import RunConfig, run
    from paper_explorer.evaluation.errors import EvaluationError

    with pytest.raises(EvaluationError, match=r"^pass question or question_id, not both$"):
        run(RunConfig(), question="Which dataset?", question_id="q1")
    line = error_line(run_cli("run", "--question", "Which dataset?", "--question-id", "q1", "--out", str(tmp_path)))
    assert line == "error: pass --question or --question-id, not both"


def test_a_config_field_is_named_by_its_dotted_name_or_by_the_flag_made_from_it():
    assert python_spelling("policy.name", "replay") == "policy.name='replay'"
    assert flag_spelling("policy.name", "replay") == "--policy replay"
    assert flag_spelling("episode.max_steps", 6) == "--max-steps 6"
    assert flag_spelling("policy.base_url", ["http://a/v1", "http://b/v1"]) == "--base-url http://a/v1 --base-url http://b/v1"
    assert flag_spelling("replay_other_corpus", True) == "--replay-other-corpus"
    assert flag_spelling("question", "a b") == "--question 'a b'"


def test_the_cli_spelling_holds_only_while_a_command_runs():
    assert setting("resume", True) == "resume=True"
    with spelled(flag_spelling):
        assert setting("resume", True) == "--resume"
    assert setting("resume", True) == "resume=True"


def test_teach_into_a_directory_names_out_as_the_caller_gave_it(tmp_path):
    from paper_explorer import TeachConfig, teach
    from paper_explorer.sft.errors import TrainingError

    with pytest.raises(TrainingError, match=r"is a directory; out names the trajectories .jsonl file to write$"):
        teach(TeachConfig(limit=1), out=tmp_path)
    line = error_line(run_cli("sft", "teach", "--limit", "1", "--out", str(tmp_path)))
    assert line == f"error: {tmp_path}: is a directory; --out names the trajectories .jsonl file to write"


def test_preregister_requires_its_rule_as_the_config_requires_its_fields(tmp_path):
    from pydantic import ValidationError

    from paper_explorer import PreregisterConfig

    with pytest.raises(ValidationError, match="min_correct_abstentions"):
        PreregisterConfig(max_false_abstentions=1)
    line = error_line(run_cli("preregister", "--max-false-abstentions", "1", "--out", str(tmp_path / "p.toml")))
    assert "missing option '--min-correct-abstentions'" in line
    assert not (tmp_path / "p.toml").exists()
