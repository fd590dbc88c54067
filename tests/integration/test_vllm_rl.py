"""explorer rl sampling through a real vLLM (its CPU build) with runtime LoRA loading: round 2
samples round 1's adapter through the server, the ids trained are the ids the server drew, and the
server's raw log-probabilities (temperature 1, vLLM's default --logprobs-mode) are replaced as the
ratio's denominator by the starting weights' at the sampling temperature, so the ratio is 1 at the
first step, while the recorded ones still match the trainer's at temperature 1.

Its own module: under `--dist loadscope` it gets its own worker and server (the session fixture),
so its CPU training does not slow the other vLLM tests' worker.
"""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.test_vllm_adapters import listed, loaded_in_log

pytestmark = pytest.mark.vllm

SAMPLED_AT = 0.7


def test_rl_samples_each_round_through_the_server_and_trains_exactly_what_it_drew(vllm_server, tmp_path):
    out = tmp_path / "rl"
    done = run_cli(
        "rl", "--policy", "openai", "--base-url", vllm_server.url, "--model", vllm_server.model,
        "--tokenizer", str(vllm_server.model_dir), "--temperature", str(SAMPLED_AT), "--rounds", "2",
        "--questions-per-round", "2", "--group-size", "2", "--max-new-tokens", "8", "--max-steps", "2",
        "--minibatches", "1", "--validation-episodes", "0", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = (json.loads((out / f"round-{n}" / "samples" / "manifest.json").read_text())["config"]["policy"] for n in (1, 2))
    assert first["served_adapter"] is None  # round 1 samples the base
    served = second["served_adapter"]  # round 2 samples round 1's adapter, as the server itself says it loaded it
    assert served["path"] == str((out / "round-1" / "update" / "adapter").resolve())
    assert loaded_in_log(vllm_server)[served["name"]] == served["path"] and served["name"] not in listed(vllm_server)
    for number, model in ((1, vllm_server.model), (2, served["name"])):
        round_dir = out / f"round-{number}"
        draws = 0
        for line in (round_dir / "samples" / "trajectories.jsonl").read_text().splitlines():
            trajectory = json.loads(line)
            assert trajectory["policy"]["settings"]["model"] == model and trajectory["outcome"]["status"] != "policy_error"
            for step in trajectory["steps"]:
                sampled = step["served"]["sampled"]
                assert sampled["source"] == "server" and sampled["temperature"] == 1.0  # vLLM's raw log-probabilities
                draws += 1
        batch = [json.loads(line) for line in (round_dir / "batch.jsonl").read_text().splitlines()]
        assert draws and batch and {(s["temperature"], s["old_logprobs_temperature"]) for s in batch} == {(SAMPLED_AT, 1.0)}
        update = json.loads((round_dir / "round.json").read_text())["update"]
        assert update["old_logprobs_recomputed"] == update["sequences"] > 0
        assert update["first_step_ratio_gap_max"] < 1e-5  # the ratio's denominator: the starting weights' at 0.7
        assert update["sampler_logprob_gap_max"] < 1e-3, update  # the server's base (and adapter) are the trainer's
    held = run_cli("check-parity", "--rl", str(out), "--tokenizer", str(vllm_server.model_dir))
    assert held.returncode == 0 and "rl parity holds: 2 rounds" in held.stdout, held.stdout + held.stderr
    assert Path(served["path"]).is_dir()
