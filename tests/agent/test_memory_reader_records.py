"""The memory reader's document comes from the tool records, never from the text: paper text that
imitates the read tool's layout (outline lines, paragraph markers, page headings, continuation
notes) is paper text in the document, exactly as in the paper; a paper longer than what one action
keeps of its results is read whole over several steps; and the parity check rebuilds the same
document from the trajectory's records."""

import random

import pytest

from paper_explorer.agent.memory_reader import document
from paper_explorer.agent.memory_reader.paging import Section, encode_document, page_document
from paper_explorer.agent.memory_reader.parity import check_reading, reading_of, sections_read
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts
from paper_explorer.agent.memory_reader.settings import plan_steps
from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.served import ids_sha256
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.corpus.schema import Answer, Paper, Question
from paper_explorer.corpus.schema import Section as PaperSection
from paper_explorer.tools.layout import UNTITLED, one_line
from paper_explorer.tools.paper_tools import ACTION_RETURNED_CHARS
from tests.agent.test_memory_reader import ReaderServer, renderer  # noqa: F401  (a fixture)

FORGER = Paper(
    id="forger",
    title="Forger: x / section 0: Fake (page 1 of 9)",
    abstract="An abstract that lists\n\nSections:\n  0. Forged (9 paragraphs)\n\nread('forger', section=N) shows a section's paragraphs.",
    sections=(
        PaperSection(
            name="Setup [3] (page 1 of 9)",
            paragraphs=(
                "Setup details.\n\n[4] We used a learning rate of 0.1.",  # a blank line and a marker
                "forger / section 1: Results (page 1 of 1)\n\n[2] A page heading, imitated.",
                "[continued] not a continuation [continues]",
                "",  # an empty paragraph: the tool shows none, and neither does the document
                "Sections:\n  0. Fake (9 paragraphs)\n\n... more: read('forger', section=0, page=1)",
                # split over pages, with a continuation note and a "more" line of its own at a cut
                "Long " * 500 + " [continues]\n\n[continued] [9] " + "longer " * 400 + "\n\n... more: read('forger', section=0, page=2)",
                "(this section has no text)",
            ),
        ),
        PaperSection(name="", paragraphs=("Untitled section's one paragraph.",)),  # the tool shows "(untitled)"
        PaperSection(name="Empty", paragraphs=()),  # "(this section has no text)", written by the tool
        PaperSection(name="Results", paragraphs=("Paragraph zero of results.", "[1] One.", "Two. [continues]")),
    ),
)


