"""docs/examples/slurm/, run as Slurm runs it: each array task is eval-array.sbatch under bash (its
#SBATCH lines are comments there) with the SLURM_ARRAY_* variables Slurm sets, and merge.sbatch
runs once every task succeeded. The merged run is the run one `explorer eval` process writes; a
task killed with its node and run again (Slurm's --requeue) resumes its shard; a refused shard fails
its task (exit 2, one line), so the merge, which depends on every task's success, never runs.
submit.sh is checked against a recording sbatch: the array, then the merge after it."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from paper_explorer.agent.trajectory import Trajectory, without_timings
from tests.conftest import HANG_SECONDS, ROOT, checkout_environment, explorer_command, killed_once_logged, run_cli

RECIPE = ROOT / "docs" / "examples" / "slurm"
EVAL_ARRAY, MERGE, SUBMIT = RECIPE / "eval-array.sbatch", RECIPE / "merge.sbatch", RECIPE / "submit.sh"
EXPLORER = " ".join(explorer_command())  # the recipe's EXPLORER: this checkout's code, split on spaces
SHARDS = 3  # of 12 demo test questions, 6, 1 and 5 fall in shards 1/3, 2/3 and 3/3
EVAL_FLAGS = ["--max-steps", "8"]  # flags after the script's name reach every task's explorer eval
SAMPLES = ["--samples", "10"]  # shard 1 then holds 60 episodes: a task killed after its first is far from done


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The index cache every command shares (module fixtures run before the per-test one sets it)."""
    return tmp_path_factory.getbasetemp() / "explorer-cache"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "eval.toml"
    path.write_text("limit = 12\n")
    return path


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cache, config):
    """The run one `explorer eval` process writes of the same questions, by its extra flags (made once each)."""
    made: dict[tuple[str, ...], Path] = {}

    def run(*flags: str) -> Path:
        if flags not in made:
            out = tmp_path_factory.mktemp("one-process") / "run"
            done = run_cli("eval", "--config", str(config), *EVAL_FLAGS, *flags, "--out", str(out), env={"EXPLORER_CACHE_DIR": str(cache)})
            assert done.returncode == 0, done.stderr
            made[flags] = out
        return made[flags]

    return run


def slurm_task(task_id: int, first: int, run: Path, config: Path, cache: Path) -> dict[str, str]:
    """What a task of `sbatch --array=FIRST-LAST --export=ALL` sees: the recipe's settings, exported by
    the submit line, and the array variables Slurm sets (LAST - FIRST + 1 = SHARDS tasks)."""
    return {
        "RUN": str(run),
        "CONFIG": str(config),
        "CORPUS": "",  # the demo corpus, whatever the caller's environment says
        "EXPLORER": EXPLORER,
        "EXPLORER_CACHE_DIR": str(cache),
        "SLURM_JOB_ID": str(7000 + task_id),
        "SLURM_ARRAY_JOB_ID": "7000",
        "SLURM_ARRAY_TASK_ID": str(task_id),
        "SLURM_ARRAY_TASK_MIN": str(first),
        "SLURM_ARRAY_TASK_MAX": str(first + SHARDS - 1),
        "SLURM_ARRAY_TASK_COUNT": str(SHARDS),
    }


