"""preregister, eval --preregistration, inspect, compare and report as a user runs them."""

import json
import shutil

import pytest

from paper_explorer.evaluation.summary import retrieval_label
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("runs")
    corpus = directory / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "40", "--seed", "9", "--out", str(corpus)).returncode == 0
    base = run_cli(
        "eval", "--corpus", str(corpus), "--split", "all", "--limit", "40", "--policy", "direct-submit", "--out", str(directory / "base")
    )
    assert base.returncode == 0, base.stderr
    return directory, corpus


def test_direct_submit_is_flagged_as_shortcut_collapse(runs):
    directory, _ = runs
    metrics = json.loads((directory / "base" / "metrics.json").read_text())
    assert metrics["verdict"]["verdict"] == "shortcut collapse" and metrics["detector_rates"]["direct_submit"] == 1.0
    assert metrics["detector_rates"]["no_tool_use"] == 1.0
    for name in ("answer_f1", "exact_match", "sub_exact_match", "evidence_f1", "evidence_f1_text_only"):
        assert 0 <= metrics[name] <= 1
    assert metrics["retrieval"]["questions"] > 0 and 0 <= metrics["retrieval"]["recall@5"] <= 1


def test_preregistered_eval_reports_the_rule_and_fisher(runs):
    directory, corpus = runs
    prereg = directory / "prereg.toml"
    done = run_cli(
        "preregister",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--limit",
        "40",
        "--out",
        str(prereg),
        "--min-correct-abstentions",
        "7",
        "--max-false-abstentions",
        "4",
        "--comparison",
        "base",
        cwd=directory,
    )
    assert done.returncode == 0, done.stderr
    run = run_cli(
        "eval",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--limit",
        "40",
        "--out",
        str(directory / "scripted"),
        "--preregistration",
        str(prereg),
        env={"COLUMNS": "200"},
    )
    assert run.returncode == 0, run.stderr
    assert "no shortcut collapse" in run.stdout and "preregistered rule: PASS" in run.stdout
    assert "Fisher exact, unanswerable abstentions" in run.stdout
    result = json.loads((directory / "scripted" / "metrics.json").read_text())["preregistration"]
    assert result["pass"] and result["comparison"]["fisher"][0]["significant"]
    assert {c["check"] for c in result["checks"]} == {"correct abstentions >= 7", "false abstentions <= 4"}


def test_a_preregistration_for_other_questions_stops_the_run_before_it_starts(runs, tmp_path):
    directory, corpus = runs
    prereg = tmp_path / "prereg.toml"
    assert (
        run_cli(
            "preregister",
            "--corpus",
            str(corpus),
            "--split",
            "all",
            "--limit",
            "40",
            "--out",
            str(prereg),
            "--min-correct-abstentions",
            "1",
            "--max-false-abstentions",
            "1",
        ).returncode
        == 0
    )
    done = run_cli(
        "eval", "--corpus", str(corpus), "--split", "all", "--limit", "39", "--out", str(tmp_path / "r"), "--preregistration", str(prereg)
    )
    assert done.returncode == 2 and "questions_sha256 is pinned" in done.stderr
    assert not (tmp_path / "r" / "trajectories.jsonl").exists()
    (tmp_path / "bad.toml").write_text("[rule]\nmin_correct_abstentions = 'seven'\n")
    bad = run_cli("eval", "--corpus", str(corpus), "--out", str(tmp_path / "r2"), "--preregistration", str(tmp_path / "bad.toml"))
    assert bad.returncode == 2 and "bad.toml: field" in bad.stderr


