"""The `explorer` command as a user runs it (in this process, as a fresh one would run it): real files, exit codes."""

import json

import pytest

from tests.conftest import QASPER_MINI, run_cli

COMMANDS = [[], ["corpus"], ["corpus", "stats"], ["corpus", "search"], ["corpus", "generate"], ["corpus", "export"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0 and "Usage: explorer" in result.stdout


def test_stats_of_the_demo_corpus_as_json():
    result = run_cli("corpus", "stats", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["papers"] == 416 and stats["index"]["paragraphs"] == stats["paragraphs"]
    assert stats["unanswerable_questions"] * 2 == stats["questions"]
    assert set(stats["papers_per_split"]) == {"train", "validation", "test"}


def test_search_a_qasper_file_as_json():
    result = run_cli("corpus", "search", "datasets CoNLL evaluate", "--corpus", str(QASPER_MINI), "-k", "2", "--json")
    assert result.returncode == 0, result.stderr
    hits = json.loads(result.stdout)
    assert len(hits) == 2 and hits[0]["paper_id"] == "2101.00001"
    assert hits[0]["text"].startswith("We propose a gated span encoder")
    assert {"section", "section_index", "paragraph_index", "score"} <= set(hits[0])


def test_search_table_and_paper_filter():
    result = run_cli("corpus", "search", "hallucination retrieval", "--corpus", str(QASPER_MINI), "--paper-id", "2101.00002")
    assert result.returncode == 0 and "2101.00002" in result.stdout and "2101.00001" not in result.stdout


def test_generate_export_and_reload_keep_the_hash(tmp_path):
    generated = run_cli("corpus", "generate", "--papers", "12", "--seed", "4", "--out", str(tmp_path / "g.jsonl"), "--json")
    assert generated.returncode == 0, generated.stderr
    sha = json.loads(generated.stdout)["sha256"]
    exported = run_cli("corpus", "export", "--corpus", str(tmp_path / "g.jsonl"), "--out", str(tmp_path / "e.jsonl"), "--json")
    assert json.loads(exported.stdout)["sha256"] == sha
    assert (tmp_path / "g.jsonl").read_bytes() == (tmp_path / "e.jsonl").read_bytes()
    stats = json.loads(run_cli("corpus", "stats", "--corpus", str(tmp_path / "e.jsonl"), "--json").stdout)
    assert stats["sha256"] == sha and stats["papers"] == 12


def test_export_to_qasper_loads_back(tmp_path):
    out = tmp_path / "qasper.json"
    assert run_cli("corpus", "export", "--corpus", str(QASPER_MINI), "--to", "qasper", "--out", str(out)).returncode == 0
    original = json.loads(run_cli("corpus", "stats", "--corpus", str(QASPER_MINI), "--json").stdout)
    again = json.loads(run_cli("corpus", "stats", "--corpus", str(out), "--json").stdout)
    assert again["sha256"] == original["sha256"]


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_existing_output_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "keep.jsonl"
    out.write_text("precious")
    assert_one_line_error(run_cli("corpus", "generate", "--papers", "3", "--out", str(out)), "already exists", "--force")
    assert out.read_text() == "precious"
    assert run_cli("corpus", "generate", "--papers", "3", "--out", str(out), "--force").returncode == 0
    assert out.read_text() != "precious"


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b"{not json", ["not valid JSON"]),
        (b'{"p1": {"title": 5, "full_text": []}}', ["paper 'p1'", "'title'"]),
        (b'{"p1": {"title": "\xff", "full_text": []}}', ["not UTF-8"]),
    ],
    ids=["not-json", "wrong-type", "not-utf8"],
)
def test_bad_corpus_files_give_one_line_and_exit_2(tmp_path, content, fragments):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    for command in (["corpus", "stats"], ["corpus", "search", "x"], ["corpus", "export", "--out", str(tmp_path / "o.jsonl")]):
        assert_one_line_error(run_cli(*command, "--corpus", str(path)), str(path), *fragments)
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_corpus_and_unknown_paper_and_format(tmp_path):
    assert_one_line_error(run_cli("corpus", "stats", "--corpus", str(tmp_path / "absent.json")), "no such file")
    assert_one_line_error(run_cli("corpus", "search", "x", "--paper-id", "nope"), "no paper 'nope'")
    assert_one_line_error(run_cli("corpus", "export", "--to", "csv", "--out", str(tmp_path / "x")), "unknown format 'csv'")


def test_corpus_can_come_from_the_environment():
    result = run_cli("corpus", "stats", "--json", env={"EXPLORER_CORPUS": str(QASPER_MINI)})
    assert json.loads(result.stdout)["papers"] == 2


def test_load_warnings_reach_stderr(tmp_path):
    document = json.loads(QASPER_MINI.read_text())
    document["2101.00002"]["qas"][0]["answers"][0]["answer"]["evidence"] = ["Not in the paper."]
    path = tmp_path / "warn.json"
    path.write_text(json.dumps(document))
    result = run_cli("corpus", "stats", "--corpus", str(path), "--json")
    assert result.returncode == 0
    assert "evidence_not_a_paragraph: 1" in result.stderr
    assert json.loads(result.stdout)["warnings"] == {"evidence_not_a_paragraph": 1}


def test_a_device_is_not_a_corpus():
    done = run_cli("corpus", "stats", "--corpus", "/dev/zero")
    assert done.returncode == 2 and "not a regular file" in done.stderr
