"""`eval --policy replay` reports its drift over the run, refuses a recording made on another
corpus unless asked, and `show` reads a torn log and lists duplicate episodes - all through the
CLI, as a user types it."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

WIDE = {"COLUMNS": "200"}  # rich tables and summaries unwrapped, so ids can be looked for whole


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A corpus, a scripted run on it (the recording), and a copy of the corpus with one
    paragraph changed - one that the recording's observations show whole."""
    directory = tmp_path_factory.mktemp("replay")
    env = {"EXPLORER_CACHE_DIR": str(directory / "cache")}
    corpus = directory / "corpus.jsonl"
    assert run_cli("corpus", "generate", "--papers", "12", "--seed", "1", "--out", str(corpus), env=env).returncode == 0
    done = run_cli("eval", "--corpus", str(corpus), "--split", "all", "--policy", "scripted", "--out", str(directory / "scripted"), env=env)
    assert done.returncode == 0, done.stderr
    observations = [step["observation"] for episode in lines(directory / "scripted" / "trajectories.jsonl") for step in episode["steps"]]
    papers = corpus.read_text().splitlines()
    changed = None
    for number, line in enumerate(papers):
        record = json.loads(line)
        for section in record["paper"]["sections"]:
            for position, paragraph in enumerate(section["paragraphs"]):
                if changed is None and any(paragraph in observation for observation in observations):
                    section["paragraphs"][position] = "Changed since the recording. " + paragraph
                    changed = number
        papers[number] = json.dumps(record) if changed == number else line
    assert changed is not None, "no paragraph of the corpus is shown whole in the recording"
    modified = directory / "modified.jsonl"
    modified.write_text("\n".join(papers) + "\n")
    return directory, corpus, modified, env


def replay(directory: Path, corpus: Path, out: str, env: dict, *extra: str):
    return run_cli(
        "eval",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--policy",
        "replay",
        "--replay",
        str(directory / "scripted" / "trajectories.jsonl"),
        "--out",
        str(directory / out),
        *extra,
        env={**env, **WIDE},
    )


def test_an_honest_replay_reports_every_observation_reproduced(recorded):
    directory, corpus, _, env = recorded
    done = replay(directory, corpus, "honest", env)
    assert done.returncode == 0, done.stderr
    recording = lines(directory / "scripted" / "trajectories.jsonl")
    drift = json.loads((directory / "honest" / "metrics.json").read_text())["replay"]
    steps = sum(len(episode["steps"]) for episode in recording)
    # each step reports on the observation before it, the last one on its own too: one per step
    assert drift == {
        "episodes": len(recording),
        "steps": steps,
        "observations_compared": steps,
        "observations_changed": 0,
        "episodes_changed": 0,
        "first_change": None,
    }
    assert f"replay: all {steps} recorded observations reproduced" in done.stdout
    assert json.loads((directory / "scripted" / "metrics.json").read_text())["replay"] is None  # other policies: none


def test_a_replay_on_another_corpus_is_refused_in_one_line(recorded, tmp_path):
    directory, _, modified, env = recorded
    done = replay(directory, modified, "refused", env)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "recorded on another corpus" in done.stderr and "--replay-other-corpus" in done.stderr and "--corpus" in done.stderr
    assert not (directory / "refused").exists()  # refused before anything is written
    run = run_cli(
        "run",
        "--corpus",
        str(modified),
        "--policy",
        "replay",
        "--replay",
        str(directory / "scripted" / "trajectories.jsonl"),
        "--question-id",
        "demo-00000-q0",
        "--out",
        str(tmp_path),
        env=env,
    )
    assert run.returncode == 2 and "recorded on another corpus" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    stray = run_cli("run", "--corpus", str(modified), "--policy", "scripted", "--replay-other-corpus", "--out", str(tmp_path), env=env)
    assert stray.returncode == 2 and "only for --policy replay" in stray.stderr


def test_a_forced_replay_on_another_corpus_counts_and_names_the_first_change(recorded):
    directory, _, modified, env = recorded
    done = replay(directory, modified, "forced", env, "--replay-other-corpus")
    assert done.returncode == 0, done.stderr
    drift = json.loads((directory / "forced" / "metrics.json").read_text())["replay"]
    assert drift["observations_changed"] > 0 and 0 < drift["episodes_changed"] <= drift["episodes"]
    assert f"replay drift: {drift['observations_changed']} of {drift['observations_compared']}" in done.stdout
    # the first change, checked against the two logs themselves: every episode replayed before it
    # saw exactly what was recorded, and its step's observation differs where it says
    first = drift["first_change"]
    recording = {episode["question_id"]: episode for episode in lines(directory / "scripted" / "trajectories.jsonl")}
    replayed = lines(directory / "forced" / "trajectories.jsonl")
    ids = [episode["episode_id"] for episode in replayed]
    for episode in replayed[: ids.index(first["episode_id"])]:
        assert [s["observation"] for s in episode["steps"]] == [s["observation"] for s in recording[episode["question_id"]]["steps"]]
    episode = replayed[ids.index(first["episode_id"])]
    then = recording[episode["question_id"]]["steps"][first["step"]]["observation"]
    now = episode["steps"][first["step"]]["observation"]
    assert [s["observation"] for s in episode["steps"][: first["step"]]] == [
        s["observation"] for s in recording[episode["question_id"]]["steps"][: first["step"]]
    ]
    assert then != now and then[: first["position"]] == now[: first["position"]]
    assert then[first["position"] : first["position"] + 1] != now[first["position"] : first["position"] + 1]
    assert first["recorded"] in then and first["current"] in now
    assert first["episode_id"] in done.stdout

    shown = run_cli("inspect", str(directory / "forced"), env=WIDE)
    assert shown.returncode == 0, shown.stderr
    assert "replay drift" in shown.stdout and f"first change: episode {first['episode_id']}" in shown.stdout
    one = run_cli("inspect", str(directory / "forced"), "--episode", first["episode_id"], env=WIDE)
    assert one.returncode == 0 and f"replay drift (step {first['step'] + 1})" in one.stdout
    report = run_cli("report", str(directory / "forced"), "-o", str(directory / "forced.html"))
    assert report.returncode == 0, report.stderr
    page = (directory / "forced.html").read_text()
    assert '<table id="replay">' in page and f"episode {first['episode_id']}, observation of step {first['step'] + 1}" in page


