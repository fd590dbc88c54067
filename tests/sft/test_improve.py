"""explorer improve on the tiny model: the mechanics of sample -> filter -> build -> train ->
validate, round by round, resumable (records asserted, not quality)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, with_signals_a_terminal_leaves
from tests.integration.conftest import VLLM_PYTHON

VLLM_INSTALLED = VLLM_PYTHON.exists()

pytest.importorskip("torch")


def improve_args(tiny_model, tmp_path, rounds: int, samples: int, limit: int, max_steps: int, max_new_tokens: int, out=None) -> list[str]:
    """A small corpus and a teacher's trajectories as seed data, and the improve command over them."""
    corpus = tmp_path / "corpus.jsonl"
    if not corpus.exists():  # a second run in the same test shares them
        assert run_cli("corpus", "generate", "--papers", "10", "--seed", "5", "--out", str(corpus)).returncode == 0
        taught = run_cli(
            "sft", "teach", "--corpus", str(corpus), "--tokenizer", str(tiny_model), "--limit", "6", "--out", str(tmp_path / "t.jsonl")
        )
        assert taught.returncode == 0, taught.stderr
    return [
        "improve",
        "--model",
        str(tiny_model),
        "--corpus",
        str(corpus),
        "--rounds",
        str(rounds),
        "--samples",
        str(samples),
        "--limit",
        str(limit),
        "--max-steps",
        str(max_steps),
        "--max-new-tokens",
        str(max_new_tokens),
        "--train-max-steps",
        "1",
        "--validation-episodes",
        "1",
        "--quantization",
        "none",
        "--seed-data",
        str(tmp_path / "t.jsonl"),
        "--out",
        str(out or tmp_path / "improve"),
    ]


@pytest.mark.slow
def test_rounds_run_every_stage_record_it_and_resume_without_redoing_them(tiny_model, tmp_path):
    args = improve_args(tiny_model, tmp_path, rounds=2, samples=2, limit=3, max_steps=2, max_new_tokens=6)
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
    changed = run_cli(*args, "--temperature", "0.3")
    assert changed.returncode == 2 and "other settings (temperature)" in changed.stderr


@pytest.mark.slow
def test_a_kill_mid_round_resumes_without_losing_or_repeating_an_attempt(tiny_model, tmp_path):
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command

    args = improve_args(tiny_model, tmp_path, rounds=1, samples=3, limit=6, max_steps=3, max_new_tokens=8)
    log = tmp_path / "improve" / "round-1" / "samples" / "trajectories.jsonl"
    process = subprocess.Popen(
        explorer_command(*args),
        env=checkout_environment(),
        preexec_fn=with_signals_a_terminal_leaves,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and len(log.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # mid-round: some attempts written, the rest not
    process.wait()
    assert not (tmp_path / "improve" / "round-1" / "round.json").exists()
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    attempts = [json.loads(line) for line in log.read_bytes().splitlines()]
    keys = [(a["question_id"], a["sample"]) for a in attempts]
    assert len(keys) == len(set(keys)) == 18  # 6 questions x 3 samples, each once
    assert json.loads((tmp_path / "improve" / "round-1" / "round.json").read_text())["episodes"] == 18


@pytest.mark.parametrize("flag, value", [("--quantization", "bogus"), ("--temperature", "inf"), ("--temperature", "50")])
def test_bad_settings_are_one_line_and_write_nothing(tiny_model, tmp_path, flag, value):
    done = run_cli("improve", "--model", str(tiny_model), "--out", str(tmp_path / "improve"), flag, value)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "improve").exists()


@pytest.mark.slow
def test_ctrl_c_while_a_round_trains_saves_a_checkpoint_and_says_how_to_resume(tiny_model, tmp_path):
    import subprocess

    from tests.sft.test_train_watch import ctrl_c_at

    args = improve_args(tiny_model, tmp_path, rounds=1, samples=1, limit=2, max_steps=2, max_new_tokens=6)
    args[args.index("--train-max-steps") + 1] = "3"
    returncode, _, stderr = ctrl_c_at(args, "step 1/3", subprocess.DEVNULL)  # the round's training is under way
    assert returncode == 130 and "Traceback" not in stderr, stderr
    train = tmp_path / "improve" / "round-1" / "train"
    assert f"checkpoint saved to {train}/checkpoint-" in stderr and "resume with: explorer improve --model" in stderr, stderr
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert json.loads((train / "training_summary.json").read_text())["steps"] == 3


def served_rounds(out) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("round-*/round.json"))]


