"""Your own questions, checked where they are read: templates refused until filled, gold answers
that say nothing refused (warned about in QASPER's own layouts), the split a command runs when
none is named, papers from plain text, and exports that keep splits and hashes."""

import json

import pytest

from paper_explorer.corpus import CorpusError, DemoConfig, generate, load
from paper_explorer.corpus.loading import from_parts, with_questions
from paper_explorer.corpus.plain_text import paper_from_text, papers_from_text
from paper_explorer.corpus.questions_file import PLACEHOLDER, check_questions, template_record, write_template
from paper_explorer.corpus.schema import Answer, Paper, Question, Section
from paper_explorer.corpus.selection import resolve_split, select_questions
from paper_explorer.corpus.writing import export_corpus, write_jsonl, write_questions
from tests.conftest import QASPER_MINI

PAPER = Paper(
    id="p1",
    title="Sparse Attention",
    sections=(
        Section(name="Method", paragraphs=("SparseDoc is trained with AdamW at a learning rate of 3e-4.", "")),
        Section(name="Results", paragraphs=("SparseDoc reaches 41.2 F1,\nfour points above the baseline.",)),
    ),
)
METHOD, RESULTS = PAPER.sections[0].paragraphs[0], PAPER.sections[1].paragraphs[0]


def lines(path, *records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def question(**fields):
    return {
        "id": "p1-q1",
        "paper_id": "p1",
        "text": "What learning rate?",
        "answers": [{"extractive_spans": ["3e-4"], "evidence": [METHOD]}],
        **fields,
    }


def papers_only():
    return from_parts([PAPER], [])


def load_error(call, *args, **kwargs) -> str:
    with pytest.raises(CorpusError) as raised:
        call(*args, **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    return message


# --- templates ---------------------------------------------------------------------------------


def test_a_template_line_names_its_paper_and_shows_every_answer_kind_from_the_paper_itself():
    record = template_record(PAPER)
    assert record["paper_id"] == "p1" and record["template"]["paper_title"] == "Sparse Attention"
    assert PLACEHOLDER in record["text"] and PLACEHOLDER in record["answers"][0]["extractive_spans"][0]
    examples = record["template"]["answer_examples"]
    assert set(examples) == {"extractive", "free_form", "yes_no", "unanswerable"}
    extractive = examples["extractive"]
    assert extractive["evidence"] == [METHOD] and extractive["extractive_spans"][0] in METHOD  # copied, as a user must


def test_init_writes_one_template_per_paper_and_never_overwrites(tmp_path):
    corpus = generate(DemoConfig(papers=5, seed=1))
    out = tmp_path / "questions.jsonl"
    assert write_template(corpus, out) == 5
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["paper_id"] for record in written] == corpus.paper_ids
    before = out.read_bytes()
    assert "already exists" in load_error(write_template, corpus, out)
    assert out.read_bytes() == before


def test_an_unfilled_template_is_refused_at_load_naming_file_line_and_what_to_do(tmp_path):
    path = lines(tmp_path / "questions.jsonl", question(id="p1-q0"), template_record(PAPER))
    message = load_error(with_questions, papers_only(), path)
    assert "questions.jsonl:2:" in message and "'p1-q1'" in message and "text still says" in message
    assert "fill it in" in message and "delete the line" in message


def test_a_placeholder_left_in_an_answer_is_named_by_its_field(tmp_path):
    record = question(answers=[{"extractive_spans": ["3e-4"], "evidence": [f"{PLACEHOLDER}: the paragraph>>"]}])
    message = load_error(with_questions, papers_only(), lines(tmp_path / "q.jsonl", record))
    assert "q.jsonl:1:" in message and "answers[0].evidence[0]" in message


def test_a_filled_question_that_kept_its_template_help_is_refused(tmp_path):
    record = question(template=template_record(PAPER)["template"])
    message = load_error(with_questions, papers_only(), lines(tmp_path / "q.jsonl", record))
    assert "q.jsonl:1:" in message and "'template' field" in message


def test_a_filled_questions_file_loads_and_checks(tmp_path):
    unanswerable = {"id": "p1-q2", "paper_id": "p1", "text": "How many heads?", "answers": [{"unanswerable": True}]}
    corpus = with_questions(papers_only(), lines(tmp_path / "q.jsonl", question(), unanswerable))
    summary = check_questions(corpus)
    assert summary.questions == 2 and summary.questions_per_paper == {"p1": 2}
    assert summary.answer_kinds == {"extractive": 1, "none": 1}
    assert summary.answerable_questions == 1 and summary.unanswerable_questions == 1
    assert summary.questions_sha256 == corpus.questions_sha256


@pytest.mark.parametrize(
    ("evidence", "hint"),
    [
        ("learning rate of 3e-4", "part of section 0 paragraph 0"),
        ("SparseDoc reaches 41.2 F1, four points above the baseline.", "only in spaces or line breaks"),
        ("A sentence the paper never holds.", "--paper-id p1"),
    ],
)
def test_check_refuses_evidence_that_is_not_a_paragraph_and_says_where_it_nearly_is(tmp_path, evidence, hint):
    record = question(answers=[{"extractive_spans": ["3e-4"], "evidence": [evidence]}])
    corpus = with_questions(papers_only(), lines(tmp_path / "q.jsonl", record))
    assert corpus.warning_counts() == {"evidence_not_a_paragraph": 1}  # a load only warns: QASPER's data holds some
    message = load_error(check_questions, corpus)
    assert message.startswith(f"{tmp_path / 'q.jsonl'}:1:") and hint in message


# --- gold answers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "said"), [([], "has no answers"), ([{}], "has an empty answer"), ([{}, {"evidence": [METHOD]}], "has only empty answers")]
)
def test_a_question_whose_answers_say_nothing_is_refused_in_a_questions_file(tmp_path, answers, said):
    message = load_error(with_questions, papers_only(), lines(tmp_path / "q.jsonl", question(answers=answers)))
    assert "q.jsonl:1:" in message and "'p1-q1'" in message and said in message and "unanswerable: true" in message


