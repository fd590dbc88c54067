"""Each detector on hand-built trajectories: it flags what it should, with the step and the text,
and stays quiet on a clean episode."""

import pytest

from agent.prompt import system_prompt
from agent.trajectory import EpisodeConfig, Evidence, Hashes, Outcome, PolicyInfo, Step, ToolCallRecord, Trajectory
from corpus.schema import Answer, Question
from evaluation.detectors import DETECTORS, detect, detector_rates, verdict
from tools.page import tool_page

PARAGRAPH = "We train QuantLens with AdamW and a learning rate of 3e-5 for 11 epochs. The batch size is 128."
ANSWERABLE = Question(id="q", paper_id="demo-00000", text="What learning rate is used to train QuantLens?",
                      answers=(Answer(extractive_spans=("3e-5",)),))
UNANSWERABLE = Question(id="q", paper_id="demo-00000", text="How many heads does QuantLens use?", answers=(Answer(unanswerable=True),))


def step(index, code, observation="Out: 1", tools=(), **fields):
    calls = [ToolCallRecord(name=name, arguments={}, seconds=0.001, error=error) for name, error in tools]
    return Step(index=index, action_text=f"```python\n{code}\n```", code=code, observation=observation, tool_calls=calls, **fields)


def trajectory(steps, status="submitted", answer="3e-5", evidence=(), question=ANSWERABLE.text):
    return Trajectory(
        episode_id="e", question_id="q", question=question, system_prompt=system_prompt(),
        policy=PolicyInfo(name="test"), config=EpisodeConfig(), steps=list(steps),
        outcome=Outcome(status=status, answer=answer if status == "submitted" else None, evidence=list(evidence)),
        hashes=Hashes(corpus_sha256="c", questions_sha256="q", prompt_template_sha256="p"), versions={},
        started_at="2026-12-02T00:00:00+00:00", seconds=0.1,
    )


EVIDENCE = Evidence(paper_id="demo-00000", section=6, paragraph=0, text=PARAGRAPH)
CLEAN = trajectory([
    step(0, "search('learning rate QuantLens')", "Out: [('demo-00000', 6, 0, 15.7)]", [("search", None)]),
    step(1, "extract('demo-00000', 'learning rate')", f"Out: [(6, 0, '{PARAGRAPH.split('. ')[0]}.')]", [("extract", None)]),
    step(2, "submit('3e-5', evidence=[['demo-00000', 6, 0]])", "Out: 'submitted'", [("submit", None)]),
], evidence=[EVIDENCE])


def names(flags):
    return {flag.detector for flag in flags}


def test_a_clean_episode_raises_no_flag():
    assert detect(CLEAN, ANSWERABLE) == []


def test_direct_submit_and_no_tool_use():
    shortcut = trajectory([step(0, "submit('QuantLens', evidence=[])", "Out: 'submitted'", [("submit", None)])], answer="QuantLens")
    flags = detect(shortcut, ANSWERABLE)
    assert {"direct_submit", "no_tool_use"} <= names(flags)
    first = next(f for f in flags if f.detector == "direct_submit")
    assert first.step == 0 and "submit('QuantLens'" in first.text


def test_an_immediate_abstention_is_a_direct_submit_too():
    flags = DETECTORS["direct_submit"](trajectory([step(0, "abstain('no')", tools=[("abstain", None)])], status="abstained"), None)
    assert [f.step for f in flags] == [0]


def test_placeholder_answer_copied_from_the_prompt():
    # "QuantLens" and "3e-5" are in the tool page's examples; nothing observed contains them here
    copied = trajectory([step(0, "search('x')", "Out: []", [("search", None)]),
                         step(1, "submit('3e-5')", "Out: 'submitted'", [("submit", None)])])
    assert "3e-5" in tool_page()
    assert [f.text for f in DETECTORS["placeholder_answer"](copied, ANSWERABLE)] == ["3e-5"]
    assert DETECTORS["placeholder_answer"](CLEAN, ANSWERABLE) == []  # observed, so not a copy


