"""A corpus whose JSON escapes a lone surrogate ("\\ud800": valid JSON, not valid Unicode) still loads
and hashes: `corpus stats` says so in its table, never in a traceback."""

import json

from tests.conftest import run_cli


def test_a_lone_surrogate_in_a_title_hashes_and_stats_print(tmp_path):
    exported = tmp_path / "demo.jsonl"
    assert run_cli("corpus", "export", "--out", str(exported)).returncode == 0
    record = json.loads(exported.read_text().splitlines()[0])
    record["paper"]["title"] = "A \ud800 title"
    corpus = tmp_path / "surrogate.jsonl"
    corpus.write_text(json.dumps(record) + "\n")  # json.dumps escapes it as \ud800
    done = run_cli("corpus", "stats", "--corpus", str(corpus), "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert len(stats["corpus_sha256"]) == 64 and "Traceback" not in done.stderr
