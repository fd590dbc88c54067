"""Errors that lead somewhere, met as a user meets them: Ctrl-C during ``eval`` says how far it got
and the command that resumes; a directory of another kind is named as what it is, with the
command that takes it (never a hint that points at another hint); ``run`` refuses an eval run's
directory; ``export`` refuses a corpus ``report`` refuses."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.agent.test_openai_policy import FakeServer
from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command, run_cli, with_signals_a_terminal_leaves

SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'
EPISODES = 6
ANSWERED = 2  # episodes the server answers before it stops answering, until the test lets it go


def one_line(done, *fragments: str, absent: tuple[str, ...] = ()) -> str:
    """The one error line of a refused command (exit 2), holding every fragment and none of ``absent``."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    for fragment in absent:
        assert fragment not in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kinds") / "eval-run"
    done = run_cli("eval", "--split", "all", "--limit", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def episode_log(tmp_path_factory) -> Path:
    """What `explorer run` writes: a trajectories.jsonl and nothing else."""
    out = tmp_path_factory.mktemp("kinds") / "runs"
    done = run_cli("run", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in out.iterdir()) == ["trajectories.jsonl"]
    return out


def test_ctrl_c_during_eval_says_how_far_it_got_and_the_command_that_resumes(tiny_tokenizer, tmp_path):
    """SIGINT to the process group, as a terminal sends it, while the run waits on its server."""
    let_go, waiting = threading.Event(), threading.Event()
    answered = [0]
    lock = threading.Lock()

    def respond(body):
        with lock:
            answered[0] += 1
            number = answered[0]
        if number > ANSWERED:
            waiting.set()
            let_go.wait(HANG_SECONDS)
        return 200, FakeServer.completion(SUBMIT, len(body["prompt"]))

    server = FakeServer(models=["served"], respond=respond)
    out = tmp_path / "run"
    command = explorer_command(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        server.url,
        "--model",
        "served",
        "--tokenizer",
        str(tiny_tokenizer),
        "--split",
        "all",
        "--limit",
        str(EPISODES),
        "--out",
        str(out),
    )
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=checkout_environment(),
        preexec_fn=with_signals_a_terminal_leaves,
        cwd=tmp_path,
    )
    try:
        assert waiting.wait(HANG_SECONDS), "the run never reached its third request"
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=HANG_SECONDS)
    finally:
        let_go.set()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    again = f"explorer eval --out {out} --resume"
    assert f"interrupted: {ANSWERED} of {EPISODES} episodes written to {out}; resume with: {again}" in stderr, stderr
    resumed = run_cli(*shlex.split(again)[1:])  # the line, exactly as printed
    server.server.shutdown()
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {ANSWERED} of {EPISODES} episodes already written" in resumed.stderr
    ids = [json.loads(line)["question_id"] for line in (out / "trajectories.jsonl").read_text().split("\n") if line]
    assert len(ids) == EPISODES == len(set(ids))


def test_eval_into_the_episode_log_of_run_names_it_and_neither_hint_points_at_the_other(episode_log):
    new = one_line(
        run_cli("eval", "--out", str(episode_log)),
        "the episode log of explorer run",
        "another --out",
        f"explorer show {episode_log}/trajectories.jsonl",
        absent=("--resume",),
    )
    resumed = one_line(
        run_cli("eval", "--out", str(episode_log), "--resume"),
        "the episode log of explorer run",
        "no run to resume",
        "another --out",
        absent=("pass --resume",),
    )
    assert new != resumed


def test_run_refuses_an_eval_run_and_leaves_it_whole(eval_run, tmp_path):
    before = {path.name: path.read_bytes() for path in eval_run.iterdir()}
    one_line(run_cli("run", "--out", str(eval_run)), "a run of explorer eval", "another --out", f"explorer inspect {eval_run}")
    assert {path.name: path.read_bytes() for path in eval_run.iterdir()} == before
    assert run_cli("inspect", str(eval_run)).returncode == 0


def test_run_appends_to_its_own_log_as_before(episode_log):
    before = (episode_log / "trajectories.jsonl").read_bytes().count(b"\n")
    assert run_cli("run", "--out", str(episode_log)).returncode == 0
    assert (episode_log / "trajectories.jsonl").read_bytes().count(b"\n") == before + 1


def _directory_of(kind: str, root: Path) -> tuple[Path, str, str]:
    """A directory as the command that makes it leaves it (by the files that tell its kind), what
    it is called, and the command named for it."""
    directory = root / kind
    directory.mkdir()
    if kind == "sft-data":
        for name in ("train.jsonl", "validation.jsonl", "build_report.json"):
            (directory / name).write_text("")
        return directory, "a dataset built by explorer sft build", f"explorer train --data {directory}"
    if kind == "training":
        (directory / "checkpoint-2").mkdir()
        (directory / "validation.jsonl").write_text("")
        return directory, "a training run of explorer train", "explorer eval --adapter"
    if kind == "checkpoint":
        (directory / "adapter_config.json").write_text("{}")
        return directory, "a checkpoint of explorer train", f"explorer eval --adapter {directory}"
    if kind == "improve":
        (directory / "improve.json").write_text("{}")
        (directory / "round-1").mkdir()
        return directory, "an explorer improve run", f"explorer inspect {directory}/round-1/samples"
    assert kind == "improve-round"
    (directory / "samples").mkdir()
    (directory / "samples" / "manifest.json").write_text("{}")
    return directory, "a round of explorer improve", f"explorer inspect {directory}/samples"