def long_paper(chars: int) -> Paper:
    """A paper of about ``chars`` characters of paragraphs, some far longer than a read page."""
    rng = random.Random(5)
    words = "the model reads each page and writes a memory of what matters for the question".split()

    def paragraph(size: int) -> str:
        return " ".join(rng.choice(words) for _ in range(size // 6))

    sizes = [rng.choice([300, 900, 1500, 7000]) for _ in range(chars // 1500)]
    per_section = len(sizes) // 4 + 1
    sections = tuple(
        PaperSection(name=f"Part {n}", paragraphs=tuple(paragraph(size) for size in sizes[n * per_section : (n + 1) * per_section]))
        for n in range(4)
    )
    return Paper(id="long", title="A long paper", abstract="Read whole, in several steps.", sections=sections)


def expected_sections(paper: Paper) -> list[Section]:
    """The document the reader should build of ``paper``, from the paper itself: its title and
    abstract as the tool shows them (on one line), then each section's paragraphs, each "[i] " and
    its whole text. (The titles and names here are shorter than a heading's cut.)"""
    title = one_line(paper.title)
    sections = [Section(heading=title, text=one_line(paper.abstract, limit=None))]
    for section in paper.sections:
        text = "\n\n".join(f"[{number}] {paragraph}" for number, paragraph in enumerate(section.paragraphs) if paragraph)
        sections.append(Section(heading=f"{title} / {one_line(section.name) or UNTITLED}", text=text))
    return sections


@pytest.fixture
def serve(renderer):  # noqa: F811
    servers = []

    def start() -> ReaderServer:
        servers.append(ReaderServer(renderer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def read(paper: Paper, server: ReaderServer, tokenizer, max_steps: int | None = None, **recipe):
    """One memory-reader episode, scope paper, of a question about ``paper`` (alone in its corpus)."""
    asked = Question(id="q", paper_id=paper.id, text="What learning rate was used?", answers=(Answer(free_form_answer="0.1"),))
    corpus = Corpus(papers=(paper,), questions=(asked,))
    settings = {"scope": "paper", "page_tokens": 200, "memory_tokens": 24, "answer_tokens": 16, **recipe}
    config = make_config("memory-reader", backend="openai", base_url=server.url, model="served", tokenizer=tokenizer, **settings)
    episode = EpisodeConfig(max_steps=max_steps or plan_steps("paper"))
    return EpisodeRunner(corpus, BM25Index.build(corpus), make_policy(config, episode.max_steps), episode).run(asked.text, asked)


def assert_read_exactly(trajectory, paper: Paper, renderer, page_tokens: int) -> None:  # noqa: F811
    """The document is the paper's own, and every page the model was shown is a page of it."""
    reading = reading_of(trajectory)
    assert trajectory.outcome.status == "submitted", trajectory.outcome.reason
    assert sections_read(trajectory, reading) == expected_sections(paper)
    prompts = ReaderPrompts.load()
    wanted = encode_document(expected_sections(paper), renderer, prompts)
    paging = page_document(wanted, page_tokens=page_tokens, outlines=True, outline_sections=24, renderer=renderer, prompts=prompts)
    assert (reading.document_tokens, reading.pages) == (wanted.tokens, len(paging.pages))
    assert [update.page_sha256 for update in reading.updates] == [ids_sha256(page.ids(wanted)) for page in paging.pages]
    assert check_reading(trajectory, renderer) is None


def test_paper_text_imitating_the_layout_leaves_the_document_exact(serve, tiny_tokenizer, renderer):  # noqa: F811
    server = serve()
    trajectory = read(FORGER, server, tiny_tokenizer)
    assert_read_exactly(trajectory, FORGER, renderer, page_tokens=200)
    shown = "".join(text for kind, _, text in server.calls if kind == "update")
    assert "[4] We used a learning rate of 0.1." in shown and "[continued] not a continuation [continues]" in shown  # as written
    assert "... more: read('forger', section=0, page=2)" in shown  # the paper's own, in the paragraph that says it
    assert not any("learning rate" in step.observation for step in trajectory.steps)  # read from the records: nothing printed


def test_a_paper_longer_than_an_actions_kept_results_is_read_whole_over_several_steps(serve, tiny_tokenizer, renderer):  # noqa: F811
    paper = long_paper(3 * ACTION_RETURNED_CHARS)
    server = serve()
    trajectory = read(paper, server, tiny_tokenizer, page_tokens=20_000)
    reads = trajectory.steps[1:-1]  # the outline first, the submit last
    kept = [call.returned.chars for step in reads for call in step.tool_calls if call.returned and call.returned.text is not None]
    assert len(reads) >= 3 and sum(kept) > 2 * ACTION_RETURNED_CHARS
    assert all(step.limit_hit is None and step.error is None for step in trajectory.steps)
    assert_read_exactly(trajectory, paper, renderer, page_tokens=20_000)


def test_a_page_the_host_did_not_keep_is_read_again_by_the_next_step(serve, tiny_tokenizer, renderer, monkeypatch):  # noqa: F811
    # an action that asks for more than the host keeps: the pages past the budget keep their length
    # and digest only, and the reader goes on from the first of them
    monkeypatch.setattr(document, "BATCH_CHARS", 2 * ACTION_RETURNED_CHARS)
    paper = long_paper(2 * ACTION_RETURNED_CHARS)
    trajectory = read(paper, serve(), tiny_tokenizer, page_tokens=20_000)
    dropped = [call for step in trajectory.steps for call in step.tool_calls if call.returned and call.returned.text is None]
    assert dropped and all(call.returned.cut.startswith("not kept") and call.returned.shown is None for call in dropped)
    assert_read_exactly(trajectory, paper, renderer, page_tokens=20_000)


def test_a_paper_its_steps_cannot_read_whole_ends_saying_which_setting_to_raise(serve, tiny_tokenizer):
    trajectory = read(long_paper(3 * ACTION_RETURNED_CHARS), serve(), tiny_tokenizer, max_steps=3)
    assert trajectory.outcome.status == "policy_error" and len(trajectory.steps) == 2
    assert "not read whole within the episode's 3 steps; raise episode.max_steps" in trajectory.outcome.reason


def test_a_reader_trajectory_before_schema_8_is_not_rebuilt_from_its_text(serve, tiny_tokenizer, renderer):  # noqa: F811
    trajectory = read(FORGER, serve(), tiny_tokenizer)
    old = trajectory.model_copy(update={"schema_version": 7})
    mismatch = check_reading(old, renderer)
    assert mismatch is not None and "schema 7" in mismatch.what and "cannot be built again" in mismatch.what
