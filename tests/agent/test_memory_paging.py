"""The memory reader's document and pages: exact in the model's tokens, with and without outlines."""

import random

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.memory_reader.paging import Document, Section, Span, encode_document, page_document
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts
from paper_explorer.agent.renderer import ChatRenderer


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer):
    return ChatRenderer.from_directory(tiny_tokenizer)


@pytest.fixture(scope="module")
def prompts():
    return ReaderPrompts.load()


def synthetic(lengths):
    """A document whose sections have the given lengths in ids (ids 0, 1, 2, ... so that a misplaced id shows)."""
    spans, start = [], 0
    for i, length in enumerate(lengths):
        spans.append(Span(f"Section {i}", start, start + length))
        start += length
    return Document(ids=list(range(start)), spans=spans, text="")


def expected_outline(prompts, document, page):
    lines = [
        prompts.outline_line.format(heading=document.spans[s].heading + (prompts.outline_continued if n == 0 and page.continued else ""))
        for n, s in enumerate(page.sections)
    ]
    return prompts.outline.format(lines="".join(lines))


def check_invariants(document, paging, *, page_tokens, outlines, outline_sections, renderer, prompts, read=None):
    """Every property page_document guarantees, for one paging."""
    read = document.tokens if read is None else min(read, document.tokens)
    pages = paging.pages
    assert paging.document_tokens == document.tokens and paging.read_tokens == read
    assert paging.unread_tokens == document.tokens - read
    assert [i for page in pages for i in page.ids(document)] == document.ids[:read]
    assert [page.index for page in pages] == list(range(len(pages)))
    assert [page.start for page in pages] == [0, *(page.end for page in pages)][: len(pages)]
    assert (pages[-1].end if pages else 0) == read
    boundaries = {span.end for span in document.spans} | {read}
    for page in pages:
        assert 0 < page.tokens <= page_tokens
        touched = tuple(i for i, s in enumerate(document.spans) if s.start < page.end and s.end > page.start and s.start < s.end)
        assert page.sections == touched
        assert page.continued == (document.spans[touched[0]].start < page.start)
        if not outlines:
            assert page.outline_ids == []
            continue
        assert len(page.sections) <= outline_sections
        assert renderer.decode(page.outline_ids) == expected_outline(prompts, document, page)
        if page.end not in boundaries:  # a cut inside a section: only where it fills a page alone
            assert page.tokens == page_tokens and len(page.sections) == 1
    if not outlines:
        assert all(page.tokens == page_tokens for page in pages[:-1])
        return
    for page, following in zip(pages, pages[1:]):  # greedy: a page ends early only where the next section does not fit
        if page.tokens < page_tokens and len(page.sections) < outline_sections:
            next_section = document.spans[following.sections[0]]
            assert next_section.start == page.end and next_section.end - next_section.start > page_tokens - page.tokens


def test_random_documents_page_exactly_with_and_without_outlines(renderer, prompts):
    rng = random.Random(801)
    for _ in range(300):
        lengths = [rng.choice([0, 1, 2, 5]) if rng.random() < 0.2 else rng.randint(1, 60) for _ in range(rng.randint(0, 25))]
        document = synthetic(lengths)
        page_tokens, outline_sections = rng.randint(1, 50), rng.randint(1, 6)
        read = rng.choice([None, rng.randint(0, document.tokens + 10)])
        for outlines in (False, True):
            paging = page_document(
                document,
                page_tokens=page_tokens,
                outlines=outlines,
                outline_sections=outline_sections,
                renderer=renderer,
                prompts=prompts,
                read_tokens=read,
            )
            check_invariants(
                document,
                paging,
                page_tokens=page_tokens,
                outlines=outlines,
                outline_sections=outline_sections,
                renderer=renderer,
                prompts=prompts,
                read=read,
            )


def pages_of(document, renderer, prompts, page_tokens, outlines=True, outline_sections=24, read_tokens=None):
    paging = page_document(
        document,
        page_tokens=page_tokens,
        outlines=outlines,
        outline_sections=outline_sections,
        renderer=renderer,
        prompts=prompts,
        read_tokens=read_tokens,
    )
    check_invariants(
        document,
        paging,
        page_tokens=page_tokens,
        outlines=outlines,
        outline_sections=outline_sections,
        renderer=renderer,
        prompts=prompts,
        read=read_tokens,
    )
    return paging


