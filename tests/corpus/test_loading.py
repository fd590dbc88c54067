import json

import pytest

from paper_explorer import corpus
from paper_explorer.corpus import CorpusError
from paper_explorer.corpus.writing import write_jsonl, write_qasper, write_questions
from tests.conftest import QASPER_MINI


def qasper_document() -> dict:
    return json.loads(QASPER_MINI.read_text())


def as_hf_rows(document: dict) -> list[dict]:
    """The v0.3 layout rewritten the way `datasets` stores allenai/qasper: columns, not rows."""
    rows = []
    for paper_id, paper in document.items():
        qas = paper["qas"]
        rows.append(
            {
                "id": paper_id,
                "title": paper["title"],
                "abstract": paper["abstract"],
                "full_text": {
                    "section_name": [s["section_name"] for s in paper["full_text"]],
                    "paragraphs": [s["paragraphs"] for s in paper["full_text"]],
                },
                "qas": {
                    "question": [q["question"] for q in qas],
                    "question_id": [q["question_id"] for q in qas],
                    "nlp_background": [q["nlp_background"] for q in qas],
                    "topic_background": [q["topic_background"] for q in qas],
                    "paper_read": [q["paper_read"] for q in qas],
                    "search_query": [q["search_query"] for q in qas],
                    "question_writer": [q["question_writer"] for q in qas],
                    "answers": [
                        {
                            "answer": [a["answer"] for a in q["answers"]],
                            "annotation_id": [a["annotation_id"] for a in q["answers"]],
                            "worker_id": [a["worker_id"] for a in q["answers"]],
                        }
                        for q in qas
                    ],
                },
                "figures_and_tables": {
                    "caption": [f["caption"] for f in paper["figures_and_tables"]],
                    "file": [f["file"] for f in paper["figures_and_tables"]],
                },
            }
        )
    return rows


def test_official_v03_file_loads_with_all_fields():
    loaded = corpus.load(QASPER_MINI)
    assert loaded.paper_ids == ["2101.00001", "2101.00002"]
    paper = loaded.paper("2101.00001")
    assert paper.sections[1].name is None
    assert paper.figures_and_tables[0].file == "2-Table2-1.png"
    assert [q.id for q in loaded.questions] == ["a1f3c0de0001", "a1f3c0de0002", "a1f3c0de0003", "a1f3c0de0004"]
    first = loaded.questions[0]
    assert first.answers[0].extractive_spans == ("CoNLL-2003", "WNUT-17", "BC5CDR")
    assert first.answers[1].kind == "abstractive" and first.answers[1].worker_id.startswith("c1fb")
    assert loaded.questions[1].answers[0].yes_no is True
    assert first.nlp_background == "five" and first.search_query == "named entity recognition"
    assert loaded.warnings == ()  # FLOAT SELECTED evidence is legal, not a warning


def test_empty_paragraphs_keep_source_indices_and_are_never_indexed():
    loaded = corpus.load(QASPER_MINI)
    sections = loaded.paper("2101.00001").sections
    assert sections[0].paragraphs[1] == "" and sections[1].paragraphs[0] == ""  # "   " counts as empty
    addresses = [(p.section_index, p.paragraph_index) for p in loaded.paragraphs() if p.paper_id == "2101.00001"]
    assert addresses == [(0, 0), (0, 2), (1, 1), (2, 0), (2, 1)]
    assert sections[1].paragraphs[1].startswith("Our encoder has six layers")


def test_hf_rows_as_json_list_and_jsonl_load_to_the_same_corpus(tmp_path):
    rows = as_hf_rows(qasper_document())
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    official = corpus.load(QASPER_MINI)
    for name in ("rows.json", "rows.jsonl"):
        loaded = corpus.load(tmp_path / name)
        assert loaded.papers == official.papers
        assert loaded.questions == official.questions
        assert loaded.sha256 == official.sha256


def test_hash_ignores_key_order_and_whitespace(tmp_path):
    document = qasper_document()
    reordered = {pid: dict(reversed(list(paper.items()))) for pid, paper in document.items()}
    (tmp_path / "compact.json").write_text(json.dumps(reordered, separators=(",", ":"), sort_keys=True))
    (tmp_path / "spaced.json").write_text(json.dumps(document, indent=7))
    hashes = {corpus.load(tmp_path / name).sha256 for name in ("compact.json", "spaced.json")}
    assert hashes == {corpus.load(QASPER_MINI).sha256}


def test_hash_changes_with_content(tmp_path):
    document = qasper_document()
    document["2101.00002"]["full_text"][1]["paragraphs"][0] += " Or not."
    (tmp_path / "changed.json").write_text(json.dumps(document))
    changed, original = corpus.load(tmp_path / "changed.json"), corpus.load(QASPER_MINI)
    assert changed.papers_sha256 != original.papers_sha256
    assert changed.questions_sha256 == original.questions_sha256


def test_explorer_jsonl_and_qasper_export_round_trip(tmp_path, small_demo):
    write_jsonl(small_demo, tmp_path / "demo.jsonl")
    again = corpus.load(tmp_path / "demo.jsonl")
    assert again.papers == small_demo.papers and again.questions == small_demo.questions
    assert again.sha256 == small_demo.sha256
    official = corpus.load(QASPER_MINI)
    write_qasper(official, tmp_path / "back.json")
    assert corpus.load(tmp_path / "back.json").sha256 == official.sha256


def test_directory_loads_every_file_in_name_order(tmp_path):
    document = qasper_document()
    (tmp_path / "qasper-dev-v0.3.json").write_text(json.dumps({"2101.00002": document["2101.00002"]}))
    (tmp_path / "qasper-train-v0.3.json").write_text(json.dumps({"2101.00001": document["2101.00001"]}))
    (tmp_path / "notes.txt").write_text("ignored")
    assert corpus.load(tmp_path).paper_ids == ["2101.00002", "2101.00001"]


