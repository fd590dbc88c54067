"""explorer improve on the tiny model: the mechanics of sample -> filter -> build -> train ->
validate, round by round, resumable (records asserted, not quality)."""

import json

import pytest

from tests.conftest import run_cli

pytest.importorskip("torch")


@pytest.mark.slow
def test_rounds_run_every_stage_record_it_and_resume_without_redoing_them(tiny_model, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    assert run_cli("corpus", "generate", "--papers", "10", "--seed", "5", "--out", str(corpus)).returncode == 0
    taught = run_cli("sft", "teach", "--corpus", str(corpus), "--tokenizer", str(tiny_model), "--limit", "6", "--out", str(tmp_path / "t.jsonl"))
    assert taught.returncode == 0, taught.stderr
    args = ["improve", "--model", str(tiny_model), "--corpus", str(corpus), "--rounds", "2", "--samples", "2", "--limit", "3",
            "--max-steps", "2", "--max-new-tokens", "6", "--train-max-steps", "1", "--validation-episodes", "1",
            "--quantization", "none", "--seed-data", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "improve")]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    first = json.loads((tmp_path / "improve" / "round-1" / "round.json").read_text())
    assert first["episodes"] == 6 and first["sampled_with"] == "base" and first["examples"] > 0
    samples = [json.loads(line) for line in (tmp_path / "improve" / "round-1" / "samples" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(s["sample"] for s in samples) == [0, 0, 0, 1, 1, 1] and samples[0]["policy"]["settings"]["decoding"] == "sampling"
    report = json.loads((tmp_path / "improve" / "round-1" / "data" / "build_report.json").read_text())
    assert report["settings"]["best_of"] == 1 and report["parity"]["mismatches"] == 0
    assert (tmp_path / "improve" / "round-1" / "train" / "training_summary.json").exists()
    if first["kept"]:  # round 2 samples with round 1's adapter
        second = json.loads((tmp_path / "improve" / "round-2" / "round.json").read_text())
        assert second["sampled_with"] == first["adapter"] and "round 2:" in done.stdout
    else:
        assert "stopped after round 1" in done.stdout and not (tmp_path / "improve" / "round-2").exists()

    summary = tmp_path / "improve" / "round-1" / "train" / "training_summary.json"
    before = summary.stat().st_mtime_ns
    again = run_cli(*args)
    assert again.returncode == 0 and summary.stat().st_mtime_ns == before, again.stderr  # nothing redone
    changed = run_cli(*[a if a != "--samples" else "--samples" for a in args[:-2]], "--temperature", "0.3", "--out", str(tmp_path / "improve"))
    assert changed.returncode == 2 and "other settings (temperature)" in changed.stderr
