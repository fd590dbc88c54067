"""A researcher's own papers and questions through the CLI, as the README tells it:
corpus from-text -> questions init -> (edit) -> questions check -> eval; and the corpus
commands' promises (a single-split corpus runs its split, one hash name, exports that keep
splits and hashes, gold answers refused at load)."""

import json

import pytest

from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.writing import write_jsonl, write_qasper
from tests.conftest import QASPER_MINI, run_cli

METHOD = "Our model, SparseDoc, attends to 64 tokens around each position. It is trained with AdamW at a learning rate of 3e-4."
METHOD_WRAPPED = METHOD.replace(". ", ".\n")  # as a PDF's text wraps it: from-text joins the lines again
FINDINGS = "Retrieval reduces hallucinated entities by a third on XSum."
SPARSE = f"""# Sparse Attention for Long Documents

## Abstract

We study sparse attention for documents of many pages.

## Method

{METHOD_WRAPPED}

## Results

SparseDoc reaches 41.2 F1 on QASPER, four points above the dense baseline.
"""
RETRIEVAL = f"""Retrieval Helps Summaries

Introduction
============

We add retrieval to a summarizer and measure hallucinated entities.

Findings
--------

{FINDINGS}
"""


def one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def fill_in(template: dict) -> list[dict]:
    """What a researcher does to a template line: write the question and answers, drop the help."""
    del template["template"]
    if template["paper_id"] == "sparse-attention":
        template.update(
            text="What learning rate is SparseDoc trained with?", answers=[{"extractive_spans": ["3e-4"], "evidence": [METHOD]}]
        )
        unanswerable = {
            "id": "sparse-attention-q2",
            "paper_id": "sparse-attention",
            "text": "How many heads does SparseDoc use?",
            "answers": [{"unanswerable": True}],
        }
        return [template, unanswerable]
    template.update(text="Does retrieval reduce hallucinated entities?", answers=[{"yes_no": True, "evidence": [FINDINGS]}])
    return [template]


def test_own_papers_and_questions_from_text_to_an_eval(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "sparse-attention.md").write_text(SPARSE)
    (texts / "retrieval.txt").write_text(RETRIEVAL)
    papers, questions = tmp_path / "papers.jsonl", tmp_path / "questions.jsonl"

    made = run_cli("corpus", "from-text", str(texts), "--out", str(papers), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["papers"] == 2

    started = run_cli("questions", "init", "--corpus", str(papers), "--out", str(questions))
    assert started.returncode == 0 and "2 question templates" in started.stdout, started.stderr
    one_line_error(run_cli("questions", "init", "--corpus", str(papers), "--out", str(questions)), "already exists")
    templates = [json.loads(line) for line in questions.read_text().splitlines()]
    assert [t["paper_id"] for t in templates] == ["retrieval", "sparse-attention"]
    assert templates[1]["template"]["paper_title"] == "Sparse Attention for Long Documents"

    one_line_error(
        run_cli("questions", "check", str(questions), "--corpus", str(papers)),
        f"{questions}:1:",
        "'retrieval-q1'",
        "fill it in",
        "delete the line",
    )
    one_line_error(
        run_cli("eval", "--corpus", str(papers), "--questions", str(questions), "--out", str(tmp_path / "early")),
        f"{questions}:1:",
        "unfilled template",
    )
    assert not (tmp_path / "early").exists()

    filled = [record for template in templates for record in fill_in(template)]
    questions.write_text("".join(json.dumps(record) + "\n" for record in filled))
    checked = run_cli("questions", "check", str(questions), "--corpus", str(papers), "--json")
    assert checked.returncode == 0, checked.stderr
    summary = json.loads(checked.stdout)
    assert summary["questions"] == 3 and summary["questions_per_paper"] == {"retrieval": 1, "sparse-attention": 2}
    assert summary["answer_kinds"] == {"boolean": 1, "extractive": 1, "none": 1}

    out = tmp_path / "runs" / "mine"
    done = run_cli("eval", "--corpus", str(papers), "--questions", str(questions), "--policy", "scripted", "--out", str(out))
    assert done.returncode == 0, done.stderr
    asked = {json.loads(line)["question_id"] for line in (out / "trajectories.jsonl").read_text().splitlines()}
    assert asked == {"retrieval-q1", "sparse-attention-q1", "sparse-attention-q2"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["split"] == "all" and manifest["config"]["questions"] == 3
    assert manifest["hashes"]["questions_sha256"] == summary["questions_sha256"]


def test_check_points_at_evidence_that_is_not_a_whole_paragraph(tmp_path):
    papers, questions = tmp_path / "papers.jsonl", tmp_path / "questions.jsonl"
    (tmp_path / "retrieval.txt").write_text(RETRIEVAL)
    assert run_cli("corpus", "from-text", str(tmp_path / "retrieval.txt"), "--out", str(papers)).returncode == 0
    record = {
        "id": "q1",
        "paper_id": "retrieval",
        "text": "By how much?",
        "answers": [{"free_form_answer": "A third.", "evidence": ["by a third on XSum"]}],
    }
    questions.write_text(json.dumps(record) + "\n")
    one_line_error(
        run_cli("questions", "check", str(questions), "--corpus", str(papers)),
        f"{questions}:1:",
        "not a paragraph",
        "section 2 paragraph 0",
    )


def test_a_question_without_gold_answers_is_refused_at_load(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "q-empty", "paper_id": "demo-00000", "text": "Why?", "answers": []}) + "\n")
    one_line_error(
        run_cli("eval", "--questions", str(questions), "--out", str(tmp_path / "run")),
        f"{questions}:1:",
        "'q-empty'",
        "has no answers",
        "explorer schema question",
    )


