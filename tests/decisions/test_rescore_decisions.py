"""explorer rescore on a decide run: every reading recomputed with the prompt's cache and without
one, each compared with the record; a prompt that is not the recorded one is a finding naming its
question."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions

QASPER_MINI = Path(__file__).resolve().parents[1] / "fixtures" / "qasper-mini-v0.3.json"


@pytest.fixture(scope="module")
def decided(tmp_path_factory, tiny_model):
    """A decide run with both readings of every question, copied fresh for each test that edits it."""
    directory = tmp_path_factory.mktemp("decided")
    file = write_decisions(directory / "decisions.jsonl")
    result = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(directory / "run"), "--check-reversed")
    assert result.returncode == 0, result.stderr
    return directory / "run"


def edited(decided: Path, tmp_path: Path, question_id: str, change) -> Path:
    """A copy of the run whose record of ``question_id`` ``change`` edits (a dict, in place)."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    for name in ("manifest.json", "metrics.json"):
        (run / name).write_bytes((decided / name).read_bytes())
    lines = []
    for line in (decided / "decisions.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["question_id"] == question_id:
            change(record)
        lines.append(json.dumps(record) + "\n")
    (run / "decisions.jsonl").write_text("".join(lines))
    return run


def test_a_faithful_run_holds_cached_and_uncached(decided, tiny_model):
    result = run_cli("rescore", str(decided), "--model", str(tiny_model))
    assert result.returncode == 0, result.stderr
    assert "decide run: questions 7, readings 14 (7 reversed), rescored with" in result.stdout
    assert "cached (the prompt's cache, its prefix reused as the run did) vs recorded: agreement 1.0000 (14 of 14)" in result.stdout
    assert "uncached (a full pass per option) vs recorded: agreement 1.0000 (14 of 14)" in result.stdout
    assert result.stdout.rstrip().endswith("rescore holds")
    report = json.loads(run_cli("rescore", str(decided), "--model", str(tiny_model), "--json").stdout)
    assert report["kind"] == "decide run" and report["holds"] and not report["findings"]
    assert report["cached"]["readings"] == report["uncached"]["readings"] == 14
    assert report["cached"]["agreement"] == report["uncached"]["agreement"] == 1.0
    assert report["cached"]["max_probability_difference"] == 0.0  # the run's own sequence of caches: the same sums
    assert 0.0 <= report["uncached"]["max_relative_loglikelihood_difference"] <= 5e-5
    recorded = {json.loads(line)["question_id"]: json.loads(line) for line in (decided / "decisions.jsonl").read_text().splitlines()}
    for reading in report["readings"]:
        record = recorded[reading["question_id"]]
        record = record["reversed"] if reading["reversed"] else record
        assert reading["options"] == record["options"] and reading["recorded"] == record["probabilities"]
        assert reading["uncached"] == pytest.approx(record["probabilities"], abs=5e-5)


def test_an_edited_probability_or_choice_is_named(decided, tiny_model, tmp_path):
    def nudge(record):
        first, second = record["probabilities"][:2]
        record["probabilities"][:2] = [first + 1e-3, second - 1e-3] if first > second else [first - 1e-3, second + 1e-3]
        p_max, count = max(record["probabilities"]), len(record["probabilities"])
        record.update(p_max=p_max, confidence=(count * p_max - 1) / (count - 1))  # consistent, so only the recomputation tells

    run = edited(decided, tmp_path / "nudged", "q5", nudge)
    result = run_cli("rescore", str(run), "--model", str(tiny_model))
    assert result.returncode == 1
    assert "rescore broken: question q5, cached: probabilities differ beyond 5e-05" in result.stderr

    def other_choice(record):
        record["reversed"]["predicted"] = next(option for option in record["options"] if option != record["reversed"]["predicted"])

    run = edited(decided, tmp_path / "chosen", "q2", other_choice)
    result = run_cli("rescore", str(run), "--model", str(tiny_model))
    assert result.returncode == 1
    assert "question q2 (its reversed reading), cached: the likeliest option is" in result.stderr
    assert "agreement 0.9286 (13 of 14)" in result.stdout


def test_a_prompt_that_is_not_the_recorded_one_is_a_finding_naming_the_question(decided, tiny_model, tmp_path):
    run = edited(decided, tmp_path, "q4", lambda record: record.update(prompt_sha256="0" * 64))
    result = run_cli("rescore", str(run), "--model", str(tiny_model), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    [finding] = report["findings"]
    assert finding.startswith("question q4: its prompt rebuilt from the file") and "is not the recorded one" in finding
    assert report["cached"]["readings"] == 13  # q4's own reading is not rescored; its reversed one is
    assert "rescore broken: question q4: its prompt rebuilt" in result.stderr


def test_the_run_must_be_rescored_against_its_own_file_and_model(decided, tiny_model, tmp_path):
    changed = tmp_path / "run"
    changed.mkdir()
    manifest = json.loads((decided / "manifest.json").read_text())
    other_file = tmp_path / "other.jsonl"
    other_file.write_text(Path(manifest["file"]).read_text().replace("Which licence?", "Which licence is it?"))
    manifest["file"] = str(other_file)
    (changed / "manifest.json").write_text(json.dumps(manifest))
    (changed / "decisions.jsonl").write_bytes((decided / "decisions.jsonl").read_bytes())
    result = run_cli("rescore", str(changed), "--model", str(tiny_model))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert f"{other_file}: not the file the run {changed} scored" in result.stderr

    manifest["file"] = str(decided.parent / "decisions.jsonl")
    manifest["model"]["tokenizer_sha256"] = "f" * 64
    (changed / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("rescore", str(changed), "--model", str(tiny_model))
    assert result.returncode == 2 and "is not the one the run was scored with" in result.stderr

    result = run_cli("rescore", str(tmp_path / "no-run"), "--model", str(tiny_model), "--corpus", str(QASPER_MINI))
    assert result.returncode == 2 and "only a decide run whose documents name papers reads a corpus" in result.stderr
    result = run_cli("rescore", str(decided), "--model", str(tiny_model), "--corpus", str(QASPER_MINI))
    assert result.returncode == 2 and f"the run {decided} read no corpus; rescore it without one" in result.stderr


def test_a_question_not_measured_because_it_does_not_fit_is_confirmed(tmp_path, tiny_model):
    long = [
        {
            "id": "d",
            "text": "word " * 400,
            "questions": [{"id": "q", "kind": "noul", "text": "Is it long?", "label": "yes"}],
        },
        {"id": "s", "text": "short", "questions": [{"id": "r", "kind": "noul", "text": "Is it short?", "label": "yes"}]},
    ]
    file = write_decisions(tmp_path / "long.jsonl", long)
    out = tmp_path / "run"
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--max-context", "200", "--out", str(out)).returncode == 0
    result = run_cli("rescore", str(out), "--model", str(tiny_model))
    assert result.returncode == 0, result.stderr
    assert (
        "questions 1, readings 1, rescored" in result.stdout and "not measured 1 (their prompt does not fit), findings 0" in result.stdout
    )

    record = json.loads((out / "decisions.jsonl").read_text().splitlines()[1])
    assert record["question_id"] == "r"
    claimed = dict(record, probabilities=None, loglikelihoods=None, predicted=None, not_measured="server down")
    (out / "decisions.jsonl").write_text((out / "decisions.jsonl").read_text().splitlines()[0] + "\n" + json.dumps(claimed) + "\n")
    result = run_cli("rescore", str(out), "--model", str(tiny_model))
    assert result.returncode == 1 and "question r: recorded as not measured (server down), but its prompt of" in result.stderr


def test_a_run_of_corpus_papers_is_rescored_with_its_corpus(tmp_path, tiny_model):
    papers = [{"id": "p", "paper": "2101.00002", "questions": [{"id": "q", "kind": "noul", "text": "Does it use retrieval?"}]}]
    file = write_decisions(tmp_path / "papers.jsonl", papers)
    out = tmp_path / "run"
    decided = run_cli("decide", str(file), "--model", str(tiny_model), "--corpus", str(QASPER_MINI), "--out", str(out))
    assert decided.returncode == 0, decided.stderr
    without = run_cli("rescore", str(out), "--model", str(tiny_model))
    assert without.returncode == 2 and "give the corpus it is in with --corpus" in without.stderr
    result = run_cli("rescore", str(out), "--model", str(tiny_model), "--corpus", str(QASPER_MINI))
    assert result.returncode == 0, result.stderr
    assert "rescore holds" in result.stdout


def test_a_run_with_an_adapter_is_rescored_with_its_adapter_only(tmp_path, tiny_model):
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora).save_pretrained(adapter)
    file = write_decisions(
        tmp_path / "decisions.jsonl", [{"id": "d", "text": "A text.", "questions": [{"id": "q", "kind": "noul", "text": "Is it?"}]}]
    )
    out = tmp_path / "run"
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--adapter", str(adapter), "--out", str(out)).returncode == 0
    held = run_cli("rescore", str(out), "--model", str(tiny_model), "--adapter", str(adapter))
    assert held.returncode == 0, held.stderr
    without = run_cli("rescore", str(out), "--model", str(tiny_model))
    assert without.returncode == 2 and "the run was scored with the adapter" in without.stderr
    changed = tmp_path / "changed"
    shutil.copytree(adapter, changed)
    (changed / "README.md").write_text("edited\n")
    other = run_cli("rescore", str(out), "--model", str(tiny_model), "--adapter", str(changed))
    assert other.returncode == 2 and "README.md is not the run's" in other.stderr