def script(path: Path, environment: dict[str, str], *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """`bash SCRIPT ARGUMENTS`, as a Slurm node runs a batch script: in the submit directory, with its environment."""
    return subprocess.run(
        ["bash", str(path), *arguments],
        cwd=cwd,
        env=checkout_environment(environment),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )


def tasks_at_once(environments: list[dict[str, str]], *flags: str, cwd: Path) -> list[subprocess.CompletedProcess]:
    """Array tasks side by side, as Slurm starts them on several nodes."""
    with ThreadPoolExecutor(len(environments)) as pool:
        return list(pool.map(lambda environment: script(EVAL_ARRAY, environment, *EVAL_FLAGS, *flags, cwd=cwd), environments))


def merge(run: Path, cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    return script(MERGE, {"RUN": str(run), "EXPLORER": EXPLORER, "EXPLORER_CACHE_DIR": str(cache)}, cwd=cwd)


def ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


def refused(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 and one error line (after the script's own line saying which shard it starts, if any)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and done.stderr.strip().splitlines()[-1] == errors[0], done.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def trajectories(run: Path) -> list[dict]:
    return [without_timings(Trajectory.model_validate_json(line)) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def as_one_process_wrote_it(merged: Path, one: Path) -> None:
    """The merged run is the one-process run: its episodes in the same order, equal but for their
    wall-clock fields; the same scores and metrics (metrics.json holds no timing field: every field,
    the bootstrap CI too); the same config."""
    expected, actual = trajectories(one), trajectories(merged)
    assert [(t["question_id"], t["sample"]) for t in actual] == [(t["question_id"], t["sample"]) for t in expected]
    assert actual == expected
    assert (merged / "scores.jsonl").read_text() == (one / "scores.jsonl").read_text()
    assert json.loads((merged / "metrics.json").read_text()) == json.loads((one / "metrics.json").read_text())
    assert json.loads((merged / "manifest.json").read_text())["config"] == json.loads((one / "manifest.json").read_text())["config"]


@pytest.mark.parametrize("first", [1, 0], ids=["array-1-3", "array-0-2"])
def test_the_array_and_its_merge_write_the_run_of_one_process(first, tmp_path, cache, config, one_process):
    run = tmp_path / "run"
    ids = range(first, first + SHARDS)
    done = tasks_at_once([slurm_task(task_id, first, run, config, cache) for task_id in ids], cwd=tmp_path)
    for task_id, task in zip(ids, done, strict=True):
        ok(task)
        index = task_id - first + 1
        assert f"shard {index}/{SHARDS}: starting {run / f'shard-{index}'} (task {task_id} of job 7000)" in task.stderr
    assert sorted(p.name for p in run.iterdir()) == ["shard-1", "shard-2", "shard-3"]
    merged = merge(run, cache, tmp_path)
    ok(merged)
    assert f"merged 3 shards (12 episodes) into {run / 'merged'}" in merged.stdout.replace("\n", " ")
    as_one_process_wrote_it(run / "merged", one_process())


@pytest.mark.slow  # six commands and 240 episodes (about 18 s on 2 cores)
def test_a_task_killed_with_its_node_resumes_its_shard_when_slurm_runs_it_again(tmp_path, cache, config, one_process):
    run = tmp_path / "run"
    task_1, *others = [slurm_task(task_id, 1, run, config, cache) for task_id in range(1, SHARDS + 1)]
    log = run / "shard-1" / "trajectories.jsonl"
    written = killed_once_logged(["bash", str(EVAL_ARRAY), *EVAL_FLAGS, *SAMPLES], log, 1, env=task_1)
    assert 1 <= written < 60, f"the task was killed after {written} of shard 1's 60 episodes"
    for task in tasks_at_once(others, *SAMPLES, cwd=tmp_path):
        ok(task)
    # Had Slurm run the merge now, it would refuse the unfinished shard and write nothing.
    refused(merge(run, cache, tmp_path), str(run / "shard-1"), f"unfinished: {written} of 60 episodes", "--resume")
    assert not (run / "merged").exists()
    requeued = script(EVAL_ARRAY, task_1, *EVAL_FLAGS, *SAMPLES, cwd=tmp_path)  # the same script, the same variables
    ok(requeued)
    assert f"shard 1/3: resuming {run / 'shard-1'}" in requeued.stderr
    assert f"resuming: {written} of 60 episodes already written" in requeued.stderr.replace("\n", " ")
    ok(merge(run, cache, tmp_path))
    as_one_process_wrote_it(run / "merged", one_process(*SAMPLES))


def test_a_refused_shard_fails_its_task_with_explorers_one_line(tmp_path, cache):
    bad = tmp_path / "eval.toml"
    bad.write_text("limit = 12\nmax_stepz = 8\n")
    run = tmp_path / "run"
    done = script(EVAL_ARRAY, slurm_task(2, 1, run, bad, cache), *EVAL_FLAGS, cwd=tmp_path)
    refused(done, str(bad), "max_stepz")
    assert not run.exists()


@pytest.mark.parametrize(
    ("array", "fragments"),
    [
        ({}, ["SLURM_ARRAY_TASK_ID is ''", "sbatch --array=1-N"]),
        (
            {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "3", "SLURM_ARRAY_TASK_COUNT": "1"},
            ["array 3-3 of 1 tasks", "submit the whole array again"],
        ),
        (
            {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "5", "SLURM_ARRAY_TASK_COUNT": "3"},
            ["array 1-5 of 3 tasks", "no step or gap"],
        ),
        (
            {
                "SLURM_ARRAY_TASK_ID": "2",
                "SLURM_ARRAY_TASK_MIN": "1",
                "SLURM_ARRAY_TASK_MAX": "3",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "RUN": "",
            },
            ["RUN is not set"],
        ),
    ],
    ids=["not-an-array-job", "part-of-the-array", "array-with-a-step", "no-run-directory"],
)
def test_the_script_refuses_a_task_it_cannot_place_before_running_anything(array, fragments, tmp_path, cache, config):
    environment = {"RUN": str(tmp_path / "run"), "CONFIG": str(config), "EXPLORER": "false", "EXPLORER_CACHE_DIR": str(cache), **array}
    unset = {name: "" for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT")}
    done = script(EVAL_ARRAY, {**unset, **environment}, cwd=tmp_path)
    refused(done, *fragments)
    assert done.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


# sbatch as submit.sh meets it: records each call (its arguments and the RUN it exports) and
# answers --parsable as Slurm does, JOBID;CLUSTER for the array and JOBID for the merge.
FAKE_SBATCH = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["SBATCH_CALLS"], "a") as calls:
    calls.write(json.dumps({{"arguments": sys.argv[1:], "RUN": os.environ.get("RUN")}}) + "\\n")
with open(os.environ["SBATCH_CALLS"]) as calls:
    print("4242;cluster" if len(calls.readlines()) == 1 else "4243")
"""


def test_submit_makes_the_merge_wait_for_every_task_of_the_array(tmp_path):
    bin_directory, calls = tmp_path / "bin", tmp_path / "sbatch-calls.jsonl"
    bin_directory.mkdir()
    (bin_directory / "sbatch").write_text(FAKE_SBATCH)
    (bin_directory / "sbatch").chmod(0o755)
    path = f"{bin_directory}:{checkout_environment()['PATH']}"
    environment = {"PATH": path, "SBATCH_CALLS": str(calls), "RUN": "runs/test", "SHARDS": "3"}
    done = script(SUBMIT, environment, "--max-steps", "8", "--base-url", "http://node 1/v1", cwd=tmp_path)
    ok(done)
    run = tmp_path / "runs" / "test"
    assert run.is_dir()
    array, merge_job = (json.loads(line) for line in calls.read_text().splitlines())
    assert array == {
        "arguments": ["--parsable", "--array=1-3", "--export=ALL", str(EVAL_ARRAY), "--max-steps", "8", "--base-url", "http://node 1/v1"],
        "RUN": str(run),
    }
    assert merge_job == {
        "arguments": ["--parsable", "--dependency=afterok:4242", "--kill-on-invalid-dep=yes", "--export=ALL", str(MERGE)],
        "RUN": str(run),
    }
    assert done.stdout == f"array job 4242: 3 shards into {run}; merge job 4243: into {run / 'merged'}\n"
    refused(script(SUBMIT, {**environment, "SHARDS": "0"}, cwd=tmp_path), "export RUN", "SHARDS")
    assert len(calls.read_text().splitlines()) == 2  # nothing submitted
