"""The researcher's workflow on files named and laid out as QASPER's official release: splits
come from the file names, and the README's recipe runs as written (tiny model, CPU)."""

import json

import pytest

from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.writing import write_jsonl, write_qasper
from tests.conftest import run_cli

OFFICIAL = {"train": "qasper-train-v0.3.json", "validation": "qasper-dev-v0.3.json", "test": "qasper-test-v0.3.json"}


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """A folder as the two official tarballs unpack: three v0.3 files (no split inside them) and the evaluator."""
    folder = tmp_path_factory.mktemp("qasper")
    corpus = generate(DemoConfig(papers=18, seed=4))
    for split, name in OFFICIAL.items():
        papers = [p.model_copy(update={"split": None}) for p in corpus.papers if p.split == split]
        ids = {p.id for p in papers}
        write_qasper(from_parts(papers, [q for q in corpus.questions if q.paper_id in ids]), folder / name)
    (folder / "qasper_evaluator.py").write_text("# shipped beside the test file; not a corpus file\n")
    return folder, corpus


def questions_of(run_dir):
    return {json.loads(line)["question_id"] for line in (run_dir / "trajectories.jsonl").read_text().splitlines()}


def test_splits_come_from_the_official_file_names(official, tmp_path):
    folder, corpus = official
    expected = {split: {q.id for q in corpus.split(split).questions} for split in OFFICIAL}
    for split, flags in (("test", []), ("validation", ["--split", "validation"]), ("validation", ["--split", "dev"])):
        out = tmp_path / "-".join([split, *flags])  # --split dev is QASPER's name for validation: the same questions
        done = run_cli("eval", "--corpus", str(folder), "--out", str(out), *flags)
        assert done.returncode == 0, done.stderr
        assert questions_of(out) == expected[split]
        assert json.loads((out / "manifest.json").read_text())["config"]["split"] == split
    single = run_cli("eval", "--corpus", str(folder / OFFICIAL["validation"]), "--split", "validation", "--out", str(tmp_path / "one"))
    assert single.returncode == 0 and questions_of(tmp_path / "one") == expected["validation"], single.stderr


def test_a_corpus_without_split_information_runs_everything_and_says_so(official, tmp_path):
    folder, corpus = official
    plain = tmp_path / "papers.json"
    plain.write_bytes((folder / OFFICIAL["test"]).read_bytes())
    done = run_cli("eval", "--corpus", str(plain), "--out", str(tmp_path / "all"))
    assert done.returncode == 0 and "no paper of the corpus says which split" in done.stderr, done.stderr
    assert questions_of(tmp_path / "all") == {q.id for q in corpus.split("test").questions}
    assert json.loads((tmp_path / "all" / "manifest.json").read_text())["config"]["split"] == "all"
    refused = run_cli("eval", "--corpus", str(plain), "--split", "test", "--out", str(tmp_path / "refused"))
    assert refused.returncode == 2 and "--split-of" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    stated = run_cli(
        "eval", "--corpus", str(plain), "--split-of", f"{plain}=validation", "--split", "validation", "--out", str(tmp_path / "stated")
    )
    assert stated.returncode == 0, stated.stderr
    resumed = run_cli("eval", "--out", str(tmp_path / "stated"), "--resume", "--corpus", str(plain))
    assert resumed.returncode == 0 and "resuming: 6 of 6" in resumed.stderr, resumed.stderr  # the manifest kept --split-of
    wrong = run_cli("eval", "--corpus", str(plain), "--split-of", "elsewhere.json=test", "--out", str(tmp_path / "w"))
    assert wrong.returncode == 2 and "not a file of the corpus" in wrong.stderr


def test_hugging_face_exports_are_split_by_file_name_or_column(official, tmp_path):
    folder, corpus = official
    from paper_explorer.corpus import load

    exported = tmp_path / "hf"
    exported.mkdir()
    for split in ("train", "validation"):
        write_jsonl(load(folder / OFFICIAL[split]), exported / f"{split}-00000-of-00001.jsonl")
    loaded = load(exported)
    assert {p.id for p in loaded.papers if p.split == "validation"} == {p.id for p in corpus.papers if p.split == "validation"}
    row = json.loads((folder / OFFICIAL["test"]).read_text())
    paper_id, paper = next(iter(row.items()))
    hf_row = {
        "id": paper_id,
        "title": paper["title"],
        "abstract": paper["abstract"],
        "split": "test",
        "full_text": {
            "section_name": [s["section_name"] for s in paper["full_text"]],
            "paragraphs": [s["paragraphs"] for s in paper["full_text"]],
        },
    }
    (tmp_path / "rows.jsonl").write_text(json.dumps(hf_row) + "\n")
    assert load(tmp_path / "rows.jsonl").papers[0].split == "test"


@pytest.mark.slow
def test_the_readme_recipe_runs_as_written_on_the_official_layout(official, tiny_model, tmp_path):
    """Eval the base model on dev, teach on train, build, train, evaluate on test - the README's commands."""
    folder, corpus = official
    model = str(tiny_model)
    steps = [
        [
            "eval",
            "--corpus",
            str(folder),
            "--policy",
            "hf",
            "--model",
            model,
            "--split",
            "validation",
            "--limit",
            "2",
            "--max-steps",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "base-dev"),
        ],
        ["sft", "teach", "--corpus", str(folder), "--tokenizer", model, "--out", str(tmp_path / "teacher.jsonl")],
        [
            "sft",
            "build",
            "-t",
            str(tmp_path / "teacher.jsonl"),
            "--corpus",
            str(folder),
            "--tokenizer",
            model,
            "--out",
            str(tmp_path / "sft-data"),
        ],
        ["check-parity", "-t", str(tmp_path / "teacher.jsonl"), "--tokenizer", model, "--data", str(tmp_path / "sft-data")],
        [
            "train",
            "--model",
            model,
            "--data",
            str(tmp_path / "sft-data"),
            "--corpus",
            str(folder),
            "--out",
            str(tmp_path / "sft"),
            "--max-steps",
            "1",
            "--validation-episodes",
            "1",
            "--quantization",
            "none",
        ],
    ]
    for args in steps:
        done = run_cli(*args)
        assert done.returncode == 0, (args[0], done.stderr)
    taught = {json.loads(line)["question_id"] for line in (tmp_path / "teacher.jsonl").read_text().splitlines()}
    assert taught == {q.id for q in corpus.split("train").questions}  # teach defaults to the train split
    report = json.loads((tmp_path / "sft-data" / "build_report.json").read_text())
    assert report["split_check"]["pass"] and report["parity"]["mismatches"] == 0
    (checkpoint,) = (tmp_path / "sft").glob("checkpoint-*")
    final = run_cli(
        "eval",
        "--corpus",
        str(folder),
        "--policy",
        "hf",
        "--model",
        model,
        "--adapter",
        str(checkpoint),
        "--limit",
        "2",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(tmp_path / "trained"),
    )
    assert final.returncode == 0, final.stderr
    assert questions_of(tmp_path / "trained") <= {q.id for q in corpus.split("test").questions}
