"""``explorer improve`` and ``explorer sft build`` take their settings from one model each
(``ImproveSettings``, ``BuildConfig``): typed on the command line, read from a ``--config`` file, or
passed by a Python caller, the same fields with the same defaults reach the same record."""

import json

import pytest

from paper_explorer import BuildConfig, ImproveSettings, build_dataset, improve
from tests.conftest import run_cli


def not_kept_round(out):
    """OUT/round-1/round.json: a round that was not kept, so a one-round run stops at once (no model loads)."""
    (out / "round-1").mkdir(parents=True)
    record = {"round": 1, "sampled_with": "base", "episodes": 2, "successful": 0, "kept": False, "reason": "nothing to train on"}
    (out / "round-1" / "round.json").write_text(json.dumps(record))


def test_improve_typed_with_no_settings_records_the_apis_defaults(tmp_path):
    for out in (tmp_path / "cli", tmp_path / "api"):
        not_kept_round(out)
    done = run_cli("improve", "--out", str(tmp_path / "cli"))
    assert done.returncode == 0 and "stopped after round 1" in done.stdout, done.stderr
    improve(ImproveSettings(), out=tmp_path / "api", log=lambda line: None)
    by_command = json.loads((tmp_path / "cli" / "improve.json").read_text())
    assert by_command == json.loads((tmp_path / "api" / "improve.json").read_text())
    assert by_command == ImproveSettings().model_dump(mode="json")
    assert by_command["model"] == "Qwen/Qwen3-8B" and by_command["rounds"] == 2 and by_command["temperature"] == 0.7


def test_improve_takes_a_config_file_and_its_flags_win(tmp_path):
    out = tmp_path / "rounds"
    not_kept_round(out)
    config = tmp_path / "improve.toml"
    config.write_text('model = "my/model"\nrounds = 1\nsamples = 8\nseed_data = ["a.jsonl"]\n')
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    done = run_cli(
        "improve",
        "--config",
        str(config),
        "--samples",
        "3",
        "--seed-data",
        str(tmp_path / "b.jsonl"),
        "-m",
        "other/model",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    recorded = json.loads((out / "improve.json").read_text())
    assert (recorded["model"], recorded["rounds"], recorded["samples"]) == ("other/model", 1, 3)
    assert recorded["seed_data"] == [str(tmp_path / "b.jsonl")]  # a list given as flags replaces the file's


@pytest.mark.parametrize(
    "args, said",
    [
        (["--base-url", "localhost:8000"], "'localhost:8000' must start with http:// or https://"),
        (["--rounds", "0"], "rounds must be at least 1"),
        (["--quantization", "8bit"], "unknown --quantization '8bit'"),
    ],
)
def test_improve_refuses_a_bad_setting_in_one_line_before_writing(tmp_path, args, said):
    done = run_cli("improve", "--out", str(tmp_path / "rounds"), *args)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "rounds").exists()
    with pytest.raises(ValueError, match="must start with http"):
        ImproveSettings(base_url="localhost:8000")


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    path = tmp_path_factory.mktemp("taught") / "teacher.jsonl"
    done = run_cli("sft", "teach", "--limit", "8", "--out", str(path))
    assert done.returncode == 0, done.stderr
    return path


def test_sft_build_typed_with_no_settings_records_the_apis_defaults(tmp_path, taught, tiny_tokenizer):
    done = run_cli("sft", "build", "-t", str(taught), "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    report = build_dataset(BuildConfig(), trajectories=[taught], tokenizer=tiny_tokenizer, out=tmp_path / "api")
    by_command = json.loads((tmp_path / "cli" / "build_report.json").read_text())
    assert by_command["settings"] == report.settings == BuildConfig().model_dump()
    assert by_command["kept"] == report.kept


def test_sft_build_takes_its_old_flags_and_a_config_file(tmp_path, taught, tiny_tokenizer):
    config = tmp_path / "build.toml"
    config.write_text('overflow = "split"\nmin_answer_f1 = 0.9\n')
    done = run_cli(
        "sft", "build", "-t", str(taught), "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "data"),
        "--config", str(config), "--min-answer-f1", "0", "--drop-abstentions", "--best-of", "1", "--evaluation-split", "none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = json.loads((tmp_path / "data" / "build_report.json").read_text())["settings"]
    assert settings == {
        **BuildConfig().model_dump(),
        "overflow": "split",
        "min_answer_f1": 0.0,
        "keep_correct_abstentions": False,
        "best_of": 1,
        "evaluation_split": "none",
    }
    refused = run_cli(
        "sft", "build", "-t", str(taught), "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "x"), "--overflow", "cut"
    )
    assert refused.returncode == 2 and "unknown --overflow 'cut'; choose 'drop' or 'split'" in refused.stderr, refused.stderr
