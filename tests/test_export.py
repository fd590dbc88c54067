"""``explorer export``: a run as an inspect_ai log (.eval and .json) and as a Hugging Face dataset,
built SFT data as a DatasetDict, each read back with the library that reads it; and the refusals.

inspect_ai and datasets are the ``export`` extra, which ``make test`` installs; without them these
tests skip, saying so (and fail under CI=true, which must have them)."""

import importlib
import os
from pathlib import Path

import pytest

from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.scoring import EpisodeScore
from paper_explorer.sft.dataset import load_examples
from tests.conftest import run_cli, run_cli_process

SCORES = ("answer_f1", "exact_match", "sub_exact_match", "evidence_f1", "evidence_f1_strict")


def needs(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        reason = f"{module} is not installed (pip install -e '.[export]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


def eval_run(directory: Path, *args: str) -> Path:
    cache = {"EXPLORER_CACHE_DIR": str(directory.parent / "explorer-cache")}  # never the user's ~/.cache
    done = run_cli("eval", "--split", "all", "--out", str(directory), *args, env=cache)
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Six scripted episodes of the demo corpus: several steps each, every question scored."""
    return eval_run(tmp_path_factory.mktemp("export") / "run", "--limit", "6")


@pytest.fixture(scope="module")
def shortcut_run(tmp_path_factory) -> Path:
    """Episodes that answer at once, so the detectors flag every one (direct_submit, no_tool_use)."""
    return eval_run(tmp_path_factory.mktemp("export") / "shortcut", "--limit", "3", "--policy", "direct-submit")


def scores_of(run_dir: Path) -> dict[str, EpisodeScore]:
    return {score.episode_id: score for score in Run.load(run_dir).scores}


def export(*args: str):
    return run_cli("export", *args)


@pytest.mark.parametrize("suffix", [".eval", ".json"])
def test_inspect_log_holds_every_step_score_and_flag(run, tmp_path, suffix):
    log_module = needs("inspect_ai.log")
    out = tmp_path / f"run{suffix}"
    done = export(str(run), "--to", "inspect", str(out))
    assert done.returncode == 0, done.stderr

    log = log_module.read_eval_log(str(out))
    trajectories = {t.episode_id: t for t in read_trajectories(run / "trajectories.jsonl")}
    scores = scores_of(run)
    assert log.status == "success" and log.eval.task == "explorer-eval" and log.eval.model == "explorer/scripted"
    assert len(log.samples) == len(trajectories) == 6
    for sample in log.samples:
        trajectory, score = trajectories[sample.metadata["episode_id"]], scores[sample.metadata["episode_id"]]
        assert (sample.id, sample.epoch) == (trajectory.question_id, trajectory.sample + 1)
        assert sample.input == trajectory.question and sample.target, "the demo corpus's gold answers are the target"
        assert [m.role for m in sample.messages[:2]] == ["system", "user"]
        assert sample.messages[0].text == trajectory.system_prompt
        assert len(sample.messages) == 2 + 2 * len(trajectory.steps)
        for i, step in enumerate(trajectory.steps):
            action, observation = sample.messages[2 + 2 * i], sample.messages[3 + 2 * i]
            assert action.role == "assistant" and action.text == step.action_text
            assert action.tool_calls[0].function == "python" and action.tool_calls[0].arguments == {"code": step.code}
            assert observation.role == "tool" and observation.text == step.observation
            assert observation.tool_call_id == action.tool_calls[0].id
            assert [call["name"] for call in observation.metadata["tool_calls"]] == [call.name for call in step.tool_calls]
        assert sample.output.completion == score.prediction
        assert {name: sample.scores[name].value for name in SCORES} == {name: score.metric(name) for name in SCORES}
        assert sample.scores["status"].value == score.status == sample.metadata["status"]
        assert sample.metadata["flags"] == [flag.to_json() for flag in score.flags]
        assert (sample.metadata["steps"], sample.metadata["tool_calls"]) == (score.steps, score.tool_calls)
        assert sample.metadata["policy"] == "scripted"
    headline = {s.name: s.metrics["mean"].value for s in log.results.scores}
    assert headline["answer_f1"] == Run.load(run).metrics.answer_f1


def test_inspect_log_carries_the_detector_flags(shortcut_run, tmp_path):
    log_module = needs("inspect_ai.log")
    out = tmp_path / "shortcut.eval"
    assert export(str(shortcut_run), "--to", "inspect", str(out)).returncode == 0
    scores = scores_of(shortcut_run)
    samples = log_module.read_eval_log(str(out)).samples
    assert len(samples) == 3
    for sample in samples:
        flagged = {flag["detector"] for flag in sample.metadata["flags"]}
        assert "direct_submit" in flagged
        assert sample.metadata["flags"] == [flag.to_json() for flag in scores[sample.metadata["episode_id"]].flags]


def test_run_as_hugging_face_dataset(run, tmp_path):
    datasets = needs("datasets")
    out = tmp_path / "hf"
    done = export(str(run), "--to", "hf", str(out))
    assert done.returncode == 0, done.stderr

    trajectories = read_trajectories(run / "trajectories.jsonl")
    scores = scores_of(run)
    on_disk = datasets.load_from_disk(str(out))
    parquet = datasets.load_dataset(
        "parquet", data_files=str(out / "parquet" / "trajectories.parquet"), split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    for dataset in (on_disk, parquet):
        assert len(dataset) == len(trajectories) == 6
        for row, trajectory in zip(dataset, trajectories):
            score = scores[trajectory.episode_id]
            assert Trajectory.model_validate_json(row["trajectory"]) == trajectory
            assert (row["episode_id"], row["question_id"], row["question"]) == (
                trajectory.episode_id,
                trajectory.question_id,
                trajectory.question,
            )
            assert (row["status"], row["answer"], row["num_steps"]) == (score.status, score.prediction, score.steps)
            assert {name: row[name] for name in SCORES} == {name: score.metric(name) for name in SCORES}
            assert [step["code"] for step in row["steps"]] == [step.code for step in trajectory.steps]
            assert [step["observation"] for step in row["steps"]] == [step.observation for step in trajectory.steps]
            assert [m["role"] for m in row["messages"]] == ["system", "user"] + ["assistant", "user"] * len(trajectory.steps)
            assert row["target"], "the demo corpus's gold answers"


def test_sft_data_as_dataset_dict(tmp_path, tiny_tokenizer):
    datasets = needs("datasets")
    taught = run_cli("sft", "teach", "--split", "train", "--limit", "4", "--out", str(tmp_path / "T.jsonl"))
    assert taught.returncode == 0, taught.stderr
    data = tmp_path / "D"
    built = run_cli(
        "sft",
        "build",
        "-t",
        str(tmp_path / "T.jsonl"),
        "--tokenizer",
        str(tiny_tokenizer),
        "--out",
        str(data),
        "--min-answer-f1",
        "0",
        "--evaluation-split",
        "none",
    )
    assert built.returncode == 0, built.stderr
    out = tmp_path / "hf"
    done = export(str(data), "--to", "hf", str(out))
    assert done.returncode == 0, done.stderr

    dataset = datasets.load_from_disk(str(out))
    assert set(dataset) == {"train", "validation"}
    for name in ("train", "validation"):
        examples = load_examples(data / f"{name}.jsonl")
        assert len(dataset[name]) == len(examples)
        assert dataset[name]["input_ids"] == [e.input_ids for e in examples]
        assert dataset[name]["labels"] == [e.labels for e in examples]
    train = load_examples(data / "train.jsonl")
    assert train, "four teacher trajectories, none dropped"
    parquet = datasets.load_dataset(
        "parquet", data_files={"train": str(out / "parquet" / "train.parquet")}, cache_dir=str(tmp_path / "hf-cache")
    )
    assert parquet["train"]["input_ids"] == [e.input_ids for e in train]
    assert parquet["train"]["episode_id"] == [e.episode_id for e in train]


def one_line_error(done, *words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr


def test_nothing_is_overwritten_without_force(run, tmp_path):
    needs("inspect_ai.log")
    needs("datasets")
    existing = tmp_path / "run.eval"
    existing.write_text("mine")
    one_line_error(export(str(run), "--to", "inspect", str(existing)), "already exists", "--force")
    assert existing.read_text() == "mine"
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    one_line_error(export(str(run), "--to", "hf", str(folder)), "already exists")
    one_line_error(export(str(run), "--to", "hf", str(folder), "--force"), "not a dataset directory")
    assert (folder / "notes.txt").read_text() == "mine"
    forced = export(str(run), "--to", "inspect", str(existing), "--force")
    assert forced.returncode == 0, forced.stderr
    assert existing.read_bytes()[:2] == b"PK"  # the .eval format is a zip
    assert not list(tmp_path.glob(".*tmp*")), "the temporary file is renamed into place"


def test_bad_input_is_one_line_and_exit_2(run, tmp_path):
    needs("inspect_ai.log")
    needs("datasets")
    one_line_error(export(str(tmp_path), "--to", "inspect", str(tmp_path / "x.eval")), "manifest.json")
    one_line_error(export(str(tmp_path / "nowhere"), "--to", "hf", str(tmp_path / "y")), "no such run directory")
    one_line_error(export(str(run), "--to", "csv", str(tmp_path / "z")), "unknown format")
    one_line_error(export(str(run), "--to", "inspect", str(tmp_path / "z.txt")), ".eval")
    other = Path(__file__).parent / "fixtures" / "qasper-mini-v0.3.json"
    one_line_error(export(str(run), "--to", "inspect", str(tmp_path / "z.eval"), "--corpus", str(other)), "hash differs")
    assert not list(tmp_path.glob("z*"))


def test_a_missing_extra_is_one_line_with_the_install_command(run, tmp_path):
    hidden = tmp_path / "hidden"
    for module in ("inspect_ai", "datasets"):
        (hidden / module).mkdir(parents=True)
        (hidden / module / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    for to, module in (("inspect", "inspect_ai"), ("hf", "datasets")):
        # PYTHONPATH is read when a process starts: in this one the real modules are loaded already
        done = run_cli_process("export", str(run), "--to", to, str(tmp_path / f"out-{to}.eval"), env={"PYTHONPATH": str(hidden)})
        one_line_error(done, module, "pip install -e '.[export]'")


def test_gold_answers_come_from_the_recorded_corpus_and_a_moved_one_is_refused_as_report_refuses_it(tmp_path):
    log_module = needs("inspect_ai.log")
    corpus = tmp_path / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "30", "--seed", "3", "--out", str(corpus)).returncode == 0
    run_dir = eval_run(tmp_path / "run", "--corpus", str(corpus), "--limit", "3")

    def targets(*args: str) -> tuple[list, str]:
        out = tmp_path / "log.json"
        done = export(str(run_dir), "--to", "inspect", str(out), "--force", *args)
        assert done.returncode == 0, done.stderr
        return [sample.target for sample in log_module.read_eval_log(str(out)).samples], done.stderr

    found, _ = targets()
    assert len(found) == 3 and all(found)
    moved = corpus.rename(tmp_path / "moved.jsonl")
    for to, out in (("inspect", tmp_path / "log.json"), ("hf", tmp_path / "data")):  # never empty gold answers, as report
        one_line_error(export(str(run_dir), "--to", to, str(out), "--force"), "is gone", "pass --corpus")
    assert targets("--corpus", str(moved))[0] == found


def test_each_sample_of_a_question_is_an_epoch(tmp_path):
    log_module = needs("inspect_ai.log")
    run_dir = eval_run(tmp_path / "run", "--limit", "2", "--samples", "2")
    out = tmp_path / "k.eval"
    assert export(str(run_dir), "--to", "inspect", str(out)).returncode == 0
    log = log_module.read_eval_log(str(out))
    assert sorted((sample.id, sample.epoch) for sample in log.samples) == [
        ("demo-00000-q0", 1),
        ("demo-00000-q0", 2),
        ("demo-00000-q1", 1),
        ("demo-00000-q1", 2),
    ]
    assert log.eval.config.epochs == 2
    assert all(sample.metadata["sample"] == sample.epoch - 1 for sample in log.samples)


def test_an_export_never_writes_through_a_link_planted_beside_its_output(run, tmp_path):
    """The temporary names are made new (mkdtemp), not guessed from the pid: links planted at every
    name the old code used are left alone, and so are their targets."""
    needs("inspect_ai.log")
    needs("datasets")
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    pid = os.getpid()  # run_cli runs in this process
    planted = [out / f".log.{pid}.tmp.json", out / f".hf.{pid}.tmp", out / f".hf.{pid}.old"]
    for link in planted:
        link.symlink_to(victim / link.name)
    assert export(str(run), "--to", "inspect", str(out / "log.json")).returncode == 0
    assert export(str(run), "--to", "hf", str(out / "hf")).returncode == 0
    assert (out / "log.json").is_file() and not (out / "log.json").is_symlink() and (out / "hf").is_dir()
    assert list(victim.iterdir()) == []
    assert all(link.is_symlink() for link in planted)
    assert sorted(path.name for path in out.iterdir() if not path.name.startswith(".")) == ["hf", "log.json"]
