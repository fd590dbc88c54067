"""The four checks as a user runs them: ``explorer decide`` with the tiny model writes each figure
into metrics.json and prints it, worked out here again from the run's records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paper_explorer.decisions.checks import order_agreement_of_runs
from paper_explorer.decisions.records import DecisionMetrics, DecisionRecord
from paper_explorer.decisions.run import read_records
from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions

FILE_ORDER = {"q3": [str(n) for n in range(1, 11)], "q5": ["minor", "major", "critical"]}


def decide(tmp_path, tiny_model, name, *flags):
    file = tmp_path / "decisions.jsonl"
    if not file.exists():
        write_decisions(file)
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / name), *flags)
    assert result.returncode == 0, result.stderr
    records = {record.question_id: record for record in read_records(tmp_path / name)}
    metrics = DecisionMetrics.model_validate_json((tmp_path / name / "metrics.json").read_text())
    assert metrics.checks is not None
    return result.stdout, records, metrics.checks


def p(record: DecisionRecord, option: str) -> float:
    return dict(zip(record.options, record.probabilities or []))[option]


def test_check_reversed_reads_every_question_again_and_reports_agreement(tmp_path, tiny_model):
    printed, records, checks = decide(tmp_path, tiny_model, "run", "--check-reversed")
    distances, agreeing = [], 0
    for record in records.values():
        again = record.reversed
        assert again is not None and again.options == record.options[::-1] and again.reversed is None
        assert sum(again.probabilities or []) == pytest.approx(1.0)
        distances.append(0.5 * sum(abs(p(record, option) - p(again, option)) for option in record.options))
        agreeing += record.predicted == again.predicted
    assert checks.reversed is not None
    assert (checks.reversed.all.questions, checks.reversed.all.agreeing, checks.reversed.unpaired) == (7, agreeing, 0)
    assert checks.reversed.all.mean_total_variation == pytest.approx(np.mean(distances))
    assert {kind: figures.questions for kind, figures in checks.reversed.kinds.items()} == {"noul": 3, "choice": 2, "score": 2}
    assert f"reversed options: n=7, same likeliest option {agreeing / 7:.3f}" in printed
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["check_reversed"] is True and manifest["order"] == "given"

    # the reversed reading is what a run --order reversed records, and two such runs give the figure
    _, reversed_run, _ = decide(tmp_path, tiny_model, "reversed", "--order", "reversed")
    for question_id, record in records.items():
        assert record.reversed is not None and record.reversed.options == reversed_run[question_id].options
        assert record.reversed.probabilities == pytest.approx(reversed_run[question_id].probabilities, abs=1e-4)
    from_runs = order_agreement_of_runs(list(records.values()), list(reversed_run.values()))
    assert from_runs.all.agreeing == checks.reversed.all.agreeing
    assert from_runs.all.mean_total_variation == pytest.approx(checks.reversed.all.mean_total_variation, abs=1e-4)


def test_negation_severity_and_unknown_are_in_every_run(tmp_path, tiny_model):
    printed, records, checks = decide(tmp_path, tiny_model, "run")
    assert checks.reversed is None and "reversed options: not run" in printed

    q, not_q = records["q1"], records["q1n"]
    consistent = {"yes": "no", "no": "yes", "unknown": "unknown"}[q.predicted or ""] == not_q.predicted
    assert (checks.negation.pairs, checks.negation.consistent) == (1, int(consistent))
    assert checks.negation.mean_yes_no_gap == pytest.approx(abs(p(q, "yes") - p(not_q, "no")))
    assert f"negation: n=1 pair, consistent {float(consistent):.3f}" in printed

    errors, leans = [], []
    for question_id, label in (("q3", "9"), ("q5", "minor")):
        record, levels = records[question_id], FILE_ORDER[question_id]
        errors.append((levels.index(record.predicted or ""), levels.index(label), len(levels) - 1))
        leans.append(sum(level * p(record, option) for level, option in enumerate(levels)) - levels.index(label))
    lean = checks.severity.all
    assert lean.questions == 2  # q6 has no label, the licence choice is not ordered
    assert lean.mean_error_levels == pytest.approx(np.mean([predicted - label for predicted, label, _ in errors]))
    assert lean.mean_error_scale == pytest.approx(np.mean([(predicted - label) / span for predicted, label, span in errors]))
    assert lean.more_severe == sum(predicted > label for predicted, label, _ in errors)
    assert lean.less_severe == sum(predicted < label for predicted, label, _ in errors)
    assert lean.expected_lean_levels == pytest.approx(np.mean(leans))
    assert set(checks.severity.kinds) == {"choice", "score"}
    assert "severity lean: n=2, mean error" in printed

    unknown = checks.unknown
    assert (unknown.unanswerable, unknown.unknown_chosen) == (1, int(records["q4"].predicted == "unknown"))
    assert unknown.mean_p_unknown == pytest.approx(p(records["q4"], "unknown"))
    assert (unknown.answerable, unknown.false_unknown) == (2, sum(records[i].predicted == "unknown" for i in ("q1", "q1n")))
    assert "unknown: n=1 unanswerable" in printed and "n=2 answerable" in printed


def test_severity_counts_levels_in_the_files_order_when_the_options_are_listed_reversed(tmp_path, tiny_model):
    _, records, checks = decide(tmp_path, tiny_model, "run", "--order", "reversed")
    choice = records["q5"]
    assert choice.options == ["critical", "major", "minor"]
    level = FILE_ORDER["q5"].index(choice.predicted or "")
    assert checks.severity.kinds["choice"].mean_error_levels == pytest.approx(level - 0)  # the label, minor, is level 0
    expected = sum(n * p(choice, option) for n, option in enumerate(FILE_ORDER["q5"]))
    assert checks.severity.kinds["choice"].expected_lean_levels == pytest.approx(expected)


def test_a_file_without_pairs_ordered_labels_or_noul_labels_says_not_measured(tmp_path, tiny_model):
    write_decisions(
        tmp_path / "decisions.jsonl",
        [
            {
                "id": "d",
                "text": "A short text.",
                "questions": [{"id": "c", "kind": "choice", "text": "Which?", "options": ["a", "b"], "label": "a"}],
            }
        ],
    )
    printed, _, checks = decide(tmp_path, tiny_model, "run")
    assert "negation: not measured: no pairs" in printed
    assert "severity lean: not measured: no labelled question with ordered options" in printed
    assert "unknown: not measured: no labelled noul question" in printed
    assert checks.negation.pairs == 0 and checks.negation.consistency is None
    assert checks.severity.all.questions == 0 and checks.unknown.unknown_rate is None


def test_resume_keeps_both_readings_of_each_question(tmp_path, tiny_model):
    decide(tmp_path, tiny_model, "run", "--check-reversed")
    out = tmp_path / "run"
    lines = (out / "decisions.jsonl").read_bytes().splitlines(keepends=True)
    (out / "decisions.jsonl").write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed mid-line
    other = run_cli("decide", str(tmp_path / "decisions.jsonl"), "--model", str(tiny_model), "--out", str(out), "--resume")
    assert other.returncode == 2 and "check_reversed" in other.stderr
    _, records, checks = decide(tmp_path, tiny_model, "run", "--resume", "--check-reversed")
    assert len(records) == 7 and all(record.reversed is not None for record in records.values())
    assert checks.reversed is not None and checks.reversed.all.questions == 7
