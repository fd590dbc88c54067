"""`explorer run`, `show` and `eval` as a user runs them, including kill -9 and --resume."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command, run_cli, run_cli_process


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    done = run_cli("corpus", "generate", "--papers", "60", "--seed", "3", "--out", str(path))
    assert done.returncode == 0, done.stderr
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bare_run_shows_a_demo_episode_and_writes_it(tmp_path):
    done = run_cli("run", "--out", str(tmp_path / "runs"), env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    for shown in ("Question", "step 1", "search(", "observation", "trajectory written to"):
        assert shown in done.stdout
    (trajectory,) = lines(tmp_path / "runs" / "trajectories.jsonl")
    assert trajectory["outcome"]["status"] in ("submitted", "abstained")
    assert trajectory["policy"]["name"] == "scripted" and trajectory["hashes"]["corpus_sha256"]
    shown = run_cli("show", str(tmp_path / "runs" / "trajectories.jsonl"))
    assert shown.returncode == 0 and "step 1" in shown.stdout and trajectory["outcome"]["status"] in shown.stdout


def test_run_a_question_of_my_own_with_another_policy(tmp_path, corpus_file):
    done = run_cli(
        "run", "--corpus", str(corpus_file), "--question", "Which optimizer is used?", "--policy", "direct-submit", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    (trajectory,) = lines(tmp_path / "trajectories.jsonl")
    assert trajectory["question_id"] is None and len(trajectory["steps"]) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--policy", "gpt-9"], "unknown policy 'gpt-9'"),
        (["run", "--question", "x", "--question-id", "y"], "not both"),
        (["run", "--question-id", "demo-00000-q9"], "no question 'demo-00000-q9'"),
        (["run", "--policy", "replay"], "needs --replay"),
        (["run", "--max-steps", "0"], "max-steps"),
        (["show", "missing.jsonl"], "no such trajectory file"),
        (["eval", "--out", "{tmp}/r", "--split", "devel"], "unknown split 'devel'; did you mean validation?"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, message):
    done = run_cli(*(arg.format(tmp=tmp_path) for arg in args))
    assert done.returncode == 2, done
    assert message in done.stderr and "Traceback" not in done.stderr


def test_eval_writes_manifest_trajectories_and_metrics(tmp_path, corpus_file):
    out = tmp_path / "run"
    # --workers forks episode processes from the caller: a process of its own, not the test process
    done = run_cli_process("eval", "--corpus", str(corpus_file), "--split", "test", "--out", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["policy"]["name"] == "scripted" and manifest["hashes"]["questions_sha256"]
    assert {"python", "paper-explorer"} <= set(manifest["versions"]) and manifest["hardware"]["cores"]
    metrics = json.loads((out / "metrics.json").read_text())
    trajectories = lines(out / "trajectories.jsonl")
    assert metrics["episodes"] == len(trajectories) == manifest["config"]["questions"]
    assert len({t["question_id"] for t in trajectories}) == len(trajectories)
    assert manifest["isolation"] and {t["isolation"] for t in trajectories} == {manifest["isolation"]}
    assert 0 <= metrics["answer_f1"] <= 1 and set(metrics["abstention"]) == {"answerable", "unanswerable"}
    again = run_cli("eval", "--corpus", str(corpus_file), "--split", "test", "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr


def test_resume_refuses_another_config_or_corpus(tmp_path, corpus_file):
    out = tmp_path / "run"
    assert run_cli("eval", "--corpus", str(corpus_file), "--out", str(out), "--limit", "3").returncode == 0
    other = run_cli("eval", "--corpus", str(corpus_file), "--out", str(out), "--limit", "3", "--max-steps", "4", "--resume")
    assert other.returncode == 2 and "config" in other.stderr
    demo = tmp_path / "demo.jsonl"
    assert run_cli("corpus", "export", "--out", str(demo)).returncode == 0
    different = run_cli("eval", "--corpus", str(demo), "--out", str(out), "--limit", "3", "--resume")  # the demo corpus, not the file
    assert different.returncode == 2 and "hashes" in different.stderr


def test_resume_reads_its_settings_from_the_manifest(tmp_path, corpus_file):
    out = tmp_path / "run"
    config = tmp_path / "eval.toml"
    config.write_text('split = "all"\nlimit = 4\n[policy]\nname = "read-all"\n[episode]\nmax_steps = 3\nwall_seconds = 7.5\n')
    first = run_cli("eval", "--corpus", str(corpus_file), "--out", str(out), "--config", str(config), "--limit", "2")
    assert first.returncode == 0, first.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["limit"] == 2 and manifest["config"]["split"] == "all"  # the flag won over the file
    assert manifest["config"]["policy"]["name"] == "read-all" and manifest["config"]["episode"]["wall_seconds"] == 7.5
    (out / "trajectories.jsonl").write_text((out / "trajectories.jsonl").read_text().splitlines(keepends=True)[0])
    resumed = run_cli("eval", "--out", str(out), "--resume")  # nothing repeated: corpus and config from the manifest
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 2 episodes already written" in resumed.stderr
    trajectories = lines(out / "trajectories.jsonl")
    assert len(trajectories) == 2 and {t["config"]["max_steps"] for t in trajectories} == {3}


@pytest.mark.slow
def test_resume_after_kill_9_loses_and_duplicates_nothing(tmp_path, corpus_file):
    out = tmp_path / "run"
    args = explorer_command("eval", "--corpus", str(corpus_file), "--split", "all", "--policy", "read-all", "--out", str(out))
    rng = random.Random(11)
    log = out / "trajectories.jsonl"
    written_at_kill = []

    def written() -> int:
        return log.read_bytes().count(b"\n") if log.exists() else 0

    for attempt in range(3):
        process = subprocess.Popen(
            args + (["--resume"] if attempt else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=checkout_environment()
        )
        target = written() + rng.randint(1, 40)  # kill at a random episode, whatever the machine's speed
        deadline = time.monotonic() + HANG_SECONDS
        while written() < target and process.poll() is None and time.monotonic() < deadline:
            time.sleep(rng.uniform(0, 0.01))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        written_at_kill.append(written())
    done = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=HANG_SECONDS, env=checkout_environment())
    assert done.returncode == 0, done.stderr
    trajectories = lines(out / "trajectories.jsonl")  # every line parses: none is torn
    ids = [t["question_id"] for t in trajectories]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(ids) == len(set(ids)) == manifest["config"]["questions"]
    assert any(0 < count < len(ids) for count in written_at_kill), written_at_kill  # a kill landed mid-run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == len(ids) and metrics["duplicate_lines"] == 0


def test_scripted_runs_never_import_torch(tmp_path):
    probe = (
        "import sys, atexit\n"
        "atexit.register(lambda: print('heavy:', sorted({'torch', 'transformers'} & set(sys.modules))))\n"
        f"sys.argv = ['explorer', 'run', '--out', {str(tmp_path)!r}]\n"
        "from paper_explorer.cli.main import main\nmain()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG_SECONDS, env=checkout_environment())
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stdout


@pytest.mark.parametrize(
    "content, message",
    [
        ("[episode]\nmax_steps = 0\n", "episode.max_steps"),
        ("colour = 'blue'\n", "colour"),
        ("[policy]\nname = 'gpt-9'\n", "unknown policy 'gpt-9'"),
        ("split = \n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path, content, message):
    config = tmp_path / "eval.toml"
    config.write_text(content)
    done = run_cli("eval", "--out", str(tmp_path / "run"), "--config", str(config))
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists()


def test_schema_describes_the_records_users_read(tmp_path):
    schema = json.loads(run_cli("schema", "trajectory").stdout)
    assert {"isolation", "steps", "outcome", "schema_version"} <= set(schema["properties"])
    assert {"Generation", "StepPolicyInfo", "ToolCallRecord", "Outcome"} <= set(schema["$defs"])
    manifest = json.loads(run_cli("schema", "manifest").stdout)
    assert {"config", "hashes", "isolation"} <= set(manifest["properties"])
    out = tmp_path / "run"
    assert run_cli("eval", "--out", str(out), "--limit", "2").returncode == 0
    written = json.loads((out / "manifest.json").read_text())
    # file_sha256 is left out for the bundled demo corpus, which was read from no file
    assert set(written) == set(manifest["properties"]) - {"file_sha256"}
    assert set(lines(out / "trajectories.jsonl")[0]) <= set(schema["properties"])
    bad = run_cli("schema", "episode")
    assert bad.returncode == 2 and "choose one of" in bad.stderr


def test_version_1_trajectories_still_load(tmp_path):
    out = tmp_path / "run"
    assert run_cli("run", "--out", str(out)).returncode == 0
    record = lines(out / "trajectories.jsonl")[0]
    record["schema_version"] = 1
    del record["isolation"]
    for step in record["steps"]:
        del step["deferred_output_chars"]
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(record) + "\n")
    shown = run_cli("show", str(old))
    assert shown.returncode == 0 and record["question"][:30] in shown.stdout


def test_a_run_on_the_demo_corpus_resumes_from_its_manifest_alone(tmp_path):
    out = tmp_path / "run"
    assert run_cli("eval", "--out", str(out), "--limit", "2").returncode == 0
    (out / "trajectories.jsonl").write_text((out / "trajectories.jsonl").read_text().splitlines(keepends=True)[0])
    resumed = run_cli("eval", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert len(lines(out / "trajectories.jsonl")) == 2


def test_a_config_file_that_changes_a_resumed_run_is_refused(tmp_path, corpus_file):
    out = tmp_path / "run"
    assert run_cli("eval", "--corpus", str(corpus_file), "--out", str(out), "--limit", "2").returncode == 0
    config = tmp_path / "other.toml"
    config.write_text("[episode]\nmax_steps = 3\n")
    done = run_cli("eval", "--out", str(out), "--resume", "--config", str(config))
    assert done.returncode == 2 and "config" in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--wall-seconds", "inf"], "wall_seconds"),
        (["--timeout", "inf"], "timeout"),
        (["--memory-mb", "99999999999999"], "memory_mb"),
    ],
)
def test_limits_that_no_run_could_record_are_refused_before_it_starts(tmp_path, args, message):
    out = tmp_path / "run"
    done = run_cli("eval", "--out", str(out), "--limit", "1", *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_run_directories_that_cannot_hold_a_run_are_one_line(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("x")
    under_file = run_cli("eval", "--out", str(blocked / "run"), "--limit", "1")
    assert under_file.returncode == 2 and ("cannot create" in under_file.stderr or "Not a directory" in under_file.stderr)
    here = run_cli("eval", "--out", "", "--limit", "1", cwd=tmp_path)
    assert here.returncode == 2 and "current directory" in here.stderr and not (tmp_path / "manifest.json").exists()
    out = tmp_path / "run"
    (out / "manifest.json").mkdir(parents=True)
    broken = run_cli("eval", "--out", str(out), "--resume")
    assert broken.returncode == 2 and len(broken.stderr.strip().splitlines()) == 1, broken.stderr
