import hashlib
import os
import re
import subprocess
import sys

import pytest

from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.corpus.writing import explorer_lines

GENERATE_AND_HASH = (
    "import hashlib, sys; from paper_explorer.corpus import DemoConfig, generate; from paper_explorer.corpus.writing import explorer_lines;"
    "print(hashlib.sha256(''.join(explorer_lines(generate(DemoConfig(papers=60, seed=3)))).encode()).hexdigest())"
)


def test_generation_is_byte_identical_across_processes_and_hash_seeds():
    digests = {
        subprocess.run(
            [sys.executable, "-c", GENERATE_AND_HASH],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("0", "1", "12345")
    }
    here = hashlib.sha256("".join(explorer_lines(generate(DemoConfig(papers=60, seed=3)))).encode()).hexdigest()
    assert digests == {here}


def test_other_seeds_give_other_corpora():
    assert generate(DemoConfig(papers=20, seed=1)).sha256 != generate(DemoConfig(papers=20, seed=2)).sha256


def test_default_is_416_papers_with_half_unanswerable():
    corpus = generate()
    assert len(corpus.papers) == 416
    unanswerable = sum(not q.answerable for q in corpus.questions)
    assert unanswerable == round(0.5 * len(corpus.questions))
    assert 14_000 < sum(1 for _ in corpus.paragraphs()) < 18_000


@pytest.mark.parametrize("ratio", [0.0, 0.2, 1.0])
def test_unanswerable_ratio_is_exact_up_to_rounding(ratio):
    corpus = generate(DemoConfig(papers=30, seed=5, unanswerable_ratio=ratio))
    assert sum(not q.answerable for q in corpus.questions) == round(ratio * len(corpus.questions))


def test_all_answer_types_occur(small_demo):
    assert {q.answers[0].kind for q in small_demo.questions} == {"extractive", "boolean", "abstractive", "none"}


def test_splits_partition_the_papers_and_follow_the_shares():
    corpus = generate(DemoConfig(papers=100, seed=11))
    splits = {}
    for paper in corpus.papers:
        splits.setdefault(paper.split, set()).add(paper.id)
    assert {name: len(ids) for name, ids in splits.items()} == {"train": 70, "validation": 15, "test": 15}
    question_ids = {name: {q.id for q in corpus.split(name).questions} for name in splits}
    assert not (question_ids["train"] & question_ids["test"]) and not (question_ids["train"] & question_ids["validation"])
    assert sum(len(ids) for ids in question_ids.values()) == len(corpus.questions)


def test_gold_evidence_is_a_paragraph_that_contains_the_answer(small_demo):
    assert small_demo.warnings == ()
    for question in small_demo.questions:
        answer = question.answers[0]
        if answer.kind == "extractive":
            joined = " ".join(answer.evidence)
            for span in answer.extractive_spans:
                assert span in joined, (question.text, span)
        if answer.kind in ("extractive", "boolean", "abstractive"):
            assert answer.evidence


def test_unanswerable_questions_are_near_misses_whose_detail_is_absent(small_demo):
    patterns = {
        "batch size is used": r"batch size of \d",
        "attention heads": r"\d+ attention heads",
        "parameters does": r"\d+M parameters",
        "How long does it take": r"takes about \d+ hours",
        "dropout rate": r"Dropout of [\d.]+",
    }
    checked = 0
    for question in small_demo.questions:
        if question.answerable:
            continue
        paper = small_demo.paper(question.paper_id)
        text = " ".join(p for s in paper.sections for p in s.paragraphs)
        for cue, stated in patterns.items():
            if cue in question.text:
                assert not re.search(stated, text), question.text
                checked += 1
        if " reach on " in question.text:
            dataset = question.text.split(" reach on ")[1].rstrip("?")
            assert f"On {dataset}," not in text
            checked += 1
    assert checked == sum(not q.answerable for q in small_demo.questions)


def test_papers_on_one_task_share_vocabulary_and_name_each_other():
    corpus = generate(DemoConfig(papers=50, seed=2))
    methods = {paper.title.split(":")[0] for paper in corpus.papers}
    related = [p for paper in corpus.papers for s in paper.sections if s.name == "Related Work" for p in s.paragraphs]
    assert any(method in paragraph for paragraph in related for method in methods)


@pytest.mark.parametrize(
    "bad", [dict(papers=0), dict(unanswerable_ratio=1.5), dict(questions_per_paper=9), dict(split_shares=(0.5, 0.5, 0.5))]
)
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        DemoConfig(**bad)