KINDS = ("sft-data", "training", "checkpoint", "improve", "improve-round")


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_report_and_export_name_a_directory_of_another_kind(kind, tmp_path):
    directory, called, command = _directory_of(kind, tmp_path)
    for args in (
        ["inspect", str(directory)],
        ["report", str(directory), "-o", str(tmp_path / "r.html")],
        ["compare", str(directory), str(directory)],
        ["export", str(directory), "--to", "inspect", str(tmp_path / "x.eval")],
    ):
        if args[0] == "export":
            pytest.importorskip("inspect_ai", reason="the export extra is not installed (tests/test_export.py requires it under CI)")
        line = one_line(run_cli(*args), called, "not a run of explorer eval", absent=("eval --resume", "--out RUN"))
        if kind != "sft-data" or args[0] != "export":  # export names --to hf for built data instead
            assert command in line, line


@pytest.mark.parametrize("kind", KINDS)
def test_eval_refuses_to_write_into_a_directory_of_another_kind(kind, tmp_path):
    directory, called, _ = _directory_of(kind, tmp_path)
    before = sorted(path.relative_to(directory) for path in directory.rglob("*"))
    one_line(run_cli("eval", "--out", str(directory)), called, "another --out")
    one_line(run_cli("eval", "--out", str(directory), "--resume"), called, "no run to resume")
    one_line(run_cli("run", "--out", str(directory)), called, "another --out")
    assert sorted(path.relative_to(directory) for path in directory.rglob("*")) == before


def test_an_unfinished_run_says_the_command_that_finishes_it(eval_run, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("manifest.json", "trajectories.jsonl"):
        (unfinished / name).write_bytes((eval_run / name).read_bytes())
    one_line(run_cli("inspect", str(unfinished)), "no metrics.json", f"explorer eval --out {unfinished} --resume finishes it")
    assert run_cli("eval", "--out", str(unfinished), "--resume").returncode == 0
    assert run_cli("inspect", str(unfinished)).returncode == 0


def test_export_refuses_a_moved_corpus_as_report_does(tmp_path):
    pytest.importorskip("inspect_ai", reason="the export extra is not installed (tests/test_export.py requires it under CI)")
    corpus = tmp_path / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "20", "--seed", "5", "--out", str(corpus)).returncode == 0
    run = tmp_path / "run"
    assert run_cli("eval", "--corpus", str(corpus), "--split", "all", "--limit", "2", "--out", str(run)).returncode == 0
    moved = corpus.rename(tmp_path / "moved.jsonl")
    report = one_line(run_cli("report", str(run), "-o", str(tmp_path / "r.html")), "is gone", "pass --corpus")
    export = one_line(run_cli("export", str(run), "--to", "inspect", str(tmp_path / "x.json")), "is gone", "pass --corpus")
    assert report == export and not (tmp_path / "x.json").exists()
    other = tmp_path / "other.jsonl"
    assert run_cli("corpus", "generate", "--papers", "20", "--seed", "6", "--out", str(other)).returncode == 0
    one_line(
        run_cli("export", str(run), "--to", "inspect", str(tmp_path / "x.json"), "--corpus", str(other)),
        "are not those of run",
        "pass --corpus",
    )
    done = run_cli("export", str(run), "--to", "inspect", str(tmp_path / "x.json"), "--corpus", str(moved))
    assert done.returncode == 0, done.stderr
    samples = json.loads((tmp_path / "x.json").read_text())["samples"]
    assert len(samples) == 2 and all(sample["target"] for sample in samples)  # gold answers, never an empty list


@pytest.mark.parametrize("name", ["trajectories.jsonl", "scores.jsonl", "metrics.json", "manifest.json"])
def test_a_run_file_an_editor_saved_with_a_byte_order_mark_reads_as_before(eval_run, tmp_path, name):
    """As corpus.files.decode reads any other text: the UTF-8 mark is dropped, not called invalid JSON."""
    run = tmp_path / "run"
    run.mkdir()
    for path in eval_run.iterdir():
        (run / path.name).write_bytes(path.read_bytes())
    (run / name).write_bytes(b"\xef\xbb\xbf" + (run / name).read_bytes())
    shown = run_cli("inspect", str(run))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == run_cli("inspect", str(eval_run)).stdout.replace(str(eval_run), str(run))
    resumed = run_cli("eval", "--out", str(run), "--resume")
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.parametrize(
    "budget, forged",
    [("max_steps", 10**9), ("observation_chars", 10**12), ("context_chars", 10**15)],
)
def test_a_resumed_manifest_with_a_budget_past_its_bound_is_one_line(eval_run, tmp_path, budget, forged):
    """A run cut off before its first episode is its manifest alone; the budgets a resume reads from it are bounded."""
    run = tmp_path / "run"
    run.mkdir()
    manifest = json.loads((eval_run / "manifest.json").read_text())
    manifest["config"]["episode"][budget] = forged
    (run / "manifest.json").write_text(json.dumps(manifest))
    one_line(run_cli("eval", "--out", str(run), "--resume"), f"{run}/manifest.json", f"config.episode.{budget}", "less than or equal to")
    assert not (run / "trajectories.jsonl").exists()
