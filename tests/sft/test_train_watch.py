"""Training you can watch and interrupt: progress on stderr (a bar on a terminal, lines in a log),
Ctrl-C that saves a checkpoint --resume finishes (and a save cut off by a kill that it skips), --save-steps, the validation figures in
TensorBoard beside the loss, and two processes under accelerate launch."""

import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from importlib.util import find_spec

import pytest

from paper_explorer.agent.models import file_sha256
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.interrupts import launcher_warning
from paper_explorer.sft.records import CheckpointManifest, TrainingSummary, ValidationRecord
from paper_explorer.sft.train import training_arguments
from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command, run_cli, with_signals_a_terminal_leaves
from tests.sft import test_train

data = test_train.data  # the dataset built for the tiny model, a fixture shared with test_train.py

pytest.importorskip("torch")

RECIPE = (
    "quantization = 'none'\nepochs = 1\ngradient_accumulation_steps = 1\nmax_length = 4096\nlearning_rate = 0.001\n"
    "validation_episodes = 1\nvalidation_examples = 1\nvalidation_max_steps = 2\nvalidation_max_new_tokens = 8\n"
)
PROGRESS_LINE = re.compile(r"^step (\d+)/(\d+) \| epoch \d+\.\d\d \| loss \d+\.\d{4} \| [\d,]+ input tokens/s \| ETA (\d+:\d\d:\d\d|\?)$")


def repeated_data(data, directory, copies: int):
    """The dataset's first training example `copies` times: one step each, all the same length."""
    directory.mkdir()
    first = (data / "data" / "train.jsonl").read_text().splitlines()[0]
    (directory / "train.jsonl").write_text((first + "\n") * copies)
    (directory / "validation.jsonl").write_text(first + "\n")
    (directory / "build_report.json").write_text((data / "data" / "build_report.json").read_text())
    return directory


def train_arguments(tiny_model, data, tmp_path, copies: int, *extra: str) -> list[str]:
    (tmp_path / "recipe.toml").write_text(RECIPE)
    return [
        "train",
        "--model",
        str(tiny_model),
        "--data",
        str(repeated_data(data, tmp_path / "data", copies)),
        "--out",
        str(tmp_path / "out"),
        "--config",
        str(tmp_path / "recipe.toml"),
        "--corpus",
        str(data / "corpus.jsonl"),
        *extra,
    ]


def manifest(checkpoint) -> CheckpointManifest:
    found = CheckpointManifest.model_validate_json((checkpoint / "explorer_manifest.json").read_text())
    assert all(file_sha256(checkpoint / name) == digest for name, digest in found.files.items())
    return found


def ctrl_c_at(arguments: list[str], prefix: str, stdout) -> tuple[int, list[str], str]:
    """`explorer ARGUMENTS`, and Ctrl-C as a user would type it once a stderr line starts with PREFIX:
    the exit code, the stderr lines read until then and the whole stderr."""
    process = subprocess.Popen(
        explorer_command(*arguments),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_environment(),
        preexec_fn=with_signals_a_terminal_leaves,
    )
    watchdog = threading.Timer(HANG_SECONDS, process.kill)  # bounds a hang, never a speed
    watchdog.start()
    try:
        seen = []
        for line in process.stderr:
            seen.append(line)
            if line.startswith(prefix):
                process.send_signal(signal.SIGINT)
                break
        _, rest = process.communicate(timeout=HANG_SECONDS)
    finally:
        watchdog.cancel()
    return process.returncode, seen, "".join(seen) + rest


