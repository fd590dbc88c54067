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
