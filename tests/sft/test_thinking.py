"""Thinking mode end to end on the tiny model: served think blocks are kept in the history and
recorded, build with and without training them, train, and check-parity holds at every stage."""

import json

import pytest

from tests.conftest import run_cli

pytest.importorskip("torch")


def test_thinking_round_trips_through_run_build_train_and_check_parity(tiny_model, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    assert run_cli("corpus", "generate", "--papers", "12", "--seed", "3", "--out", str(corpus)).returncode == 0
    # the model thinks (random weights: it never closes its think block, so the budget closes it)
    served = run_cli(
        "run",
        "--corpus",
        str(corpus),
        "--policy",
        "hf",
        "--model",
        str(tiny_model),
        "--thinking",
        "--thinking-budget",
        "6",
        "--max-new-tokens",
        "6",
        "--max-steps",
        "2",
        "--record-prompt-ids",
        "--out",
        str(tmp_path / "run"),
    )
    assert served.returncode == 0, served.stderr
    (line,) = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    steps = json.loads(line)["steps"]
    assert all(step["reasoning"] is not None and step["served"]["source"] == "policy" for step in steps)
    assert steps[0]["generation"]["thinking_budget_hit"] and steps[0]["generation"]["thinking_tokens"] == 6
    assert steps[1]["served"]["ids"]["keep"] > 0
    held = run_cli("check-parity", "-t", str(tmp_path / "run" / "trajectories.jsonl"), "--tokenizer", str(tiny_model))
    assert held.returncode == 0, held.stderr

    taught = tmp_path / "taught.jsonl"
    done = run_cli(
        "sft", "teach", "--corpus", str(corpus), "--split", "all", "--thinking", "--tokenizer", str(tiny_model), "--out", str(taught)
    )
    assert done.returncode == 0, done.stderr
    labels = {}
    for train_thinking in (False, True):
        out = tmp_path / f"data-{train_thinking}"
        flags = ["--train-thinking"] if train_thinking else []
        built = run_cli(
            "sft",
            "build",
            "--corpus",
            str(corpus),
            "-t",
            str(taught),
            "--tokenizer",
            str(tiny_model),
            "--out",
            str(out),
            "--evaluation-split",
            "none",
            "--validation-share",
            "0.25",
            *flags,
        )
        assert built.returncode == 0, built.stderr
        example = json.loads((out / "train.jsonl").read_text().splitlines()[0])
        labels[train_thinking] = sum(label != -100 for label in example["labels"])
        checked = run_cli("check-parity", "-t", str(taught), "--tokenizer", str(tiny_model), "--data", str(out))
        assert checked.returncode == 0, checked.stderr
    assert labels[True] > labels[False]  # the think blocks are trained only when asked

    trained = run_cli(
        "train",
        "--model",
        str(tiny_model),
        "--data",
        str(tmp_path / "data-True"),
        "--out",
        str(tmp_path / "adapter"),
        "--max-steps",
        "1",
        "--validation-episodes",
        "1",
        "--quantization",
        "none",
    )
    assert trained.returncode == 0, trained.stderr
    assert list((tmp_path / "adapter").glob("checkpoint-*/explorer_manifest.json"))
