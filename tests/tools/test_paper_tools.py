import difflib
import random
from collections import Counter

import pytest
import re2
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from paper_explorer.corpus import BM25Index, Corpus, Paper, Section
from paper_explorer.corpus.index import quote_form
from paper_explorer.tools import paper_tools, registry
from paper_explorer.tools.catalog.submit import QUOTE_SCANS
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.layout import PAGE_CHARS
from paper_explorer.tools.layout import pages as _pages
from paper_explorer.tools.page import tool_page
from paper_explorer.tools.paper_tools import PaperTools, SentenceIndex, SentenceIndexCache, _close_matches


@pytest.fixture
def tools(small_demo):
    return PaperTools(small_demo, BM25Index.build(small_demo))


@pytest.fixture
def call(tools):
    return tools.functions()


def extractive_question(corpus):
    return next(q for q in corpus.questions if q.answers[0].kind == "extractive" and "learning rate" in q.text)


def test_search_returns_plain_hits_with_addresses_that_read_can_follow(call, small_demo):
    question = extractive_question(small_demo)
    hits = call["search"](question.text, k=3)
    assert len(hits) == 3 and all(type(hit) is dict for hit in hits)
    assert set(hits[0]) == {"paper_id", "title", "section", "section_name", "paragraph", "score", "snippet"}
    assert hits[0]["paper_id"] == question.paper_id
    assert question.answers[0].extractive_spans[0] in hits[0]["snippet"]
    page = call["read"](hits[0]["paper_id"], section=hits[0]["section"])
    assert f"[{hits[0]['paragraph']}] " in page


def test_search_within_one_paper(call, small_demo):
    paper_id = small_demo.papers[5].id
    hits = call["search"]("results datasets", k=50, paper_id=paper_id)
    assert hits and {hit["paper_id"] for hit in hits} == {paper_id}


def test_read_without_section_is_the_outline(call, small_demo):
    paper = small_demo.papers[0]
    outline = call["read"](paper.id)
    assert paper.title in outline and paper.abstract in outline
    for number, section in enumerate(paper.sections):
        assert f"{number}. {section.name}" in outline


def test_read_section_by_name_number_and_digit_string(call, small_demo):
    paper = small_demo.papers[0]
    by_name = call["read"](paper.id, section="results")
    number = [s.name for s in paper.sections].index("Results")
    assert by_name == call["read"](paper.id, section=number) == call["read"](paper.id, section=str(number))
    assert call["read"](paper.id, section="Baselines") == call["read"](paper.id, section="Experiments ::: Baselines")


def test_long_sections_are_paged_and_say_how_to_continue(small_demo):
    from paper_explorer.corpus import Corpus, Paper, Section

    long_paper = Paper(
        id="long", title="Long", sections=(Section(name="Body", paragraphs=tuple(f"Paragraph {i}. " + "word " * 300 for i in range(12))),)
    )
    corpus = Corpus(papers=(long_paper,))
    call = PaperTools(corpus, BM25Index.build(corpus)).functions()
    first = call["read"]("long", section=0)
    assert "page 1 of" in first and "read('long', section=0, page=1)" in first
    pages, page = [], 0
    while True:
        text = call["read"]("long", section=0, page=page)
        assert len(text) < PAGE_CHARS + 300
        pages.append(text)
        if "... more:" not in text:
            break
        page += 1
    joined = "\n".join(pages)
    assert all(f"[{i}] Paragraph {i}." in joined for i in range(12))
    with pytest.raises(ToolError, match="page"):
        call["read"]("long", section=0, page=page + 1)


def test_extract_finds_the_fact_sentence_with_its_location(call, small_demo):
    question = extractive_question(small_demo)
    found = call["extract"](question.paper_id, "learning rate", k=3)
    assert found and question.answers[0].extractive_spans[0] in found[0]["sentence"]
    paper = small_demo.paper(question.paper_id)
    assert found[0]["sentence"] in paper.sections[found[0]["section"]].paragraphs[found[0]["paragraph"]]


def test_extract_regex_is_linear_time_re2(call, small_demo):
    paper_id = small_demo.papers[0].id
    assert call["extract"](paper_id, r"learning RATE of \S+", regex=True)
    assert call["extract"](paper_id, r"(a+)+$", regex=True) == []  # catastrophic for backtracking engines
    with pytest.raises(ToolError, match="not a valid RE2 pattern"):
        call["extract"](paper_id, r"(a)\1", regex=True)