def test_schema_question_documents_the_questions_file():
    done = run_cli("schema", "question")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert "questions file" in schema["$comment"] and {"id", "paper_id", "text", "answers"} <= set(schema["properties"])
    answer = schema["$defs"]["Answer"]["properties"]
    assert "whole" in answer["evidence"]["description"] and answer["unanswerable"]["description"]


@pytest.fixture(scope="module")
def dev_only(tmp_path_factory):
    """QASPER's official dev file alone: its papers say no split, its name says validation."""
    folder = tmp_path_factory.mktemp("dev")
    demo = generate(DemoConfig(papers=12, seed=4))
    papers = [p.model_copy(update={"split": None}) for p in demo.papers if p.split == "validation"]
    ids = {p.id for p in papers}
    write_qasper(from_parts(papers, [q for q in demo.questions if q.paper_id in ids]), folder / "qasper-dev-v0.3.json")
    return folder / "qasper-dev-v0.3.json", [q.id for q in demo.questions if q.paper_id in ids]


def test_a_single_split_corpus_runs_its_split_by_default_and_says_so(dev_only, tmp_path):
    dev, expected = dev_only
    done = run_cli("eval", "--corpus", str(dev), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "every question of the corpus is in the validation split" in done.stderr
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["config"]["split"] == "validation"
    asked = [json.loads(line)["question_id"] for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(asked) == sorted(expected)
    one_line_error(
        run_cli("eval", "--corpus", str(dev), "--split", "test", "--out", str(tmp_path / "test")),
        "no questions to run in split 'test'",
        "validation: ",
    )


def test_stats_and_manifests_call_the_papers_hash_corpus_sha256(dev_only, tmp_path):
    dev, _ = dev_only
    stats = run_cli("corpus", "stats", "--corpus", str(dev), "--json")
    assert stats.returncode == 0, stats.stderr
    hashes = json.loads(stats.stdout)
    assert "papers_sha256" not in hashes
    assert run_cli("eval", "--corpus", str(dev), "--limit", "1", "--out", str(tmp_path / "run")).returncode == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["hashes"]["corpus_sha256"] == hashes["corpus_sha256"]
    assert manifest["hashes"]["questions_sha256"] == hashes["questions_sha256"]
    table = run_cli("corpus", "stats", "--corpus", str(dev))
    assert "corpus_sha256" in table.stdout and hashes["corpus_sha256"] in table.stdout.replace("\n", "").replace("│", "").replace(" ", "")


def test_export_to_qasper_keeps_the_splits_and_the_hashes(tmp_path):
    corpus = generate(DemoConfig(papers=12, seed=4))
    write_jsonl(corpus, tmp_path / "demo.jsonl")
    exported = run_cli(
        "corpus", "export", "--corpus", str(tmp_path / "demo.jsonl"), "--to", "qasper", "--out", str(tmp_path / "demo.json"), "--json"
    )
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)
    assert summary["hashes_kept"] and summary["corpus_sha256"] == corpus.papers_sha256
    again = json.loads(run_cli("corpus", "stats", "--corpus", str(tmp_path / "demo.json"), "--json").stdout)
    assert (again["corpus_sha256"], again["questions_sha256"]) == (corpus.papers_sha256, corpus.questions_sha256)
    assert again["questions_per_split"] == {split: len(corpus.split(split).questions) for split in ("test", "train", "validation")}


def test_an_export_whose_name_states_another_split_says_the_hash_changed(tmp_path):
    renamed = run_cli("corpus", "export", "--corpus", str(QASPER_MINI), "--to", "qasper", "--out", str(tmp_path / "qasper-dev-v0.3.json"))
    assert renamed.returncode == 0, renamed.stderr
    assert "note: corpus_sha256 changed" in renamed.stderr and "name states" in renamed.stderr
