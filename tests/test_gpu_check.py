"""bench/gpu_check.py must not rot while no GPU runs it: its CPU path and its model builder."""

import json
import subprocess
import sys

from tests.conftest import HANG_SECONDS, ROOT


def test_the_cpu_smoke_path_reports_every_figure(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--tiny",
            "--context",
            "512",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "report.json"),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["episode_steps"] == 10 and report["fits"] is True
    assert report["prefill_tokens"] < report["prompt_tokens_final"] + 10 * 8  # the cache was reused
    assert report["prefill_tokens_per_second"] > 0 and report["decode_tokens_per_second"] > 0
    training = report["training"]
    assert training["steps"] == 3 and training["tokens_per_second"] > 0 and training["dry_run_estimate_gib"] > 0


def test_the_random_qwen3_8b_builder_writes_a_loadable_model(tmp_path, tiny_model):
    sys.path.insert(0, str(ROOT))
    from transformers import AutoModelForCausalLM

    from bench.gpu_check import QWEN3_8B, build_random_model

    shape = {
        **QWEN3_8B,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 4096,
    }
    directory = build_random_model(shape, tmp_path / "model", tiny_model)
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert model.config.num_key_value_heads == 2 and model.config.max_position_embeddings == 40960
    assert (directory / "tokenizer.json").exists()
