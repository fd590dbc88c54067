"""explorer serve: typed decisions over HTTP, asked through a real HTTP client (httpx) of a real
uvicorn server on 127.0.0.1 - the command itself in a subprocess, the app in a thread of this
process for the rest. Bounds are on hangs only (HANG_SECONDS), never on speed."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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


QUESTION = {"id": "q", "kind": "noul", "text": "Is it?"}


def with_question(**fields) -> dict:
    return {"document": "A document.", "questions": [{**QUESTION, **fields}]}


@pytest.mark.parametrize(
    ("body", "loc", "said"),
    [
        ({"questions": [QUESTION]}, ["body", "document"], "Field required"),
        ({"document": "A document."}, ["body", "questions"], "Field required"),
        ({"document": "A document.", "questions": []}, ["body", "questions"], "at least 1"),
        (with_question(kind="multiple"), ["body", "questions", 0, "kind"], "'noul', 'choice' or 'score'"),
        (with_question(kind="choice", options=["only"]), ["body", "questions", 0], "needs 2 to 160 options, got 1"),
        (with_question(kind="choice", options=[str(n) for n in range(161)]), ["body", "questions", 0], "needs 2 to 160 options, got 161"),
        (with_question(kind="choice", options=["a", "b"], label="c"), ["body", "questions", 0], "label 'c' is not one of the options"),
        (with_question(options=["no", "yes", "unknown"]), ["body", "questions", 0], "yes, no, unknown in that order"),
        (with_question(kind="score", options=["1", "1"]), ["body", "questions", 0], "option '1' is given twice"),
        (with_question(text=""), ["body", "questions", 0, "text"], "at least 1 character"),
        ({"document": 5, "questions": [QUESTION]}, ["body", "document"], "valid string"),
        ({"document": "A document.", "questions": "q"}, ["body", "questions"], "valid list"),
        ({"document": "A document.", "questions": [QUESTION], "cut": "middle"}, ["body", "cut"], "'none', 'start' or 'end'"),
        ({"document": "A document.", "questions": [QUESTION], "order": 1}, ["body", "order"], "'given' or 'reversed'"),
        ({"document": "A document.", "questions": [QUESTION], "mode": "fast"}, ["body", "mode"], "Extra inputs"),
        ({"document": "A document.", "questions": [QUESTION, QUESTION]}, ["body", "questions", 1, "id"], "question id 'q' is given twice"),
        (with_question(negation_of="other"), ["body", "questions", 0, "negation_of"], "no noul question of this request"),
        ([QUESTION], ["body"], "valid dictionary"),
    ],
)
def test_a_malformed_body_is_422_naming_the_field(url, body, loc, said):
    with client() as http:
        reply = http.post(f"{url}/v1/decisions", json=body)
    assert reply.status_code == 422, reply.text
    [problem] = reply.json()["detail"]
    assert problem["loc"] == loc and said in problem["msg"], problem


@pytest.mark.parametrize(
    ("content", "headers", "loc", "said"),
    [
        (b"{not json", {"content-type": "application/json"}, ["body", 1], "JSON decode error"),
        (b'{"document": "\\ud800", "questions": []}', {"content-type": "application/json"}, ["body", "document"], "unicode"),
        (json.dumps(with_question()).encode(), {"content-type": "text/plain"}, ["body"], "send application/json"),
        (json.dumps(with_question()).encode(), {}, ["body"], "send application/json"),
    ],
)
def test_a_body_that_is_no_json_object_is_422(url, content, headers, loc, said):
    with client() as http:
        reply = http.post(f"{url}/v1/decisions", content=content, headers=headers)
    assert reply.status_code == 422, reply.text
    problem = reply.json()["detail"][0]
    assert problem["loc"] == loc and said in problem["msg"], problem


def test_a_body_over_the_limit_is_413_whether_its_length_is_given_or_not(small_url):
    body = json.dumps({"document": "word " * 20_000, "questions": [QUESTION]}).encode()
    with client() as http:
        declared = http.post(f"{small_url}/v1/decisions", content=body, headers={"content-type": "application/json"})
        chunked = http.post(
            f"{small_url}/v1/decisions",
            content=(body[start : start + 4096] for start in range(0, len(body), 4096)),  # no Content-Length: sent in chunks
            headers={"content-type": "application/json"},
        )
    for reply in (declared, chunked):
        assert reply.status_code == 413, reply.text
        [problem] = reply.json()["detail"]
        assert problem["loc"] == ["body"] and "over this server's limit of 65,536" in problem["msg"]


def test_too_many_questions_or_document_tokens_are_413(small_url):
    questions = [{**QUESTION, "id": f"q{n}"} for n in range(5)]
    with client() as http:
        many = http.post(f"{small_url}/v1/decisions", json={"document": "A document.", "questions": questions})
        long = http.post(f"{small_url}/v1/decisions", json={"document": "word " * 5_000, "questions": [QUESTION], "cut": "start"})
    assert many.status_code == 413 and many.json()["detail"][0]["loc"] == ["body", "questions"]
    assert "5 questions, over this server's limit of 4" in many.json()["detail"][0]["msg"]
    assert long.status_code == 413 and long.json()["detail"][0]["loc"] == ["body", "document"]
    assert "over this server's limit of 2,000" in long.json()["detail"][0]["msg"]


def test_a_document_over_the_context_is_refused_unless_the_request_says_where_to_cut(small_url, tmp_path, tiny_model):
    document = {"id": "long", "text": "word " * 400, "questions": [{"id": "q", "kind": "noul", "text": "Is it long?", "label": "yes"}]}
    with client() as http:
        refused = http.post(f"{small_url}/v1/decisions", json=request_of(document))
    assert refused.status_code == 422
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", "document"] and "set cut to start or end" in problem["msg"]
    for side in ("start", "end"):
        [answer] = ask(small_url, request_of(document, cut=side))["questions"]
        cut = answer["cut"]
        assert cut["side"] == side and cut["tokens"] + cut["kept"] == answer["document_tokens"]
        assert f"{cut['tokens']:,} tokens over" in problem["msg"]
        assert answer["prompt_tokens"] + max(option["tokens"] for option in answer["options"]) <= CONTEXT
        assert sum(probabilities(answer)) == pytest.approx(1.0)
    file = write_decisions(tmp_path / "long.jsonl", [document])
    assert (
        run_cli(
            "decide", str(file), "--model", str(tiny_model), "--max-context", str(CONTEXT), "--cut", "end", "--out", str(tmp_path / "run")
        ).returncode
        == 0
    )
    from paper_explorer.decisions.run import read_records

    [record] = read_records(tmp_path / "run")
    assert record.cut is not None and (record.cut.tokens, record.cut.kept) == (cut["tokens"], cut["kept"])
    assert record.prompt_sha256 == answer["prompt_sha256"]


def test_options_that_leave_no_room_for_the_document_are_422_on_the_question(small_url):
    options = ["a long option " * 40 + str(n) for n in range(3)]
    body = {"document": "Short.", "questions": [{"id": "wide", "kind": "choice", "text": "Which?", "options": options}], "cut": "start"}
    with client() as http:
        reply = http.post(f"{small_url}/v1/decisions", json=body)
    assert reply.status_code == 422
    [problem] = reply.json()["detail"]
    assert problem["loc"] == ["body", "questions", 0] and "leave no room for the document" in problem["msg"]


def test_32_concurrent_requests_are_each_answered_as_alone(url, app):
    """32 requests at once, sent while the model is held busy so that all of them wait together:
    the server keeps accepting (its health answers, counting them), then scores them one by one,
    each answer the one that request got alone."""
    bodies = [request_of({**DOCUMENTS[n % 2], "text": f"Version {n}. " + (DOCUMENTS[n % 2].get("text") or "")}) for n in range(8)]
    for body in bodies:
        body["document"] = body["document"].strip()
    alone = [ask(url, body) for body in bodies]
    service = app.state.service
    with client() as http, ThreadPoolExecutor(32) as pool:
        with service.lock:  # the model busy: every request gets as far as waiting for it
            futures = [pool.submit(http.post, f"{url}/v1/decisions", json=bodies[n % 8]) for n in range(32)]
            deadline = time.monotonic() + HANG_SECONDS
            while (waiting := http.get(f"{url}/v1/health").json()["waiting"]) < 32 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert waiting == 32
        replies = [future.result(HANG_SECONDS) for future in futures]
    for n, reply in enumerate(replies):
        assert reply.status_code == 200, reply.text
        expected = alone[n % 8]
        for answer, single in zip(reply.json()["questions"], expected["questions"], strict=True):
            assert {**answer, "options": None} == {**single, "options": None}
            assert [option["option"] for option in answer["options"]] == [option["option"] for option in single["options"]]
            assert probabilities(answer) == pytest.approx(probabilities(single), rel=1e-6, abs=1e-12)


def test_the_api_is_described_and_tells_its_model(url, backend):
    from paper_explorer.decisions.prompts import load_prompts

    with client() as http:
        schema = http.get(f"{url}/openapi.json").json()
        docs = http.get(f"{url}/docs")
        model = http.get(f"{url}/v1/model").json()
    assert {"post"} == set(schema["paths"]["/v1/decisions"]) and {"/v1/health", "/v1/model"} <= set(schema["paths"])
    assert {"DecisionRequest", "DecisionQuestion", "DecisionReply", "QuestionAnswer"} <= set(schema["components"]["schemas"])
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert model["backend"] == "hf" and model["settings"]["model"] == backend.settings()["model"]
    assert model["prompts_sha256"] == load_prompts().sha256 and model["context"] == backend.max_context
    assert model["limits"] == {"body_bytes": 16 * 2**20, "document_tokens": 1_048_576, "questions": 64}


class FailingOnce:
    """The tiny model's backend whose next score fails as a model out of memory fails."""

    def __init__(self, backend) -> None:
        self.inner, self.name, self.renderer, self.max_context = backend, backend.name, backend.renderer, backend.max_context
        self.failures = 1

    def settings(self) -> dict:
        return self.inner.settings()

    def score(self, prompt, options, mode="shared"):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("CUDA out of memory")
        return self.inner.score(prompt, options, mode)


def test_a_model_that_fails_fails_that_request_only(backend):
    with served(create_app(FailingOnce(backend))) as base, client() as http:
        failed = http.post(f"{base}/v1/decisions", json=request_of(DOCUMENTS[1]))
        again = http.post(f"{base}/v1/decisions", json=request_of(DOCUMENTS[1]))
    assert failed.status_code == 500
    [problem] = failed.json()["detail"]
    assert problem["loc"] == ["body", "questions", 0] and "RuntimeError: CUDA out of memory" in problem["msg"]
    assert again.status_code == 200 and len(again.json()["questions"]) == 3  # the model's lock was let go
