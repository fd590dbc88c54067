"""A question that brings its own documents (a LongBench or MemAgent context, ``Paper.context``) is
answered over them alone: its episode's search, read, extract and submit see that paper and nothing
else, and no other question's episode sees it. One property each, through real sandbox episodes."""

import ast
import json

import pytest
from rank_bm25 import BM25Okapi

from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index, Paper, tokenize
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.writing import write_jsonl
from paper_explorer.evaluation.retrieval import retrieval_metrics
from paper_explorer.tools.paper_tools import PaperTools
from paper_explorer.tools.sandbox import Limits, Sandbox
from tests.conftest import run_cli
from tests.tools.own_documents import A_QUESTION, B_QUESTION, A, B, long_context, lookalikes, mixed_corpus, shared_papers

LIMITS = Limits(wall_seconds=30, cpu_seconds=30, host_seconds=30, tool_calls=2_000)


@pytest.fixture(scope="module")
def corpus():
    return mixed_corpus()


@pytest.fixture(scope="module")
def index(corpus):
    return BM25Index.build(corpus)


@pytest.fixture(scope="module")
def only_a():
    """The reference for an episode about A: a corpus in which A is the only paper there is."""
    corpus = from_parts([A], [A_QUESTION])
    return corpus, BM25Index.build(corpus)


@pytest.fixture(scope="module")
def only_shared():
    """The reference for an episode about a shared paper: a corpus with no own documents at all."""
    corpus = from_parts(*shared_papers())
    return corpus, BM25Index.build(corpus)


def reaching(ids: list[str], quotes: list[str]) -> str:
    """An action that tries to reach papers by id (each spelling, every tool that takes one) and by quote."""
    return f"""
for pid in {ids!r}:
    for call in (
        lambda: read(pid),
        lambda: read(pid, section=0),
        lambda: extract(pid, "zebras penguins learning rate", k=3),
        lambda: extract(pid, "a|e", regex=True),
        lambda: search("learning rate", paper_id=pid),
        lambda: submit("x", evidence=[[pid, 0, 0]]),
        lambda: submit("x", evidence=[{{"paper_id": pid, "section": 0, "paragraph": 0}}]),
    ):
        try:
            call()
        except ToolError:
            pass
for quote in {quotes!r}:
    try:
        submit("x", evidence=[quote])
    except ToolError:
        pass
"""


def errors_of(corpus, index, paper_id: str | None, code: str) -> list[str | None]:
    with Sandbox(corpus, LIMITS, index=index, paper_id=paper_id) as sandbox:
        result = sandbox.execute(code)
    assert result.error is None and result.limit_hit is None, result
    return [call.error for call in result.tool_calls]


def hits_of(corpus, index, paper_id: str | None, queries: list[str]) -> tuple[str, list[list[dict]]]:
    code = f"found = [search(query, k=50) for query in {queries!r}]\nfound"
    with Sandbox(corpus, LIMITS, index=index, paper_id=paper_id) as sandbox:
        result = sandbox.execute(code)
        documents = sandbox.documents
    assert result.error is None, result
    return documents, [json.loads(call.returned.text) for call in result.tool_calls]


def paragraph_texts(*papers: Paper) -> list[str]:
    return [text for paper in papers for section in paper.sections for text in section.paragraphs if text]


def test_the_corpus_index_covers_the_shared_papers_only(corpus, index, only_shared):
    shared, shared_index = only_shared
    assert index.corpus.paper_ids == shared.paper_ids and index.loaded is corpus
    assert index.bm25.n_docs == shared_index.bm25.n_docs
    cached = BM25Index.cached(corpus)
    assert cached.corpus.paper_ids == shared.paper_ids and cached.bm25.n_docs == shared_index.bm25.n_docs
    # one cache file for the shared papers: the corpus without its own documents loads the same one
    assert BM25Index.cached(shared).source == "cache"


