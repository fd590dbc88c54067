"""explorer merge: the runs of eval --shard I/N joined into the run one machine would have written,
and every refusal one line (exit 2) that names the run, with nothing written."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from paper_explorer.agent.trajectory import Trajectory, without_timings
from tests.conftest import run_cli, run_cli_process

LIMIT = ["--limit", "12"]  # 12 demo test questions: 6, 1 and 5 of them in shards 1/3, 2/3 and 3/3


def _cli(cache: Path, *args: str, run=run_cli):
    return run(*args, env={"EXPLORER_CACHE_DIR": str(cache)})


def _ok(result) -> None:
    assert result.returncode == 0, result.stderr


def _side_by_side(cache: Path, *commands: list[str]) -> None:
    """Independent evals at once, as separate machines would run them (each its own process)."""
    with ThreadPoolExecutor(len(commands)) as pool:
        for result in pool.map(lambda args: _cli(cache, *args, run=run_cli_process), commands):
            _ok(result)


def _refused(result, *fragments: str) -> str:
    """Exit 2 and one line, 'error: ...', holding every fragment."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _trajectories(run: Path) -> list[dict]:
    return [without_timings(Trajectory.model_validate_json(line)) for line in (run / "trajectories.jsonl").read_text().splitlines()]


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One unsharded run of the scripted policy on the demo corpus, the same as three shards, and their merge."""
    root = tmp_path_factory.mktemp("sharded")
    cache = tmp_path_factory.getbasetemp() / "explorer-cache"
    _side_by_side(
        cache,
        ["eval", "--out", str(root / "one"), *LIMIT],
        *(["eval", "--out", str(root / f"shard-{index}"), *LIMIT, "--shard", f"{index}/3"] for index in (1, 2, 3)),
    )
    merged = _cli(cache, "merge", *(str(root / f"shard-{index}") for index in (3, 1, 2)), "--out", str(root / "merged"))
    _ok(merged)
    return root, cache, merged


def test_sharded_runs_merge_to_the_metrics_and_trajectories_of_one_run(runs):
    root, _, merged = runs
    one, out = root / "one", root / "merged"
    assert f"written: {out / 'manifest.json'}" in merged.stdout.replace("\n", " ")
    assert f"merged 3 shards (12 episodes) into {out}" in merged.stdout.replace("\n", " ")
    assert sorted(p.name for p in root.iterdir()) == ["merged", "one", "shard-1", "shard-2", "shard-3"]  # no temporary left
    # metrics.json holds no timing field (its figures are computed from outcomes, steps and
    # tool calls), so nothing is excluded: every field must be equal, the bootstrap CI included
    # (it depends on the episodes' order, which the merge restores).
    expected, actual = _json(one / "metrics.json"), _json(out / "metrics.json")
    assert expected["episodes"] == 12
    for field in expected:
        assert actual[field] == expected[field], field
    assert actual.keys() == expected.keys()
    assert (out / "scores.jsonl").read_text() == (one / "scores.jsonl").read_text()
    # The same episodes in the same order (question order of the selection, then sample), equal
    # but for their wall-clock fields (started_at, seconds, step and tool timings).
    assert _trajectories(out) == _trajectories(one)
    # The config one unsharded eval records, with its questions and their hash.
    assert _json(out / "manifest.json")["config"] == _json(one / "manifest.json")["config"]
    record = _json(out / "merged.json")
    assert [(r["shard"], r["episodes"], Path(r["directory"]).name) for r in record["runs"]] == [
        ("1/3", 6, "shard-1"),
        ("2/3", 1, "shard-2"),
        ("3/3", 5, "shard-3"),
    ]


def test_the_merged_run_inspects_compares_reports_and_resumes_with_nothing_to_run(runs, tmp_path):
    root, cache, _ = runs
    out = tmp_path / "merged"
    shutil.copytree(root / "merged", out)
    before = (out / "trajectories.jsonl").read_bytes()
    resumed = _cli(cache, "eval", "--out", str(out), "--resume")
    _ok(resumed)
    assert "resuming: 12 of 12 episodes already written" in resumed.stderr
    assert (out / "trajectories.jsonl").read_bytes() == before
    _ok(_cli(cache, "inspect", str(out)))
    compared = _cli(cache, "compare", str(root / "one"), str(out))
    _ok(compared)
    assert "no paired question's F1 differs" in compared.stdout
    _ok(_cli(cache, "report", str(out), "--out", str(tmp_path / "report.html")))
    assert "<html" in (tmp_path / "report.html").read_text().lower()


@pytest.mark.slow  # five commands (about 5 s on 2 cores)
def test_shards_of_several_samples_per_question_merge_to_one_run(tmp_path):
    """A corpus file this time: the merge loads the corpus the shards' manifests recorded."""
    cache = tmp_path / "cache"
    corpus = tmp_path / "demo-40.jsonl"
    _ok(_cli(cache, "corpus", "generate", "--papers", "40", "--seed", "7", "--out", str(corpus)))
    common = ["--corpus", str(corpus), "--limit", "6", "--samples", "2"]
    _side_by_side(
        cache,
        ["eval", "--out", str(tmp_path / "one"), *common],
        *(["eval", "--out", str(tmp_path / f"shard-{index}"), *common, "--shard", f"{index}/2"] for index in (1, 2)),
    )
    (tmp_path / "merged").mkdir()  # an empty --out is taken
    _ok(_cli(cache, "merge", str(tmp_path / "shard-1"), str(tmp_path / "shard-2"), "--out", str(tmp_path / "merged")))
    expected, actual = _json(tmp_path / "one" / "metrics.json"), _json(tmp_path / "merged" / "metrics.json")
    assert expected["episodes"] == 12 and expected["sampling"]["samples"] == 2
    assert actual == expected
    trajectories = _trajectories(tmp_path / "merged")
    assert trajectories == _trajectories(tmp_path / "one")
    assert [t["sample"] for t in trajectories] == [0, 1] * 6