def test_an_empty_document_has_no_pages(renderer, prompts):
    for outlines in (False, True):
        paging = pages_of(synthetic([]), renderer, prompts, 10, outlines=outlines)
        assert paging.pages == [] and paging.document_tokens == 0


def test_one_huge_section_is_cut_at_the_page_size_and_says_it_continues(renderer, prompts):
    paging = pages_of(synthetic([25]), renderer, prompts, 10)
    assert [(page.start, page.end) for page in paging.pages] == [(0, 10), (10, 20), (20, 25)]
    assert [page.continued for page in paging.pages] == [False, True, True]
    outlines = [renderer.decode(page.outline_ids) for page in paging.pages]
    assert outlines[0] == "Sections on this page:\n- Section 0\n\n"
    assert outlines[1] == "Sections on this page:\n- Section 0 (continued from the previous page)\n\n"


def test_sections_of_exactly_a_page_fill_one_page_each(renderer, prompts):
    paging = pages_of(synthetic([10, 10, 10]), renderer, prompts, 10)
    assert [(page.start, page.end, page.sections, page.continued) for page in paging.pages] == [
        (0, 10, (0,), False),
        (10, 20, (1,), False),
        (20, 30, (2,), False),
    ]


def test_pages_break_on_section_boundaries_where_a_section_fits(renderer, prompts):
    paging = pages_of(synthetic([4, 4, 3, 8, 12, 2]), renderer, prompts, 10)
    # 4+4 fit, 3 does not; 3 then 8 does not; 8; 12 is cut at 10; its last 2 then 2.
    assert [(page.start, page.end) for page in paging.pages] == [(0, 8), (8, 11), (11, 19), (19, 29), (29, 33)]
    assert paging.pages[4].sections == (4, 5) and paging.pages[4].continued
    assert (
        renderer.decode(paging.pages[4].outline_ids)
        == "Sections on this page:\n- Section 4 (continued from the previous page)\n- Section 5\n\n"
    )


def test_one_section_per_page_when_the_outline_holds_one(renderer, prompts):
    paging = pages_of(synthetic([3, 3, 15, 1]), renderer, prompts, 10, outline_sections=1)
    assert [(page.start, page.end, page.sections) for page in paging.pages] == [
        (0, 3, (0,)),
        (3, 6, (1,)),
        (6, 16, (2,)),
        (16, 21, (2,)),
        (21, 22, (3,)),
    ]


def test_without_outlines_pages_are_fixed_slices(renderer, prompts):
    paging = pages_of(synthetic([4, 4, 3, 8]), renderer, prompts, 5, outlines=False)
    assert [(page.start, page.end) for page in paging.pages] == [(0, 5), (5, 10), (10, 15), (15, 19)]
    assert paging.pages[1].sections == (1, 2) and paging.pages[1].continued
    assert all(page.outline_tokens == 0 for page in paging.pages)


def test_a_token_budget_leaves_the_tail_unread_and_counted(renderer, prompts):
    document = synthetic([6, 6, 6])
    for outlines in (False, True):
        paging = pages_of(document, renderer, prompts, 4, outlines=outlines, read_tokens=9)
        assert paging.read_tokens == 9 and paging.unread_tokens == 9 and paging.pages[-1].end == 9
        assert pages_of(document, renderer, prompts, 4, outlines=outlines, read_tokens=100).unread_tokens == 0
        assert pages_of(document, renderer, prompts, 4, outlines=outlines, read_tokens=0).pages == []


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"page_tokens": 0}, "pages must hold at least 1 token, not 0"),
        ({"outline_sections": 0}, "at least 1 section in its outline, not 0"),
        ({"read_tokens": -1}, "cannot be negative"),
    ],
)
def test_bad_arguments_are_one_line(renderer, prompts, arguments, expected):
    settings = {"page_tokens": 10, "outlines": True, "outline_sections": 24, **arguments}
    with pytest.raises(AgentError, match=expected):
        page_document(synthetic([5]), renderer=renderer, prompts=prompts, **settings)


