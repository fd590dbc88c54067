"""Faults a newcomer met following the docs (issue 32, item 8), each as they met it: the command
typed, what it printed. Ids in narrow tables, a file where a run directory goes (and the other way
round), QASPER's own name for its validation split, a report missing its questions file, check-parity
on a run directory, switches in --help, a hub warning printed twice, training into a source folder."""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import run_cli

EXAMPLES = "docs/examples"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, tiny_tokenizer):
    """A finished run of 6 episodes that recorded what the tiny tokenizer would have served."""
    out = tmp_path_factory.mktemp("runs") / "first"
    done = run_cli("eval", "--out", str(out), "--limit", "6", "--tokenizer", str(tiny_tokenizer), "--record-prompt-ids")
    assert done.returncode == 0, done.stderr
    return out


def scores(run) -> list[dict]:
    return [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("columns", ["80", "60"])
def test_tables_keep_every_episode_id_whole_in_a_narrow_terminal(demo_run, columns):
    everyone = [score["episode_id"] for score in scores(demo_run)]
    flag = "ungrounded_answer"
    flagged = [score["episode_id"] for score in scores(demo_run) if any(item["detector"] == flag for item in score["flags"])]
    for arguments, listed in (
        (["inspect", str(demo_run)], everyone),
        (["inspect", str(demo_run), "--flag", flag], flagged),
        (["show", str(demo_run / "trajectories.jsonl")], everyone),
    ):
        done = run_cli(*arguments, env={"COLUMNS": columns})
        assert done.returncode == 0, done.stderr
        assert max(len(line) for line in done.stdout.splitlines()) <= int(columns)
        for episode in listed:
            assert episode in done.stdout, f"{arguments}: {episode} is not whole in\n{done.stdout}"


def test_inspect_given_a_file_of_a_run_names_the_run_directory(demo_run):
    done = run_cli("inspect", str(demo_run / "trajectories.jsonl"))
    assert done.returncode == 2
    assert f"a file of the run {demo_run}; name the run directory itself: {demo_run}" in done.stderr
    assert "no such run directory" not in done.stderr


def test_inspect_given_the_log_of_run_says_show_reads_it(tmp_path):
    log = tmp_path / "trajectories.jsonl"
    log.write_text("")
    done = run_cli("inspect", str(log))
    assert done.returncode == 2 and f"explorer show {log} prints its episodes" in done.stderr


def test_show_given_a_manifest_says_what_it_is_and_what_reads_it(demo_run):
    done = run_cli("show", str(demo_run / "manifest.json"))
    assert done.returncode == 2
    assert "a run's manifest (config, versions, hashes), not a trajectories file" in done.stderr
    assert f"explorer show {demo_run / 'trajectories.jsonl'} prints its episodes" in done.stderr
    assert f"explorer inspect {demo_run} summarises the run" in done.stderr
    assert "not JSON" not in done.stderr
    done = run_cli("show", str(demo_run))
    assert done.returncode == 2 and f"explorer show {demo_run / 'trajectories.jsonl'}" in done.stderr


def test_dev_is_qaspers_name_for_validation_and_an_unknown_split_says_the_nearest(tmp_path):
    done = run_cli("eval", "--split", "dev", "--limit", "2", "--out", str(tmp_path / "dev"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "dev" / "manifest.json").read_text())["config"]["split"] == "validation"
    done = run_cli("eval", "--split", "vali", "--limit", "2", "--out", str(tmp_path / "typo"))
    assert done.returncode == 2 and "unknown split 'vali'; did you mean validation?" in done.stderr
    done = run_cli(
        "preregister",
        "--out",
        str(tmp_path / "p.toml"),
        "--split",
        "tset",
        "--min-correct-abstentions",
        "0",
        "--max-false-abstentions",
        "0",
    )
    assert done.returncode == 2 and "did you mean test?" in done.stderr


def test_report_without_the_questions_file_says_it_is_missing(tmp_path):
    corpus, run = tmp_path / "papers.jsonl", tmp_path / "mine"
    assert run_cli("corpus", "from-text", f"{EXAMPLES}/papers", "--out", str(corpus)).returncode == 0
    done = run_cli("eval", "--corpus", str(corpus), "--questions", f"{EXAMPLES}/questions.jsonl", "--out", str(run))
    assert done.returncode == 0, done.stderr
    done = run_cli("report", str(run), "--out", str(tmp_path / "mine.html"))
    assert done.returncode == 2
    assert "holds no questions of its own" in done.stderr and "pass that file with --questions" in done.stderr
    assert "e3b0c44298fc" not in done.stderr  # the hash of nothing explained nothing
    done = run_cli("report", str(run), "--questions", f"{EXAMPLES}/questions.jsonl", "--out", str(tmp_path / "mine.html"))
    assert done.returncode == 0, done.stderr


def test_check_parity_takes_a_run_directory_as_every_command_does(demo_run, tiny_tokenizer):
    by_run = run_cli("check-parity", str(demo_run), "--tokenizer", str(tiny_tokenizer))
    by_file = run_cli("check-parity", "-t", str(demo_run / "trajectories.jsonl"), "--tokenizer", str(tiny_tokenizer))
    assert by_run.returncode == by_file.returncode == 0, by_run.stderr + by_file.stderr
    assert by_run.stdout == by_file.stdout and "parity holds: 6 trajectories" in by_run.stdout
    done = run_cli("check-parity", "--tokenizer", str(tiny_tokenizer))
    assert done.returncode == 2 and "name the run to check" in done.stderr
    done = run_cli("check-parity", str(demo_run.parent), "--tokenizer", str(tiny_tokenizer))
    assert done.returncode == 2 and "no trajectories.jsonl" in done.stderr


def test_a_switch_shows_no_placeholder_in_help():
    for command in (["eval"], ["report"], ["train"], []):
        done = run_cli(*command, "--help", env={"COLUMNS": "120"})
        assert done.returncode == 0
        assert "<bool>" not in done.stdout, f"explorer {' '.join(command)} --help:\n{done.stdout}"
    assert "<int>" in run_cli("eval", "--help", env={"COLUMNS": "120"}).stdout  # a value's placeholder stays


def test_a_library_that_prints_its_own_log_lines_is_not_printed_twice():
    from paper_explorer.cli.main import not_shown_by_its_library

    library, ours = logging.getLogger("a_library.utils._http"), logging.getLogger("paper_explorer.some.module")
    own = logging.StreamHandler()
    logging.getLogger("a_library").addHandler(own)  # as huggingface_hub does, and propagates too
    try:
        assert not not_shown_by_its_library(library.makeRecord(library.name, logging.WARNING, "f", 1, "Retrying in 1s", None, None))
        assert not_shown_by_its_library(ours.makeRecord(ours.name, logging.WARNING, "f", 1, "a note", None, None))
    finally:
        logging.getLogger("a_library").removeHandler(own)


def test_train_into_a_folder_that_is_no_training_run_is_refused_with_resume_too(tmp_path):
    pytest.importorskip("torch")
    data, package = tmp_path / "data", tmp_path / "sft"
    data.mkdir()
    (data / "build_report.json").write_text("{}")
    package.mkdir()
    (package / "__init__.py").write_text("")
    for resume in ([], ["--resume"]):
        done = run_cli("train", "--data", str(data), "--out", str(package), *resume)
        assert done.returncode == 2
        assert f"{package}: not a training run (it holds __init__.py, which explorer train never writes)" in done.stderr
        assert "--resume" not in done.stderr.split("error:", 1)[1]  # the old advice wrote checkpoints among the sources
    assert sorted(path.name for path in package.iterdir()) == ["__init__.py"]


def test_an_unreachable_hub_is_one_line_of_ours_not_ten_of_its_retries(caplog):
    """Offline, huggingface_hub logs each failed request and each of five retries (about 23 s of
    lines); while a model's files are fetched the user sees one line that says what to do."""
    from paper_explorer.agent.models import HUB_HTTP_LOGGER, hub_retries_said_once

    hub = logging.getLogger(HUB_HTTP_LOGGER)
    with caplog.at_level(logging.WARNING), hub_retries_said_once("Qwen/Qwen3-8B"):
        for attempt in range(1, 6):
            hub.warning("'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/x")
            hub.warning("Retrying in %ss [Retry %s/5].", 2**attempt, attempt)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and said[0].startswith("Qwen/Qwen3-8B: the Hugging Face hub does not answer")
    assert "HF_HUB_OFFLINE=1" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        hub.warning("Retrying in 1s [Retry 1/5].")  # outside a fetch of ours the hub speaks for itself
    assert [record.getMessage() for record in caplog.records] == ["Retrying in 1s [Retry 1/5]."]