def test_show_reads_the_whole_lines_of_a_torn_log_and_says_what_it_skipped(recorded, tmp_path):
    directory = recorded[0]
    whole = (directory / "scripted" / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(whole[0] + whole[1] + whole[2][:500])  # what a kill -9 in the middle of the third line leaves
    episodes = [json.loads(line) for line in whole[:2]]
    shown = run_cli("show", str(torn), env=WIDE)
    assert shown.returncode == 0, shown.stderr
    assert all(episode["episode_id"] in shown.stdout for episode in episodes) and "2 episodes" in shown.stdout
    assert f"{torn}:3: skipped a torn last line (500 bytes" in shown.stderr
    one = run_cli("show", str(torn), "--episode", episodes[1]["episode_id"], env=WIDE)
    assert one.returncode == 0 and "step 1" in one.stdout and "skipped a torn last line" in one.stderr
    at_torn = run_cli("show", str(torn), "--line", "3")
    assert at_torn.returncode == 2 and "torn last line" in at_torn.stderr
    # torn in the middle of a UTF-8 character: still only that line is skipped
    cut = whole[1].index(b'"question"') + 12
    (tmp_path / "mid-character.jsonl").write_bytes(whole[0] + "é".encode() * 3 + whole[1][:cut] + "é".encode()[:1])
    assert run_cli("show", str(tmp_path / "mid-character.jsonl")).returncode == 0
    # a bad line that is not the last stays an error
    (tmp_path / "bad.jsonl").write_bytes(whole[0] + whole[1][:500] + b"\n" + whole[2])
    bad = run_cli("show", str(tmp_path / "bad.jsonl"))
    assert bad.returncode == 2 and "bad.jsonl:2: not JSON" in bad.stderr


def test_show_lists_episodes_that_share_an_id_and_shows_one_by_line(recorded, tmp_path):
    directory = recorded[0]
    whole = (directory / "scripted" / "trajectories.jsonl").read_text().splitlines(keepends=True)
    again = json.loads(whole[0]) | {"started_at": "2031-01-02T03:04:05+00:00"}  # the same question run twice
    again["outcome"]["answer"] = "a later answer"
    log = tmp_path / "twice.jsonl"
    log.write_text(whole[0] + whole[1] + json.dumps(again) + "\n")
    first = json.loads(whole[0])
    for chosen in (first["episode_id"], first["question_id"]):
        listed = run_cli("show", str(log), "--episode", chosen, env=WIDE)
        assert listed.returncode == 2
        assert len(listed.stderr.strip().splitlines()) == 1 and "2 episodes match" in listed.stderr and "--line N" in listed.stderr
        assert first["started_at"] in listed.stdout and again["started_at"] in listed.stdout
        rows = [row for row in listed.stdout.splitlines() if first["episode_id"] in row]
        assert [row.split()[1] for row in rows] == ["1", "3"]  # the line numbers --line takes
    later = run_cli("show", str(log), "--line", "3", env=WIDE)
    assert later.returncode == 0, later.stderr
    assert "a later answer" in later.stdout
    earlier = run_cli("show", str(log), "--line", "1", "--episode", first["question_id"], env=WIDE)
    assert earlier.returncode == 0 and "a later answer" not in earlier.stdout
    wrong = run_cli("show", str(log), "--line", "2", "--episode", first["episode_id"])
    assert wrong.returncode == 2 and "not" in wrong.stderr
    missing = run_cli("show", str(log), "--line", "9")
    assert missing.returncode == 2 and "no episode on that line" in missing.stderr
    listing = run_cli("show", str(log), env=WIDE)
    assert listing.returncode == 0 and "3 episodes" in listing.stdout


def test_show_prints_each_steps_reasoning_labelled_and_as_data(recorded, tmp_path):
    directory = recorded[0]
    episode = json.loads((directory / "scripted" / "trajectories.jsonl").read_text().splitlines()[0])
    assert len(episode["steps"]) >= 2
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps(episode) + "\n")
    episode["steps"][0]["reasoning"] = "The question asks for a size, so search first.\n\x1b[2J[/x] then read."
    episode["steps"][1]["reasoning"] = "Still thinking when the budget ran out"
    episode["steps"][1]["generation"] = {"generated_tokens": 12, "thinking_tokens": 10, "thinking_budget_hit": True}
    thinking = tmp_path / "thinking.jsonl"
    thinking.write_text(json.dumps(episode) + "\n")
    shown = run_cli("show", str(thinking), env=WIDE)
    assert shown.returncode == 0, shown.stderr
    assert (
        shown.stdout.count("reasoning (think block") == 2 and "reasoning (think block, closed for the model at its budget)" in shown.stdout
    )
    assert "The question asks for a size, so search first." in shown.stdout and "Still thinking when the budget ran out" in shown.stdout
    assert "\\x1b[2J[/x] then read." in shown.stdout and "\x1b" not in shown.stdout  # the model's text is data, escaped
    assert shown.stdout.index("search first") < shown.stdout.index("step 2")  # each step's reasoning in its own step
    without = run_cli("show", str(plain), env=WIDE)
    assert without.returncode == 0 and "reasoning" not in without.stdout
