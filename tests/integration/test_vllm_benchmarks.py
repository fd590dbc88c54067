"""Issue 34 against a real vLLM: the code agent (--policy openai) and MemAgent's reader (--preset
memagent, --backend openai) evaluate LongBench's five QA subsets and MemAgent's 224k-token layout,
the server receiving exactly the ids check-parity rebuilds."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.vllm

FIVE = ["longbench/2wikimqa", "longbench/hotpotqa", "longbench/musique", "longbench/narrativeqa", "longbench/qasper"]


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def ok(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def served(server):
    return ["--base-url", server.url, "--model", server.model, "--tokenizer", str(server.model_dir)]


def test_the_code_agent_on_the_server_answers_every_longbench_subset_over_its_own_documents(vllm_server, longbench_file, tmp_path):
    out = tmp_path / "agent"
    ok(
        run_cli(
            "eval", "--corpus", str(longbench_file), "--policy", "openai", *served(vllm_server), "--max-steps", "2",
            "--max-new-tokens", "16", "--concurrency", "4", "--record-prompt-ids", "--out", str(out),
        )
    )  # fmt: skip
    found = lines(out / "trajectories.jsonl")
    assert len(found) == 15 and all(t["outcome"]["status"] != "policy_error" for t in found), [t["outcome"] for t in found]
    for trajectory in found:
        for step in trajectory["steps"]:
            for call in step["tool_calls"]:
                for paper_id, _, _ in (call.get("returned") or {}).get("shown", {}).get("paragraphs", []):
                    assert paper_id == trajectory["paper_id"]  # its tools showed it its own documents only
    tables = json.loads((out / "metrics.json").read_text())["benchmarks"]
    assert sorted(tables["by_benchmark"]) == FIVE and tables["longbench_qa"]["missing"] == []
    ok(run_cli("check-parity", "-t", str(out / "trajectories.jsonl"), "--tokenizer", str(vllm_server.model_dir), "--require-server-ids"))


def test_memagents_reader_on_the_server_reads_a_224k_context_whole(vllm_server, memagent_224k, tmp_path):
    """Pages of 3,000 tokens keep each prompt inside the tiny server's context; every token of the
    context is read, each page's prompt is the one the server received and check-parity rebuilds."""
    out = tmp_path / "reader"
    ok(
        run_cli(
            "eval", "--corpus", str(memagent_224k.path), "--policy", "memory-reader", "--backend", "openai", *served(vllm_server),
            "--preset", "memagent", "--page-tokens", "3000", "--memory-tokens", "8", "--answer-tokens", "8", "--out", str(out),
        )
    )  # fmt: skip
    (trajectory,) = lines(out / "trajectories.jsonl")
    reading = trajectory["steps"][-1]["policy_info"]["reading"]
    assert reading["document"] == "verbatim" and reading["unread_tokens"] == 0 and reading["read_tokens"] == reading["document_tokens"]
    assert reading["pages"] == len(reading["updates"]) == math.ceil(reading["document_tokens"] / 3000)
    for call in [*reading["updates"], reading["answer"]]:
        assert call["served"]["server_sha256"] == call["served"]["sha256"], call["served"]
    parity = ok(run_cli("check-parity", "-t", str(out / "trajectories.jsonl"), "--tokenizer", str(vllm_server.model_dir)))
    assert f"{reading['pages'] + 1} memory-reader prompts rebuilt and matched" in parity.stdout