def test_a_missing_shard_is_named(runs, tmp_path):
    root, cache, _ = runs
    out = tmp_path / "merged"
    _refused(
        _cli(cache, "merge", str(root / "shard-1"), str(root / "shard-3"), "--out", str(out)),
        "shard 2/3 is missing",
        "given: 1/3, 3/3",
        "--shard 2/3",
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_shard_given_twice_names_both_runs(runs, tmp_path):
    root, cache, _ = runs
    copy = tmp_path / "copy-of-2"
    shutil.copytree(root / "shard-2", copy)
    line = _refused(
        _cli(
            cache,
            "merge",
            str(root / "shard-1"),
            str(root / "shard-2"),
            str(copy),
            str(root / "shard-3"),
            "--out",
            str(tmp_path / "merged"),
        ),
        "shard 2/3 is given twice",
    )
    assert str(root / "shard-2") in line and str(copy) in line
    assert not (tmp_path / "merged").exists()


def test_an_episode_in_two_runs_names_both(runs, tmp_path):
    root, cache, _ = runs
    widened = tmp_path / "shard-1-plus"
    shutil.copytree(root / "shard-1", widened)
    stray = (root / "shard-2" / "trajectories.jsonl").read_bytes().split(b"\n")[0] + b"\n"
    with open(widened / "trajectories.jsonl", "ab") as log:
        log.write(stray)
    question = json.loads(stray)["question_id"]
    line = _refused(
        _cli(cache, "merge", str(widened), str(root / "shard-2"), str(root / "shard-3"), "--out", str(tmp_path / "merged")),
        f"question {question} sample 0 is in both",
    )
    assert str(widened) in line and str(root / "shard-2") in line
    assert not (tmp_path / "merged").exists()


def test_a_shard_run_with_another_config_or_another_count_of_shards_is_refused(runs, tmp_path):
    root, cache, _ = runs
    other, halves = tmp_path / "shard-3-other", tmp_path / "half-2"
    _side_by_side(
        cache,
        ["eval", "--out", str(other), *LIMIT, "--shard", "3/3", "--max-steps", "8"],
        ["eval", "--out", str(halves), *LIMIT, "--shard", "2/2"],
    )
    line = _refused(
        _cli(cache, "merge", str(root / "shard-1"), str(root / "shard-2"), str(other), "--out", str(tmp_path / "merged")),
        str(other),
        "config differs",
        "episode.max_steps 8 vs 10",
    )
    assert "shard" not in line.split("(")[1].split(")")[0]  # the shard itself is not a difference
    _refused(
        _cli(cache, "merge", str(root / "shard-1"), str(halves), "--out", str(tmp_path / "merged")),
        f"{halves}: shard 2/2, but {root / 'shard-1'} is shard 1/3",
    )
    assert not (tmp_path / "merged").exists()


def test_a_shard_made_by_other_code_is_refused(runs, tmp_path):
    root, cache, _ = runs
    other = tmp_path / "shard-2-other-python"
    shutil.copytree(root / "shard-2", other)
    manifest = _json(other / "manifest.json")
    manifest["versions"]["python"] = "3.99.0"
    (other / "manifest.json").write_text(json.dumps(manifest))
    _refused(
        _cli(cache, "merge", str(root / "shard-1"), str(other), str(root / "shard-3"), "--out", str(tmp_path / "merged")),
        str(other),
        "package versions differ",
        "python 3.99.0 vs",
    )
    assert not (tmp_path / "merged").exists()


def test_a_policy_error_run_again_is_merged_as_its_scoring_counts_it(runs, tmp_path):
    """A shard's log may still hold a policy_error line that a later line of the same episode
    replaced (eval --resume --retry-errors, killed before it rewrote the log): left out, and said."""
    root, cache, _ = runs
    retried = tmp_path / "shard-3-retried"
    shutil.copytree(root / "shard-3", retried)
    log = retried / "trajectories.jsonl"
    first = json.loads(log.read_text().splitlines()[0])
    failed = {**first, "steps": [], "outcome": {"status": "policy_error", "reason": "server down"}}
    log.write_text(json.dumps(failed) + "\n" + log.read_text())
    merged = _cli(cache, "merge", str(root / "shard-1"), str(root / "shard-2"), str(retried), "--out", str(tmp_path / "merged"))
    _ok(merged)
    assert f"{retried}: left out 1 of its log's lines" in merged.stderr.replace("\n", " ")
    assert _json(tmp_path / "merged" / "metrics.json") == _json(root / "one" / "metrics.json")
    assert _json(tmp_path / "merged" / "merged.json")["runs"][2]["lines_left_out"] == 1


@pytest.mark.slow  # four commands in a row (about 6 s on 2 cores)
def test_an_unfinished_shard_is_named_and_merges_once_resumed(runs, tmp_path):
    root, cache, _ = runs
    cut = tmp_path / "shard-3-cut"
    shutil.copytree(root / "shard-3", cut)
    lines = (cut / "trajectories.jsonl").read_bytes().split(b"\n")
    (cut / "trajectories.jsonl").write_bytes(b"\n".join(lines[:2]) + b"\n")  # as if killed after two episodes
    shards = [str(root / "shard-1"), str(root / "shard-2"), str(cut)]
    _refused(
        _cli(cache, "merge", *shards, "--out", str(tmp_path / "merged")),
        f"{cut}: unfinished: 2 of 5 episodes",
        f"explorer eval --out {cut} --resume",
    )
    with open(cut / "trajectories.jsonl", "ab") as log:  # killed in the middle of the third
        log.write(lines[2][:50])
    _refused(
        _cli(cache, "merge", *shards, "--out", str(tmp_path / "merged")),
        "unfinished",
        "torn last line",
        f"explorer eval --out {cut} --resume",
    )
    assert not (tmp_path / "merged").exists()
    _ok(_cli(cache, "eval", "--out", str(cut), "--resume"))
    _ok(_cli(cache, "merge", *shards, "--out", str(tmp_path / "merged")))
    assert _json(tmp_path / "merged" / "metrics.json") == _json(root / "one" / "metrics.json")


def test_an_unsharded_run_is_refused(runs, tmp_path):
    root, cache, _ = runs
    _refused(_cli(cache, "merge", str(root / "one"), "--out", str(tmp_path / "merged")), str(root / "one"), "not a shard")


def test_an_out_that_holds_anything_is_refused(runs, tmp_path):
    root, cache, _ = runs
    shards = [str(root / f"shard-{index}") for index in (1, 2, 3)]
    out = tmp_path / "merged"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _refused(_cli(cache, "merge", *shards, "--out", str(out)), str(out), "not empty")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    _refused(_cli(cache, "merge", *shards, "--out", str(out / "notes.txt")), "is a file")
    assert list(tmp_path.iterdir()) == [out]


def test_another_corpus_is_refused_by_its_hash(runs, tmp_path):
    root, cache, _ = runs
    corpus = tmp_path / "other.jsonl"
    _ok(_cli(cache, "corpus", "generate", "--papers", "20", "--out", str(corpus)))
    _refused(
        _cli(
            cache,
            "merge",
            *(str(root / f"shard-{index}") for index in (1, 2, 3)),
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "merged"),
        ),
        str(corpus),
        "corpus_sha256",
        "differs from the shards'",
    )
    assert not (tmp_path / "merged").exists()


