"""`explorer report RUN_A RUN_B` as a user types it: it refuses, in one line with exit code 2 and
without writing anything, runs that cannot be paired or a corpus that is not the runs' own, and
never overwrites a file without --force. (The pages themselves are tested in a browser, in
test_report_browser.py.)"""

import shutil

import pytest

from tests.conftest import run_cli


def refused(done, *phrases: str) -> bool:
    lines = done.stderr.strip().splitlines()
    return done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and all(phrase in lines[0] for phrase in phrases)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report-cli")
    for name, seed in (("small.jsonl", "3"), ("other.jsonl", "4")):
        assert run_cli("corpus", "generate", "--papers", "10", "--seed", seed, "--out", str(directory / name)).returncode == 0
    for corpus, out in (("small.jsonl", "a"), ("other.jsonl", "elsewhere")):
        done = run_cli(
            "eval",
            "--corpus",
            str(directory / corpus),
            "--split",
            "all",
            "--limit",
            "6",
            "--policy",
            "direct-submit",
            "--out",
            str(directory / out),
        )
        assert done.returncode == 0, done.stderr
    # two runs of the same corpus on disjoint questions: each replays half of run a's episodes
    lines = (directory / "a" / "trajectories.jsonl").read_text().splitlines(keepends=True)
    for name, half in (("first", lines[:3]), ("second", lines[3:])):
        (directory / f"{name}.jsonl").write_text("".join(half))
        done = run_cli(
            "eval",
            "--corpus",
            str(directory / "small.jsonl"),
            "--split",
            "all",
            "--policy",
            "replay",
            "--replay",
            str(directory / f"{name}.jsonl"),
            "--out",
            str(directory / name),
        )
        assert done.returncode == 0, done.stderr
    return directory


def test_two_runs_that_share_questions_make_one_page(runs, tmp_path):
    done = run_cli("report", str(runs / "a"), str(runs / "first"), "--out", str(tmp_path / "ab.html"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "ab.html").read_text()
    assert '<table id="mcnemar">' in page and "3 paired questions" in page
    assert "<tr><td>questions scored in this run only</td><td>3</td><td>0</td></tr>" in page  # the rest of a, said apart


def test_runs_of_different_corpora_are_refused(runs, tmp_path):
    done = run_cli("report", str(runs / "a"), str(runs / "elsewhere"), "--out", str(tmp_path / "x.html"))
    assert refused(done, "different corpora", "or report each run alone") and not (tmp_path / "x.html").exists()


def test_runs_without_a_shared_question_are_refused(runs, tmp_path):
    done = run_cli("report", str(runs / "first"), str(runs / "second"), "--out", str(tmp_path / "x.html"))
    assert refused(done, "share no scored question", "3 scored only in A, 3 only in B") and not (tmp_path / "x.html").exists()


def test_a_corpus_other_than_the_runs_is_refused(runs, tmp_path):
    for runs_given in ([runs / "a"], [runs / "a", runs / "first"]):
        done = run_cli("report", *map(str, runs_given), "--corpus", str(runs / "other.jsonl"), "--out", str(tmp_path / "x.html"))
        assert refused(done, "other.jsonl", "are not those of run", "pass --corpus") and not (tmp_path / "x.html").exists()


def test_a_moved_corpus_is_named_with_corpus(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs / "elsewhere", run)
    moved = tmp_path / "moved.jsonl"
    shutil.move(runs / "other.jsonl", moved)
    try:
        gone = run_cli("report", str(run), "--out", str(tmp_path / "x.html"))
        assert refused(gone, "is gone", "pass --corpus") and not (tmp_path / "x.html").exists()
        named = run_cli("report", str(run), "--corpus", str(moved), "--out", str(tmp_path / "x.html"))
        assert named.returncode == 0, named.stderr
    finally:
        shutil.move(moved, runs / "other.jsonl")


def test_an_existing_file_needs_force(runs, tmp_path):
    target = tmp_path / "old.html"
    target.write_text("keep me")
    done = run_cli("report", str(runs / "a"), str(runs / "first"), "--out", str(target))
    assert refused(done, "already exists", "--force") and target.read_text() == "keep me"
    forced = run_cli("report", str(runs / "a"), str(runs / "first"), "--out", str(target), "--force")
    assert forced.returncode == 0 and target.read_text().startswith("<!doctype html>")
    assert refused(run_cli("report", str(runs / "a"), "--out", str(tmp_path)), "is a directory")