def test_submit_resolves_hits_triples_and_quotes_to_paragraphs(tools, call, small_demo):
    question = extractive_question(small_demo)
    hits = call["search"](question.text, k=1)
    gold = question.answers[0].evidence[0]
    quote = gold[len(gold) // 3 : len(gold) // 3 + 40]
    confirmation = call["submit"]("x", evidence=[hits[0], [hits[0]["paper_id"], hits[0]["section"], hits[0]["paragraph"]], quote])
    assert "submitted" in confirmation
    assert tools.outcome.status == "submitted" and tools.outcome.answer == "x"
    assert gold in [item.text for item in tools.outcome.evidence]
    with pytest.raises(ToolError, match="already ended"):
        call["abstain"]("changed my mind")


def test_abstain_records_the_reason(tools, call):
    assert call["abstain"]("not in the papers") == "abstained"
    assert tools.outcome.status == "abstained" and tools.outcome.reason == "not in the papers"


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "message"),
    [
        ("read", ("demo-0000",), {}, "did you mean 'demo-00000'"),
        ("read", ("demo-00000",), {"section": 99}, "has sections 0 to"),
        ("read", ("demo-00000",), {"section": "Experiments"}, "ambiguous"),
        ("read", ("demo-00000",), {"section": "Appendix Z"}, "no section 'Appendix Z'"),
        ("search", ("x",), {"k": 51}, "k: input should be less than or equal to 50"),
        ("search", ("x",), {"k": True}, "k: input should be a valid integer"),
        ("search", (3,), {}, "query: input should be a valid string"),
        ("search", ("",), {}, "query"),
        ("search", ("x" * 501,), {}, "at most 500 characters"),
        ("search", ("x",), {"limit": 3}, "has no argument 'limit'"),
        ("search", ("x", 3, None, None, "extra"), {}, "at most 4 arguments"),
        ("search", ("x",), {"paper_id": "nope"}, "no paper 'nope'"),
        ("extract", ("demo-00000",), {}, "needs the argument 'query'"),
        ("submit", ("",), {}, "answer"),
        ("submit", ("a",), {"evidence": [["demo-00000", 0, 999]]}, "no paragraph 999"),
        ("submit", ("a",), {"evidence": [{"paper_id": "demo-00000"}]}, "missing section, paragraph"),
        ("submit", ("a",), {"evidence": ["short"]}, "at least 10 characters"),
        ("submit", ("a",), {"evidence": [3.5]}, "got float"),
        ("submit", ("a",), {"evidence": [object()]}, "plain data"),
        ("abstain", (), {}, "needs the argument 'reason'"),
    ],
)
def test_bad_arguments_give_actionable_messages(tools, call, name, args, kwargs, message):
    with pytest.raises(ToolError) as caught:
        call[name](*args, **kwargs)
    assert message in str(caught.value)
    assert tools.calls[-1].error == str(caught.value)
    assert tools.outcome is None


def test_lying_subclasses_are_copied_to_exact_builtins_before_checks(call, tools):
    class Liar(str):
        def __len__(self):
            return 1

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    class BigInt(int):
        def __le__(self, other):
            return True

    with pytest.raises(ToolError, match="less than or equal to 50"):
        call["search"]("learning", k=BigInt(10_000))
    hits = call["search"](Liar("learning rate"), k=1)
    assert type(tools.calls[-1].arguments["query"]) is str and hits


def test_results_are_fresh_objects_that_cannot_poison_later_calls(call):
    first = call["search"]("learning rate", k=2)
    first[0]["paper_id"] = "poisoned"
    first[0]["snippet"] = "poisoned"
    assert call["search"]("learning rate", k=2)[0]["paper_id"] != "poisoned"


def test_every_call_is_recorded_with_arguments_and_latency(tools, call):
    call["search"]("learning rate", k=2)
    with pytest.raises(ToolError):
        call["read"]("nope")
    assert [c.name for c in tools.calls] == ["search", "read"]
    assert tools.calls[0].arguments == {"query": "learning rate", "k": 2, "paper_id": None, "rerank": None}
    assert tools.calls[0].seconds > 0 and tools.calls[0].error is None and "no paper" in tools.calls[1].error


def test_tool_page_documents_every_tool_from_its_argument_model():
    page = tool_page()
    for tool in registry.tools():
        assert tool.summary in page and tool.example in page
        for name, field in tool.arguments.model_fields.items():
            assert f"{name}: {field.description}" in page
    assert "search(query, k=5, paper_id=None, rerank=None)" in page and "(>= 1, <= 50)" in page
    assert page.count("search(query") == 1


