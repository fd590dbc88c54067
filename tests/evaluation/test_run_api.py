"""The Python API of a run: ``evaluate(config, out=...) -> Run`` and ``Run.load(path)``, the one rule
for which log line counts, and a reporter that hears what the CLI prints - without the CLI."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.corpus.jsonl import Record
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run import EvaluationInterrupted, evaluate
from paper_explorer.evaluation.run_directory import Run, counted, superseded
from paper_explorer.evaluation.scoring import EpisodeScore
from tests.conftest import rescored, run_cli

QUESTIONS = 4


class Heard:
    """A reporter that keeps what a run says, and can stop it (as Ctrl-C would) after some episodes."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.notes, self.said, self.started, self.advanced, self.stop_after = [], [], [], 0, stop_after

    def note(self, line: str) -> None:
        self.notes.append(line)

    def say(self, line: str) -> None:
        self.said.append(line)

    @contextlib.contextmanager
    def progress(self, total: int, done: int):
        self.started.append((total, done))

        def advance(episodes: int) -> None:
            self.advanced += episodes
            if self.stop_after is not None and self.advanced >= self.stop_after:
                raise KeyboardInterrupt

        yield advance


@pytest.fixture(scope="module")
def finished(tmp_path_factory, small_demo):
    """Four scripted episodes on a loaded corpus, through the API alone."""
    out = tmp_path_factory.mktemp("api") / "run"
    heard = Heard()
    run = evaluate(EvalConfig(split="all", limit=QUESTIONS), out=out, corpus=small_demo, reporter=heard)
    return run, heard


def test_evaluate_returns_the_run_it_wrote(finished):
    run, heard = finished
    assert isinstance(run, Run) and run.metrics.episodes == QUESTIONS and len(run.scores) == QUESTIONS
    assert run.config.limit == QUESTIONS and run.config.split == "all" and run.config.questions == QUESTIONS
    assert [t.episode_id for t in run.trajectories] == [s.episode_id for s in run.scores]
    assert heard.started == [(QUESTIONS, 0)] and heard.advanced == QUESTIONS
    again = Run.load(run.directory)
    assert again.manifest == run.manifest and again.metrics == run.metrics and again.scores == run.scores


def test_a_run_is_a_data_frame(finished):
    pytest.importorskip("pandas")
    run, _ = finished
    frame = run.to_pandas()
    assert len(frame) == QUESTIONS and set(frame["episode_id"]) == {s.episode_id for s in run.scores}
    assert {"run", "question_id", "status", "answer_f1", "flags", "paper_id", "policy"} <= set(frame.columns)
    assert set(frame["run"]) == {run.directory.name} and set(frame["policy"]) == {"scripted"}
    assert all(isinstance(flags, list) for flags in frame["flags"])


def test_without_pandas_to_pandas_is_one_line_saying_how_to_install_it(finished, monkeypatch):
    run, _ = finished
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(EvaluationError, match="pip install 'pandas"):
        run.to_pandas()


def test_a_corpus_given_by_path_or_loaded_makes_the_same_run_and_a_resume_finds_the_recorded_one(tmp_path, small_demo):
    path = tmp_path / "demo.jsonl"
    assert run_cli("corpus", "generate", "--papers", "40", "--seed", "7", "--out", str(path)).returncode == 0
    config = EvalConfig(split="all", limit=2)
    by_path = evaluate(config, out=tmp_path / "by-path", corpus=path)
    loaded = evaluate(config, out=tmp_path / "loaded", corpus=small_demo)
    assert by_path.manifest.hashes == loaded.manifest.hashes
    assert [s.model_dump(exclude={"episode_id"}) for s in by_path.scores] == [s.model_dump(exclude={"episode_id"}) for s in loaded.scores]
    heard = Heard()
    again = evaluate(config, out=tmp_path / "by-path", resume=True, reporter=heard)  # no corpus: the file the manifest names
    assert "every episode is written; the policy's server is not asked" in heard.notes
    assert "resuming: 2 of 2 episodes already written" in heard.said and again.scores == by_path.scores
    path.rename(tmp_path / "moved.jsonl")
    with pytest.raises(EvaluationError, match="is gone; pass corpus with the same corpus"):
        evaluate(config, out=tmp_path / "by-path", resume=True)
    assert evaluate(config, out=tmp_path / "by-path", corpus=tmp_path / "moved.jsonl", resume=True).scores == by_path.scores