def interrupted(arguments: list[str], tmp_path, steps: int) -> tuple[int, str]:
    """Ctrl-C once the first step's progress line shows (training is under way); the step training
    stopped at (its checkpoint's, said on stderr with the command that resumes it) and whether it was validated."""
    with open(tmp_path / "stdout", "w") as stdout:
        returncode, seen, stderr = ctrl_c_at(arguments, "step 1/", stdout)
    assert returncode == 130, stderr
    assert PROGRESS_LINE.match(seen[-1].rstrip("\n")), seen[-1]
    stopped = re.search(
        rf"interrupted at step (\d+) of {steps}: checkpoint saved to (\S+) \((not validated|validated)\); "
        "resume with: explorer train .* --resume$",
        stderr,
        re.M,
    )
    assert stopped, stderr
    step = int(stopped.group(1))
    assert 1 <= step < steps and stopped.group(2) == str(tmp_path / "out" / f"checkpoint-{step}")
    return step, stopped.group(3)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_that_resume_trains_to_the_end(tiny_model, data, tmp_path):
    arguments = train_arguments(tiny_model, data, tmp_path, 12, "--save-steps", "5")
    step, judged = interrupted(arguments, tmp_path, 12)
    checkpoint = tmp_path / "out" / f"checkpoint-{step}"
    saved = manifest(checkpoint)
    if step % 5:  # the usual case: Ctrl-C during step 2
        assert judged == "not validated" and saved.interrupted and saved.validation is None and saved.step == step
    else:  # a slow machine stopped on a --save-steps step: validated as it would have been
        assert judged == "validated" and not saved.interrupted and saved.validation.behaviour.episodes == 1
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert not (tmp_path / "out" / "training_summary.json").exists()
    # a later save that a kill cut off before its manifest: never resumed from
    cut = tmp_path / "out" / f"checkpoint-{step + 1}"
    shutil.copytree(checkpoint, cut)
    (cut / "explorer_manifest.json").unlink()
    (cut / "adapter_model.safetensors").write_bytes(b"torn")

    resumed = run_cli(*arguments, "--resume", env={"COLUMNS": "400"})
    assert resumed.returncode == 0, resumed.stderr
    assert f"{cut}: cut off while saving (no explorer_manifest.json); removed, resuming from {checkpoint.name}" in resumed.stdout
    steps = [int(m.group(1)) for m in map(PROGRESS_LINE.match, resumed.stderr.splitlines()) if m]
    assert steps == list(range(step + 1, 13))  # continues after the checkpoint, to the end
    summary = TrainingSummary.model_validate_json((tmp_path / "out" / "training_summary.json").read_text())
    assert summary.steps == 12 and len(summary.losses) == 12 and summary.resumed_from_step == step  # the whole run's losses
    assert summary.train_loss == pytest.approx(sum(summary.losses) / 12)
    expected = [s for s in (5, 10, 12) if s > step]  # every --save-steps step and the epoch's end
    assert [c.checkpoint for c in summary.checkpoints] == [f"checkpoint-{s}" for s in expected]
    for s in expected:
        complete = manifest(tmp_path / "out" / f"checkpoint-{s}")
        assert not complete.interrupted and complete.validation.behaviour.episodes == 1
        assert len((tmp_path / "out" / "validation-episodes" / f"step-{s}.jsonl").read_text().splitlines()) == 1
    assert summary.best_checkpoint is None or summary.best_checkpoint in {c.checkpoint for c in summary.checkpoints}


@pytest.mark.slow
def test_ctrl_c_on_a_step_that_saves_anyway_validates_its_checkpoint(tiny_model, data, tmp_path):
    """With --save-steps 1 every step saves a checkpoint: the one Ctrl-C stops at is validated, never
    written off as interrupted (and so lost to the selection)."""
    step, judged = interrupted(train_arguments(tiny_model, data, tmp_path, 4, "--save-steps", "1"), tmp_path, 4)
    saved = manifest(tmp_path / "out" / f"checkpoint-{step}")
    assert judged == "validated" and not saved.interrupted and saved.validation.behaviour.episodes == 1
    records = [ValidationRecord.model_validate_json(line) for line in (tmp_path / "out" / "validation.jsonl").read_text().splitlines()]
    assert [r.checkpoint for r in records] == [f"checkpoint-{s}" for s in range(1, step + 1)]


def test_progress_is_a_bar_on_a_terminal_and_tensorboard_gets_the_behaviour_beside_the_loss(tiny_model, data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    arguments = train_arguments(tiny_model, data, tmp_path, 3, "--report-to", "tensorboard")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    with open(tmp_path / "stdout", "w") as stdout:
        process = subprocess.Popen(
            explorer_command(*arguments),
            stdout=stdout,
            stderr=terminal,
            env=checkout_environment(),
            preexec_fn=with_signals_a_terminal_leaves,
        )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert process.wait(timeout=HANG_SECONDS) == 0, shown.decode(errors="replace")
    bar = shown.decode(errors="replace")
    assert "3/3" in bar and re.search(r"loss \d+\.\d{4}, [\d,]+ input tok/s", bar), bar
    assert not re.search(r"^step \d+/3 \|", bar, re.M)  # the line format is for logs, not terminals

    (record,) = [ValidationRecord.model_validate_json(line) for line in (tmp_path / "out" / "validation.jsonl").read_text().splitlines()]
    (run,) = (tmp_path / "out" / "runs").iterdir()
    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    figures = {
        "direct_submit_rate": record.behaviour.direct_submit_rate,
        "answer_f1": record.behaviour.answer_f1,
        "tool_calls_before_submit": record.behaviour.tool_calls_before_submit,
        "first_action_end_probability": record.teacher_forced.first_action_end_probability,
        "loss": record.teacher_forced.loss_all,
    }
    assert None not in (figures["direct_submit_rate"], figures["answer_f1"], figures["first_action_end_probability"])
    for name, value in figures.items():
        if value is None:  # no episode ended by submit or abstain: there is no count before it to log
            assert f"eval/{name}" not in tags
            continue
        (logged,) = events.Scalars(f"eval/{name}")
        assert logged.step == 3 and logged.value == pytest.approx(value, rel=1e-6), name


def test_a_reporter_whose_package_is_missing_is_one_line_before_loading_anything(tmp_path):
    if find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: the missing-package message cannot be shown")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "build_report.json").write_text("{}")
    done = run_cli(
        "train", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--report-to", "wandb"
    )
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --report-to wandb needs the wandb package, which is not installed; pip install wandb, or pass --report-to none"
    )
    assert not (tmp_path / "out").exists()
    unknown = run_cli("train", "--dry-run", "--report-to", "mlflow")
    assert unknown.returncode == 2 and "unknown --report-to 'mlflow'" in unknown.stderr