def test_an_episode_about_a_question_with_own_documents_sees_that_paper_alone(corpus, index, only_a):
    others = [*corpus.paper_ids[:-2], "lb-B"]
    ids = [spelling for paper_id in others for spelling in lookalikes(paper_id)] + ["lb-a", "LB-A", " lb-A"]
    quotes = paragraph_texts(B, *corpus.papers[:2])[:8]
    scoped = errors_of(corpus, index, "lb-A", reaching(ids, quotes))
    alone = errors_of(*only_a, "lb-A", reaching(ids, quotes))
    # every call failed, and failed exactly as it does where no other paper exists
    assert len(scoped) == len(ids) * 7 + len(quotes) and all(scoped)
    assert scoped == alone
    suggested = {error.split("did you mean ", 1)[1] for error in scoped if "did you mean " in error}
    assert suggested == {"'lb-A'?"}  # a near miss is pointed at the question's own documents, never at another paper

    documents, found = hits_of(
        corpus, index, "lb-A", ["penguins Ross ice shelf", *paragraph_texts(*corpus.papers[:2])[:3], "learning rate"]
    )
    assert documents == "own"
    assert found[0] == [] and {hit["paper_id"] for hits in found for hit in hits} == {"lb-A"}


def test_a_shared_question_never_sees_a_question_s_own_documents(corpus, index, only_shared):
    shared, _ = only_shared
    ids = [spelling for paper_id in ("lb-A", "lb-B") for spelling in lookalikes(paper_id)]
    quotes = paragraph_texts(A, B)[:6]
    for paper_id in (shared.questions[0].paper_id, None, "no-such-paper"):
        scoped = errors_of(corpus, index, paper_id, reaching(ids, quotes))
        assert all(scoped) and scoped == errors_of(*only_shared, paper_id, reaching(ids, quotes))
        documents, found = hits_of(corpus, index, paper_id, ["zebras Okavango savanna", "penguins Ross ice shelf", "learning rate"])
        assert documents == "shared" and found[:2] == [[], []]
        assert found[2] and {hit["paper_id"] for hits in found for hit in hits} <= set(shared.paper_ids)


def test_own_documents_are_ranked_by_a_bm25_over_that_paper_alone(corpus, index):
    query = "zebra savanna learning rate foal river"
    _, (hits,) = hits_of(corpus, index, "lb-A", [query])
    texts = paragraph_texts(A)
    tokenized = [tokenize(text) for text in texts]
    scores = BM25Okapi(tokenized).get_scores(tokenize(query))
    matching = [i for i, tokens in enumerate(tokenized) if set(tokens) & set(tokenize(query))]
    expected = sorted(matching, key=lambda i: (-scores[i], i))
    assert [(hit["section"], hit["paragraph"]) for hit in hits] == [(i, 0) for i in expected]
    assert [hit["score"] for hit in hits] == [round(scores[i], 3) for i in expected]
    # the statistics are A's: over every paper's paragraphs the same query scores A's otherwise
    everything = BM25Okapi([tokenize(text) for text in paragraph_texts(*corpus.papers)]).get_scores(tokenize(query))
    offset = len(paragraph_texts(*corpus.papers[:-2]))
    assert [round(everything[offset + i], 3) for i in expected] != [hit["score"] for hit in hits]


def test_a_reused_host_serves_the_next_question_s_documents_not_the_last_one_s(corpus, index):
    with Sandbox(corpus, LIMITS, index=index, paper_id="lb-A") as first:
        assert first.execute('sorted(set(h["paper_id"] for h in search("learning rate", k=50)))').value == "['lb-A']"
        host = first.host_pid
    for paper_id, expected in (("lb-B", "lb-B"), (corpus.questions[0].paper_id, corpus.questions[0].paper_id)):
        with Sandbox(corpus, LIMITS, index=index, paper_id=paper_id) as sandbox:
            ids = sandbox.execute('sorted(set(h["paper_id"] for h in search("learning rate data model", k=50)))').value
            read_a = sandbox.execute('read("lb-A")')
            assert sandbox.host_pid == host  # the same process, reset for this episode
        assert "lb-A" not in ids and (expected in ids) and "no paper 'lb-A'" in read_a.error


