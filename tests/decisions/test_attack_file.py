"""Attacks on the decision file and `explorer decide`'s refusals: each bad input is one line naming
the place, exit code 2, no traceback, and no run directory written."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions


def refused(tmp_path, model, file) -> str:
    """The one line `explorer decide FILE` exits 2 with; nothing written to its --out."""
    out = tmp_path / "run"
    result = run_cli("decide", str(file), "--model", str(model), "--out", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()
    return result.stderr


def one_question(**question) -> list[dict]:
    return [{"id": "d", "text": "A short document.", "questions": [{"id": "q", "kind": "choice", "text": "Which?", **question}]}]


def test_a_binary_file_a_fifo_or_a_directory_is_one_line(tmp_path, tiny_model):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)))
    assert "NUL byte" in refused(tmp_path, tiny_model, binary)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert "FIFO" in refused(tmp_path, tiny_model, fifo)
    assert "is a directory" in refused(tmp_path, tiny_model, tmp_path)


@pytest.mark.parametrize("option", ["MIT\n- BSD", "MIT\u2028BSD", "MIT\r", "MIT\x85", "\x1b[31mMIT", "MIT\x00"])
def test_an_option_that_breaks_the_listing_of_options_is_refused(tmp_path, tiny_model, option):
    """The prompt lists one option a line: an option holding a line break would read as two."""
    file = write_decisions(tmp_path / "file.jsonl", one_question(options=[option, "GPL"]))
    line = refused(tmp_path, tiny_model, file)
    assert f"{file}:1" in line and "questions.0" in line and "line break or control character" in line


def test_a_tab_in_an_option_is_kept(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "file.jsonl", one_question(options=["MIT\tlicence", "GPL"]))
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run")).returncode == 0


@pytest.mark.parametrize("ordered", ["true", 1, "yes"])
def test_ordered_is_a_json_boolean_not_a_string_or_number(tmp_path, tiny_model, ordered):
    file = write_decisions(tmp_path / "file.jsonl", one_question(options=["low", "high"], ordered=ordered))
    assert "questions.0.ordered" in refused(tmp_path, tiny_model, file)


def test_a_document_too_long_to_tokenise_is_refused_before_any_model_loads(tmp_path, tiny_model):
    """Tokenising takes some 200 bytes a character: a 200 MB document took over 20 GB and the
    process was killed, its run directory half made. Over 16 Mi characters it is one line."""
    from paper_explorer.decisions.schema import DOCUMENT_CHARS

    half = "word " * (DOCUMENT_CHARS // 10 + 1)
    documents = [{"id": "d", "paragraphs": [half, half], "questions": [{"id": "q", "kind": "noul", "text": "Long?"}]}]
    line = refused(tmp_path, tiny_model, write_decisions(tmp_path / "file.jsonl", documents))
    assert ":1:" in line and f"over the {DOCUMENT_CHARS:,}" in line


def test_options_the_tokenizer_reads_alike_are_refused_before_the_run_starts(tmp_path, qwen3_vocab_model):
    """Qwen3's tokenizer normalises to NFC: "café" and "cafe" + a combining accent are one option
    to the model, which would split its probability between them."""
    documents = one_question(options=["caf\u00e9", "cafe\u0301", "bar"], label="cafe\u0301")
    file = tmp_path / "file.jsonl"
    file.write_text(json.dumps(documents[0], ensure_ascii=False) + "\n", encoding="utf-8")
    line = refused(tmp_path, qwen3_vocab_model, file)
    assert f"{file}:1: question 'q': options" in line and "same tokens to this model" in line


def test_indistinct_options_are_found_by_their_ids(qwen3_tokenizer, tiny_model):
    from paper_explorer.agent.renderer import ChatRenderer
    from paper_explorer.decisions.prompts import indistinct

    qwen3 = ChatRenderer.from_directory(qwen3_tokenizer)
    assert indistinct(qwen3, ["\u212b", "\u00c5", "x"]) is not None  # the angstrom sign is NFC's A-ring
    assert indistinct(qwen3, ["MIT", "MIT ", "mit"]) is None  # whitespace and case are tokens of their own
    assert indistinct(ChatRenderer.from_directory(tiny_model), ["caf\u00e9", "cafe\u0301"]) is None  # no normaliser