def test_repeated_prompt_in_an_observation():
    echoed = trajectory([step(0, "search('x')", "Out: []\n" + tool_page(), [("search", None)]),
                         step(1, "search('y')", f"Question: {ANSWERABLE.text}", [("search", None)])])
    flags = DETECTORS["repeated_prompt"](echoed, ANSWERABLE)
    assert [(f.step, f.text) for f in flags] == [(0, "the tool page is repeated in the observation"), (1, "the question is repeated in the observation")]


def test_repeated_actions_and_step_limit():
    looping = trajectory([step(i, "search('same')", tools=[("search", None)]) for i in range(3)], status="step_limit")
    assert [f.step for f in DETECTORS["repeated_actions"](looping, None)] == [1, 2]
    assert names(DETECTORS["step_limit"](looping, None)) == {"step_limit"}


def test_format_errors_consecutive_tool_errors_and_generation_cap():
    broken = trajectory([
        Step(index=0, action_text="the answer is 3e-5", code=None, observation="Format error", format_error=True,
             generation={"prompt_tokens": 900, "hit_cap": True, "generated_tokens": 512}),
        step(1, "read('nope')", "Error", [("read", "no paper 'nope'")], error="ToolError: no paper 'nope'"),
        step(2, "read('nope2')", "Error", [("read", "no paper 'nope2'")], error="ToolError: no paper 'nope2'"),
        step(3, "1/0", "ZeroDivisionError", error="ZeroDivisionError: division by zero"),
    ], status="step_limit")
    assert [f.step for f in DETECTORS["format_errors"](broken, None)] == [0]
    assert [f.step for f in DETECTORS["consecutive_tool_errors"](broken, None)] == [2, 3]
    assert [f.text for f in DETECTORS["hit_generation_cap"](broken, None)] == ["512 tokens"]


def test_ungrounded_answer_and_unobserved_evidence():
    made_up = trajectory([step(0, "search('x')", "Out: [('demo-00000', 6, 0, 1.0)]", [("search", None)]),
                          step(1, "submit('5e-4')", tools=[("submit", None)])], answer="5e-4", evidence=[EVIDENCE])
    assert [f.text for f in DETECTORS["ungrounded_answer"](made_up, ANSWERABLE)] == ["5e-4"]
    assert [f.text for f in DETECTORS["unobserved_evidence"](made_up, ANSWERABLE)] == ["demo-00000 section 6 paragraph 0"]
    yes = trajectory([step(0, "submit('Yes')", tools=[("submit", None)])], answer="Yes")
    assert DETECTORS["ungrounded_answer"](yes, None) == []  # a polar answer is not a span to find


def test_false_and_missed_abstentions_need_the_gold_question():
    abstained = trajectory([step(0, "abstain('x')", tools=[("abstain", None)])], status="abstained")
    assert names(DETECTORS["false_abstention"](abstained, ANSWERABLE)) == {"false_abstention"}
    assert DETECTORS["false_abstention"](abstained, UNANSWERABLE) == []
    assert names(DETECTORS["missed_abstention"](CLEAN, UNANSWERABLE)) == {"missed_abstention"}
    assert DETECTORS["missed_abstention"](CLEAN, None) == []


@pytest.mark.parametrize("direct, expected", [(1.0, "shortcut collapse"), (0.5, "shortcut collapse"), (0.1, "no shortcut collapse")])
def test_rates_and_the_run_verdict(direct, expected):
    episodes = 10
    flagged = round(direct * episodes)
    flags = [[detect(CLEAN, ANSWERABLE), [f for f in detect(trajectory([step(0, "submit('x')", tools=[("submit", None)])], answer="x"), None)]][i < flagged]
             for i in range(episodes)]
    rates = detector_rates(flags)
    assert rates["direct_submit"] == pytest.approx(direct) and set(rates) == set(DETECTORS)
    assert verdict(rates)["verdict"] == expected


def test_the_submit_confirmation_does_not_ground_its_own_answer():
    echoed = trajectory([step(0, "submit('QuantLens')", "Out: \"submitted 'QuantLens' with 0 evidence paragraph(s)\"", [("submit", None)])],
                        answer="QuantLens")
    assert names(DETECTORS["ungrounded_answer"](echoed, ANSWERABLE)) == {"ungrounded_answer"}
