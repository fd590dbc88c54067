"""explorer rl --report-to tensorboard: each finished round's figures, at step N, equal to its round.json."""

import json

import pytest

from tests.conftest import run_cli

pytest.importorskip("torch")


def test_tensorboard_gets_each_round_as_round_json_records_it(tiny_model, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "rl"
    done = run_cli(
        "rl", "--model", str(tiny_model), "--out", str(out), "--rounds", "2", "--questions-per-round", "1", "--group-size", "2",
        "--max-steps", "1", "--max-new-tokens", "8", "--validation-episodes", "1", "--validation-max-steps", "1", "--threads", "1",
        "--report-to", "tensorboard",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = EventAccumulator(str(out / "runs"))
    events.Reload()
    rounds = [json.loads((out / f"round-{n}" / "round.json").read_text()) for n in (1, 2)]
    rewards = events.Scalars("rl/reward_mean")
    assert [e.step for e in rewards] == [1, 2]
    assert [e.value for e in rewards] == pytest.approx([r["reward_mean"] for r in rounds])
    assert [e.value for e in events.Scalars("rl/tokens_trained")] == [r["update"]["tokens_trained"] for r in rounds]
    assert [e.value for e in events.Scalars("eval/answer_f1")] == pytest.approx([r["validation"]["answer_f1"] for r in rounds])
    assert {"rl/kl", "rl/clip_fraction", "rl/reward_part/answer_f1", "rl/reward_part/direct_submit"} <= set(events.Tags()["scalars"])
