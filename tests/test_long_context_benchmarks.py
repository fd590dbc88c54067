"""Issue 34 end to end, as a user runs it on CPU: the code agent and the memory reader evaluate a
LongBench file with the five subsets of the released table and MemAgent's 224k-token HotpotQA
layout, the reader reads every token of the long context as given, check-parity holds on both,
and the per-benchmark tables come out of eval, inspect, compare and report."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import run_cli

FIVE = ["longbench/2wikimqa", "longbench/hotpotqa", "longbench/musique", "longbench/narrativeqa", "longbench/qasper"]


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def reading_of(trajectory):
    return trajectory["steps"][-1]["policy_info"]["reading"]


def ok(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_the_reader_reads_every_token_of_a_224k_context_as_given(memagent_224k, qwen3_vocab_model, qwen3_tokenizer, tmp_path):
    """MemAgent's recipe on a context of 1,600 documents: its own Qwen3 token stream, paged at
    exactly 5,000 tokens, every page read and recorded, and every prompt rebuilt by check-parity."""
    from paper_explorer.agent.renderer import ChatRenderer

    out = tmp_path / "reader"
    flags = ["--memory-tokens", "8", "--answer-tokens", "8"]  # random weights: short memories keep it to seconds
    ok(
        run_cli(
            "eval", "--corpus", str(memagent_224k.path), "--policy", "memory-reader", "--backend", "hf",
            "--model", str(qwen3_vocab_model), "--preset", "memagent", *flags, "--out", str(out),
        )
    )  # fmt: skip
    (trajectory,) = lines(out / "trajectories.jsonl")
    reading = reading_of(trajectory)
    expected = ChatRenderer.from_directory(qwen3_tokenizer).text(memagent_224k.context.strip())
    assert 220_000 <= len(expected) <= 228_000
    assert reading["document"] == "verbatim" and reading["document_text"] == memagent_224k.context.strip()
    assert (reading["document_tokens"], reading["read_tokens"], reading["unread_tokens"]) == (len(expected), len(expected), 0)
    assert reading["pages"] == len(reading["updates"]) == math.ceil(len(expected) / 5000)
    assert [(u["start"], u["end"]) for u in reading["updates"]] == [
        (start, min(start + 5000, len(expected))) for start in range(0, len(expected), 5000)
    ]
    assert trajectory["policy"]["settings"]["prompts"] == "memagent" and trajectory["policy"]["settings"]["answer_from"] == "boxed"
    (score,) = lines(out / "scores.jsonl")
    assert score["benchmark"] == "memagent/hotpotqa"
    parity = ok(run_cli("check-parity", "-t", str(out / "trajectories.jsonl"), "--tokenizer", str(qwen3_vocab_model)))
    assert f"{len(reading['updates']) + 1} memory-reader prompts rebuilt and matched" in parity.stdout


def test_a_changed_character_of_the_read_context_fails_check_parity(memagent_file, tiny_model, tmp_path):
    out = tmp_path / "reader"
    ok(
        run_cli(
            "eval", "--corpus", str(memagent_file), "--policy", "memory-reader", "--backend", "hf", "--model", str(tiny_model),
            "--preset", "memagent", "--page-tokens", "256", "--memory-tokens", "8", "--answer-tokens", "8", "--limit", "1",
            "--out", str(out),
        )
    )  # fmt: skip
    log = out / "trajectories.jsonl"
    ok(run_cli("check-parity", "-t", str(log), "--tokenizer", str(tiny_model)))
    (trajectory,) = lines(log)
    reading = reading_of(trajectory)
    text = reading["document_text"]
    reading["document_text"] = text[:100] + ("x" if text[100] != "x" else "y") + text[101:]
    edited = tmp_path / "edited.jsonl"
    edited.write_text(json.dumps(trajectory) + "\n", encoding="utf-8")
    done = run_cli("check-parity", "-t", str(edited), "--tokenizer", str(tiny_model))
    assert done.returncode == 1 and "parity broken" in done.stderr and "its recorded text" in done.stderr


def test_a_changed_character_of_the_text_a_budget_left_unread_fails_check_parity(memagent_file, tiny_model, tmp_path):
    """No prompt shows the rest of a document a token budget left unread: the reading's digest of the
    whole document holds it to the text that was paged, so an edit there fails too."""
    from paper_explorer.agent.renderer import ChatRenderer

    out = tmp_path / "reader"
    ok(
        run_cli(
            "eval", "--corpus", str(memagent_file), "--policy", "memory-reader", "--backend", "hf", "--model", str(tiny_model),
            "--preset", "memagent", "--page-tokens", "256", "--memory-tokens", "8", "--answer-tokens", "8", "--limit", "1",
            "--token-budget", "1500", "--out", str(out),
        )
    )  # fmt: skip
    (trajectory,) = lines(out / "trajectories.jsonl")
    reading = reading_of(trajectory)
    assert 0 < reading["read_tokens"] < reading["document_tokens"]
    renderer = ChatRenderer.from_directory(tiny_model)
    text, read = reading["document_text"], reading["read_tokens"]
    ids = renderer.text(text)
    # a letter near the end changed so that the ids keep their count and the pages read stay the same:
    # only the digest of the whole document can tell
    edited_text = next(
        edit
        for position in range(len(text) - 1, len(text) - 500, -1)
        for letter in "aeiou"
        if text[position].isalpha() and letter != text[position]
        for edit in [text[:position] + letter + text[position + 1 :]]
        if len(edited := renderer.text(edit)) == len(ids) and edited[:read] == ids[:read]
    )
    reading["document_text"] = edited_text
    edited = tmp_path / "edited.jsonl"
    edited.write_text(json.dumps(trajectory) + "\n", encoding="utf-8")
    done = run_cli("check-parity", "-t", str(edited), "--tokenizer", str(tiny_model))
    assert done.returncode == 1 and "its recorded text is not the document the reader paged" in done.stderr, done.stderr


def test_both_agents_evaluate_the_five_longbench_subsets(longbench_file, tiny_model, tmp_path):
    """The code agent (hf) and the memory reader (hf backend, MemAgent's recipe) on the same
    LongBench file: every question scored, per-benchmark tables with the five-subset average,
    compare and report across the two, and check-parity on both."""
    agent, reader = tmp_path / "agent", tmp_path / "reader"
    ok(
        run_cli(
            "eval", "--corpus", str(longbench_file), "--policy", "hf", "--model", str(tiny_model), "--max-new-tokens", "16",
            "--max-steps", "2", "--out", str(agent),
        )
    )  # fmt: skip
    ok(
        run_cli(
            "eval", "--corpus", str(longbench_file), "--policy", "memory-reader", "--backend", "hf", "--model", str(tiny_model),
            "--preset", "memagent", "--page-tokens", "512", "--memory-tokens", "8", "--answer-tokens", "8", "--out", str(reader),
        )
    )  # fmt: skip
    for run in (agent, reader):
        metrics = json.loads((run / "metrics.json").read_text())
        tables = metrics["benchmarks"]
        assert sorted(tables["by_benchmark"]) == FIVE
        assert all(row["questions"] == 3 for row in tables["by_benchmark"].values())
        assert tables["longbench_qa"]["missing"] == [] and tables["longbench_qa"]["f1"] is not None
        ok(run_cli("check-parity", "-t", str(run / "trajectories.jsonl"), "--tokenizer", str(tiny_model)))
        shown = ok(run_cli("inspect", str(run))).stdout
        assert "longbench/" in shown and "musique" in shown
    for trajectory in lines(reader / "trajectories.jsonl"):
        reading = reading_of(trajectory)
        assert reading["document"] == "verbatim" and reading["unread_tokens"] == 0 and reading["papers"] == [trajectory["paper_id"]]
    compared = ok(run_cli("compare", str(agent), str(reader))).stdout
    assert "longbench/qa" in compared and "F1 of longbench/: LongBench qa_f1_score" in compared
    ok(run_cli("report", str(agent), str(reader), "--out", str(tmp_path / "report.html")))


def test_the_code_agent_searches_a_224k_context_alone(memagent_224k, tiny_model, tmp_path):
    """The code agent's tools over MemAgent's 1,600 documents: a scripted search ranks them by
    their own BM25 statistics and finds a supporting document; the model policy runs its steps
    there too; every hit is the question's own paper."""
    rag, agent = tmp_path / "rag", tmp_path / "agent"
    ok(run_cli("eval", "--corpus", str(memagent_224k.path), "--policy", "single-shot-rag", "--out", str(rag)))
    ok(
        run_cli(
            "eval", "--corpus", str(memagent_224k.path), "--policy", "hf", "--model", str(tiny_model), "--max-new-tokens", "16",
            "--max-steps", "2", "--out", str(agent),
        )
    )  # fmt: skip
    for run in (rag, agent):
        (trajectory,) = lines(run / "trajectories.jsonl")
        assert trajectory["documents"] == "own" and trajectory["paper_id"] == memagent_224k.question_id
        assert trajectory["outcome"]["status"] != "policy_error", trajectory["outcome"]
    (trajectory,) = lines(rag / "trajectories.jsonl")
    (search,) = [call for step in trajectory["steps"] for call in step["tool_calls"] if call["name"] == "search"]
    hits = search["returned"]["shown"]["paragraphs"]
    assert hits and all(paper_id == memagent_224k.question_id for paper_id, _, _ in hits)
    assert hits[0][1] + 1 in memagent_224k.supporting  # section i holds "Document {i + 1}:"