def test_own_documents_extract_and_cite_as_any_paper_does(corpus, index):
    code = (
        'found = extract("lb-A", "zebras graze Okavango", k=1)\n'
        'page = read("lb-A", section="Document 1:")\n'
        "submit('the savanna', evidence=[found[0], 'Zebras graze in the savanna near the Okavango'])"
    )
    with Sandbox(corpus, LIMITS, index=index, paper_id="lb-A") as sandbox:
        result = sandbox.execute(code)
    assert result.error is None and result.outcome.status == "submitted"
    assert [(item.paper_id, item.section, item.paragraph) for item in result.outcome.evidence] == [("lb-A", 0, 0)]
    assert result.outcome.evidence[0].text == A.sections[0].paragraphs[0]


def test_a_forged_scope_from_the_worker_changes_nothing(corpus, index):
    """An action that escaped the language layer writes frames of its own on its channel: a reset
    naming B, a call frame carrying a scope. The host takes neither; the next action still sees A."""
    forged = [
        {"op": "reset", "limits": LIMITS.model_dump(mode="json"), "paper_id": "lb-B"},
        {"op": "call", "tool": "read", "args": ["lb-B"], "kwargs": {}, "paper_id": "lb-B"},
        {"op": "call", "tool": "read", "args": ["lb-B"], "kwargs": {"paper_id": "lb-B", "scope": "shared"}},
    ]
    with Sandbox(corpus, LIMITS, index=index, paper_id="lb-A", restricted=False) as sandbox:
        for frame in forged:
            body = json.dumps(frame).encode()
            result = sandbox.execute(
                f"import os, struct\nos.write(3, struct.pack('>I', {len(body)}) + {body!r})\n"
                "header = os.read(3, 4)\n"
                "os.read(3, struct.unpack('>I', header)[0]) if len(header) == 4 else header"
            )
            assert result.outcome is None and all(call.error for call in result.tool_calls), result
            assert result.limit_hit == "protocol" or "got two values for" in result.value, result
            after = sandbox.execute('[h["paper_id"] for h in search("penguins learning rate", k=50)]')
            assert set(ast.literal_eval(after.value)) == {"lb-A"}, after


def test_a_host_takes_the_question_s_paper_only_as_a_string():
    from paper_explorer.tools.episode_host import question_paper

    assert question_paper({"limits": {}, "paper_id": "lb-A"}) == "lb-A" and question_paper({"limits": {}}) is None
    for forged in (["lb-A"], {"id": "lb-A"}, 1):
        with pytest.raises(ValueError):
            question_paper({"limits": {}, "paper_id": forged})


def test_the_tools_of_a_question_see_its_documents_alone(corpus, index):
    """What every tool, a tool of your own included, reaches: ``episode.corpus`` and ``episode.index``."""
    own = PaperTools.for_question(index, "lb-A")
    assert own.corpus.paper_ids == ["lb-A"] and own.index.corpus is own.corpus and own.index.bm25.n_docs == len(paragraph_texts(A))
    shared = PaperTools.for_question(index, "lb-B-q")  # not a paper: a question of the caller's own sees the shared papers
    assert shared.corpus is index.corpus and "lb-A" not in shared.corpus and "lb-B" not in shared.corpus
    with pytest.raises(ValueError, match="another corpus"):
        PaperTools(only_paper := from_parts([A], []), index)
    assert only_paper.own_documents("lb-A") is A


def test_retrieval_searches_each_question_s_own_documents(corpus, index):
    metrics = retrieval_metrics(index, [A_QUESTION, B_QUESTION])
    assert metrics["questions"] == 1 and metrics["recall@1"] == 1.0


def test_episodes_record_which_documents_their_tools_saw(corpus, index):
    policies = ("scripted", "read-all", "single-shot-rag", "direct-submit")
    for name in policies:
        runner = EpisodeRunner(corpus, index, make_policy(make_config(name)), EpisodeConfig(max_steps=6))
        for question, documents in ((A_QUESTION, "own"), (corpus.questions[0], "shared")):
            trajectory = runner.run(question.text, question)
            assert trajectory.documents == documents and trajectory.paper_id == question.paper_id
            shown = {
                paper_id
                for step in trajectory.steps
                for call in step.tool_calls
                if call.returned is not None and call.returned.shown is not None
                for paper_id, _, _ in call.returned.shown.paragraphs
            }
            assert shown <= ({"lb-A"} if documents == "own" else set(index.corpus.paper_ids)), (name, shown)
            if name == "read-all" and documents == "own":
                assert shown == {"lb-A"}


