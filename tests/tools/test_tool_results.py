"""What the host's tools returned, as each call record keeps it: whole, cut at the cap for one
result, or past the action's budget as length and sha256 only, and each cut says so."""

import hashlib
import json

from corpus import BM25Index, Corpus
from corpus.schema import Paper, Section
from tools.errors import ToolError
from tools.paper_tools import ACTION_RETURNED_CHARS, RETURNED_CHARS, PaperTools


def tools_for(corpus):
    tools = PaperTools(corpus, BM25Index.build(corpus))
    return tools, tools.functions()


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def test_each_successful_call_keeps_what_it_returned(small_demo):
    tools, call = tools_for(small_demo)
    hits = call["search"]("learning rate", k=3)
    page = call["read"](hits[0]["paper_id"], section=hits[0]["section"])
    found = call["extract"](hits[0]["paper_id"], "learning rate", k=2)
    confirmation = call["submit"]("3e-5", evidence=[hits[0]])
    search, read, extract, submit = (record.returned for record in tools.calls)
    assert json.loads(search.text) == hits and json.loads(extract.text) == found
    assert read.text == page and submit.text == confirmation
    for returned in (search, read, extract, submit):
        assert returned.cut is None and returned.chars == len(returned.text) and returned.sha256 == sha256(returned.text)


def test_a_failed_call_returned_nothing(small_demo):
    tools, call = tools_for(small_demo)
    try:
        call["read"]("no-such-paper")
    except ToolError:
        pass
    tools.refuse("search", "arguments over the cap")
    assert [(record.error is not None, record.returned) for record in tools.calls] == [(True, None), (True, None)]


def test_a_result_over_the_cap_for_one_call_is_cut_and_says_so():
    # one sentence with no boundary, longer than the cap: extract returns it whole
    sentence = "word " * (RETURNED_CHARS // 4)
    corpus = Corpus(papers=(Paper(id="p", title="Long", sections=(Section(name="S", paragraphs=(sentence,)),)),))
    tools, call = tools_for(corpus)
    whole = json.dumps(call["extract"]("p", "word", k=1), ensure_ascii=False)
    returned = tools.calls[-1].returned
    assert len(whole) > RETURNED_CHARS and returned.text == whole[:RETURNED_CHARS]
    assert returned.chars == len(whole) and returned.sha256 == sha256(whole)
    assert returned.cut == f"the first {RETURNED_CHARS:,} of {len(whole):,} characters (the cap for one result)"


def test_past_the_action_budget_results_keep_length_and_sha256_until_the_next_action(small_demo):
    tools, call = tools_for(small_demo)
    pages = [call["read"]("demo-00003", section=8) for _ in range(ACTION_RETURNED_CHARS // 2_000)]  # pages of 2,446 characters
    kept = [record.returned for record in tools.calls if record.returned.text is not None]
    spent = [record.returned for record in tools.calls if record.returned.text is None]
    assert len(pages[0]) > 2_000 and kept and spent
    assert sum(len(returned.text) for returned in kept) <= ACTION_RETURNED_CHARS
    assert tools.calls[len(kept)].returned.text is None  # kept in order, until the budget is spent
    assert all(returned.chars == len(pages[0]) and returned.sha256 == sha256(pages[0]) for returned in spent)
    assert spent[0].cut.startswith(f"not kept: {len(pages[0]):,} characters, over the ")
    assert spent[-1].cut == (
        f"not kept: {len(pages[0]):,} characters, over the 0 left of the action's {ACTION_RETURNED_CHARS:,} characters of kept results"
    )
    call["search"]("x", k=1)  # small, but the budget is spent
    assert tools.calls[-1].returned.text is None
    tools.start_action()
    call["search"]("x", k=1)
    assert tools.calls[-1].returned.text is not None and tools.calls[-1].returned.cut is None
