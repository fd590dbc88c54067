"""Action parsing, the observation text the policy is shown, and the prompts' examples, which must fit any corpus."""

import re
from pathlib import Path

import pytest

from paper_explorer.agent.actions import extract_code
from paper_explorer.agent.prompt import CUT_MARKER, EMPTY_OBSERVATION, FORMAT_ERROR, cut, observation, system_prompt
from paper_explorer.corpus import BM25Index
from paper_explorer.corpus.demo import CORES, PREFIXES, TASKS
from paper_explorer.corpus.plain_text import papers_from_text
from paper_explorer.tools import registry
from paper_explorer.tools.page import tool_page
from paper_explorer.tools.sandbox import ActionResult, Sandbox

EXAMPLE_PAPERS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "papers"


@pytest.mark.parametrize(
    "text, code",
    [
        ("I search.\n\n```python\nhits = search('x')\nhits\n```", "hits = search('x')\nhits"),
        ("```py\n1 + 1\n```", "1 + 1"),
        ("```\nprint(2)\n```", "print(2)"),
        ("```python\nfirst = 1\n```\nthen\n```python\nsecond = 2\n```", "first = 1"),  # only the first block runs
        ("x = search('learning rate')", "x = search('learning rate')"),  # bare code
        ("The answer is 3e-5 because the paper says so.", None),
        ("", None),
        ("```python\n\n```", None),
    ],
)
def test_code_extraction(text, code):
    assert extract_code(text) == code


def test_observation_shows_output_value_error_and_limits():
    assert observation(ActionResult()) == EMPTY_OBSERVATION
    text = observation(ActionResult(stdout="hello\n", value="42"))
    assert text == "hello\nOut: 42"
    failed = observation(
        ActionResult(error="NameError: name 'x' is not defined", traceback="Traceback (action lines only):\n  line 1\nNameError: x")
    )
    assert failed.startswith("Traceback (action lines only)")
    killed = observation(ActionResult(limit_hit="wall_clock", variables_lost=True))
    assert "Limit hit: wall_clock" in killed and "variables were lost" in killed


@pytest.mark.parametrize("length, budget", [(10, 200), (5_000, 200), (1_000_000, 4_000), (250, 249)])
def test_cut_keeps_the_budget_and_counts_what_it_dropped(length, budget):
    text = "x" * length
    shown, omitted = cut(text, budget)
    assert len(shown) <= max(budget, len(text) if length <= budget else budget)
    if length <= budget:
        assert (shown, omitted) == (text, 0)
    else:
        assert omitted == length - shown.index("\n[observation cut")
        assert CUT_MARKER.format(omitted=omitted, total=length) in shown


def test_the_system_prompt_holds_the_tool_page_once():
    assert system_prompt().count(tool_page()) == 1


def test_the_instructions_are_said_once_and_the_tool_page_is_a_pure_reference():
    from paper_explorer.tools.page import tool_page

    prompt = system_prompt()
    for instruction in ("cite the paragraphs", "abstain when", "python block", "(paper_id, section, paragraph) numbers"):
        assert prompt.count(instruction) == 1, instruction
    assert tool_page().startswith("search(") and "abstain when the papers" not in tool_page()


def test_the_template_hash_covers_the_prompt_file(tmp_path, monkeypatch):
    import paper_explorer.agent.prompt as prompt

    before = prompt.prompt_template_sha256()
    edited = tmp_path / "prompts.toml"
    edited.write_bytes(prompt.PROMPTS_FILE.read_bytes().replace(b"research assistant", b"research agent"))
    monkeypatch.setattr(prompt, "PROMPTS_FILE", edited)
    assert prompt.prompt_template_sha256() != before


def demo_names(corpus) -> list[str]:
    """Every method name the demo generator can make, every dataset and baseline it can cite, and
    the ids of ``corpus``'s papers."""
    methods = [prefix + core for prefix in PREFIXES for core in CORES]
    cited = [name for task in TASKS for name in (*task.datasets, *task.baselines)]
    return [*methods, *cited, *(paper.id for paper in corpus.papers)]


def test_the_prompts_name_no_paper_method_or_dataset_of_the_demo_corpus(small_demo):
    # a model copies the examples verbatim: on another corpus a demo name is a search for nothing
    for text in (system_prompt(), FORMAT_ERROR):
        assert not re.search(r"demo-[0-9]", text)
        assert [name for name in demo_names(small_demo) if name in text] == []


@pytest.fixture(scope="module", params=["demo", "text files"])
def any_corpus(request, small_demo):
    return small_demo if request.param == "demo" else papers_from_text([EXAMPLE_PAPERS])


@pytest.mark.parametrize("ending", ["submit", "abstain"])
def test_the_examples_run_in_order_on_the_demo_corpus_and_on_another(any_corpus, ending):
    """The format-error message's example, then the tool page's in the order shown (the later ones
    use the search's hits) as one episode's actions: each runs, every call succeeds, the last ends it."""
    examples = [extract_code(FORMAT_ERROR)] + [
        tool.example for tool in registry.tools() if tool.name not in {"submit", "abstain"} - {ending}
    ]
    with Sandbox(any_corpus, index=BM25Index.build(any_corpus)) as sandbox:
        for example in examples:
            result = sandbox.execute(example)
            assert result.error is None and result.tool_calls, example
            assert [call.error for call in result.tool_calls] == [None], example
            if "search(" in example:
                assert result.tool_calls[0].returned.text.startswith('[{"paper_id"'), example  # hits for the later examples
        outcome = sandbox.outcome
    assert outcome is not None and outcome.status == {"submit": "submitted", "abstain": "abstained"}[ending]
    assert ending == "abstain" or len(outcome.evidence) == 1
