"""A corpus whose JSON escapes a lone surrogate ("\\ud800": valid JSON, not valid Unicode) is refused
in one line naming the file and the line: such text cannot be written back as UTF-8, so accepting
it only moved the failure to a later write (a trajectory, a chat template)."""

import json

from tests.conftest import run_cli
from tests.test_run_directory_errors import one_line


def test_a_lone_surrogate_in_a_title_is_one_line_naming_the_file_and_line(tmp_path):
    exported = tmp_path / "demo.jsonl"
    assert run_cli("corpus", "export", "--out", str(exported)).returncode == 0
    record = json.loads(exported.read_text().splitlines()[0])
    record["paper"]["title"] = "A \ud800 title"
    corpus = tmp_path / "surrogate.jsonl"
    corpus.write_text(json.dumps(record) + "\n")  # json.dumps escapes it as \ud800
    one_line(run_cli("corpus", "stats", "--corpus", str(corpus), "--json"), "surrogate.jsonl:1", "lone surrogate")


def test_a_surrogate_pair_is_a_character_and_loads(tmp_path):
    exported = tmp_path / "demo.jsonl"
    assert run_cli("corpus", "export", "--out", str(exported)).returncode == 0
    record = json.loads(exported.read_text().splitlines()[0])
    record["paper"]["title"] = "A \U0001f600 title"
    corpus = tmp_path / "pair.jsonl"
    corpus.write_text(json.dumps(record) + "\n")  # escaped as the pair \ud83d\ude00
    done = run_cli("corpus", "stats", "--corpus", str(corpus), "--json")
    assert done.returncode == 0, done.stderr