def test_a_preregistered_run_in_shards_is_judged_once_merged(runs, tmp_path):
    _, cache, _ = runs
    prereg = tmp_path / "prereg.toml"
    _ok(_cli(cache, "preregister", *LIMIT, "--out", str(prereg), "--min-correct-abstentions", "1", "--max-false-abstentions", "12"))
    shards = [
        ["eval", "--out", str(tmp_path / f"shard-{index}"), *LIMIT, "--shard", f"{index}/3", "--preregistration", str(prereg)]
        for index in (1, 2, 3)
    ]
    for command in shards:
        done = _cli(cache, *command)
        _ok(done)
        assert "judged on the whole run, once explorer merge has joined the shards" in " ".join(done.stderr.split())
        assert _json(Path(command[2]) / "metrics.json").get("preregistration") is None
    merged = _cli(cache, "merge", *(str(tmp_path / f"shard-{index}") for index in (1, 2, 3)), "--out", str(tmp_path / "merged"))
    _ok(merged)
    assert _json(tmp_path / "merged" / "metrics.json")["preregistration"]["pass"] is True


def test_a_line_made_by_another_run_is_refused(runs, tmp_path):
    """A shard's log holding an episode of another policy (copied in, or a run mixed up) would
    change the merged metrics unseen; the line is named."""
    root, cache, _ = runs
    other = tmp_path / "direct"
    _ok(_cli(cache, "eval", "--out", str(other), *LIMIT, "--shard", "1/3", "--policy", "direct-submit"))
    forged = tmp_path / "shard-1-forged"
    shutil.copytree(root / "shard-1", forged)
    lines = (forged / "trajectories.jsonl").read_bytes().split(b"\n")
    lines[1] = (other / "trajectories.jsonl").read_bytes().split(b"\n")[1]
    (forged / "trajectories.jsonl").write_bytes(b"\n".join(lines))
    _refused(
        _cli(cache, "merge", str(forged), str(root / "shard-2"), str(root / "shard-3"), "--out", str(tmp_path / "merged")),
        "trajectories.jsonl:2: not an episode of this run: it was made by policy 'direct-submit'",
    )
    assert not (tmp_path / "merged").exists()
