"""One bad line never costs a run: every character ``str.splitlines()`` splits on (U+2028, U+0085,
``\\r``, ...) inside a real run's questions, paper text, actions, observations, answers and reasons,
read back by every reader of what a run writes - the run-directory loaders, ``inspect``, ``report``,
``compare``, ``export``, ``merge``, ``eval --resume`` and the SFT dataset readers - each giving
the text back exactly.

JSON escapes ``\\n`` (and ``\\r`` and the other C0 controls), but our writers, like
``json.dumps(ensure_ascii=False)`` and pydantic, write U+0085, U+2028 and U+2029 raw: a reader
that cut lines with ``splitlines()`` refused the whole run over one answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from paper_explorer.agent.policies.base import action
from paper_explorer.agent.trajectory import Trajectory, without_timings
from paper_explorer.agent.writer import read_log, read_trajectories
from paper_explorer.corpus import load
from paper_explorer.corpus.jsonl import JsonLinesError, append_records, read_numbered, read_records, split_lines, write_records
from paper_explorer.evaluation import export, merge
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.scoring import EpisodeScore
from paper_explorer.sft.dataset import load_examples
from tests.conftest import run_cli

# Every character but "\n" that str.splitlines() splits on (checked below against Python itself).
SEPARATORS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
ESCAPED = SEPARATORS.encode("unicode_escape").decode("ascii")  # as a Python string literal in an action spells them
EPISODES = 4


def splitlines_breaks() -> set[str]:
    return {chr(point) for point in range(0x110000) if len(f"a{chr(point)}b".splitlines()) > 1}


def test_the_separators_are_every_character_splitlines_splits_on_but_the_newline():
    assert splitlines_breaks() - {"\n"} == set(SEPARATORS)


def _cli(cache: Path, *args: str):
    done = run_cli(*args, env={"EXPLORER_CACHE_DIR": str(cache)})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done


def _lines(path: Path) -> list[bytes]:
    """A file's lines, cut the way the readers under test must cut them (the test's own oracle)."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data.split(b"\n")[:-1]


def _separated_corpus(source: Path, out: Path) -> None:
    """The demo corpus with every separator inside each question and at the end of each paragraph
    (evidence quoting a paragraph follows it, so the gold answers still hold)."""
    records = [json.loads(line) for line in _lines(source)]
    for record in records:
        changed = {}
        for section in record["paper"]["sections"]:
            for index, text in enumerate(section["paragraphs"]):
                changed[text] = section["paragraphs"][index] = f"{text} {SEPARATORS}"
        for question in record["questions"]:
            question["text"] = f"{question['text']} {SEPARATORS}"
            for answer in question["answers"]:
                answer["evidence"] = [changed.get(text, text) for text in answer["evidence"]]
    out.write_bytes(b"".join(json.dumps(record, ensure_ascii=False).encode() + b"\n" for record in records))


def _recording(scripted: Path, corpus: Path, out: Path) -> dict[str, dict]:
    """A replay recording of the scripted run's questions whose actions write every separator raw
    (the thought), print it (the observation, with a paragraph that holds it too) and submit or
    abstain with it; returns what each question's episode must give back."""
    paper_of = {q["id"]: q["paper_id"] for line in _lines(corpus) for q in json.loads(line)["questions"]}
    expected, recorded = {}, []
    for number, line in enumerate(_lines(scripted / "trajectories.jsonl")):
        episode = json.loads(line)
        question = episode["question_id"]
        first = action(
            f'print("seen{ESCAPED}there")\nprint(read("{paper_of[question]}", section=0))', f"I look first {SEPARATORS} then answer"
        )
        if number % 2 == 0:
            last, outcome = action(f'submit("answer {number}{ESCAPED}end", evidence=[])'), ("answer", f"answer {number}{SEPARATORS}end")
        else:
            last, outcome = action(f'abstain("reason {number}{ESCAPED}end")'), ("reason", f"reason {number}{SEPARATORS}end")
        episode["steps"] = [dict(episode["steps"][0], action_text=first), dict(episode["steps"][1], action_text=last)]
        recorded.append(json.dumps(episode, ensure_ascii=False))
        expected[question] = {"actions": [first, last], "outcome": outcome}
    out.write_text("".join(line + "\n" for line in recorded), encoding="utf-8")
    return expected


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("separators")
    cache = tmp_path_factory.getbasetemp() / "explorer-cache"
    _cli(cache, "corpus", "generate", "--papers", "12", "--seed", "9", "--out", str(root / "demo.jsonl"))
    corpus = root / "separated.jsonl"
    _separated_corpus(root / "demo.jsonl", corpus)
    common = ["--corpus", str(corpus), "--split", "all"]
    _cli(cache, "eval", *common, "--limit", str(EPISODES), "--out", str(root / "scripted"))
    expected = _recording(root / "scripted", corpus, root / "recording.jsonl")
    replay = [*common, "--policy", "replay", "--replay", str(root / "recording.jsonl")]
    _cli(cache, "eval", *replay, "--out", str(root / "hostile"))
    for index in (1, 2):
        _cli(cache, "eval", *replay, "--shard", f"{index}/2", "--out", str(root / f"shard-{index}"))
    return root, cache, expected


