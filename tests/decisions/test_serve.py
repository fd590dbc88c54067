"""explorer serve: typed decisions over HTTP, asked through a real HTTP client (httpx) of a real
uvicorn server on 127.0.0.1 - the command itself in a subprocess, the app in a thread of this
process for the rest. Bounds are on hangs only (HANG_SECONDS), never on speed."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from paper_explorer.decisions.service import ServeLimits, create_app, listening_socket  # noqa: E402
from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command, run_cli, with_signals_a_terminal_leaves  # noqa: E402
from tests.decisions.decision_files import DOCUMENTS, write_decisions  # noqa: E402

CONTEXT = 300  # the small server's: a document of a few hundred words is over it


@contextlib.contextmanager
def served(app) -> Iterator[str]:
    """``app`` served by uvicorn in a thread of this process; its base URL."""
    listener = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_SECONDS
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(HANG_SECONDS)
        listener.close()


@pytest.fixture(scope="module")
def backend(tiny_model):
    from paper_explorer.decisions.backends import LocalBackend

    return LocalBackend.load(str(tiny_model))


@pytest.fixture(scope="module")
def app(backend):
    return create_app(backend)


@pytest.fixture(scope="module")
def url(app) -> Iterator[str]:
    with served(app) as base:
        yield base


@pytest.fixture(scope="module")
def small_url(tiny_model) -> Iterator[str]:
    """A server with a context of CONTEXT tokens and small limits."""
    from paper_explorer.decisions.backends import LocalBackend

    limits = ServeLimits(body_bytes=64 * 1024, document_tokens=2_000, questions=4)
    with served(create_app(LocalBackend.load(str(tiny_model), max_context=CONTEXT), limits)) as base:
        yield base


def client() -> httpx.Client:
    return httpx.Client(timeout=HANG_SECONDS)


def request_of(document: dict, **settings) -> dict:
    """A document of the decision file as the API's request (its text; its questions as they are)."""
    text = document.get("text") or "\n\n".join(document["paragraphs"])
    return {"document": text, "questions": document["questions"], **settings}


def ask(base: str, body: dict) -> dict:
    with client() as http:
        reply = http.post(f"{base}/v1/decisions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def probabilities(answer: dict) -> list[float]:
    return [option["probability"] for option in answer["options"]]


def test_every_kind_is_answered_with_probabilities_and_confidence(url):
    for document in DOCUMENTS:
        reply = ask(url, request_of(document))
        answers = {answer["id"]: answer for answer in reply["questions"]}
        assert list(answers) == [question["id"] for question in document["questions"]]
        for question in document["questions"]:
            answer = answers[question["id"]]
            assert answer["kind"] == question["kind"]
            shown = [option["option"] for option in answer["options"]]
            assert shown == question.get("options", ["yes", "no", "unknown"])
            p = probabilities(answer)
            assert sum(p) == pytest.approx(1.0) and all(0 <= value <= 1 for value in p)
            assert answer["predicted"] == shown[p.index(max(p))] and answer["p_max"] == max(p)
            assert answer["confidence"] == pytest.approx((len(p) * max(p) - 1) / (len(p) - 1))
            assert answer["cut"] is None and answer["label"] == question.get("label")
            assert answer["correct"] == (None if "label" not in question else answer["predicted"] == question["label"])
            assert all(option["tokens"] >= 2 for option in answer["options"])  # its text and the end of turn
    assert {answer["kind"] for answer in ask(url, request_of(DOCUMENTS[1]))["questions"]} == {"noul", "choice", "score"}


def test_reversed_order_lists_and_scores_the_options_last_first(url):
    reply = ask(url, request_of(DOCUMENTS[0], order="reversed"))
    choice = next(answer for answer in reply["questions"] if answer["id"] == "q2")
    assert [option["option"] for option in choice["options"]] == ["GPL-3.0 or later", "BSD-3-Clause", "MIT"]


def test_160_options_of_any_length(url, backend):
    options = [f"level {n}" + " and more words" * (n % 9) + ("!" * (n % 3)) for n in range(160)]
    body = {"document": "A long rubric.", "questions": [{"id": "r", "kind": "score", "text": "Which level?", "options": options}]}
    [answer] = ask(url, body)["questions"]
    assert [option["option"] for option in answer["options"]] == options
    assert sum(probabilities(answer)) == pytest.approx(1.0)
    assert [option["tokens"] for option in answer["options"]] == [len(backend.renderer.action(option)) for option in options]
    assert len({option["tokens"] for option in answer["options"]}) > 5


def test_the_server_answers_what_explorer_decide_computes(tmp_path, tiny_model):
    """`explorer serve` as a user starts it: the URL printed, the same prompt and numbers as
    `explorer decide` for the same questions, SIGTERM stopping it (exit 0) after it answered."""
    file = write_decisions(tmp_path / "d1.jsonl", [DOCUMENTS[0]])
    decided = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run"))
    assert decided.returncode == 0, decided.stderr
    from paper_explorer.decisions.run import read_records

    records = {record.question_id: record for record in read_records(tmp_path / "run")}
    with serve_process("--model", str(tiny_model), "--port", "0") as (process, base):
        reply = ask(base, request_of(DOCUMENTS[0]))
        with client() as http:
            health = http.get(f"{base}/v1/health").json()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=HANG_SECONDS)
    assert process.returncode == 0, err
    assert "stopped" in err and "Traceback" not in err
    assert health == {"model": str(tiny_model), "context": reply["context"], "ready": True, "waiting": 0}
    for answer in reply["questions"]:
        record = records[answer["id"]]
        assert answer["prompt_sha256"] == record.prompt_sha256 and answer["prompt_tokens"] == record.prompt_tokens
        assert [option["option"] for option in answer["options"]] == record.options
        assert [option["tokens"] for option in answer["options"]] == record.option_tokens
        assert [option["loglikelihood"] for option in answer["options"]] == pytest.approx(record.loglikelihoods, rel=1e-6)
        assert probabilities(answer) == pytest.approx(record.probabilities, rel=1e-6)
        assert answer["confidence"] == pytest.approx(record.confidence, rel=1e-6, abs=1e-9)
        assert answer["predicted"] == record.predicted and answer["log_mass"] == pytest.approx(record.log_mass, rel=1e-6)


def test_ctrl_c_stops_the_server_as_every_command_stops(tiny_model):
    with serve_process("--model", str(tiny_model), "--port", "0") as (process, base):
        with client() as http:
            assert http.get(f"{base}/v1/health").json()["ready"] is True
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=HANG_SECONDS)
    assert process.returncode == 130 and "Traceback" not in err


@contextlib.contextmanager
def serve_process(*args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`explorer serve ARGS` in a fresh process, and the base URL it printed; killed by its pid if left running."""
    process = subprocess.Popen(
        explorer_command("serve", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_environment(),
        preexec_fn=with_signals_a_terminal_leaves,
    )
    try:
        printed: list[str] = []
        reader = threading.Thread(target=lambda: printed.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(HANG_SECONDS)
        assert printed and printed[0].startswith("serving typed decisions at http://127.0.0.1:"), (printed, process.poll())
        yield process, printed[0].split(" at ")[1].split("/v1/")[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(HANG_SECONDS)


def test_a_port_in_use_is_one_line(tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--model", str(tiny_model), "--port", str(port))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"--port {port}" in line and "in use" in line


def test_without_the_serve_extra_it_is_one_line(tiny_model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: find_spec answers None
    result = run_cli("serve", "--model", str(tiny_model))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "needs uvicorn" in line and ".[serve]" in line
