"""Attacks on `explorer serve` through a real HTTP client: bodies json.loads cannot read, options the
model's tokenizer reads alike, a document too long to tokenise, and documents the renderer would
have kept in memory for good."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from paper_explorer.decisions.service import ServeLimits, create_app  # noqa: E402
from tests.decisions.test_serve import client, served  # noqa: E402

QUESTION = {"id": "q", "kind": "noul", "text": "Is it open source?"}


@pytest.fixture(scope="module")
def backend(tiny_model):
    from paper_explorer.decisions.backends import LocalBackend

    return LocalBackend.load(str(tiny_model))


@pytest.fixture(scope="module")
def url(backend) -> Iterator[str]:
    with served(create_app(backend, ServeLimits(body_bytes=64 * 2**20))) as base:
        yield base


def post(base: str, **request) -> httpx.Response:
    with client() as http:
        return http.post(f"{base}/v1/decisions", **request)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"document": "A", "questions": [{"label": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", "nested too deeply"),
        (b'{"document": "A", "questions": [], "cut": ' + b"9" * 5_000 + b"}", "a number of too many digits"),
        ('{"document": "caf\u00e9", "questions": []}'.encode("latin-1"), "not UTF-8"),
    ],
)
def test_a_body_json_cannot_read_is_422_naming_the_body(url, body, said):
    """FastAPI answered these with a bare 400 "There was an error parsing the body", not the
    validation shape every other refusal has."""
    reply = post(url, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
    (problem,) = reply.json()["detail"]
    assert problem["loc"] == ["body"] and said in problem["msg"] and problem["type"] == "json_invalid"


def test_other_http_errors_keep_their_status(url):
    with client() as http:
        assert http.get(f"{url}/v1/decisions").status_code == 405
        assert http.get(f"{url}/v1/nothing").status_code == 404


def test_a_document_too_long_to_tokenise_is_413_before_it_is(url):
    from paper_explorer.decisions.schema import DOCUMENT_CHARS

    reply = post(url, json={"document": "w" * (DOCUMENT_CHARS + 1), "questions": [QUESTION]})
    assert reply.status_code == 413, reply.text
    assert reply.json()["detail"][0]["loc"] == ["body", "document"]


def test_long_documents_are_not_kept_in_the_renderers_memory(url, backend):
    """Every document was remembered with its ids (4096 of them): a server's memory grew by some
    4 MB for each distinct 1 MB document, refused or answered, until it ran out."""
    remembered = backend.renderer._remembered
    assert post(url, json={"document": "A short one.", "questions": [QUESTION]}).status_code == 200  # the prompt's own texts
    before = remembered.cache_info().currsize
    for number in range(5):
        reply = post(url, json={"document": f"document {number}: " + "word " * 10_000, "questions": [QUESTION]})
        assert reply.status_code == 200, reply.text
    assert remembered.cache_info().currsize == before


def test_options_the_tokenizer_reads_alike_are_422_naming_them(qwen3_vocab_model):
    from paper_explorer.decisions.backends import LocalBackend

    question = {"id": "which", "kind": "choice", "text": "Which?", "options": ["caf\u00e9", "bar", "cafe\u0301"]}
    with served(create_app(LocalBackend.load(str(qwen3_vocab_model)))) as base:
        reply = post(base, json={"document": "A caf\u00e9.", "questions": [QUESTION, question]})
    assert reply.status_code == 422, reply.text
    (problem,) = reply.json()["detail"]
    assert problem["loc"] == ["body", "questions", 1, "options"] and "same tokens to this model" in problem["msg"]


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("example.invalid", "--host 'example.invalid': not an address"),
        ("192.0.2.1", "give an address of this machine"),  # TEST-NET-1: no machine's own
    ],
)
def test_a_host_that_is_not_this_machines_is_one_line_about_the_host(tiny_model, host, said):
    """Both were told to choose another --port, which could never help."""
    from tests.conftest import run_cli

    result = run_cli("serve", "--model", str(tiny_model), "--host", host, "--port", "0")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert said in line and "--port" not in line.split(":", 2)[-1].split(";")[-1]


def test_every_interface_is_served_with_a_warning(tiny_model):
    """--host 0.0.0.0 serves an API without authentication to every machine that reaches it: said."""
    import signal
    import subprocess

    from tests.conftest import HANG_SECONDS, checkout_environment, explorer_command

    process = subprocess.Popen(
        explorer_command("serve", "--model", str(tiny_model), "--host", "0.0.0.0", "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_environment(),
    )
    try:
        assert process.stdout is not None and process.stdout.readline().startswith("serving typed decisions at http://0.0.0.0:")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=HANG_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(HANG_SECONDS)
    assert process.returncode == 0
    assert err.splitlines()[0].startswith("warning: listening on 0.0.0.0, reachable from other machines; the API has no authentication")