def test_an_interrupted_run_says_how_far_it_got_and_resumes_to_every_episode_once(tmp_path, small_demo):
    out = tmp_path / "run"
    config = EvalConfig(split="all", limit=QUESTIONS)
    with pytest.raises(EvaluationInterrupted) as stopped:
        evaluate(config, out=out, corpus=small_demo, reporter=Heard(stop_after=1))
    assert isinstance(stopped.value, KeyboardInterrupt)  # a script's own Ctrl-C handling still sees one
    assert (stopped.value.written, stopped.value.total, stopped.value.directory) == (1, QUESTIONS, out)
    assert str(stopped.value) == f"interrupted: 1 of {QUESTIONS} episodes written to {out}"
    heard = Heard()
    run = evaluate(config, out=out, corpus=small_demo, resume=True, reporter=heard)
    assert f"resuming: 1 of {QUESTIONS} episodes already written" in heard.said and heard.started == [(QUESTIONS, 1)]
    ids = [json.loads(line)["episode_id"] for line in (out / "trajectories.jsonl").read_text().split("\n") if line]
    assert len(ids) == QUESTIONS == len(set(ids)) == run.metrics.episodes


def test_evaluate_refuses_a_directory_of_another_kind_before_loading_anything(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "build_report.json").write_text("{}")
    with pytest.raises(EvaluationError, match="a dataset built by explorer sft build"):
        evaluate(EvalConfig(), out=data, corpus=tmp_path / "no-such-corpus.jsonl")


def _records(run: Run, statuses: list[tuple[int, str]]) -> list[Record[Trajectory]]:
    """Log lines made from the run's first episodes: (which episode, its status), numbered in order."""
    made = []
    for number, (which, status) in enumerate(statuses, 1):
        trajectory = run.trajectories[which]
        trajectory = trajectory.model_copy(update={"outcome": trajectory.outcome.model_copy(update={"status": status})})
        made.append(Record(number, trajectory, trajectory.model_dump_json().encode()))
    return made


def test_the_line_that_counts_is_the_first_no_later_line_supersedes(finished):
    run, _ = finished
    records = _records(run, [(0, "policy_error"), (1, "submitted"), (0, "submitted"), (1, "abstained"), (2, "policy_error")])
    assert superseded(records) == {1}  # a policy_error with a later line of its (question, sample); the last one stays
    assert [record.number for record in counted(records)] == [2, 3, 5]  # a repeat by hand counts once: the first


def test_a_superseded_failure_left_in_the_log_is_scored_once_and_counted_everywhere(finished, tmp_path, small_demo):
    """A crash between a retry's append and the log's rewrite leaves both lines: scoring, reading
    back and resuming all keep the retry (run_directory.counted)."""
    run, _ = finished
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "manifest.json").write_bytes((run.directory / "manifest.json").read_bytes())
    first = run.trajectories[0]
    failed = first.model_copy(update={"outcome": first.outcome.model_copy(update={"status": "policy_error", "reason": "down"})})
    (copy / "trajectories.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in [failed, *run.trajectories]))
    resumed = evaluate(EvalConfig(split="all", limit=QUESTIONS), out=copy, corpus=small_demo, resume=True, retry_errors=True)
    assert len((copy / "trajectories.jsonl").read_bytes().split(b"\n")) == QUESTIONS + 1  # the failure was dropped
    assert resumed.metrics.episodes == QUESTIONS and resumed.metrics.status.get("policy_error", 0) == 0
    assert resumed.metrics.duplicate_lines == 0 and [t.episode_id for t in resumed.trajectories] == [t.episode_id for t in run.trajectories]


def test_a_model_answer_holding_line_separators_does_not_cost_the_run(finished, tmp_path, small_demo):
    """scores.jsonl is read as bytes split on \\n: U+2028 in an answer (written raw, as pydantic
    writes it) is one line, for the API and for inspect, report, compare and export alike."""
    run, _ = finished
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "manifest.json").write_bytes((run.directory / "manifest.json").read_bytes())
    episodes = [
        t.model_copy(update={"outcome": t.outcome.model_copy(update={"answer": f"one\u2028two\x85three {t.outcome.answer}"})})
        for t in run.trajectories
        if t.outcome.status == "submitted"
    ]
    (copy / "trajectories.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in episodes), encoding="utf-8")
    rescored(copy, small_demo)  # the answers scored as eval scores them
    odd = Run.load(copy).scores
    assert "\u2028" in (copy / "scores.jsonl").read_text(encoding="utf-8") and len(odd) == len(episodes) > 0
    assert all(score.prediction.startswith("one\u2028two\x85three ") for score in odd)
    assert [EpisodeScore.model_validate_json(line) for line in (copy / "scores.jsonl").read_bytes().split(b"\n") if line] == odd
    shown = run_cli("inspect", str(copy))
    assert shown.returncode == 0, shown.stderr