# -- fast paths give the simple definitions' answers, and what they keep is bounded ----------------

TRICKY_WORDS = [
    "model",
    "Model",
    "the",
    "of",
    "ΑΣ",
    "σς",
    "İstanbul",
    "1,000.5",
    "3e-5",
    "x_y",
    "a.b",
    "--",
    "(BERT)",
    "naïve",
    "data",
    "rate",
    "\ud800",
    "é",
    "ǅ",
    ".",
]
TRICKY_SPACES = [" ", "  ", "\n", "\t", "\u2028", "\x85", "\xa0", "\u3000", "\x1c"]


def linear_quote_lookup(index, quote):
    """The definition: the first paragraph, in corpus order, whose quote form contains the quote's."""
    wanted = quote_form(quote)
    return next((number for number, paragraph in enumerate(index.paragraphs) if wanted in quote_form(paragraph.text)), None)


@st.composite
def paragraphs_and_quotes(draw):
    words = st.lists(st.tuples(st.sampled_from(TRICKY_WORDS), st.sampled_from(TRICKY_SPACES)), min_size=1, max_size=25)
    texts = [text for text in ("".join(w + s for w, s in pairs).strip() for pairs in draw(st.lists(words, min_size=1, max_size=8))) if text]
    assume(texts)
    quotes = []
    for _ in range(6):
        text = draw(st.sampled_from(texts))
        start = draw(st.integers(0, len(text)))
        quote = text[start : draw(st.integers(start, len(text)))]
        if draw(st.booleans()):  # a near miss: one character changed or added
            at = draw(st.integers(0, len(quote)))
            quote = quote[:at] + draw(st.sampled_from(["x", " ", "Σ", "1"])) + quote[at + 1 :]
        quotes.append(quote)
    return texts, quotes


@settings(max_examples=150, deadline=None)
@given(paragraphs_and_quotes(), st.booleans())
def test_quote_lookup_is_the_linear_scan_on_tricky_text(drawn, stopwords):
    texts, quotes = drawn
    corpus = Corpus(papers=(Paper(id="p", title="t", sections=(Section(name="s", paragraphs=tuple(texts)),)),))
    index = BM25Index.build(corpus, stopwords=stopwords)
    for quote in quotes:
        assert index.find_quote(quote) == linear_quote_lookup(index, quote), quote


def test_quote_lookup_is_the_linear_scan_on_the_demo_corpus(tools, small_demo):
    rng = random.Random(0)
    texts = [p.text for p in tools.index.paragraphs]
    common = [word for word, _ in Counter(w for t in texts for w in quote_form(t).split()).most_common(40)]
    quotes = []
    for _ in range(200):
        text = rng.choice(texts)
        start = rng.randrange(len(text))
        quote = text[start : start + rng.randrange(10, 200)]
        quotes.append(quote if rng.random() < 0.6 else quote.replace(" ", "  x ", 1))
    quotes += [" ".join(rng.sample(common, 6)) for _ in range(20)]  # common words only: scans the whole text
    plans = [tools.index.plan_quote(quote) for quote in quotes]
    assert any(plan.scans_everything for plan in plans) and any(not plan.scans_everything for plan in plans)
    for quote in quotes:
        assert tools.index.find_quote(quote) == linear_quote_lookup(tools.index, quote)


def test_submit_scans_the_whole_corpus_for_few_quotes_and_says_so(call, tools):
    words = dict.fromkeys(word for p in tools.index.paragraphs for word in p.text.split() if word.isalpha() and len(word) >= 12)
    weak = list(words)[:4]  # one word, perhaps cut at both ends: nothing to look it up by
    assert len(weak) == 4 and all(tools.index.plan_quote(quote).scans_everything for quote in weak)
    assert "submitted" in call["submit"]("x", evidence=weak[:QUOTE_SCANS])
    another = PaperTools(tools.corpus, tools.index)
    with pytest.raises(ToolError, match="evidence 3: this quote has no word uncommon enough") as caught:
        another.functions()["submit"]("x", evidence=weak)
    assert f"for {QUOTE_SCANS} such quotes at most" in str(caught.value) and another.outcome is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("ab01-.x", min_size=1, max_size=12), min_size=1, max_size=60, unique=True), st.text("ab01-.xy", max_size=14))
