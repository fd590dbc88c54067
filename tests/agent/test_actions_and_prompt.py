"""Action parsing and the observation text the policy is shown."""

import pytest

from agent.actions import extract_code
from agent.prompt import CUT_MARKER, EMPTY_OBSERVATION, cut, observation, system_prompt
from tools.page import tool_page
from tools.sandbox import ActionResult


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
    from tools.page import tool_page

    prompt = system_prompt()
    for instruction in ("cite the paragraphs", "abstain when", "python block", "(paper_id, section, paragraph) numbers"):
        assert prompt.count(instruction) == 1, instruction
    assert tool_page().startswith("search(") and "abstain when the papers" not in tool_page()


def test_the_template_hash_covers_the_prompt_file(tmp_path, monkeypatch):
    import agent.prompt as prompt

    before = prompt.prompt_template_sha256()
    edited = tmp_path / "prompts.toml"
    edited.write_bytes(prompt.PROMPTS_FILE.read_bytes().replace(b"research assistant", b"research agent"))
    monkeypatch.setattr(prompt, "PROMPTS_FILE", edited)
    assert prompt.prompt_template_sha256() != before
