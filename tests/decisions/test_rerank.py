"""Reranking search hits by a model's P(yes): the order, the shared prefix, the CLI, and the sandbox's
``search(..., rerank=K)`` through a real reranking service (``explorer rerank-serve``'s app)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from paper_explorer.decisions.likelihood import OptionLikelihoods
from paper_explorer.tools.reranking import reranked_order
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def backend(tiny_model):
    from paper_explorer.decisions.backends import LocalBackend

    return LocalBackend.load(str(tiny_model), threads=1)


@dataclass
class ScriptedBackend:
    """A backend whose P(yes) for each passage is given: it reads which passage a prompt holds."""

    inner: object
    relevance: dict[str, float]
    name: str = "scripted"

    def __post_init__(self) -> None:
        self.renderer = self.inner.renderer  # type: ignore[attr-defined]
        self.max_context = self.inner.max_context  # type: ignore[attr-defined]

    def settings(self) -> dict:
        return {"model": "scripted"}

    def score(self, prompt, options, mode="shared") -> OptionLikelihoods:
        text = self.renderer.tokenizer.decode(prompt)
        passage = next(passage for passage in self.relevance if passage in text)
        p = self.relevance[passage]
        return OptionLikelihoods([math.log(p), math.log(1 - p)], 0, 1)


def test_passages_are_ordered_by_p_yes_and_ties_keep_the_bm25_order(backend):
    from paper_explorer.decisions.rerank import Reranker

    relevance = {"alpha passage": 0.2, "beta passage": 0.9, "gamma passage": 0.2, "delta passage": 0.9, "epsilon passage": 0.5}
    reranker = Reranker(ScriptedBackend(backend, relevance))  # type: ignore[arg-type]
    order, judged = reranker.rerank("which passage?", list(relevance))
    assert order == [1, 3, 4, 0, 2]
    assert [item.relevance for item in judged] == pytest.approx(list(relevance.values()))
    assert reranked_order([0.5, 0.5, 0.5]) == [0, 1, 2]
    assert reranked_order([0.1, 0.7, 0.1, 0.7]) == [1, 3, 0, 2]


def test_the_query_comes_first_so_passages_share_its_cache(backend):
    """The second passage of a query reuses the cache of the prompt up to its passage; its P(yes)
    equals one scored from nothing (separate passes), so the sharing changes no figure."""
    from paper_explorer.decisions.rerank import Reranker

    reranker = Reranker(backend)
    backend.scorer.forget()
    judged = reranker.judge("what learning rate was used?", ["We train with a learning rate of 3e-4.", "The corpus holds news text."])
    assert judged[0].cached_tokens == 0
    assert judged[1].cached_tokens > 20  # the template's head, the instructions and the query
    alone = Reranker(backend)
    backend.scorer.forget()
    second = alone.judge("what learning rate was used?", ["The corpus holds news text."])[0]
    assert second.relevance == pytest.approx(judged[1].relevance, abs=1e-4)
    assert 0.0 < judged[0].relevance < 1.0


def test_a_passage_over_the_context_is_cut_at_its_end_and_counted(tiny_model):
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.rerank import Reranker

    small = LocalBackend.load(str(tiny_model), max_context=120, threads=1)
    judged = Reranker(small).judge("q?", ["word " * 400, "short"])
    assert judged[0].cut_tokens > 0 and judged[0].prompt_tokens <= 120
    assert judged[1].cut_tokens == 0


def test_a_prompt_file_without_the_query_is_refused_in_one_line(tmp_path):
    from paper_explorer.decisions.errors import DecisionError
    from paper_explorer.decisions.rerank import load_relevance_prompt

    path = tmp_path / "relevance.toml"
    path.write_text('[relevance]\nbefore = "a"\nafter = "b"\n')
    with pytest.raises(DecisionError, match=r"\{query\}"):
        load_relevance_prompt(path)


def test_corpus_search_reranks_with_a_model(tiny_model):
    plain = run_cli("corpus", "search", "learning rate", "-k", "3", "--json")
    done = run_cli("corpus", "search", "learning rate", "-k", "3", "--rerank", "8", "--model", str(tiny_model), "--threads", "1", "--json")
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)
    assert len(hits) == 3 and len(json.loads(plain.stdout)) == 3
    relevance = [hit["relevance"] for hit in hits]
    assert relevance == sorted(relevance, reverse=True)
    assert all(1 <= hit["bm25_rank"] <= 8 for hit in hits) and len({hit["bm25_rank"] for hit in hits}) == 3
    table = run_cli("corpus", "search", "learning rate", "-k", "2", "--rerank", "4", "--model", str(tiny_model), "--threads", "1")
    assert table.returncode == 0 and "P(relevant)" in table.stdout and "BM25 #" in table.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rerank", "5"], "--rerank K and --model M go together"),
        (["--rerank", "2", "--model", "m"], "--rerank 2 reorders fewer hits than -k 3"),
    ],
)
def test_corpus_search_rerank_flags_are_checked_in_one_line(flags, message):
    done = run_cli("corpus", "search", "learning rate", "-k", "3", *flags)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- the sandbox's search(rerank=K), through a real reranking service ---------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serving(app):
    """``app`` served by uvicorn on a free port of 127.0.0.1, in a thread: (its URL, a stop function)."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return f"http://127.0.0.1:{port}", stop


