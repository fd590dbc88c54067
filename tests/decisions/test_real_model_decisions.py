"""Typed decisions with a real pretrained chat model, SmolLM2-135M-Instruct (``make smollm2``), on
the example file of docs/decisions.md: every kind, in its own chat template, the one-pass scores
equal to a pass per option, and answers that read the document where the choice is plain.

Skipped without the model locally; under CI=true a missing model fails."""

import json

import pytest

from paper_explorer.decisions.run import read_records
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.real_model
EXAMPLE = ROOT / "docs" / "examples" / "decisions" / "software-papers.jsonl"


@pytest.fixture(scope="module")
def runs(smollm2, tmp_path_factory):
    directory = tmp_path_factory.mktemp("decide-smollm2")
    for mode in ("shared", "separate"):
        done = run_cli("decide", str(EXAMPLE), "--model", str(smollm2), "--threads", "1", "--mode", mode, "--out", str(directory / mode))
        assert done.returncode == 0, done.stderr
    return directory


def test_every_kind_is_scored_in_its_own_template_and_one_pass_equals_a_pass_per_option(runs):
    shared = {record.question_id: record for record in read_records(runs / "shared")}
    separate = {record.question_id: record for record in read_records(runs / "separate")}
    assert {record.kind for record in shared.values()} == {"noul", "choice", "score"}
    assert len(shared) == 16 and all(record.measured for record in shared.values())
    for question_id, record in shared.items():
        assert record.loglikelihoods == pytest.approx(separate[question_id].loglikelihoods, abs=1e-3)
        assert record.predicted == separate[question_id].predicted
        # a real model puts a real share of its replies on the options (the random tiny model: ~e^-20)
        assert record.log_mass is not None and record.log_mass > -12
    metrics = json.loads((runs / "shared" / "metrics.json").read_text())
    assert {kind: figures["labelled"] for kind, figures in metrics["kinds"].items()} == {"noul": 7, "choice": 6, "score": 3}


def test_it_reads_the_document_where_the_answer_is_plain(runs):
    """The language each paper names, among five: a random model would pick either at chance."""
    records = {record.question_id: record for record in read_records(runs / "shared")}
    assert records["orbitsim-language"].predicted == "C++"
    assert records["geneplot-language"].predicted == "R"
