"""docs/sandbox.md's "Add a tool", as a reader follows it: its module written to a file of its own,
registered, and called by a policy through a real sandbox episode (worker behind the fence, the
tool run and recorded in the episode's host process); and the registry's refusals."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from paper_explorer.agent.policies import Policy, Reply
from paper_explorer.agent.policies.base import action
from paper_explorer.agent.prompt import system_prompt
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig, research_before_end
from paper_explorer.corpus import BM25Index, tokenize
from paper_explorer.tools import registry
from paper_explorer.tools.catalog.search import SearchArgs, search
from paper_explorer.tools.page import tool_page
from paper_explorer.tools.registry import RegistryError, Tool

DOC = Path(__file__).resolve().parents[2] / "docs" / "sandbox.md"


def doc_module() -> str:
    """The ```python plugins/count_tool.py block of the page's "Add a tool" section."""
    section = DOC.read_text(encoding="utf-8").split("## Add a tool", 1)[1]
    found = re.search(r"```python plugins/count_tool\.py\n(.*?)\n```", section, re.DOTALL)
    assert found, "docs/sandbox.md's Add a tool section lost its count_tool.py block"
    return found.group(1)


@pytest.fixture
def count_tool(tmp_path):
    path = tmp_path / "count_tool.py"
    path.write_text(doc_module() + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("count_tool", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["count_tool"] = module
    spec.loader.exec_module(module)
    registry.register(module.TOOL)
    yield module
    registry.unregister("count")
    del sys.modules["count_tool"]


class Fixed(Policy):
    name = "fixed"

    def __init__(self, *codes):
        self.codes = codes

    def act(self, messages):
        return Reply(action(self.codes[sum(1 for m in messages if m["role"] == "assistant")]))


def test_the_docs_tool_is_one_file_that_a_policy_calls_in_a_sandbox_episode(count_tool, small_demo):
    paper = small_demo.papers[0]
    expected = sum(1 for s in paper.sections for text in s.paragraphs for token in tokenize(text, stopwords=False) if token == "the")
    assert "count(paper_id, word)" in tool_page() and "count(paper_id, word)" in system_prompt()
    policy = Fixed(
        f'n = count("{paper.id}", "The")\nprint(n)', 'count("nope", "the")', 'count("' + paper.id + '", "two words")', 'abstain("x")'
    )
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig()).run("How often?")
    first, typo, two, _ = trajectory.steps
    assert first.observation.strip() == str(expected) and expected > 0
    assert [call.name for call in first.tool_calls] == ["count"] and first.tool_calls[0].returned.text == str(expected)
    assert first.tool_calls[0].arguments == {"paper_id": paper.id, "word": "The"}  # validated by its model, recorded by the host
    assert "no paper 'nope'" in typo.tool_calls[0].error and "is not one word" in two.tool_calls[0].error
    assert trajectory.outcome.status == "abstained"
    assert list(research_before_end(trajectory)) == []  # it declared no record="shown": not research


def test_a_tool_gone_is_gone_from_the_page_the_worker_and_the_host(count_tool, small_demo):
    registry.unregister("count")
    try:
        assert "count(" not in tool_page()
        trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), Fixed('count("x", "y")', 'abstain("x")'), EpisodeConfig()).run(
            "?"
        )
        assert "NameError" in trajectory.steps[0].observation and trajectory.steps[0].tool_calls == []
    finally:
        registry.register(count_tool.TOOL)


@pytest.mark.parametrize(
    "name, said",
    [("print", "no builtin"), ("_hidden", "lower-case identifier"), ("Count", "lower-case identifier"), ("search", "already registered")],
)
def test_a_tool_that_would_shadow_a_name_or_another_tool_is_refused(name, said):
    with pytest.raises(RegistryError, match=said):
        registry.register(Tool(name=name, arguments=SearchArgs, function=search, summary="", returns="", example="", order=99))


def test_a_tool_declared_in_main_is_refused():
    def function(episode, args):
        return 1

    function.__module__ = "__main__"
    with pytest.raises(RegistryError, match="module of its own"):
        registry.register(Tool(name="fresh", arguments=SearchArgs, function=function, summary="", returns="", example="", order=99))
    assert "fresh" not in registry.names()


def test_every_catalog_tool_is_registered_in_page_order():
    assert registry.names() == ("search", "read", "extract", "submit", "abstain")
    assert registry.research_tools() == {"search", "read", "extract"} and registry.ending_tools() == {"submit", "abstain"}
