import pytest

from corpus import BM25Index
from tools.errors import ToolError
from tools.page import tool_page
from tools.paper_tools import PAGE_CHARS, TOOLS, PaperTools


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
    from corpus import Corpus, Paper, Section

    long_paper = Paper(id="long", title="Long", sections=(Section(name="Body", paragraphs=tuple(f"Paragraph {i}. " + "word " * 300 for i in range(12))),))
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
    quote = gold[len(gold) // 3: len(gold) // 3 + 40]
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
        ("search", ("x", 3, None, "extra"), {}, "at most 3 arguments"),
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
    assert tools.calls[0].arguments == {"query": "learning rate", "k": 2, "paper_id": None}
    assert tools.calls[0].seconds > 0 and tools.calls[0].error is None and "no paper" in tools.calls[1].error


def test_tool_page_documents_every_tool_from_its_argument_model():
    page = tool_page()
    for tool in TOOLS:
        assert tool.summary in page and tool.example in page
        for name, field in tool.arguments.model_fields.items():
            assert f"{name}: {field.description}" in page
    assert "search(query, k=5, paper_id=None)" in page and "(>= 1, <= 50)" in page
    assert page.count("search(query") == 1