@pytest.fixture(scope="module")
def rerank_url(backend):
    from paper_explorer.decisions.rerank import Reranker
    from paper_explorer.decisions.rerank_service import rerank_app

    url, stop = _serving(rerank_app(Reranker(backend)))
    yield url
    stop()


def _exec(tmp_path, code: str, *flags: str) -> dict:
    (tmp_path / "action.py").write_text(code)
    done = run_cli("exec", str(tmp_path / "action.py"), *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_episode_reranks_through_the_service_and_records_which_model(tmp_path, rerank_url, tiny_model):
    code = 'hits = search("learning rate", k=3, rerank=10)\nsubmit("x", evidence=[hits[0]])\n[h["relevance"] for h in hits]\n'
    result = _exec(tmp_path, code, "--rerank-url", rerank_url, "--host-seconds", "60", "--wall-seconds", "120", "--cpu-seconds", "120")
    assert result["error"] is None, result["error"]
    call = result["tool_calls"][0]
    assert call["arguments"]["rerank"] == 10
    assert call["reranker"]["model"] == str(tiny_model) and len(call["reranker"]["settings_sha256"]) == 64
    hits = json.loads(call["returned"]["text"])
    assert [hit["relevance"] for hit in hits] == sorted((hit["relevance"] for hit in hits), reverse=True)
    assert all(1 <= hit["bm25_rank"] <= 10 for hit in hits)
    assert result["outcome"]["status"] == "submitted"
    plain = _exec(tmp_path, 'search("learning rate", k=3)\n', "--rerank-url", rerank_url)
    assert plain["tool_calls"][0]["reranker"] is None  # no rerank asked: BM25 alone, no model


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('search("learning rate", rerank=5)', "this run has no reranker"),
        ('search("learning rate", rerank=0)', "rerank: input should be greater than or equal to 1"),
        ('search("learning rate", rerank=51)', "rerank: input should be less than or equal to 50"),
        ('search("learning rate", k=5, rerank=3)', "rerank=3 reorders the top 3 hits, fewer than k=5"),
    ],
)
def test_a_bad_rerank_is_the_models_tool_error(tmp_path, call, message):
    result = _exec(tmp_path, call + "\n")
    assert message in result["error"] and message in result["tool_calls"][0]["error"]


def test_an_unreachable_reranker_is_a_tool_error(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    result = _exec(tmp_path, 'search("learning rate", rerank=5)\n', "--rerank-url", url)
    assert "cannot be reached" in result["error"] and "search without rerank" in result["error"]


def test_a_rerank_url_that_is_no_url_is_one_line(tmp_path):
    (tmp_path / "a.py").write_text("1\n")
    done = run_cli("exec", str(tmp_path / "a.py"), "--rerank-url", "localhost:8765")
    assert done.returncode == 2 and "rerank" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_service_answers_a_malformed_request_422_with_the_field_named(rerank_url):
    import httpx

    for body, field in (({"query": "q", "passages": []}, "passages"), ({"query": "", "passages": ["p"]}, "query")):
        reply = httpx.post(f"{rerank_url}/v1/rerank", json=body)
        assert reply.status_code == 422 and field in json.dumps(reply.json()["detail"])
    described = httpx.get(f"{rerank_url}/v1/reranker").json()
    assert described["identity"]["options"] == ["yes", "no"] and described["settings"]["prompts_sha256"]


def test_a_reply_that_is_not_one_relevance_per_passage_is_a_tool_error(tmp_path):
    from fastapi import FastAPI

    fake = FastAPI()

    @fake.post("/v1/rerank")
    def short_reply() -> dict:  # one relevance, whatever was asked
        identity = {"model": "m", "settings_sha256": "0" * 64, "prompts_sha256": "0" * 64, "options": ["yes", "no"]}
        return {"relevance": [0.5], "cut_tokens": [0], "reranker": identity}

    url, stop = _serving(fake)
    try:
        result = _exec(tmp_path, 'search("learning rate", rerank=5)\n', "--rerank-url", url)
    finally:
        stop()
    assert "judged 1 passages of 5" in result["error"]