def test_questions_file_replaces_the_corpus_questions(tmp_path):
    official = corpus.load(QASPER_MINI)
    write_questions(official.questions[:2], tmp_path / "questions.jsonl")
    loaded = corpus.load(QASPER_MINI, questions=tmp_path / "questions.jsonl")
    assert loaded.questions == official.questions[:2]


def test_evidence_that_is_not_a_paragraph_is_warned_and_counted(tmp_path):
    document = qasper_document()
    answer = document["2101.00002"]["qas"][0]["answers"][0]["answer"]
    answer["evidence"] = ["A sentence the paper never contains.", "Retrieval reduces hallucinated entities by a third on XSum."]
    (tmp_path / "bad-evidence.json").write_text(json.dumps(document))
    loaded = corpus.load(tmp_path / "bad-evidence.json")
    assert loaded.warning_counts() == {"evidence_not_a_paragraph": 1}
    assert loaded.warnings[0].paper_id == "2101.00002"
    assert "never contains" in str(loaded.warnings[0])


def write(tmp_path, name, content) -> str:
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


def load_error(path, **kwargs) -> str:
    with pytest.raises(CorpusError) as caught:
        corpus.load(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def mutated(change) -> str:
    document = qasper_document()
    change(document)
    return json.dumps(document)


BAD_INPUTS = {
    "not JSON": ('{"2101.00001": {"title": }', ["bad.json:1", "not valid JSON"]),
    "wrong type": (
        mutated(lambda d: d["2101.00001"]["qas"][1]["answers"][0]["answer"].update(yes_no="yes")),
        ["paper '2101.00001'", "qas[1].answers[0].answer.yes_no", "boolean", "'yes'"],
    ),
    "missing field": (
        mutated(lambda d: d["2101.00002"].pop("full_text")),
        ["paper '2101.00002'", "'full_text' is missing"],
    ),
    "paragraphs not a list": (
        mutated(lambda d: d["2101.00002"]["full_text"][0].update(paragraphs="text")),
        ["paper '2101.00002'", "full_text[0].paragraphs"],
    ),
    "duplicate paper id": (
        QASPER_MINI.read_text().replace('"2101.00002"', '"2101.00001"'),
        ["duplicate paper id '2101.00001'"],
    ),
    "duplicate question id": (
        mutated(lambda d: d["2101.00002"]["qas"][0].update(question_id="a1f3c0de0001")),
        ["duplicate question id 'a1f3c0de0001'"],
    ),
    "non-UTF-8": (b'{"2101.00001": {"title": "Caf' + b"\xe9" + b'"}}', ["bad.json:1", "not UTF-8", "offset 29"]),
    "not a paper": ("[1, 2]", ["expected a JSON object for a paper, got int"]),
    "unknown layout": ('{"id": "x", "text": "y"}\n{"id": "z", "text": "w"}\n', ["bad.json:1", "unrecognised record"]),
    "empty file": ("  \n", ["the file is empty"]),
    # read, search and extract take paper ids of at most 200 characters: a longer one could never be read
    "paper id longer than the tools take": (
        QASPER_MINI.read_text().replace('"2101.00002"', '"' + "2" * 201 + '"'),
        ["field 'id': string should have at most 200 characters"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_naming_file_paper_and_field(tmp_path, case):
    content, expected = BAD_INPUTS[case]
    message = load_error(write(tmp_path, "bad.json", content))
    assert message.startswith(str(tmp_path / "bad.json"))
    for fragment in expected:
        assert fragment in message, (fragment, message)


def test_jsonl_errors_name_the_line(tmp_path, small_demo):
    write_jsonl(small_demo, tmp_path / "demo.jsonl")
    lines = (tmp_path / "demo.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    record["paper"]["sections"][0]["paragraphs"][0] = 7
    lines[2] = json.dumps(record)
    message = load_error(write(tmp_path, "broken.jsonl", "\n".join(lines) + "\n"))
    assert "broken.jsonl:3" in message and record["paper"]["id"] in message
    assert "paper.sections[0].paragraphs[0]" in message


def test_duplicate_papers_across_lines_name_both_places(tmp_path, small_demo):
    write_jsonl(small_demo, tmp_path / "demo.jsonl")
    lines = (tmp_path / "demo.jsonl").read_text().splitlines()
    message = load_error(write(tmp_path, "dup.jsonl", "\n".join(lines + lines[:1]) + "\n"))
    assert f"dup.jsonl:{len(lines) + 1}" in message and "first in" in message and "dup.jsonl:1" in message


def test_question_about_a_missing_paper_is_an_error(tmp_path):
    line = json.dumps({"id": "q1", "paper_id": "no-such-paper", "text": "Why?", "answers": []})
    message = load_error(QASPER_MINI, questions=write(tmp_path, "questions.jsonl", line + "\n"))
    assert "questions.jsonl:1" in message and "'no-such-paper'" in message and "not in the corpus" in message


def test_missing_path_is_an_error(tmp_path):
    assert "no such file" in load_error(tmp_path / "absent.json")


def test_unknown_schema_version_is_an_error(tmp_path, small_demo):
    write_jsonl(small_demo, tmp_path / "demo.jsonl")
    text = (tmp_path / "demo.jsonl").read_text().replace('"schema_version":1', '"schema_version":99', 1)
    message = load_error(write(tmp_path, "future.jsonl", text))
    assert "future.jsonl:1" in message and "'schema_version'" in message and "99" in message
