"""An answer metric is declared once (``evaluation.answer_metrics``): a metric registered here, in the
test, and nowhere else is scored into scores.jsonl, aggregated into metrics.json, checked by
``Run.load``, compared (a paired figure and its McNemar test), exported, and shown by the report
pages and ``inspect``. A run scored before it existed still loads, with no figure for it.

The existing metrics keep the keys and the order users and older runs read."""

from __future__ import annotations

import json
import re
from statistics import fmean

import pytest

from paper_explorer.evaluation import answer_metrics
from paper_explorer.evaluation.answer_metrics import Answered, Metric, register_metric
from paper_explorer.evaluation.run_directory import Run
from tests.conftest import run_cli

WIDE = {"COLUMNS": "200"}
LABEL = "answer of at most three words"


def at_most_three_words(answered: Answered) -> float:
    return float(0 < len(answered.prediction.split()) <= 3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run scored before the metric existed ("before"), then, with it registered, a run of each of
    two policies that answer differently ("scripted" searches first, "direct" answers at once)."""
    directory = tmp_path_factory.mktemp("metrics")
    done = run_cli("eval", "--split", "all", "--limit", "6", "--out", str(directory / "before"))
    assert done.returncode == 0, done.stderr
    saved = dict(answer_metrics._registry)
    register_metric(Metric("short_answer", LABEL, at_most_three_words, yes_no=True, higher_is_better=False))
    try:
        for name, policy in (("scripted", "scripted"), ("direct", "direct-submit")):
            done = run_cli("eval", "--split", "all", "--limit", "6", "--policy", policy, "--out", str(directory / name))
            assert done.returncode in (0, 1), done.stderr  # 1: direct-submit's shortcut collapse
        yield directory
    finally:
        answer_metrics._registry.clear()
        answer_metrics._registry.update(saved)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def page_data(path) -> dict:
    text = path.read_text()
    match = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_a_registered_metric_is_scored_and_aggregated(runs):
    scores = lines(runs / "scripted" / "scores.jsonl")
    before = [metric.name for metric in answer_metrics.answer_metrics()][-2]  # registered just before it
    assert all(list(line).index("short_answer") == list(line).index(before) + 1 for line in scores)
    assert [line["short_answer"] for line in scores] == [float(0 < len(line["prediction"].split()) <= 3) for line in scores]
    metrics = json.loads((runs / "scripted" / "metrics.json").read_text())
    assert metrics["short_answer"] == pytest.approx(fmean(line["short_answer"] for line in scores))
    run = Run.load(runs / "scripted")  # the derived check recomputes it from the scores and the log
    assert run.metrics.metric("short_answer") == metrics["short_answer"]
    assert all(score.metric("short_answer") is not None for score in run.scores)
    for record in ("scores", "metrics"):  # explorer schema describes the files as they are written
        schema = json.loads(run_cli("schema", record).stdout)
        assert schema["properties"]["short_answer"]["title"] == LABEL and "answer_metrics" not in schema["properties"]


def test_a_registered_metric_is_compared_with_its_mcnemar_test(runs):
    done = run_cli("compare", str(runs / "direct"), str(runs / "scripted"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    a, b = (fmean(line["short_answer"] for line in lines(runs / name / "scores.jsonl")) for name in ("direct", "scripted"))
    assert result["short_answer"] == {"a": pytest.approx(a), "b": pytest.approx(b), "difference": pytest.approx(b - a)}
    assert [test["outcome"] for test in result["mcnemar_answers"]][-1] == LABEL
    shown = run_cli("compare", str(runs / "direct"), str(runs / "scripted"), env=WIDE)
    assert f"{LABEL} (lower is better)" in shown.stdout


def test_a_registered_metric_is_in_the_report_data_inspect_and_the_export(runs, tmp_path):
    done = run_cli("report", str(runs / "scripted"), "--out", str(tmp_path / "run.html"))
    assert done.returncode == 0, done.stderr
    data = page_data(tmp_path / "run.html")
    assert {"name": "short_answer", "label": f"{LABEL} (lower is better)", "digits": 0} in data["metrics"]
    assert all("short_answer" in episode for episode in data["episodes"])
    assert f"short_answer: {LABEL}" in (tmp_path / "run.html").read_text()  # the metrics table
    paired = run_cli("report", str(runs / "direct"), str(runs / "scripted"), "--out", str(tmp_path / "pair.html"))
    assert paired.returncode == 0, paired.stderr
    assert any(m["name"] == "short_answer" for m in page_data(tmp_path / "pair.html")["metrics"])
    shown = run_cli("inspect", str(runs / "scripted"), env=WIDE)
    assert shown.returncode == 0 and f"short_answer: {LABEL} (lower is better)" in shown.stdout
    episode = run_cli("inspect", str(runs / "scripted"), "--episode", lines(runs / "scripted" / "scores.jsonl")[0]["episode_id"], env=WIDE)
    assert f"{LABEL} " in episode.stdout
    pytest.importorskip("datasets")
    from paper_explorer.evaluation.export import read_run, trajectory_features, trajectory_rows

    assert "short_answer" in trajectory_features()
    rows = trajectory_rows(read_run(runs / "scripted"))
    assert [row["short_answer"] for row in rows] == [line["short_answer"] for line in lines(runs / "scripted" / "scores.jsonl")]


def test_a_run_scored_before_the_metric_existed_loads_without_it(runs):
    run = Run.load(runs / "before")  # read with the metric registered (the fixture keeps it for the module)
    assert run.metrics.metric("short_answer") is None and run.metrics.answer_f1 is not None
    assert all(score.metric("short_answer") is None for score in run.scores if score.scored)
    done = run_cli("compare", str(runs / "before"), str(runs / "scripted"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["short_answer"]["a"] is None and result["short_answer"]["difference"] is None
    assert LABEL not in [test["outcome"] for test in result["mcnemar_answers"]]  # no pairs to test


def test_the_existing_metrics_keep_their_keys_and_order(runs):
    """What users and older runs read: a line of scores.jsonl and metrics.json as they always were,
    a metric registered since (hotpotqa_f1) after them."""
    line = lines(runs / "before" / "scores.jsonl")[0]
    assert list(line)[list(line).index("answerable") :] == [
        "answerable",
        "answer_f1",
        "exact_match",
        "sub_exact_match",
        "sub_exact_match_substring",
        "evidence_f1",
        "evidence_f1_text_only",
        "evidence_f1_strict",
        "hotpotqa_f1",
        "abstained",
    ]
    metrics = json.loads((runs / "before" / "metrics.json").read_text())
    assert list(metrics)[:12] == [
        "episodes",
        "scored",
        "answer_f1",
        "answer_f1_ci95",
        "exact_match",
        "sub_exact_match",
        "sub_exact_match_substring",
        "evidence_f1",
        "evidence_f1_text_only",
        "evidence_f1_strict",
        "hotpotqa_f1",
        "answer_f1_by_type",
    ]
    assert set(metrics["answer_f1_ci95"]) == {"mean", "low", "high", "confidence"}