@pytest.mark.slow
@pytest.mark.skipif(VLLM_INSTALLED, reason="tests/integration/test_vllm_adapters.py proves this against a real vLLM")
def test_two_runs_on_one_server_each_sample_every_round_with_their_own_adapter(tiny_model, tmp_path):
    """The bug this guards against: adapters named round-N, a second run's load answered "already
    loaded", and its round 2 sampled the first run's adapter while recording its own. (Against a
    fake vLLM, where no real one is installed: the real one proves it in the integration tests,
    which CI always runs, and four improve runs would double the suite's slowest module.)"""
    from tests.agent.test_adapters import FakeVllm, make_adapter

    server = FakeVllm()
    start = make_adapter(tmp_path / "start")  # round 1's policy; the fake never reads its weights
    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        args = improve_args(tiny_model, tmp_path, rounds=2, samples=1, limit=2, max_steps=2, max_new_tokens=6, out=out)
        done = run_cli(*args, "--base-url", server.url, "--adapter", str(start))
        assert done.returncode == 0, done.stderr
    used = server.sampled_with()  # each name completions asked for -> the path loaded under it at the time
    records = [record for out in runs for record in served_rounds(out)]
    assert len(records) >= 2 and len({record["served_name"] for record in records}) == len(records)
    for record in records:
        assert record["served_path"] == str(Path(record["sampled_with"]).resolve())
        assert used[record["served_name"]] == record["served_path"]  # sampled with exactly that checkpoint
    assert set(used) == {record["served_name"] for record in records} and server.adapters == {}  # all unloaded
    server.server.shutdown()


def forged_round(out: Path, adapter: Path | None, **fields) -> Path:
    """OUT/round-1/round.json: a kept round naming ``adapter`` (nothing is trained or sampled)."""
    (out / "round-1").mkdir(parents=True, exist_ok=True)
    record = {
        "round": 1,
        "sampled_with": "base",
        "episodes": 2,
        "successful": 1,
        "adapter": adapter and str(adapter),
        "kept": True,
        "reason": "kept",
    }
    (out / "round-1" / "round.json").write_text(json.dumps({**record, **fields}))
    return out / "round-1" / "round.json"


def one_round(out: Path):
    return run_cli("improve", "--model", "no-model-is-loaded", "--rounds", "1", "--out", str(out))


def test_a_rounds_recorded_adapter_is_used_only_inside_its_training_run_and_as_recorded(tmp_path):
    from paper_explorer.agent.models import file_hashes

    out = tmp_path / "improve"
    adapter = out / "round-1" / "train" / "checkpoint-2"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    forged_round(out, adapter, adapter_files=file_hashes(adapter))
    done = one_round(out)
    assert done.returncode == 0 and f"the result is {adapter}" in done.stdout, done.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "adapter_model.safetensors").write_bytes(b"weights")
    linked = out / "round-1" / "train" / "checkpoint-3"
    linked.symlink_to(elsewhere)
    (out / "round-1" / "train" / "file").write_text("not a checkpoint")
    for named in (elsewhere, linked, out / "round-1" / "train", out / "round-1" / "train" / ".." / ".." / ".." / "elsewhere"):
        record = forged_round(out, named, adapter_files=file_hashes(elsewhere))
        done = one_round(out)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"{record}: its adapter {named} is not a checkpoint of the round's training run" in done.stderr
        assert f"remove {record} to judge the round again" in done.stderr

    (adapter / "adapter_model.safetensors").write_bytes(b"other weights")
    for fields, said in (
        ({"adapter_files": {"adapter_model.safetensors": "0" * 64}}, "adapter_model.safetensors changed, added or removed"),
        ({}, "a kept round without its adapter's file hashes"),
    ):
        forged_round(out, adapter, **fields)
        done = one_round(out)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    forged_round(out, None)
    assert "a kept round without an adapter" in one_round(out).stderr
