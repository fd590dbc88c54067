"""Resuming training changes nothing: a run resumed from its validated mid checkpoint trains, bit for
bit, what the uninterrupted run trained; settings that would change that are refused; a run whose
only checkpoint a kill cut off starts again from step 0; a finished run's summary is kept."""

import shutil

import pytest

from paper_explorer.agent.models import file_sha256
from paper_explorer.sft.records import TrainingSummary
from tests.conftest import run_cli
from tests.sft import test_train
from tests.sft.test_train_watch import repeated_data, train_arguments

data = test_train.data  # the dataset built for the tiny model, a fixture shared with test_train.py

pytest.importorskip("torch")


def error_line(done) -> str:
    """The one error line (bitsandbytes may print a warning of its own on import, before it)."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def summary(out) -> TrainingSummary:
    return TrainingSummary.model_validate_json((out / "training_summary.json").read_text())


@pytest.mark.slow
def test_a_run_resumed_from_its_validated_checkpoint_trains_bit_for_bit_what_the_whole_run_did(tiny_model, data, tmp_path):
    arguments = train_arguments(tiny_model, data, tmp_path, 4, "--save-steps", "2")
    out = tmp_path / "out"
    # a kill that cut off the first save: --resume removes it, says so and trains from step 0
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"torn")
    whole = run_cli(*arguments, "--resume", env={"COLUMNS": "400"})
    assert whole.returncode == 0, whole.stderr
    assert f"{out / 'checkpoint-2'}: cut off while saving (no explorer_manifest.json); removed, resuming from step 0" in whole.stdout
    assert f"{out}: no complete checkpoint to resume from; training starts from step 0" in whole.stdout
    assert [c.checkpoint for c in summary(out).checkpoints] == ["checkpoint-2", "checkpoint-4"]  # validated at step 2 and 4

    # checkpoint-2 alone, as a kill during step 3 would have left it
    again = tmp_path / "again"
    shutil.copytree(out / "checkpoint-2", again / "checkpoint-2")
    resume = [*arguments[: arguments.index("--out") + 1], str(again), *arguments[arguments.index("--out") + 2 :], "--resume"]
    other_data = repeated_data(data, tmp_path / "other", 3)
    changed = run_cli(*resume, "--learning-rate", "0.5", "--lora-r", "8", "--report-to", "tensorboard", "--data", str(other_data))
    assert error_line(changed).startswith(
        f"error: {again}: refusing to resume: checkpoint-2 was trained with other settings "
        f"(lora_r 4 -> 8; learning_rate 0.001 -> 0.5; data {tmp_path / 'data'} -> {other_data})"
    )
    assert sorted(p.name for p in again.iterdir()) == ["checkpoint-2"]  # refused before anything was written

    resumed = run_cli(*resume)
    assert resumed.returncode == 0, resumed.stderr
    for name in ("adapter_model.safetensors", "optimizer.pt"):
        assert file_sha256(again / "checkpoint-4" / name) == file_sha256(out / "checkpoint-4" / name), name
    # the summary covers the whole run, both sessions
    assert summary(again).losses == summary(out).losses and summary(again).train_loss == summary(out).train_loss
    assert summary(again).steps == 4 and summary(again).resumed_from_step == 2 and summary(out).resumed_from_step == 0

    kept = (again / "training_summary.json").read_bytes()
    finished = run_cli(*resume, env={"COLUMNS": "400"})
    assert finished.returncode == 0, finished.stderr
    assert f"{again}: training already finished at step 4; nothing to train, its training_summary.json is kept" in finished.stdout
    assert (again / "training_summary.json").read_bytes() == kept


def test_resume_refusals_and_an_unwritable_log_directory_are_one_line_before_the_model_loads(tiny_model, data, tmp_path):
    arguments = train_arguments(tiny_model, data, tmp_path, 2)
    nothing = run_cli(*arguments, "--resume")
    assert nothing.returncode == 2 and "no training run to resume; start training without --resume" in nothing.stderr, nothing.stderr
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs").write_text("")  # where TensorBoard would write its event files
    blocked = run_cli(*arguments, "--resume", "--report-to", "tensorboard")
    assert error_line(blocked) == (
        f"error: --report-to tensorboard writes its logs under {tmp_path / 'out' / 'runs'}, but {tmp_path / 'out' / 'runs'} "
        "is a file; move it away, or choose another --out"
    )