def test_the_trainer_is_told_the_reporter_and_the_save_steps(tmp_path):
    """The wiring of --report-to wandb, checked without wandb installed (WANDB_MODE=offline is wandb's own)."""
    wandb = training_arguments(TrainConfig(report_to="wandb", save_steps=7), tmp_path, cuda=False)
    assert wandb.report_to == ["wandb"] and wandb.save_strategy == "steps" and wandb.save_steps == 7
    quiet = training_arguments(TrainConfig(), tmp_path, cuda=False)
    assert quiet.report_to == [] and quiet.save_strategy == "epoch"


@pytest.mark.slow
def test_two_processes_under_accelerate_launch_train_and_only_the_first_writes(tiny_model, data, tmp_path):
    arguments = train_arguments(tiny_model, data, tmp_path, 8)
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--num_cpu_threads_per_process",
        "1",
        "--main_process_port",
        "0",
        "-m",
        "paper_explorer.cli.main",
        *arguments,
    ]
    done = subprocess.run(launch, capture_output=True, text=True, env=checkout_environment({"COLUMNS": "200"}), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    # 8 examples over 2 processes: 4 steps, one checkpoint at the epoch's end
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-4"]
    saved = manifest(out / "checkpoint-4")
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(saved.files)  # each process's RNG, for an exact resume
    assert saved.validation.behaviour.episodes == 1
    assert len((out / "validation.jsonl").read_text().splitlines()) == 1  # validated once, by the first process
    assert len((out / "validation-episodes" / "step-4.jsonl").read_text().splitlines()) == 1
    summary = TrainingSummary.model_validate_json((out / "training_summary.json").read_text())
    assert summary.steps == 4
    assert done.stdout.count("selection (highest") == 1  # the summary, printed once
    assert [m.group(1) for m in map(PROGRESS_LINE.match, done.stderr.splitlines()) if m] == ["1", "2", "3", "4"]
    # The first step's loss is the one process would log: every example is the same, and a fresh
    # adapter (LoRA's B is zero) leaves the base model's loss - not half of it (the token count is
    # summed over both processes, DDP averages their gradients).
    import torch

    from paper_explorer.sft.dataset import load_examples
    from paper_explorer.sft.model import assistant_loss, load_model

    model, _ = load_model(TrainConfig(model=str(tiny_model), quantization="none", gradient_checkpointing=False))
    example = load_examples(tmp_path / "data" / "train.jsonl")[0]
    with torch.no_grad():
        alone, _, _ = assistant_loss(model.eval(), torch.tensor([example.input_ids]), torch.tensor([example.labels]))
    assert summary.losses[0] == pytest.approx(alone.item(), rel=0.02)


def test_ctrl_c_under_torchrun_warns_of_its_kill_unless_the_timeout_was_raised():
    """torchrun SIGKILLs its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (30 by default) after it
    forwards a Ctrl-C; a step and a save that take longer are lost, so the interrupt says so."""
    launched = {"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    assert "kills these 2 processes 30 s after Ctrl-C" in launcher_warning(launched)
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=3600" in launcher_warning(launched)
    assert launcher_warning({**launched, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "3600"}) is None
    assert launcher_warning({**launched, "WORLD_SIZE": "1"}) is None and launcher_warning({}) is None


def test_loading_a_model_leaves_the_download_progress_bars_on(tiny_model):
    """transformers' own switch turns the hub's download bars off with its loading bar; ours turns
    them back on. (A switch, not a download: nothing may be fetched from a hub in tests.) In a fresh
    process, as the CLI loads a model: this test process's tiny-model builder turned them off."""
    script = (
        "from huggingface_hub import utils\nfrom paper_explorer.agent.models import load_causal_lm\n"
        f"load_causal_lm({str(tiny_model)!r}, 'none')\nprint('disabled' if utils.are_progress_bars_disabled() else 'shown')"
    )
    environment = {k: v for k, v in checkout_environment().items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=HANG_SECONDS)
    assert done.returncode == 0 and done.stdout.split() == ["shown"], done.stderr
