"""Attacks on a decide run's records: a forged figure that calibration or the checks read must not
pass `explorer rescore`, and a question recorded twice is refused by every reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions


@pytest.fixture(scope="module")
def decided(tmp_path_factory, tiny_model) -> Path:
    directory = tmp_path_factory.mktemp("decided")
    file = write_decisions(directory / "decisions.jsonl")
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(directory / "run")).returncode == 0
    return directory / "run"


def forged(decided: Path, tmp_path: Path, change) -> Path:
    """A copy of the run whose records ``change`` edits (the list of dicts, in place)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("manifest.json", "metrics.json"):
        (run / name).write_bytes((decided / name).read_bytes())
    records = [json.loads(line) for line in (decided / "decisions.jsonl").read_text().splitlines()]
    change(records)
    (run / "decisions.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return run


def q2(records: list[dict]) -> dict:
    return next(record for record in records if record["question_id"] == "q2")


def other_label(record: dict) -> None:
    record["label"] = next(option for option in record["options"] if option != record["label"])


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda records: q2(records).update(correct=not q2(records)["correct"]), "its recorded correct"),
        (lambda records: q2(records).update(p_max=0.5), "its recorded p_max 0.5 is not what its probabilities"),
        (lambda records: q2(records).update(confidence=0.0), "its recorded confidence 0.0 is not what"),
        (lambda records: other_label(q2(records)), "its recorded label 'BSD-3-Clause' (the file's: 'MIT') is not the file's"),
        (lambda records: q2(records).update(ordered=True), "its recorded ordered True (the file's: False)"),
        (lambda records: q2(records).update(document_id="d2"), "its recorded document_id 'd2' (the file's: 'd1')"),
    ],
)
def test_a_forged_figure_the_metrics_read_is_a_finding(decided, tmp_path, tiny_model, change, said):
    """The probabilities untouched, every recomputation agrees: the forged figure rescore said held
    (accuracy and calibration read `correct` and `p_max`, the checks `ordered` and the label)."""
    result = run_cli("rescore", str(forged(decided, tmp_path, change)), "--model", str(tiny_model))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"question q2: {said}" in result.stderr


def test_a_question_recorded_twice_is_refused(decided, tmp_path, tiny_model):
    """The first line of a question was read and the second ignored: a line put before the real
    one replaced it in the metrics, inspect and rescore."""

    def twice(records: list[dict]) -> None:
        copy = dict(records[0], probabilities=list(reversed(records[0]["probabilities"])))
        records.insert(0, copy)

    run = forged(decided, tmp_path, twice)
    result = run_cli("rescore", str(run), "--model", str(tiny_model))
    assert result.returncode == 2 and "decisions.jsonl:2: question 'q1' is also on line 1" in result.stderr
    file = write_decisions(tmp_path / "decisions.jsonl")  # the run's file, byte for byte
    resumed = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(run), "--resume")
    assert resumed.returncode == 2 and "is also on line 1" in resumed.stderr


def test_a_faithful_run_still_holds(decided, tiny_model):
    result = run_cli("rescore", str(decided), "--model", str(tiny_model))
    assert result.returncode == 0, result.stderr
    assert "rescore holds" in result.stdout