@pytest.fixture(scope="module")
def corpus_file(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("scoped") / "mixed.jsonl"
    write_jsonl(corpus, path)
    return path


def test_explorer_run_and_eval_answer_each_question_over_its_own_documents(corpus_file, tmp_path):
    done = run_cli("run", "--corpus", str(corpus_file), "--question-id", "lb-A-q", "--out", str(tmp_path / "one"))
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "one" / "trajectories.jsonl").read_text().splitlines()
    assert json.loads(line)["documents"] == "own"

    done = run_cli("eval", "--corpus", str(corpus_file), "--out", str(tmp_path / "run"), "--policy", "read-all")
    assert done.returncode == 0, done.stderr
    trajectories = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    by_question = {t["question_id"]: t for t in trajectories}
    assert by_question["lb-A-q"]["documents"] == "own" and by_question["lb-B-q"]["documents"] == "own"
    for trajectory in trajectories:
        seen = {
            hit["paper_id"]
            for step in trajectory["steps"]
            for call in step["tool_calls"]
            if call["name"] == "search" and call["error"] is None
            for hit in json.loads(call["returned"]["text"])
        }
        if trajectory["documents"] == "own":
            assert seen <= {trajectory["paper_id"]}, trajectory["question_id"]
        else:
            assert not seen & {"lb-A", "lb-B"}, trajectory["question_id"]


def test_explorer_exec_runs_as_an_episode_about_the_paper_it_names(corpus_file, tmp_path):
    action = tmp_path / "look.py"
    action.write_text('sorted(set(h["paper_id"] for h in search("learning rate", k=50)))\n')
    scoped = run_cli("exec", "--corpus", str(corpus_file), "--paper-id", "lb-B", str(action))
    assert scoped.returncode == 0, scoped.stderr
    result = json.loads(scoped.stdout)
    assert result["value"] == "['lb-B']" and result["documents"] == "own" and scoped.stderr == ""

    shared = run_cli("exec", "--corpus", str(corpus_file), str(action))
    assert shared.returncode == 0 and json.loads(shared.stdout)["documents"] == "shared"
    assert "lb-" not in json.loads(shared.stdout)["value"]
    assert "2 of the corpus's 6 papers hold their questions' own documents" in shared.stderr and "--paper-id" in shared.stderr

    unknown = run_cli("exec", "--corpus", str(corpus_file), "--paper-id", "lb-C", str(action))
    assert unknown.returncode == 2 and "--paper-id: no paper 'lb-C'" in unknown.stderr and unknown.stdout == ""


def test_explorer_corpus_search_searches_own_documents_only_when_named(corpus_file):
    shared = run_cli("corpus", "search", "zebras Okavango", "--corpus", str(corpus_file), "--json")
    assert shared.returncode == 0 and json.loads(shared.stdout) == []
    assert "2 papers hold their questions' own documents and are searched only with --paper-id" in shared.stderr
    own = run_cli("corpus", "search", "zebras Okavango", "--corpus", str(corpus_file), "--paper-id", "lb-A", "--json")
    assert own.returncode == 0 and json.loads(own.stdout)[0]["paper_id"] == "lb-A"


def test_a_224k_token_context_is_served_within_an_action_s_default_limits():
    """Its index and sentence index are made with the episode, before its first action (~0.2 s and
    ~0.4 s with both on a loaded two-core machine), so no action pays for them."""
    big = long_context("hqa-224k")
    corpus = from_parts([*shared_papers()[0], big], [])
    assert len(big.context) > 900_000
    code = (
        'hits = search("savanna zebra river", k=5)\n'
        'found = extract("hqa-224k", "foal herd migration", k=3)\n'
        'page = read("hqa-224k", section=1599)\n'
        "submit('an answer', evidence=[hits[0], found[0]])"
    )
    with Sandbox(corpus, paper_id=big.id) as sandbox:
        result = sandbox.execute(code)
    assert result.limit_hit is None and result.error is None and result.outcome.status == "submitted"
    assert {item.paper_id for item in result.outcome.evidence} == {big.id}