def _assert_exact(trajectories: list[Trajectory], expected: dict[str, dict]) -> None:
    """Each episode holds, unchanged, the separators its corpus question, actions, observations
    and outcome were made with."""
    assert sorted(t.question_id for t in trajectories) == sorted(expected)
    for trajectory in trajectories:
        wanted = expected[trajectory.question_id]
        assert trajectory.question.endswith(f" {SEPARATORS}")
        assert [step.action_text for step in trajectory.steps] == wanted["actions"]
        assert f"seen{SEPARATORS}there" in trajectory.steps[0].observation
        assert f" {SEPARATORS}" in trajectory.steps[0].observation  # a paragraph's end, as read() returned it
        field, text = wanted["outcome"]
        assert getattr(trajectory.outcome, field) == text


def _as_written(run: Path) -> list[Trajectory]:
    return [Trajectory.model_validate_json(line) for line in _lines(run / "trajectories.jsonl")]


def test_the_run_directory_loaders_give_back_every_episode_exactly(runs):
    root, _, expected = runs
    run = root / "hostile"
    written = _as_written(run)
    _assert_exact(written, expected)
    assert read_trajectories(run / "trajectories.jsonl") == written
    loaded = Run.load(run)
    assert loaded.scores == [EpisodeScore.model_validate_json(line) for line in _lines(run / "scores.jsonl")]
    assert len(loaded.scores) == EPISODES and all(score.question.endswith(SEPARATORS) for score in loaded.scores)
    assert {score.prediction for score in loaded.scores if score.status == "submitted"} == {
        wanted["outcome"][1] for wanted in expected.values() if wanted["outcome"][0] == "answer"
    }
    records = export.read_run(run)
    assert records.trajectories == written and set(records.scores) == {t.episode_id for t in written}


def test_merge_reads_each_shard_and_copies_its_lines_as_written(runs):
    root, cache, expected = runs
    shards = [merge.read_run(root / f"shard-{index}") for index in (1, 2)]
    for index, shard in enumerate(shards, 1):
        assert sorted(shard.lines.values()) == sorted(line + b"\n" for line in _lines(root / f"shard-{index}" / "trajectories.jsonl"))
    _cli(cache, "merge", str(root / "shard-1"), str(root / "shard-2"), "--out", str(root / "merged"))
    merged = _as_written(root / "merged")
    _assert_exact(merged, expected)
    assert [without_timings(t) for t in merged] == [without_timings(t) for t in _as_written(root / "hostile")]
    assert Run.load(root / "merged").scores == Run.load(root / "hostile").scores


def test_inspect_report_compare_and_export_read_the_run(runs, tmp_path):
    root, cache, _ = runs
    run = root / "hostile"
    episode = _as_written(run)[0].episode_id
    _cli(cache, "inspect", str(run))
    _cli(cache, "inspect", str(run), "--episode", episode)
    _cli(cache, "report", str(run), "-o", str(tmp_path / "report.html"))
    compared = _cli(cache, "compare", str(root / "scripted"), str(run), "--json")
    assert json.loads(compared.stdout)
    pytest.importorskip("inspect_ai", reason="the export extra is not installed (tests/test_export.py requires it under CI)")
    _cli(cache, "export", str(run), "--to", "inspect", str(tmp_path / "run.json"))
    log = json.loads((tmp_path / "run.json").read_text())
    assert {sample["metadata"]["episode_id"] for sample in log["samples"]} == {t.episode_id for t in _as_written(run)}
    assert all(any(f"seen{SEPARATORS}there" in text for text in _strings(sample)) for sample in log["samples"])


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [text for item in items for text in _strings(item)]


def test_resume_mends_a_line_torn_inside_a_separator(runs, tmp_path):
    """A kill in the middle of U+2028's three bytes: the torn line is cut off and its episode run again."""
    root, cache, expected = runs
    run = tmp_path / "resumed"
    shutil.copytree(root / "hostile", run)
    (run / "metrics.json").unlink()
    (run / "scores.jsonl").unlink()
    lines = _lines(run / "trajectories.jsonl")
    cut = lines[-1].index("\u2028".encode()) + 1
    (run / "trajectories.jsonl").write_bytes(b"".join(line + b"\n" for line in lines[:-1]) + lines[-1][:cut])
    _, torn = read_log(run / "trajectories.jsonl")
    assert torn is not None and torn.number == EPISODES and torn.size == cut
    done = _cli(cache, "eval", "--out", str(run), "--resume")
    assert f"resuming: {EPISODES - 1} of {EPISODES}" in done.stderr and "removed a torn last line" in done.stderr
    resumed = _as_written(run)
    _assert_exact(resumed, expected)
    assert [without_timings(t) for t in resumed] == [without_timings(t) for t in _as_written(root / "hostile")]
    assert [s.model_dump(exclude={"episode_id"}) for s in Run.load(run).scores] == [
        s.model_dump(exclude={"episode_id"}) for s in Run.load(root / "hostile").scores
    ]