def test_inspect_summary_flags_and_episode(runs):
    directory, _ = runs
    summary = run_cli("inspect", str(directory / "base"), env={"COLUMNS": "200"})
    assert summary.returncode == 0 and "shortcut collapse" in summary.stdout and "worst" in summary.stdout
    flagged = run_cli("inspect", str(directory / "base"), "--flag", "direct_submit", env={"COLUMNS": "200"})
    assert flagged.returncode == 0 and "direct_submit: 40 of 40 episodes" in flagged.stdout
    first = json.loads((directory / "base" / "scores.jsonl").read_text().splitlines()[0])
    episode = run_cli("inspect", str(directory / "base"), "--episode", first["episode_id"], env={"COLUMNS": "200"})
    assert episode.returncode == 0 and "flag direct_submit (step 1)" in episode.stdout
    unknown = run_cli("inspect", str(directory / "base"), "--flag", "laziness")
    assert unknown.returncode == 2 and "unknown flag 'laziness'" in unknown.stderr
    missing = run_cli("inspect", str(directory / "nothing"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr


def scripted_run(directory, corpus):
    """The scripted policy's run on the same questions, made once for the tests that need it."""
    if not (directory / "scripted").exists():
        assert (
            run_cli("eval", "--corpus", str(corpus), "--split", "all", "--limit", "40", "--out", str(directory / "scripted")).returncode
            == 0
        )
    return directory / "scripted"


def test_search_recall_is_labelled_as_the_questions_and_says_when_the_policy_never_searched(runs, tmp_path):
    directory, corpus = runs
    base = json.loads((directory / "base" / "metrics.json").read_text())
    assert base["searched_episodes"] == 0 and base["retrieval"]["recall@5"] is not None  # the figure is there all the same
    summary = run_cli("inspect", str(directory / "base"), env={"COLUMNS": "200"})
    assert summary.returncode == 0, summary.stderr
    for name in ("recall@1", "recall@5", "recall@10", "mrr@10"):
        assert f"search {name} (of the questions' BM25 results; the policy never searched)" in summary.stdout
    scripted = scripted_run(directory, corpus)
    assert json.loads((scripted / "metrics.json").read_text())["searched_episodes"] == 40
    searched = run_cli("inspect", str(scripted), env={"COLUMNS": "200"})
    assert "search recall@5 (of the questions' BM25 results)" in searched.stdout and "never searched" not in searched.stdout
    # a run scored before searches were counted: the figure is still the questions', and nothing is claimed about the policy
    assert retrieval_label("recall@5", None) == "search recall@5 (of the questions' BM25 results)"
    # such a run's metrics.json (no searched_episodes, no digest of what it was computed from) is refused until rescored
    shutil.copytree(directory / "base", tmp_path / "older")
    (tmp_path / "older" / "metrics.json").write_text(
        json.dumps({key: value for key, value in base.items() if key not in ("searched_episodes", "derived_from")})
    )
    older = run_cli("inspect", str(tmp_path / "older"), env={"COLUMNS": "200"})
    assert older.returncode == 2 and "records no digest" in older.stderr and "--resume scores the run again" in older.stderr
    assert run_cli("eval", "--out", str(tmp_path / "older"), "--corpus", str(corpus), "--resume").returncode == 0
    assert run_cli("inspect", str(tmp_path / "older")).returncode == 0


def test_compare_two_runs(runs):
    directory, corpus = runs
    scripted_run(directory, corpus)
    done = run_cli("compare", str(directory / "base"), str(directory / "scripted"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["paired_questions"] == 40 and result["same_corpus"]
    assert result["answer_f1"]["b"] > result["answer_f1"]["a"] and result["answer_f1"]["paired_difference_ci95"]["low"] > 0
    exact = next(test for test in result["mcnemar_answers"] if test["outcome"] == "exact match")
    assert exact["p_value"] < 0.05 and result["direct_submit_rate"] == {"a": 1.0, "b": 0.0}
    shown = run_cli("compare", str(directory / "base"), str(directory / "scripted"), env={"COLUMNS": "200"})
    assert "exact McNemar" in shown.stdout and "Fisher exact on unanswerable" in shown.stdout


def test_odd_files_where_a_run_or_config_should_be_are_one_line(runs, tmp_path):
    directory, corpus = runs
    prereg_dir = run_cli("eval", "--corpus", str(corpus), "--out", str(tmp_path / "r"), "--preregistration", str(tmp_path))
    assert prereg_dir.returncode == 2 and "is a directory" in prereg_dir.stderr
    config_dir = run_cli("train", "--dry-run", "--config", str(tmp_path))
    assert config_dir.returncode == 2 and "is a directory" in config_dir.stderr
    (tmp_path / "latin1.toml").write_bytes(b"model = '\xe9'\n")
    latin = run_cli("train", "--dry-run", "--config", str(tmp_path / "latin1.toml"))
    assert latin.returncode == 2 and "not UTF-8" in latin.stderr
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "manifest.json").write_text("[]")
    odd = run_cli("eval", "--corpus", str(corpus), "--out", str(tmp_path / "odd"), "--resume")
    assert odd.returncode == 2 and "not a run manifest" in odd.stderr
    (tmp_path / "empty-train").mkdir()
    (tmp_path / "empty-train" / "x").write_text("")
    resume = run_cli("train", "--data", str(directory), "--out", str(tmp_path / "empty-train"), "--resume")
    assert resume.returncode == 2 and "Traceback" not in resume.stderr


def test_a_failed_preregistered_rule_exits_1_and_paths_are_checked_when_written(runs, tmp_path):
    directory, corpus = runs
    prereg = tmp_path / "strict.toml"
    missing = run_cli(
        "preregister",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--limit",
        "40",
        "--out",
        str(prereg),
        "--min-correct-abstentions",
        "1",
        "--max-false-abstentions",
        "0",
        "--comparison",
        "base",
    )
    assert missing.returncode == 2 and "no metrics.json" in missing.stderr and not prereg.exists()  # "base" is not in the cwd
    written = run_cli(
        "preregister",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--limit",
        "40",
        "--out",
        str(prereg),
        "--min-correct-abstentions",
        "40",
        "--max-false-abstentions",
        "0",
        "--comparison",
        str(directory / "base"),
    )
    assert written.returncode == 0, written.stderr
    run = run_cli(
        "eval",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--limit",
        "40",
        "--policy",
        "direct-submit",
        "--out",
        str(tmp_path / "run"),
        "--preregistration",
        str(prereg),
    )
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]  # the rest is the progress bar
    assert run.returncode == 1 and len(errors) == 1 and errors[0].startswith("error: the preregistered rule") and "FAILED" in errors[0]
    assert not json.loads((tmp_path / "run" / "metrics.json").read_text())["preregistration"]["pass"]  # the run is kept whole


def test_report_never_overwrites_without_force(runs, tmp_path):
    directory, _ = runs
    target = tmp_path / "metrics.json"
    target.write_text("{}")
    refused = run_cli("report", str(directory / "base"), "-o", str(target))
    assert refused.returncode == 2 and "--force" in refused.stderr and target.read_text() == "{}"
    forced = run_cli("report", str(directory / "base"), "-o", str(target), "--force")
    assert forced.returncode == 0 and target.read_text().lstrip().startswith("<!")


def test_an_edited_comparison_run_never_sets_the_preregistered_fisher_tests(runs, tmp_path):
    """The comparison run's metrics.json with its abstention table edited (the direct-submit run made
    to abstain on every unanswerable question): the verdict's Fisher tests would be computed from a
    table its trajectories do not give. The run is read as every run is, and refused before any episode."""
    directory, corpus = runs
    comparison = tmp_path / "base"
    shutil.copytree(directory / "base", comparison)
    metrics = json.loads((comparison / "metrics.json").read_text())
    table = metrics["abstention"]["unanswerable"]
    table["abstained"], table["answered"] = table["abstained"] + table["answered"], 0
    (comparison / "metrics.json").write_text(json.dumps(metrics))
    prereg = tmp_path / "prereg.toml"
    words = ["--corpus", str(corpus), "--split", "all", "--limit", "40"]
    done = run_cli(
        "preregister",
        *words,
        "--out",
        str(prereg),
        "--min-correct-abstentions",
        "1",
        "--max-false-abstentions",
        "40",
        "--comparison",
        str(comparison),
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "scripted"
    done = run_cli("eval", *words, "--out", str(out), "--preregistration", str(prereg))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{prereg}: its comparison run cannot be used: {comparison / 'metrics.json'}: abstention is" in done.stderr, done.stderr
    assert not out.exists()