def test_a_question_without_answers_is_refused_in_explorer_jsonl(tmp_path):
    corpus = from_parts([PAPER], [Question(id="p1-q1", paper_id="p1", text="Why?", answers=(Answer(unanswerable=True),))])
    write_jsonl(corpus, tmp_path / "papers.jsonl")
    record = json.loads((tmp_path / "papers.jsonl").read_text())
    record["questions"][0]["answers"] = []
    (tmp_path / "papers.jsonl").write_text(json.dumps(record) + "\n")
    message = load_error(load, tmp_path / "papers.jsonl")
    assert "papers.jsonl:1:" in message and "'p1-q1'" in message and "has no answers" in message


def test_questions_built_in_code_are_held_to_the_same_rule():
    assert "has no answers" in load_error(from_parts, [PAPER], [Question(id="q", paper_id="p1", text="Why?")])


def test_qasper_layouts_warn_about_a_question_without_gold_and_still_load(tmp_path):
    document = json.loads(QASPER_MINI.read_text())
    paper_id = next(iter(document))
    first = document[paper_id]["qas"][0]
    first["answers"] = []
    (tmp_path / "qasper.json").write_text(json.dumps(document))
    loaded = load(tmp_path / "qasper.json")
    assert loaded.warning_counts() == {"no_gold_answer": 1}
    assert first["question_id"] in str(loaded.warnings[0]) and "missed abstention" in str(loaded.warnings[0])
    assert len(loaded.questions) == len(load(QASPER_MINI).questions)


def test_the_official_layout_fixture_still_loads_without_warnings():
    assert load(QASPER_MINI).warnings == ()


# --- which split runs ----------------------------------------------------------------------------


def corpus_in_splits(*splits):
    demo = generate(DemoConfig(papers=12, seed=4))
    papers = [p for p in demo.papers if p.split in splits]
    ids = {p.id for p in papers}
    return from_parts(papers, [q for q in demo.questions if q.paper_id in ids])


def test_a_corpus_whose_questions_are_all_in_one_split_runs_it_and_says_so():
    notes = []
    corpus = corpus_in_splits("validation")
    assert resolve_split(corpus, None, "test", notes.append) == "validation"
    assert len(notes) == 1 and "validation split runs" in notes[0]
    assert select_questions(corpus, None, None, note=notes.append) == list(corpus.questions)


def test_a_named_split_or_a_corpus_of_several_splits_keeps_the_default():
    notes = []
    assert resolve_split(corpus_in_splits("validation"), "validation", "test", notes.append) == "validation"
    assert resolve_split(corpus_in_splits("validation", "test"), None, "test", notes.append) == "test"
    assert notes == []


def test_a_training_default_never_moves_to_a_held_out_split():
    notes = []
    message = load_error(select_questions, corpus_in_splits("validation"), None, None, default="train", note=notes.append)
    assert notes == []
    assert "split 'train'" in message and "validation: " in message


def test_a_corpus_without_splits_runs_everything_and_bad_splits_are_corpus_errors():
    notes = []
    plain = papers_only()
    assert resolve_split(plain, None, "test", notes.append) == "all" and "no paper of the corpus" in notes[0]
    assert "unknown split 'tset'; did you mean test?" in load_error(resolve_split, plain, "tset", "test", notes.append)
    assert "split_of" in load_error(resolve_split, plain, "test", "test", notes.append)