def sections_of_text():
    return [
        Section("Abstract", "We study QuantLens, a tool for reading papers."),
        Section("1 Introduction", "Résumé: 数据集 «QASPER» — 5 000 questions 😀 and <|im_end|> as text."),
        Section("2 Method", "We train on SQuAD {with braces} and\n\nseveral paragraphs."),
    ]


def check_document(document, renderer, prompts, sections):
    pieces = [prompts.document_section.format(heading=s.heading, text=s.text) for s in sections]
    assert document.text == "".join(pieces)
    assert document.ids == [i for piece in pieces for i in renderer.text(piece)]
    assert [span.heading for span in document.spans] == [s.heading for s in sections]
    assert [span.start for span in document.spans] == [0, *(span.end for span in document.spans)][: len(document.spans)]
    assert document.spans[-1].end == document.tokens
    for span, piece in zip(document.spans, pieces):
        assert renderer.decode(document.ids[span.start : span.end]) == piece
    assert renderer.decode(document.ids) == document.text


def test_a_document_is_its_sections_pieces_and_decodes_to_its_text(renderer, prompts):
    sections = sections_of_text()
    document = encode_document(sections, renderer, prompts)
    check_document(document, renderer, prompts, sections)
    assert encode_document([], renderer, prompts) == Document(ids=[], spans=[], text="")


def test_a_multibyte_document_pages_exactly_with_the_real_qwen3_tokenizer(qwen3_tokenizer, prompts):
    renderer = ChatRenderer.from_directory(qwen3_tokenizer)
    sections = sections_of_text() * 3
    document = encode_document(sections, renderer, prompts)
    check_document(document, renderer, prompts, sections)
    for outlines in (False, True):
        paging = pages_of(document, renderer, prompts, 7, outlines=outlines, outline_sections=2)
        joined = [i for page in paging.pages for i in page.ids(document)]
        assert renderer.decode(joined) == document.text


def test_balanced_outlines_spread_the_sections_over_as_many_pages_as_greedy_fills(renderer, prompts):
    """Balanced pages (MemAgent preset): the same page count as greedy, every guarantee but the
    greedy fill, no page larger than greedy's largest, the cuts inside sections where greedy cuts."""
    rng = random.Random(24)
    for _ in range(300):
        lengths = [rng.choice([0, 1, 2, 5]) if rng.random() < 0.2 else rng.randint(1, 60) for _ in range(rng.randint(0, 40))]
        document = synthetic(lengths)
        page_tokens, outline_sections = rng.randint(1, 50), rng.randint(1, 6)
        read = rng.choice([None, rng.randint(0, document.tokens + 10)])
        options = dict(page_tokens=page_tokens, outlines=True, outline_sections=outline_sections, renderer=renderer, prompts=prompts)
        greedy = page_document(document, read_tokens=read, **options)
        balanced = page_document(document, read_tokens=read, balanced=True, **options)
        assert len(balanced.pages) == len(greedy.pages)
        assert max((p.tokens for p in balanced.pages), default=0) <= max((p.tokens for p in greedy.pages), default=0)
        boundaries = {span.end for span in document.spans} | {balanced.read_tokens}
        for page in balanced.pages:
            assert 0 < page.tokens <= page_tokens and len(page.sections) <= outline_sections
            assert renderer.decode(page.outline_ids) == expected_outline(prompts, document, page)
        assert [i for page in balanced.pages for i in page.ids(document)] == document.ids[: balanced.read_tokens]
        greedy_cuts = {page.end for page in greedy.pages} - boundaries
        assert {page.end for page in balanced.pages} - boundaries <= greedy_cuts  # a section is cut only where greedy cuts it


def test_balanced_pages_even_out_a_short_last_page(renderer, prompts):
    document = synthetic([10] * 10)  # 100 tokens in sections of 10: greedy 40, 40, 20; balanced 40, 30, 30
    options = dict(page_tokens=40, outlines=True, outline_sections=24, renderer=renderer, prompts=prompts)
    assert [p.tokens for p in page_document(document, **options).pages] == [40, 40, 20]
    assert [p.tokens for p in page_document(document, balanced=True, **options).pages] == [40, 30, 30]
