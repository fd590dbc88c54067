"""`explorer eval --policy memory-reader` as a user runs it: the local tiny model (its memory cap,
the parity check, a token budget, the oracle scope), the openai backend against a fake server
(the ids hf would send, scoring, identical trajectories across repeats and --concurrency), and the
run commands around it (merge of shards, compare and report beside a code-agent run, kill -9 and
--resume, sft build)."""

import hashlib
import json
import time

import pytest

from paper_explorer.agent.memory_reader.parity import reading_of
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.served import ids_sha256
from paper_explorer.agent.trajectory import without_timings
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.corpus import DemoConfig, generate
from paper_explorer.evaluation.answers import references
from tests.agent.test_memory_reader import ReaderServer
from tests.agent.test_openai_policy import FakeServer
from tests.conftest import explorer_command, killed_once_logged, run_cli

CAP, ANSWER_CAP = 24, 12
RECIPE = ("--page-tokens", "256", "--memory-tokens", str(CAP), "--answer-tokens", str(ANSWER_CAP))


def reader_eval(out, *flags, backend=("--backend", "hf")):
    return run_cli("eval", "--policy", "memory-reader", *backend, *RECIPE, "--out", str(out), *flags)


def openai_backend(server, tokenizer) -> tuple[str, ...]:
    return ("--backend", "openai", "--base-url", server.url, "--model", "served", "--tokenizer", str(tokenizer))


def trajectories(run):
    return read_trajectories(run / "trajectories.jsonl")


