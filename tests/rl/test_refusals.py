"""explorer rl refuses what it cannot run before it writes anything, in one line with exit 2, and a
start that failed leaves an OUT the corrected command can use."""

import json

import pytest

from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.rl.config import RLConfig
from tests.conftest import run_cli

SMALL = ("--rounds", "1", "--questions-per-round", "1", "--group-size", "2", "--max-steps", "2", "--validation-episodes", "0")


def refused(out, *flags):
    done = run_cli("rl", "--out", str(out), *SMALL, *flags)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_a_weight_given_twice_or_not_a_number_is_one_line(tmp_path):
    assert "answer_f1 is weighed twice" in refused(tmp_path / "out", "--reward", "answer_f1=1", "--reward", "answer_f1=2")
    assert "weighs nan" in refused(tmp_path / "out", "--reward", "answer_f1=nan")
    assert not (tmp_path / "out").exists()


def test_more_questions_a_round_than_the_train_split_holds_are_refused_before_anything_is_written(tmp_path):
    said = refused(tmp_path / "out", "--model", str(tmp_path), "--questions-per-round", "100000")
    assert "--questions-per-round 100000 is more than the train split's" in said and "give at most" in said
    assert not (tmp_path / "out").exists()


def write_adapter(directory, config_text, weights=True):
    directory.mkdir()
    (directory / "adapter_config.json").write_text(config_text)
    if weights:
        (directory / "adapter_model.safetensors").write_bytes(b"")
    return directory


@pytest.mark.parametrize(
    "config_text, weights, said",
    [
        ("{not json", True, "adapter_config.json: not valid JSON"),
        ("[]", True, "not a peft adapter's config (no peft_type)"),
        ('{"peft_type": "LORA"}', False, "no adapter_model.safetensors"),
    ],
)
def test_an_adapter_that_is_not_one_is_one_line_before_anything_is_written(tmp_path, config_text, weights, said):
    adapter = write_adapter(tmp_path / "adapter", config_text, weights)
    assert said in refused(tmp_path / "out", "--model", str(tmp_path), "--adapter", str(adapter))
    assert not (tmp_path / "out").exists()


def test_a_start_that_failed_leaves_nothing_and_its_out_takes_the_corrected_command(tmp_path):
    out = tmp_path / "out"
    said = refused(out, "--model", str(tmp_path / "no-such-model"))
    assert "no-such-model" in said and not out.exists()  # the model is found missing after OUT was made: it is gone again
    # an OUT left by an older failed start: its settings alone, and the round directory it had made
    (out / "round-1").mkdir(parents=True)
    (out / "rl.json").write_text(RLConfig(kl_beta=0.5).model_dump_json())
    said = refused(out, "--model", str(tmp_path / "no-such-model"))
    assert "other settings" not in said and "no-such-model" in said
    assert out.is_dir() and not any(out.iterdir())  # nothing had been written that the settings were for


def test_a_run_with_something_written_keeps_its_settings(tmp_path):
    out = tmp_path / "out"
    (out / "round-0" / "validation").mkdir(parents=True)
    (out / "round-0" / "validation" / "manifest.json").write_text("{}")
    (out / "rl.json").write_text(RLConfig(kl_beta=0.5).model_dump_json())
    assert "holds an explorer rl run with other settings" in refused(out, "--model", str(tmp_path))
    assert json.loads((out / "rl.json").read_text())["kl_beta"] == 0.5


@pytest.mark.parametrize("shares, said", [((0.0, 0.5, 0.5), "no train questions"), ((1.0, 0.0, 0.0), "no validation questions")])
def test_a_corpus_without_the_split_it_needs_is_refused_before_anything_is_written(tmp_path, shares, said):
    from paper_explorer.agent.config import build_config
    from paper_explorer.rl.run import reinforce
    from paper_explorer.sft.errors import TrainingError

    config = build_config(RLConfig, {}, {"policy.model": str(tmp_path), "validation_episodes": 1}, "test")
    with pytest.raises(TrainingError, match=said):
        reinforce(config, out=tmp_path / "out", corpus=generate(DemoConfig(papers=6, seed=3, split_shares=shares)), log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_dangling_link_for_out_is_named_as_one(tmp_path):
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    assert "a symbolic link to" in refused(tmp_path / "out", "--model", str(tmp_path))


def test_an_adapter_made_for_another_model_is_one_line_and_leaves_nothing(tiny_model, tmp_path):
    adapter = write_adapter(tmp_path / "adapter", json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["no_such_proj"]}))
    said = refused(tmp_path / "out", "--model", str(tiny_model), "--threads", "1", "--adapter", str(adapter))
    assert f"{adapter}: this LoRA adapter does not load on {tiny_model}" in said and "no_such_proj" in said
    assert not (tmp_path / "out").exists()


def test_a_settings_file_that_is_not_one_is_to_be_restored_not_removed(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rl.json").write_text("{broken")
    said = refused(tmp_path / "out", "--model", str(tmp_path / "model"))
    assert "rl.json:1: not valid JSON" in said and "restore it, or choose another --out" in said


def test_the_dry_run_refuses_a_card_of_infinite_memory(tiny_model):
    done = run_cli("rl", "--dry-run", "--model", str(tiny_model), "--card-gib", "inf")
    assert done.returncode == 2 and "--card-gib" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_failed_start_reporting_to_tensorboard_leaves_no_event_file_behind(tmp_path):
    """TensorBoard's writer is opened when the first round is done: an event file written at the
    start would keep a failed start's settings from being forgotten."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "out"
    assert "no-such-model" in refused(out, "--model", str(tmp_path / "no-such-model"), "--report-to", "tensorboard")
    assert not out.exists()