def test_close_ids_are_difflibs(candidates, wanted):
    assert _close_matches(wanted, candidates) == difflib.get_close_matches(wanted, candidates, n=20, cutoff=0.6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("abc01-", max_size=70), min_size=1, max_size=20), st.text("abc01-x", max_size=66))
def test_close_id_bounds_are_upper_bounds_of_difflibs_ratio(candidates, wanted):
    rows, bounds = paper_tools._id_table(tuple(candidates)).ratio_bounds(wanted)
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(wanted)
    for row, bound in zip(rows.tolist(), bounds.tolist()):
        matcher.set_seq1(candidates[row])
        assert matcher.ratio() <= bound
    passing = {i for i, candidate in enumerate(candidates) if difflib.SequenceMatcher(None, candidate, wanted).ratio() >= 0.6}
    assert passing <= set(rows.tolist())


def test_close_ids_on_typos_of_many_similar_ids():
    rng = random.Random(1)
    ids = [f"{rng.randrange(1500, 2300)}.{rng.randrange(0, 20000):05d}" for _ in range(1500)]
    for _ in range(50):
        typed = list(rng.choice(ids))
        typed[rng.randrange(len(typed))] = rng.choice("0123456789.")
        typed = "".join(typed)
        assert _close_matches(typed, ids) == difflib.get_close_matches(typed, ids, n=20, cutoff=0.6)


def pages_by_definition(entries, budget):
    """The paging as first written: quadratic in a long paragraph, kept here as the definition."""
    pieces = []
    for entry in entries:
        while len(entry) > budget:
            pieces.append(entry[:budget] + " [continues]")
            entry = "[continued] " + entry[budget:]
        pieces.append(entry)
    pages, used = [[]], 0
    for piece in pieces:
        if pages[-1] and used + len(piece) > budget:
            pages.append([])
            used = 0
        pages[-1].append(piece)
        used += len(piece) + 2
    return pages


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=6), st.integers(13, 120))
def test_pages_are_the_definitions(entries, budget):
    assert _pages(entries, budget) == pages_by_definition(entries, budget)


def test_sentence_indexes_are_bounded_and_rebuilt_the_same(small_demo, monkeypatch):
    cache = SentenceIndexCache(max_papers=3, max_chars=10**9)
    monkeypatch.setattr(paper_tools, "SENTENCE_INDEXES", cache)
    call = PaperTools(small_demo, BM25Index.build(small_demo)).functions()
    first = [call["extract"](paper.id, "learning rate datasets", k=3) for paper in small_demo.papers]
    assert len(cache) == 3 and cache.chars == sum(SentenceIndex.build(p).chars for p in small_demo.papers[-3:])
    again = PaperTools(small_demo, BM25Index.build(small_demo)).functions()  # another episode: same answers
    assert [again["extract"](paper.id, "learning rate datasets", k=3) for paper in small_demo.papers] == first
    by_chars = SentenceIndexCache(max_papers=100, max_chars=1)
    for paper in small_demo.papers[:5]:
        assert by_chars.get(paper).paper is paper
    assert len(by_chars) == 1  # one paper over the bound is kept alone, and only it


def test_regex_extract_gives_the_first_k_matching_sentences(tools, call, small_demo):
    paper = small_demo.papers[3]
    index = SentenceIndex.build(paper)
    pattern = re2.compile(r"(?i)\b(the|model)\b")
    expected = [i for i, (_, _, text) in enumerate(index.located) if pattern.search(text)][:4]
    found = call["extract"](paper.id, r"\b(the|model)\b", regex=True, k=4)
    assert [(hit["section"], hit["paragraph"], hit["sentence"]) for hit in found] == [index.located[i] for i in expected]


def test_a_regex_too_costly_for_the_paper_is_refused_before_it_runs(call, small_demo):
    with pytest.raises(ToolError, match=r"too complex to run over 'demo-00000' \([0-9,]+ RE2 instructions x [0-9,]+ bytes"):
        call["extract"]("demo-00000", r"(.{0,50}a){10}q", regex=True)
    assert call["extract"]("demo-00000", r"learning rate of \S+", regex=True)


def test_regex_extract_over_text_with_a_lone_surrogate(tools):
    corpus = Corpus(papers=(Paper(id="s", title="t", sections=(Section(name="A", paragraphs=("Odd \ud800 text here. Next.",)),)),))
    call = PaperTools(corpus, BM25Index.build(corpus)).functions()
    assert [hit["sentence"] for hit in call["extract"]("s", r"odd . text", regex=True)] == ["Odd \ud800 text here."]