def scores(run) -> list[dict]:
    return [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hf_run(tiny_model, tmp_path_factory):
    """Two questions read by the tiny random-weight model, each its own paper (scope paper)."""
    out = tmp_path_factory.mktemp("reader") / "hf"
    done = reader_eval(out, "--model", str(tiny_model), "--scope", "paper", "--limit", "2")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def renderer(tiny_model):
    return ChatRenderer.from_directory(tiny_model)


@pytest.fixture
def serve(renderer):
    servers = []

    def start(**answers) -> ReaderServer:
        servers.append(ReaderServer(renderer, **answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def digest_notes(number, text):
    """An update that depends on its prompt alone (the same prompt, the same memory, in any order)."""
    return "notes " + hashlib.sha256(text.encode()).hexdigest()[:8]


def test_the_tiny_model_stays_under_the_memory_cap_and_reads_its_own_paper(hf_run):
    episodes = trajectories(hf_run)
    assert len(episodes) == 2
    for trajectory in episodes:
        reading = reading_of(trajectory)
        assert reading.scope == "paper" and reading.papers == [trajectory.paper_id]  # the oracle: no search
        assert "search(" not in trajectory.steps[0].action_text
        assert trajectory.policy.settings["oracle"] is True
        assert len(reading.updates) == reading.pages > 3
        for update in reading.updates:
            assert update.memory_tokens_in <= CAP and update.memory_tokens_out <= CAP
            assert update.hit_cap and update.generation.generated_tokens == CAP  # random weights always hit it
        assert reading.answer.memory_tokens_in <= CAP
        assert trajectory.outcome.status == "no_answer" and reading.answer.invalid == f"cut at the answer cap of {ANSWER_CAP} tokens"
        assert reading.read_tokens == reading.document_tokens and reading.unread_tokens == 0 and reading.stopped is None
    assert {row["status"] for row in scores(hf_run)} == {"no_answer"} and all(row["answer_f1"] == 0 for row in scores(hf_run))


def test_check_parity_rebuilds_every_reader_prompt_and_an_edited_memory_fails_it(hf_run, tiny_model, tmp_path):
    log = hf_run / "trajectories.jsonl"
    updates = sum(len(reading_of(t).updates) + 1 for t in trajectories(hf_run))
    held = run_cli("check-parity", "-t", str(log), "--tokenizer", str(tiny_model))
    assert held.returncode == 0 and f"{updates} memory-reader prompts rebuilt and matched" in held.stdout, held.stdout + held.stderr
    lines = log.read_text().splitlines()
    first = json.loads(lines[0])
    reading = first["steps"][-1]["policy_info"]["reading"]
    reading["updates"][1]["memory"] = "an edited memory"
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    failed = run_cli("check-parity", "-t", str(edited), "--tokenizer", str(tiny_model))
    assert failed.returncode == 1 and "memory update 2 (pass 1, page 2)" in failed.stderr and "digest differs" in failed.stderr


def test_a_token_budget_bounds_the_model_tokens_and_counts_what_it_left_unread(tiny_model, tmp_path):
    done = reader_eval(tmp_path / "run", "--model", str(tiny_model), "--scope", "paper", "--limit", "1", "--token-budget", "2000")
    assert done.returncode == 0, done.stderr
    (trajectory,) = trajectories(tmp_path / "run")
    reading = reading_of(trajectory)
    spent = sum(u.served.tokens + u.generation.generated_tokens for u in reading.updates)
    spent += reading.answer.served.tokens + reading.answer.generation.generated_tokens
    assert reading.model_tokens == spent <= 2000 and reading.token_budget == 2000
    assert 0 < reading.read_tokens < reading.document_tokens
    assert reading.unread_tokens == reading.document_tokens - reading.read_tokens
    assert reading.stopped.startswith("the token budget of 2000")
    (row,) = scores(tmp_path / "run")
    assert (row["model_tokens"], row["unread_tokens"]) == (reading.model_tokens, reading.unread_tokens)


def test_a_question_of_ones_own_with_the_paper_scope_is_one_clear_line(tiny_model, tmp_path):
    done = run_cli(
        "run", "--policy", "memory-reader", "--backend", "hf", "--model", str(tiny_model), "--scope", "paper",
        "-q", "What learning rate is used?", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()  # refused before the model loads: nothing runs, nothing is written
    assert "--scope paper reads the question's own paper" in line and "use --scope search:K" in line
    assert not (tmp_path / "trajectories.jsonl").exists()


def test_the_openai_backend_sends_the_ids_hf_sent(hf_run, tiny_model, renderer, tmp_path):
    """A server that answers each prompt with what the tiny model wrote for it, found by the prompt's
    digest: a prompt hf did not send gets no answer (the episode fails), so equal runs mean equal ids."""
    written = {}
    for trajectory in trajectories(hf_run):
        reading = reading_of(trajectory)
        for call, text in [*((u, u.memory) for u in reading.updates), (reading.answer, reading.answer.text)]:
            written[call.served.sha256] = (text, call.generation.hit_cap)
    received = []

    def respond(body):
        answer = written.get(ids_sha256(body["prompt"]))
        if answer is None:
            return 400, {"error": "a prompt the tiny model was never sent"}
        received.append(body["prompt"])
        text, cut = answer
        count = body["max_tokens"] if cut else len(renderer.text(text))
        choice = {"text": text, "finish_reason": "length" if cut else "stop", "prompt_token_ids": body["prompt"]}
        return 200, {"choices": [choice], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": count}}

    server = FakeServer(models=["served"], respond=respond, return_ids=True)
    try:
        done = reader_eval(
            tmp_path / "openai", "--scope", "paper", "--limit", "2", "--retries", "0", backend=openai_backend(server, tiny_model)
        )
    finally:
        server.server.shutdown()
    assert done.returncode == 0, done.stderr
    for local, served in zip(trajectories(hf_run), trajectories(tmp_path / "openai"), strict=True):
        hf_reading, openai_reading = reading_of(local), reading_of(served)
        assert [u.served.sha256 for u in openai_reading.updates] == [u.served.sha256 for u in hf_reading.updates]
        assert openai_reading.answer.served.sha256 == hf_reading.answer.served.sha256
        assert all(u.served.server_sha256 == u.served.sha256 for u in openai_reading.updates)
        assert [u.memory for u in openai_reading.updates] == [u.memory for u in hf_reading.updates]
        assert served.outcome == local.outcome and openai_reading.model_tokens == hf_reading.model_tokens
    assert len(received) == len(written)


@pytest.fixture(scope="module")
def demo_references():
    """The bundled demo corpus's gold answers by question text: what a perfect reader would box."""
    return {question.text: references(question) for question in generate(DemoConfig()).questions}


def boxed_gold(demo_references):
    def final(text):
        question = text.partition("<problem>\n")[2].partition("\n</problem>")[0]
        gold = demo_references.get(question) or [""]
        return f"My memory says: \\boxed{{{gold[0]}}}" if gold[0] else "\\boxed{}"

    return final


def comparable(run) -> dict:
    return {trajectory.episode_id: without_timings(trajectory) for trajectory in trajectories(run)}


def test_the_same_run_twice_and_with_two_episodes_at_once_is_the_same(serve, tiny_model, demo_references, tmp_path):
    server = serve(update=digest_notes, final=boxed_gold(demo_references))
    backend = openai_backend(server, tiny_model)
    for name, flags in [("one", ()), ("again", ()), ("two", ("--concurrency", "2"))]:
        done = reader_eval(tmp_path / name, "--scope", "search:2", "--limit", "3", *flags, backend=backend)
        assert done.returncode == 0, done.stderr
    one = comparable(tmp_path / "one")
    assert len(one) == 3 and one == comparable(tmp_path / "again") == comparable(tmp_path / "two")
    assert all(len(reading_of(t).papers) == 2 for t in trajectories(tmp_path / "one"))


def test_a_boxed_gold_answer_is_submitted_and_scored(serve, tiny_model, demo_references, tmp_path):
    server = serve(update=digest_notes, final=boxed_gold(demo_references))
    # the fake server writes whole answers: a cap under their length would cut them (no_answer)
    flags = ("--scope", "paper", "--limit", "3", "--answer-tokens", "256")
    done = reader_eval(tmp_path / "run", *flags, backend=openai_backend(server, tiny_model))
    assert done.returncode == 0, done.stderr
    rows = scores(tmp_path / "run")
    answerable = [row for row in rows if row["answerable"]]
    assert answerable and all(row["status"] == "submitted" and row["answer_f1"] == 1.0 for row in answerable)
    assert all(row["prediction"] == demo_references[row["question"]][0] for row in answerable)
    assert all(row["model_tokens"] > 0 for row in rows)


@pytest.fixture
def reader_and_agent(serve, tiny_model, demo_references, tmp_path):
    """The same four questions read by the memory reader in two shards (merged) and by the code agent
    (the same fake model: it submits at once)."""
    server = serve(update=digest_notes, final=boxed_gold(demo_references))
    for shard in ("1/2", "2/2"):
        done = reader_eval(
            tmp_path / f"shard{shard[0]}", "--scope", "paper", "--limit", "4", "--shard", shard, backend=openai_backend(server, tiny_model)
        )
        assert done.returncode == 0, done.stderr
    merged = run_cli("merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--out", str(tmp_path / "reader"))
    assert merged.returncode == 0, merged.stderr
    agent = run_cli(
        "eval", "--policy", "openai", "--base-url", server.url, "--model", "served", "--tokenizer", str(tiny_model),
        "--limit", "4", "--out", str(tmp_path / "agent"),
    )  # fmt: skip
    assert agent.returncode == 0, agent.stderr
    return tmp_path / "reader", tmp_path / "agent"


def test_shards_merge_and_compare_and_report_beside_a_code_agent_run(reader_and_agent, tmp_path):
    reader, agent = reader_and_agent
    ids = sorted(t.question_id for t in trajectories(reader))
    assert len(ids) == 4 and ids == sorted(t.question_id for t in trajectories(agent))
    spent = [row["model_tokens"] for row in scores(reader)]
    assert all(tokens > 0 for tokens in spent) and json.loads((reader / "metrics.json").read_text())
    compared = run_cli("compare", str(reader), str(agent), env={"COLUMNS": "200"})  # a row on one line
    assert compared.returncode == 0, compared.stderr
    figures = json.loads(run_cli("compare", "--json", str(reader), str(agent)).stdout)["model_tokens"]
    assert figures["pairs"] == 4 and figures["a"] == sum(spent) / 4 and figures["b"] > 0
    assert "model tokens per episode (4 pairs)" in compared.stdout and f"{sum(spent) / 4:,.0f}" in compared.stdout
    for runs, out in [((reader,), "reader.html"), ((reader, agent), "both.html")]:
        written = run_cli("report", *map(str, runs), "--out", str(tmp_path / out))
        assert written.returncode == 0, written.stderr
        page = (tmp_path / out).read_text()
        assert "memory-reader" in page and all(f'"model_tokens": {tokens}' in page for tokens in spent)


def test_sft_build_refuses_reader_trajectories_in_one_line(reader_and_agent, tiny_model, tmp_path):
    reader, _ = reader_and_agent
    built = run_cli(
        "sft", "build", "-t", str(reader / "trajectories.jsonl"), "--out", str(tmp_path / "sft"), "--tokenizer", str(tiny_model)
    )
    assert built.returncode == 2 and "memory" in built.stderr and len(built.stderr.strip().splitlines()) == 1, built.stderr


def test_a_run_killed_mid_way_resumes_with_every_question_once(serve, tiny_model, tmp_path):
    def slow(number, text):
        time.sleep(0.05)  # episodes take long enough for the kill to land between them
        return digest_notes(number, text)

    server = serve(update=slow)
    out = tmp_path / "run"
    command = explorer_command(
        "eval",
        "--policy",
        "memory-reader",
        *openai_backend(server, tiny_model),
        *RECIPE,
        "--scope",
        "paper",
        "--limit",
        "6",
        "--out",
        str(out),
    )
    written = killed_once_logged(command, out / "trajectories.jsonl", 2)
    assert 2 <= written < 6
    done = run_cli("eval", "--out", str(out), "--resume")
    assert done.returncode == 0, done.stderr
    ids = [trajectory.episode_id for trajectory in trajectories(out)]
    assert len(ids) == 6 == len(set(ids))
    assert all(reading_of(trajectory).answer is not None for trajectory in trajectories(out))