# --- papers from plain text --------------------------------------------------------------------

MARKDOWN = """---
title: "SparseDoc: sparse attention"
tags: [nlp]
---

# Abstract

We study sparse attention.

# Method

SparseDoc is trained
with AdamW.

```python
# a comment, not a heading

x = 1
```

Results
=======

It reaches 41.2 F1.
"""


def test_markdown_headings_become_sections_and_blank_lines_paragraphs():
    paper = paper_from_text("sparse", MARKDOWN)
    assert paper.title == "SparseDoc: sparse attention" and paper.abstract == "We study sparse attention."
    assert [section.name for section in paper.sections] == ["Method", "Results"]
    method = paper.sections[0].paragraphs
    assert method[0] == "SparseDoc is trained with AdamW." and method[1].startswith("```python\n# a comment")
    assert paper.sections[1].paragraphs == ("It reaches 41.2 F1.",)


def test_plain_text_takes_its_title_from_the_file_name_and_keeps_text_before_any_heading():
    paper = paper_from_text("notes", "Some text\nwrapped.\n\nIntro\n-----\nMore.\n")
    assert paper.title == "notes"
    assert [(s.name, s.paragraphs) for s in paper.sections] == [(None, ("Some text wrapped.",)), ("Intro", ("More.",))]
    assert paper_from_text("t", "# A Title\n\nText.\n").title == "A Title"


def test_a_directory_of_text_files_is_a_corpus_and_bad_files_are_one_line(tmp_path):
    (tmp_path / "b.md").write_text(MARKDOWN)
    (tmp_path / "a.txt").write_text("Text.\n")
    (tmp_path / "skip.pdf").write_bytes(b"%PDF")
    corpus = papers_from_text([tmp_path])
    assert corpus.paper_ids == ["a", "b"] and corpus.questions == ()
    (tmp_path / "empty.txt").write_text("\n\n# Only a heading\n")
    assert "holds no paragraphs" in load_error(papers_from_text, [tmp_path / "empty.txt"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.md").write_text("Text.\n")
    assert "rename one" in load_error(papers_from_text, [tmp_path / "a.txt", tmp_path / "other"])
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    assert "not UTF-8" in load_error(papers_from_text, [tmp_path / "latin1.txt"])


# --- exports keep splits and hashes ------------------------------------------------------------


@pytest.mark.parametrize("to", ["qasper", "jsonl"])
def test_an_export_reads_back_with_the_same_splits_and_hashes(tmp_path, to):
    corpus = generate(DemoConfig(papers=12, seed=4))
    assert len({paper.split for paper in corpus.papers}) == 3
    out = tmp_path / ("papers.json" if to == "qasper" else "papers.jsonl")
    assert export_corpus(corpus, out, to) == []
    again = load(out)
    assert [p.split for p in again.papers] == [p.split for p in corpus.papers]
    assert (again.papers_sha256, again.questions_sha256) == (corpus.papers_sha256, corpus.questions_sha256)


def test_an_export_says_why_a_hash_changed(tmp_path):
    unsplit = load(QASPER_MINI)
    notes = export_corpus(unsplit, tmp_path / "qasper-dev-v0.3.json", "qasper")
    assert len(notes) == 1 and notes[0].startswith("corpus_sha256 changed") and "states" in notes[0]
    reordered = from_parts(unsplit.papers, list(reversed(unsplit.questions)))
    notes = export_corpus(reordered, tmp_path / "papers.json", "qasper")
    assert len(notes) == 1 and notes[0].startswith("questions_sha256 changed") and "paper order" in notes[0]


def test_written_questions_load_back_as_a_questions_file(tmp_path):
    official = load(QASPER_MINI)
    write_questions(official.questions, tmp_path / "questions.jsonl")
    assert with_questions(official, tmp_path / "questions.jsonl").questions == official.questions


def test_a_qasper_question_without_gold_exports_to_qasper_but_not_to_jsonl(tmp_path):
    document = json.loads(QASPER_MINI.read_text())
    next(iter(document.values()))["qas"][0]["answers"] = []
    (tmp_path / "qasper.json").write_text(json.dumps(document))
    loaded = load(tmp_path / "qasper.json")
    assert export_corpus(loaded, tmp_path / "again.json", "qasper") == []
    message = load_error(export_corpus, loaded, tmp_path / "papers.jsonl", "jsonl")
    assert "has no answers" in message and "--to qasper" in message
    assert not (tmp_path / "papers.jsonl").exists()
