"""The four checks and the reload check of a decide run with a real model, SmolLM2-135M-Instruct
(``make smollm2``), on the docs' example file. What the random-weight tiny model never shows: a
real model's probabilities move when its options are listed in another order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paper_explorer.decisions.records import DecisionMetrics
from tests.conftest import run_cli

pytestmark = pytest.mark.real_model
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "decisions" / "checks.jsonl"


def test_the_checks_print_their_figures_and_the_run_rescores(smollm2, tmp_path):
    out = tmp_path / "run"
    decided = run_cli("decide", str(EXAMPLE), "--model", str(smollm2), "--out", str(out), "--check-reversed", "--threads", "1")
    assert decided.returncode == 0, decided.stderr
    for start in ("reversed options: n=8,", "negation: n=2 pairs,", "severity lean: n=2,", "unknown: n=1 unanswerable,"):
        assert start in decided.stdout
    checks = DecisionMetrics.model_validate_json((out / "metrics.json").read_text()).checks
    assert checks is not None and checks.reversed is not None
    assert checks.reversed.all.mean_total_variation is not None and checks.reversed.all.mean_total_variation > 1e-3

    rescored = run_cli("rescore", str(out), "--model", str(smollm2), "--json")
    assert rescored.returncode == 0, rescored.stderr
    report = json.loads(rescored.stdout)
    assert report["holds"] and report["cached"]["agreement"] == report["uncached"]["agreement"] == 1.0
    assert report["cached"]["readings"] == 16