def test_sft_build_and_its_readers_keep_the_text(runs, tiny_tokenizer, tmp_path):
    root, cache, expected = runs
    data = tmp_path / "data"
    _cli(
        cache,
        "sft",
        "build",
        "--trajectories",
        str(root / "hostile" / "trajectories.jsonl"),
        "--tokenizer",
        str(tiny_tokenizer),
        "--corpus",
        str(root / "separated.jsonl"),
        "--out",
        str(data),
        "--min-answer-f1",
        "0",
        "--evaluation-split",
        "none",
        "--validation-share",
        "0",
    )
    examples = load_examples(data / "train.jsonl")
    assert examples and all(example.question.endswith(f" {SEPARATORS}") for example in examples)
    assert {example.question_id for example in examples} <= set(expected)
    datasets = pytest.importorskip("datasets", reason="the export extra is not installed (tests/test_export.py requires it under CI)")
    _cli(cache, "export", str(data), "--to", "hf", str(tmp_path / "hf"))
    train = datasets.load_from_disk(str(tmp_path / "hf"))["train"]
    assert sorted(train["question"]) == sorted(example.question for example in examples)


# -- the module that cuts every .jsonl file into lines ----------------------------------------------


def test_lines_are_cut_on_the_newline_byte_only():
    text = {"answer": f"a{SEPARATORS}b"}
    data = b"".join(json.dumps(text, ensure_ascii=False).encode() + b"\n" for _ in range(2)) + b'{"torn'
    lines, tail = split_lines(data)
    assert [line.number for line in lines] == [1, 2] and all(json.loads(line.data) == text for line in lines)
    assert tail is not None and (tail.number, tail.data) == (3, b'{"torn')


def test_writers_and_readers_round_trip_every_separator(tmp_path):
    scores = [
        EpisodeScore(
            episode_id=f"e{i}",
            question_id=f"q{i}",
            question=f"q{SEPARATORS}",
            status="submitted",
            prediction=f"p{i}{SEPARATORS}",
            steps=1,
            tool_calls=0,
            tool_calls_before_end=0,
            flags=[],
        )
        for i in range(3)
    ]
    write_records(tmp_path / "scores.jsonl", scores)
    assert read_records(tmp_path / "scores.jsonl", EpisodeScore, what="episode score") == scores
    assert (tmp_path / "scores.jsonl").read_bytes().count(b"\n") == 3 and "\u2028".encode() in (tmp_path / "scores.jsonl").read_bytes()
    log = tmp_path / "log.jsonl"
    append_records(log, scores[:2])
    log.write_bytes(log.read_bytes() + '{"episode_id": "\u2028'.encode()[:-1])  # a kill mid-line, mid-character
    numbered, torn = read_numbered(log, EpisodeScore, what="episode score")
    assert [r.value for r in numbered] == scores[:2] and torn is not None and torn.number == 3
    append_records(log, scores[2:])  # the torn tail is cut off first
    assert read_records(log, EpisodeScore, what="episode score") == scores


@pytest.mark.parametrize(
    "content, model, message",
    [
        (b'{"a": 1}\n\xff\xfe\n', None, "bad.jsonl:2: not UTF-8"),
        (b'{"a": 1}\n\n{"a": \n', None, "bad.jsonl:3: not JSON"),  # a blank line is skipped but counted
        (b'{"b": 2}\n', EpisodeScore, "bad.jsonl:1: not an episode score: field 'episode_id'"),
    ],
)
def test_a_bad_line_is_one_error_naming_file_and_line(tmp_path, content, model, message):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(JsonLinesError, match=message):
        read_records(tmp_path / "bad.jsonl", model, what="episode score")


def test_a_corpus_and_its_questions_load_through_the_same_cut(tmp_path, small_demo):
    from paper_explorer.corpus.writing import write_jsonl, write_questions

    question = small_demo.questions[0].model_copy(update={"text": f"Why{SEPARATORS}?"})
    write_jsonl(small_demo, tmp_path / "demo.jsonl")
    write_questions([question], tmp_path / "questions.jsonl")
    loaded = load(tmp_path / "demo.jsonl", questions=tmp_path / "questions.jsonl")
    assert [q.text for q in loaded.questions] == [f"Why{SEPARATORS}?"]
