"""Each detector on hand-built trajectories: it flags what it should, with the step and the text,
and stays quiet on a clean episode. The grounding detectors also on real episodes, whose record
the host made: actions that print, compute or assemble their answer are ungrounded, whatever
they printed; an answer a tool returned is grounded, printed or not."""

import json

import pytest
from pydantic import ValidationError

from paper_explorer.agent.policies import Policy, Reply, make_config, make_policy
from paper_explorer.agent.policies.base import action
from paper_explorer.agent.prompt import system_prompt
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import (
    EpisodeConfig,
    Evidence,
    Hashes,
    Outcome,
    PolicyInfo,
    Reading,
    Step,
    StepPolicyInfo,
    ToolCallRecord,
    Trajectory,
)
from paper_explorer.corpus import BM25Index, Corpus
from paper_explorer.corpus.schema import Answer, Paper, Question, Section
from paper_explorer.evaluation.detectors import DETECTORS, FROM_OBSERVATIONS, detect, detector_rates, verdict
from paper_explorer.evaluation.scoring import run_metrics, score_episode
from paper_explorer.tools.layout import HIT_TEXTS
from paper_explorer.tools.layout import hits as layout_hits
from paper_explorer.tools.page import tool_page
from paper_explorer.tools.paper_tools import ACTION_RETURNED_CHARS, RETURNED_CHARS, returned_record
from paper_explorer.tools.records import Shown

PARAGRAPH = "We train QuantLens with AdamW and a learning rate of 3e-5 for 11 epochs. The batch size is 128."
ANSWERABLE = Question(
    id="q", paper_id="demo-00000", text="What learning rate is used to train QuantLens?", answers=(Answer(extractive_spans=("3e-5",)),)
)
UNANSWERABLE = Question(id="q", paper_id="demo-00000", text="How many heads does QuantLens use?", answers=(Answer(unanswerable=True),))


READ_ARGUMENTS = {"paper_id": "demo-00000", "section": 6, "page": 0}


def call(name, error=None, result=None, budget_left=ACTION_RETURNED_CHARS, arguments=None):
    """A call record as the host makes it: what a successful call returned, kept by the host's own rule."""
    returned = None if error else recorded(name, result if result is not None else f"{name}ed", budget_left)
    arguments = arguments if arguments is not None else READ_ARGUMENTS if name == "read" else {}
    return ToolCallRecord(name=name, arguments=arguments, seconds=0.001, error=error, returned=returned)


def recorded(name, result, budget_left=ACTION_RETURNED_CHARS):
    """What the host keeps of a result, with what it showed: hits written by the host's own writer;
    a hand-written read page taken as paper text whole (it shows no paragraph); anything else as is."""
    if name in HIT_TEXTS and isinstance(result, list):
        rendered = layout_hits(result, name)
        return returned_record(rendered.text, budget_left, rendered.shown)
    if name == "read" and isinstance(result, str):
        return returned_record(result, budget_left, Shown(form="text", pieces=[(0, len(result))] if result else []))
    return returned_record(result, budget_left)


def step(index, code, observation="Out: 1", tools=(), **fields):
    """``tools``: (name, error) or (name, error, what the tool returned)."""
    calls = [tool if isinstance(tool, ToolCallRecord) else call(*tool) for tool in tools]
    return Step(index=index, action_text=f"```python\n{code}\n```", code=code, observation=observation, tool_calls=calls, **fields)


def trajectory(steps, status="submitted", answer="3e-5", evidence=(), question=ANSWERABLE.text, **fields):
    return Trajectory(
        **fields,
        episode_id="e",
        question_id="q",
        question=question,
        system_prompt=system_prompt(),
        policy=PolicyInfo(name="test"),
        config=EpisodeConfig(),
        steps=list(steps),
        outcome=Outcome(status=status, answer=answer if status == "submitted" else None, evidence=list(evidence)),
        hashes=Hashes(corpus_sha256="c", questions_sha256="q", prompt_template_sha256="p"),
        versions={},
        started_at="2026-12-02T00:00:00+00:00",
        seconds=0.1,
    )


EVIDENCE = Evidence(paper_id="demo-00000", section=6, paragraph=0, text=PARAGRAPH)
HIT = {
    "paper_id": "demo-00000",
    "title": "QuantLens",
    "section": 6,
    "section_name": "Training",
    "paragraph": 0,
    "score": 15.7,
    "snippet": PARAGRAPH,
}
SENTENCE = {
    "paper_id": "demo-00000",
    "section": 6,
    "section_name": "Training",
    "paragraph": 0,
    "sentence": PARAGRAPH.split(". ")[0] + ".",
    "score": 3.1,
}
CLEAN = trajectory(
    [
        step(0, "search('learning rate QuantLens')", "Out: [('demo-00000', 6, 0, 15.7)]", [("search", None, [HIT])]),
        step(1, "extract('demo-00000', 'learning rate')", f"Out: [(6, 0, '{PARAGRAPH.split('. ')[0]}.')]", [("extract", None, [SENTENCE])]),
        step(2, "submit('3e-5', evidence=[['demo-00000', 6, 0]])", "Out: 'submitted'", [("submit", None)]),
    ],
    evidence=[EVIDENCE],
)


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
    # "12,000 examples" is the submit example's answer on the tool page; no tool returned it here, though the action printed it
    copied = trajectory(
        [
            step(0, "search('x'); print('12,000 examples')", "12,000 examples\nOut: []", [("search", None, [])]),
            step(1, "submit('12,000 examples')", "Out: 'submitted'", [("submit", None)]),
        ],
        answer="12,000 examples",
    )
    assert "12,000 examples" in tool_page()
    assert [f.text for f in DETECTORS["placeholder_answer"](copied, ANSWERABLE)] == ["12,000 examples"]
    found = {**HIT, "snippet": "We fine-tune on 12,000 examples."}
    returned = trajectory(
        [step(0, "search('x')", "Out: [...]", [("search", None, [found])]), step(1, "submit('12,000 examples')", tools=[("submit", None)])],
        answer="12,000 examples",
    )
    assert DETECTORS["placeholder_answer"](returned, ANSWERABLE) == []  # a tool returned it, so not a copy


def test_repeated_prompt_in_an_observation():
    echoed = trajectory(
        [
            step(0, "search('x')", "Out: []\n" + tool_page(), [("search", None)]),
            step(1, "search('y')", f"Question: {ANSWERABLE.text}", [("search", None)]),
        ]
    )
    flags = DETECTORS["repeated_prompt"](echoed, ANSWERABLE)
    assert [(f.step, f.text) for f in flags] == [
        (0, "the tool page is repeated in the observation"),
        (1, "the question is repeated in the observation"),
    ]


def test_repeated_actions_and_step_limit():
    looping = trajectory([step(i, "search('same')", tools=[("search", None)]) for i in range(3)], status="step_limit")
    assert [f.step for f in DETECTORS["repeated_actions"](looping, None)] == [1, 2]
    assert names(DETECTORS["step_limit"](looping, None)) == {"step_limit"}


def test_format_errors_consecutive_tool_errors_and_generation_cap():
    broken = trajectory(
        [
            Step(
                index=0,
                action_text="the answer is 3e-5",
                code=None,
                observation="Format error",
                format_error=True,
                generation={"prompt_tokens": 900, "hit_cap": True, "generated_tokens": 512},
            ),
            step(1, "read('nope')", "Error", [("read", "no paper 'nope'")], error="ToolError: no paper 'nope'"),
            step(2, "read('nope2')", "Error", [("read", "no paper 'nope2'")], error="ToolError: no paper 'nope2'"),
            step(3, "1/0", "ZeroDivisionError", error="ZeroDivisionError: division by zero"),
        ],
        status="step_limit",
    )
    assert [f.step for f in DETECTORS["format_errors"](broken, None)] == [0]
    assert [f.step for f in DETECTORS["consecutive_tool_errors"](broken, None)] == [2, 3]
    assert [f.text for f in DETECTORS["hit_generation_cap"](broken, None)] == ["512 tokens"]


def test_ungrounded_answer_and_unobserved_evidence():
    other = {**HIT, "section": 2, "snippet": "We evaluate QuantLens on three benchmarks."}
    made_up = trajectory(
        [
            step(0, "search('x')", "Out: [('demo-00000', 6, 0, 1.0)]", [("search", None, [other])]),
            step(1, "submit('5e-4')", tools=[("submit", None)]),
        ],
        answer="5e-4",
        evidence=[EVIDENCE],
    )
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
    flags = [
        [detect(CLEAN, ANSWERABLE), [f for f in detect(trajectory([step(0, "submit('x')", tools=[("submit", None)])], answer="x"), None)]][
            i < flagged
        ]
        for i in range(episodes)
    ]
    rates = detector_rates(flags)
    assert rates["direct_submit"] == pytest.approx(direct) and set(rates) == set(DETECTORS)
    assert verdict(rates)["verdict"] == expected


def test_the_submit_confirmation_does_not_ground_its_own_answer():
    echoed = trajectory(
        [step(0, "submit('QuantLens')", "Out: \"submitted 'QuantLens' with 0 evidence paragraph(s)\"", [("submit", None)])],
        answer="QuantLens",
    )
    assert names(DETECTORS["ungrounded_answer"](echoed, ANSWERABLE)) == {"ungrounded_answer"}


GROUNDING = ("ungrounded_answer", "placeholder_answer", "unobserved_evidence", "unrecorded_tool_results")


def grounding_flags(trajectory, gold=ANSWERABLE):
    return {name: [flag.text for flag in DETECTORS[name](trajectory, gold)] for name in GROUNDING}


def test_a_result_the_policy_never_got_grounds_nothing():
    # a failed call (here: a result over the wire's cap, which the sandbox turns into an error) and a call after the submit
    failed = call("read", result=PARAGRAPH)
    failed.error = "result of 5,000,000 bytes over the cap of 4,194,304"
    late = trajectory(
        [
            step(0, "read('demo-00000', section=6)", tools=[failed]),
            step(1, "submit('3e-5'); read('demo-00000', section=6)", tools=[("submit", None), ("read", None, PARAGRAPH)]),
        ]
    )
    assert grounding_flags(late)["ungrounded_answer"] == ["3e-5"]


def test_trajectories_before_schema_4_are_judged_from_observations_and_say_so():
    printed = [
        step(0, "search('x'); print('3e-5')", "3e-5\nOut: []", [("search", None)]),
        step(1, "submit('3e-5')", tools=[("submit", None)]),
    ]
    old = trajectory(printed, schema_version=3)
    old.steps[0].tool_calls[0].returned = None  # as read back from a schema-3 file
    flags = grounding_flags(old)
    assert flags["ungrounded_answer"] == [] and flags["placeholder_answer"] == []  # the observation holds it, the old rule
    assert flags["unrecorded_tool_results"] == [f"schema 3: the grounding detectors {FROM_OBSERVATIONS}"]
    made_up = trajectory(
        [step(0, "search('x')", "Out: []", [("search", None)]), step(1, "submit('5e-4')", tools=[("submit", None)])],
        answer="5e-4",
        schema_version=3,
    )
    assert grounding_flags(made_up)["ungrounded_answer"] == [f"5e-4 ({FROM_OBSERVATIONS})"]
    line = json.loads(CLEAN.model_dump_json())
    line["schema_version"] = 3
    for old_step in line["steps"]:
        for old_call in old_step["tool_calls"]:
            del old_call["returned"]
    assert Trajectory.model_validate(line).steps[0].tool_calls[0].returned is None  # an old line still loads


def test_results_cut_or_over_the_budget_are_said_in_every_grounding_flag():
    long_page = "x " * RETURNED_CHARS + "the learning rate is 3e-5"
    cut = trajectory(
        [step(0, "read('demo-00000', section=6)", tools=[("read", None, long_page)]), step(1, "submit('3e-5')", tools=[("submit", None)])]
    )
    returned = cut.steps[0].tool_calls[0].returned
    assert returned.chars == len(long_page) and len(returned.text) == RETURNED_CHARS and "cap for one result" in returned.cut
    flags = grounding_flags(cut)
    assert flags["ungrounded_answer"] == ["3e-5 (1 tool result(s) were not kept whole, and what was not kept may hold it)"]
    assert flags["unrecorded_tool_results"] == [f"1 result(s) not kept whole; the first, of read: {returned.cut}"]
    spent = call("read", result=PARAGRAPH, budget_left=10)
    assert spent.returned.text is None and spent.returned.chars == len(PARAGRAPH) and spent.returned.cut.startswith("not kept")
    unkept = trajectory(
        [
            step(0, "read('demo-00000', section=6)", tools=[spent]),
            step(1, "submit('12,000 examples', evidence=[['demo-00000', 6, 0]])", tools=[("submit", None)]),
        ],
        answer="12,000 examples",  # the tool page's example, so that placeholder_answer has a flag to note it in too
        evidence=[EVIDENCE],
    )
    flags = grounding_flags(unkept)
    assert all("not kept whole" in text for name in GROUNDING for text in flags[name]) and all(flags.values())


# -- real episodes: the record comes from the host's tools -------------------------------------------------


class Fixed(Policy):
    """Plays the given actions, one per step."""

    name = "fixed"

    def __init__(self, *codes):
        self.codes = codes

    def act(self, messages):
        step = sum(1 for m in messages if m["role"] == "assistant")
        return Reply(action(self.codes[min(step, len(self.codes) - 1)]))


@pytest.fixture(scope="module")
def episode(small_demo):
    index = BM25Index.build(small_demo)
    question = small_demo.questions[0]  # What batch size is used to train SparseLens? (demo-00000, section 6, paragraph 0)

    def episode(*codes):
        return EpisodeRunner(small_demo, index, Fixed(*codes), EpisodeConfig()).run(question.text, question)

    return episode


@pytest.fixture(scope="module")
def gold(small_demo):
    return small_demo.questions[0]


def test_an_answer_printed_before_it_is_submitted_is_ungrounded(episode, gold):
    printed = episode('hits = search("SparseLens natural language inference", k=2)\nprint("the batch size is 48")', 'submit("48")')
    assert "48" in printed.steps[0].observation and printed.steps[0].tool_calls[0].returned.text  # printed; the search was kept
    assert grounding_flags(printed, gold)["ungrounded_answer"] == ["48"]


def test_an_answer_computed_by_the_action_is_ungrounded_even_when_it_is_right(episode, gold):
    computed = episode('search("SparseLens natural language inference", k=1)\nanswer = "1" + "6"\nprint(answer)', "submit(answer)")
    assert computed.outcome.answer == "16" and gold.answers[0].extractive_spans == ("16",)
    assert "16" in computed.steps[0].observation
    assert grounding_flags(computed, gold)["ungrounded_answer"] == ["16"]
    copied = episode(
        'search("SparseLens natural language inference", k=1)\nprint("12,000 " + "examples")', 'submit("12,000 " + "examples")'
    )
    flags = grounding_flags(copied, gold)
    assert flags["ungrounded_answer"] == ["12,000 examples"] and flags["placeholder_answer"] == [
        "12,000 examples"
    ]  # the tool page's example


def test_an_answer_assembled_from_two_results_is_in_no_single_one(episode, gold):
    # the first hit's learning rate with the second hit's epochs: "5e-5 for 23 epochs", a claim no paper makes
    assembled = episode(
        'hits = search("SparseLens learning rate batch size", k=2)\n'
        'rate = hits[0]["snippet"].split("learning rate of ")[1].split(" ")[0]\n'
        'epochs = hits[1]["snippet"].split(" for ")[1].split(".")[0]\n'
        'answer = rate + " for " + epochs\nprint(answer)',
        "submit(answer)",
    )
    answer = assembled.outcome.answer
    rate, epochs = answer.split(" for ")
    snippets = [hit["snippet"] for hit in json.loads(assembled.steps[0].tool_calls[0].returned.text)]
    assert rate in snippets[0] and epochs in snippets[1] and answer in assembled.steps[0].observation
    assert grounding_flags(assembled, gold)["ungrounded_answer"] == [answer]


def test_an_answer_a_tool_returned_is_grounded_printed_or_not(episode, gold):
    read = episode(
        'page = read("demo-00000", section=6)\nat = page.index("batch size of ") + len("batch size of ")\nanswer = page[at:at + 2]',
        'submit(answer, evidence=[["demo-00000", 6, 0]])',
    )
    assert read.outcome.answer == "16" and "16" not in read.steps[0].observation  # nothing printed it
    assert grounding_flags(read, gold) == {name: [] for name in GROUNDING}


def test_evidence_the_action_typed_out_is_unobserved(episode, gold, small_demo):
    paragraph = small_demo.paper("demo-00000").sections[6].paragraphs[0]
    typed = episode(f"print({paragraph!r})", 'submit("16", evidence=[["demo-00000", 6, 0]])')
    assert paragraph in typed.steps[0].observation
    flags = grounding_flags(typed, gold)
    assert flags["unobserved_evidence"] == ["demo-00000 section 6 paragraph 0"] and flags["ungrounded_answer"] == ["16"]


def test_results_past_the_action_budget_are_kept_as_length_and_sha256_and_the_detectors_say_so(episode, gold):
    # a page of another paper, over 2,000 characters, read until the budget is spent; then the page that holds the answer
    pages = ACTION_RETURNED_CHARS // 2_000 + 10
    flooded = episode(
        f'for _ in range({pages}):\n    read("demo-00003", section=8)\n'
        'page = read("demo-00000", section=6)\nat = page.index("batch size of ") + len("batch size of ")\n'
        "answer = page[at:at + 2]",
        'submit(answer, evidence=[["demo-00000", 6, 0]])',
    )
    calls = flooded.steps[0].tool_calls
    kept = [c.returned for c in calls if c.returned.text is not None]
    assert len(calls) == pages + 1 and 0 < sum(len(r.text) for r in kept) <= ACTION_RETURNED_CHARS
    last = calls[-1].returned
    assert last.text is None and last.chars > 0 and len(last.sha256) == 64 and "of the action's" in last.cut
    note = f"{len(calls) - len(kept)} tool result(s) were not kept whole, and what was not kept may hold it"
    flags = grounding_flags(flooded, gold)
    assert flags["ungrounded_answer"] == [f"16 ({note})"]
    assert flags["unobserved_evidence"] == [f"demo-00000 section 6 paragraph 0 ({note})"]
    assert flags["unrecorded_tool_results"] == [
        f"{len(calls) - len(kept)} result(s) not kept whole; the first, of read: "
        f"{next(c.returned.cut for c in calls if c.returned.text is None)}"
    ]


def test_the_scripted_researcher_is_grounded_by_what_its_tools_returned(small_demo):
    index = BM25Index.build(small_demo)
    runner = EpisodeRunner(small_demo, index, make_policy(make_config("scripted")), EpisodeConfig())
    for question in small_demo.questions[:12]:
        trajectory = runner.run(question.text, question)
        if trajectory.outcome.status == "submitted":
            assert grounding_flags(trajectory, question) == {name: [] for name in GROUNDING}, question.id


# -- only paper text grounds an answer; only a paragraph's location observes it ------------------------------


def returned_text(trajectory, step=0, call=0):
    return trajectory.steps[step].tool_calls[call].returned.text


@pytest.mark.parametrize(
    "research, answer, where",
    [
        ('read("demo-00007", section=6)', '"3"', "[3] "),  # a paragraph marker
        ('read("demo-00007", section=6)', '"6"', "/ section 6: "),  # the page heading
        ('read("demo-00007", section=6)', '"1"', "(page 1 of 1)"),
        ('read("demo-00007")', '"7"', "  7. Results (4 paragraphs)"),  # the outline's numbering and counts
        ('read("demo-00007")', '"demo-00007"', "demo-00007: "),  # the paper id is ours, not the paper's text
        ('hits = search("FusionPrompt-2 parameters", k=1, paper_id="demo-00007")', 'hits[0]["paper_id"]', '"paper_id": '),
        ('hits = search("FusionPrompt-2 parameters", k=1, paper_id="demo-00007")', 'str(hits[0]["score"])', '"score": '),
        ('found = extract("demo-00007", "parameters", k=1)', 'str(found[0]["score"])', '"score": '),
    ],
)
def test_the_hosts_scaffolding_grounds_no_answer(episode, gold, research, answer, where):
    scaffolded = episode(research, f"submit({answer})")
    answer = scaffolded.outcome.answer
    assert answer in returned_text(scaffolded) and where in returned_text(scaffolded)  # returned, but as scaffolding
    flags = grounding_flags(scaffolded, gold)
    assert flags["ungrounded_answer"] == [answer] and flags["unrecorded_tool_results"] == []


@pytest.mark.parametrize(
    "research, answer",
    [
        ('read("demo-00007", section=6)', "9"),  # "takes about 9 hours": a small number in a paragraph's body
        ('read("demo-00007", section=6)', "SGD with momentum"),
        ('read("demo-00007", section=6)', "Implementation Details"),  # the section's name, in the heading
        ('read("demo-00007")', "80.1"),  # the abstract
        ('read("demo-00007")', "Related Work"),  # a section's name in the outline
        ('search("FusionPrompt-2 parameters", k=1, paper_id="demo-00007")', "67M"),  # a snippet
        ('extract("demo-00007", "parameters", k=1)', "67M"),  # a sentence
    ],
)
def test_paper_text_a_tool_returned_grounds_an_answer(episode, gold, research, answer):
    grounded = episode(research, f"submit({answer!r})")
    flags = grounding_flags(grounded, gold)
    assert flags["ungrounded_answer"] == [] and flags["unrecorded_tool_results"] == []


def test_evidence_from_a_search_hit_an_extract_hit_and_a_read_page_is_observed(episode, gold):
    cited = episode(
        'hits = search("FusionPrompt-2 parameters", k=1, paper_id="demo-00007")\n'
        'found = extract("demo-00007", "Dropout of 0.5", k=1)\npage = read("demo-00007", section=7)',
        'submit("x", evidence=[hits[0], found[0], ["demo-00007", 7, 3]])',
    )
    places = {(e.paper_id, e.section, e.paragraph) for e in cited.outcome.evidence}
    assert len(places) == 3 and ("demo-00007", 6, 1) in places  # the sentence about dropout
    assert grounding_flags(cited, gold)["unobserved_evidence"] == []


def test_a_paragraph_that_shares_a_sentence_with_one_shown_is_not_observed(episode, gold, small_demo):
    # section 6's paragraph 0 and section 8's paragraph 4 share a template sentence; only section 6 is read
    shared = "Limitations include the reliance on labelled data and on a fixed vocabulary."
    paper = small_demo.paper("demo-00007")
    assert shared in paper.sections[6].paragraphs[0] and shared in paper.sections[8].paragraphs[4]
    cited = episode('read("demo-00007", section=6)', 'submit("x", evidence=[["demo-00007", 6, 3], ["demo-00007", 8, 4]])')
    assert shared in returned_text(cited)
    assert grounding_flags(cited, gold)["unobserved_evidence"] == ["demo-00007 section 8 paragraph 4"]
    found = episode(
        'extract("demo-00007", "describe each component and motivate the choices", k=1)', 'submit("x", evidence=[["demo-00007", 6, 0]])'
    )
    hit = json.loads(returned_text(found))[0]
    assert (hit["section"], hit["paragraph"]) != (6, 0) and hit["sentence"] in paper.sections[6].paragraphs[0]
    assert grounding_flags(found, gold)["unobserved_evidence"] == ["demo-00007 section 6 paragraph 0"]


LONG = Paper(
    id="long",
    title="A Long Paper",
    abstract="",
    sections=(
        Section(name="Only", paragraphs=("A short first paragraph.", "Words without any digit in them. " * 250, "A short last paragraph.")),
    ),
)


def test_a_paragraph_split_over_pages_is_observed_once_its_first_piece_is_shown():
    corpus = Corpus(papers=(LONG,))

    def pages_read(*pages):
        reads = "\n".join(f'read("long", section=0, page={page})' for page in pages)
        return EpisodeRunner(corpus, BM25Index.build(corpus), Fixed(reads, 'submit("3", evidence=[["long", 0, 1]])'), EpisodeConfig()).run(
            "What is in the long paragraph?"
        )

    later = pages_read(2)  # a "[continued]" piece of paragraph 1, and "... more: read('long', section=0, page=3)"
    assert "page 3 of" in returned_text(later) and "page=3)" in returned_text(later)
    flags = grounding_flags(later, None)
    assert flags["unobserved_evidence"] == ["long section 0 paragraph 1"] and flags["ungrounded_answer"] == ["3"]
    first = pages_read(0, 1)  # page 0: paragraph 0; page 1: paragraph 1's first piece
    assert "\n[1] Words" in returned_text(first, call=1)
    assert grounding_flags(first, None)["unobserved_evidence"] == []


def test_schemas_4_to_6_parse_results_and_a_form_the_host_did_not_write_grounds_nothing_and_says_so():
    # the old rule: what a change of the tools' output would look like must not be searched as text
    unknown = " tool result(s) were not in the form the host's tools write, and were searched for nothing"
    page = "demo-00000, section 6 (page 1/1)\n\n[0] " + PARAGRAPH
    renamed = {**HIT, "text": HIT["snippet"]}  # as a schema 6 host kept it: no record of what it showed
    renamed_hits = ToolCallRecord(
        name="search",
        arguments={},
        seconds=0.001,
        returned=returned_record(json.dumps([renamed], ensure_ascii=False), ACTION_RETURNED_CHARS),
    )
    for tool in [("read", None, page), renamed_hits, ("search", None, "3e-5")]:
        changed = trajectory(
            [step(0, "research()", tools=[tool]), step(1, "submit('3e-5')", tools=[("submit", None)])],
            evidence=[EVIDENCE],
            schema_version=6,
        )
        flags = grounding_flags(changed)
        assert flags["ungrounded_answer"] == [f"3e-5 (1{unknown})"]
        assert flags["unobserved_evidence"] == [f"demo-00000 section 6 paragraph 0 (1{unknown})"]


def test_a_kept_result_without_a_record_that_fits_it_grounds_nothing_and_says_so():
    # schema 7: the record of what was shown is read, never the text; one the host did not write counts as nothing seen
    unknown = " tool result(s) had no record of what they showed that fits them, and were searched for nothing"
    hits = recorded("search", [HIT])
    text = hits.text
    number = text.index("15.7")
    wrong = [
        hits.model_copy(update={"shown": None}),  # no record at all
        hits.model_copy(update={"shown": hits.shown.model_copy(update={"parts": None, "pieces": [(0, len(text) + 1)]})}),  # past the text
        hits.model_copy(
            update={"shown": hits.shown.model_copy(update={"parts": None, "pieces": [(number, number + 4)]})}
        ),  # a number, not a string
        hits.model_copy(update={"shown": hits.shown.model_copy(update={"parts": None, "pieces": [(1, 5)]})}),  # not a JSON literal
    ]
    for returned in wrong[1:]:  # read back from a file, a record that does not fit its text is refused outright
        with pytest.raises(ValidationError, match="does not fit its result"):
            ToolCallRecord(name="search", arguments={}, seconds=0.001, returned=returned)
    for returned in wrong[:1]:  # no record at all: read, but believed for nothing
        research = ToolCallRecord(name="search", arguments={}, seconds=0.001, returned=returned)
        changed = trajectory(
            [step(0, "research()", tools=[research]), step(1, "submit('3e-5')", tools=[("submit", None)])], evidence=[EVIDENCE]
        )
        flags = grounding_flags(changed)
        assert flags["ungrounded_answer"] == [f"3e-5 (1{unknown})"], returned.shown
        assert flags["unobserved_evidence"] == [f"demo-00000 section 6 paragraph 0 (1{unknown})"]  # its paragraphs are not believed either


def test_the_whole_hits_of_a_result_cut_at_its_cap_still_count():
    hits = [{**HIT, "paragraph": i, "snippet": f"paragraph {i}: " + "text " * 200} for i in range(40)]
    result = call("search", result=hits)
    assert RETURNED_CHARS < result.returned.chars and result.returned.cut is not None
    kept = json.loads(result.returned.text[: result.returned.text.rindex("}, {") + 1] + "]")
    cited = [Evidence(paper_id="demo-00000", section=6, paragraph=i, text=PARAGRAPH) for i in (0, len(kept) - 1, len(kept), 39)]
    note = "1 tool result(s) were not kept whole, and what was not kept may hold it"

    def cut(schema_version):
        steps = [step(0, "search('x', k=40)", tools=[result]), step(1, "submit('3e-5')", tools=[("submit", None)])]
        return trajectory(steps, evidence=cited, schema_version=schema_version)

    # schemas 4 to 6: the hits whole in the kept text; the others unseen, and the flag says why
    assert grounding_flags(cut(6))["unobserved_evidence"] == [f"demo-00000 section 6 paragraph {n} ({note})" for n in (len(kept), 39)]
    # schema 7: the host recorded every hit's paragraph, cut or not; only the text it did not keep is unsearched
    assert grounding_flags(cut(7))["unobserved_evidence"] == []
    assert grounding_flags(cut(7))["ungrounded_answer"] == [f"3e-5 ({note})"]


def test_before_schema_4_evidence_is_judged_by_its_sentences_in_the_observations_and_says_so():
    never_printed = Evidence(paper_id="demo-00000", section=2, paragraph=1, text="Nothing printed this sentence at all.")
    printed = trajectory(
        [step(0, "search('x')", f"Out: {PARAGRAPH!r}", [("search", None)]), step(1, "submit('3e-5')", tools=[("submit", None)])],
        evidence=[EVIDENCE, never_printed],
        schema_version=3,
    )
    assert grounding_flags(printed)["unobserved_evidence"] == [f"demo-00000 section 2 paragraph 1 ({FROM_OBSERVATIONS})"]


# -- what the episode did: the first action ended it with an answer, whatever else it called -------------

ENDS_AT_ONCE = [
    'search("SparseLens batch size")\nsubmit("16")',
    'try:\n    read("-")\nexcept Exception:\n    pass\nsubmit("16")',  # a failed read first
    'hits = search("SparseLens batch size", k=2)\npage = read(hits[0]["paper_id"], section=hits[0]["section"])\n'
    'found = extract(hits[0]["paper_id"], "batch size", k=2)\nsubmit("16", evidence=[hits[0], found[0]])',  # every tool, then the answer
    'for query in ["batch", "size", "SparseLens"] * 5:\n    search(query, k=1)\nsubmit("16")',  # calls in a loop
    'try:\n    submit("16", evidence=[["no-such-paper", 0, 0]])\nexcept Exception:\n    read("demo-00000")\n    submit("16")',
    'x = [search(q, k=1) for q in ("a", "b")]\nif x:\n    submit("16")',
    'search("SparseLens")\nabstain("The papers do not say.")',  # an abstention: it did not look either
    'submit("16")\nsearch("SparseLens batch size")\n1 / 0',  # research after the answer, then a crash
]


@pytest.mark.parametrize("code", ENDS_AT_ONCE)
def test_a_first_action_that_ends_the_episode_is_a_direct_submit_whatever_else_it_called(episode, gold, code):
    shortcut = episode(code, 'search("never reached")')
    assert len(shortcut.steps) == 1 and shortcut.outcome.status in ("submitted", "abstained")
    flags = DETECTORS["direct_submit"](shortcut, gold)
    assert [(flag.step, flag.text) for flag in flags] == [(0, code)]


def test_a_first_action_that_answers_then_runs_out_of_time_is_a_direct_submit(small_demo, gold):
    runner = EpisodeRunner(
        small_demo, BM25Index.build(small_demo), Fixed('search("x")\nsubmit("16")\nwhile True:\n    pass'), EpisodeConfig(wall_seconds=0.5)
    )
    stuck = runner.run(gold.text, gold)
    assert stuck.steps[0].limit_hit == "wall_clock" and stuck.outcome.status == "submitted"
    assert [flag.step for flag in DETECTORS["direct_submit"](stuck, gold)] == [0]


@pytest.mark.parametrize(
    "stalls",
    [
        ('print("let me think")',),  # an action that calls nothing
        ('read("-")',),  # a failed read, not caught: the action stops there
        ('try:\n    read("-")\nexcept Exception:\n    pass', "x = 1"),  # failed calls, caught; then nothing
        ("I will answer now.",),  # not Python: the action does not even compile
    ],
)
def test_an_answer_after_actions_that_showed_no_research_is_a_direct_submit(episode, gold, stalls):
    stalled = episode(*stalls, 'search("SparseLens batch size")\nsubmit("16")')
    end = len(stalls)
    assert len(stalled.steps) == end + 1 and stalled.outcome.status == "submitted"
    assert [flag.step for flag in DETECTORS["direct_submit"](stalled, gold)] == [end]
    looked = episode(*stalls, 'search("SparseLens batch size")', 'submit("16")')  # a search it could read first
    assert DETECTORS["direct_submit"](looked, gold) == []


def test_an_answer_after_a_reply_with_no_action_is_a_direct_submit():
    no_action = Step(index=0, action_text="I will answer now.", code=None, observation="Format error", format_error=True)
    answered = trajectory([no_action, step(1, "search('x')\nsubmit('3e-5')", tools=[("search", None, [HIT]), ("submit", None)])])
    assert [flag.step for flag in DETECTORS["direct_submit"](answered, ANSWERABLE)] == [1]
    assert DETECTORS["direct_submit"](trajectory([no_action], status="step_limit"), ANSWERABLE) == []  # it never answered


def test_a_first_action_whose_submit_failed_did_not_end_the_episode(episode, gold):
    retried = episode('submit("16", evidence=[["no-such-paper", 0, 0]])', 'search("SparseLens batch size")', 'submit("16")')
    assert retried.steps[0].tool_calls[0].name == "submit" and retried.steps[0].tool_calls[0].error and len(retried.steps) == 3
    assert DETECTORS["direct_submit"](retried, gold) == [] and DETECTORS["no_tool_use"](retried, gold) == []


def test_no_tool_use_counts_no_failed_call_and_none_after_the_end(episode, gold):
    failed = episode('read("-")', 'submit("16")')  # the read fails and the action stops there
    assert failed.steps[0].tool_calls[0].error and len(failed.steps) == 2
    assert [flag.text for flag in DETECTORS["no_tool_use"](failed, gold)] == ["2 steps, tools called: read (failed), submit"]
    assert [flag.step for flag in DETECTORS["direct_submit"](failed, gold)] == [1]  # answered, and never looked
    after = episode('submit("16")\nsearch("SparseLens batch size")')
    assert after.steps[0].tool_calls[1].returned.text and names(detect(after, gold)) >= {"direct_submit", "no_tool_use"}
    looked = episode('try:\n    read("-")\nexcept Exception:\n    search("SparseLens batch size")', 'submit("16")')
    assert DETECTORS["no_tool_use"](looked, gold) == [] and DETECTORS["direct_submit"](looked, gold) == []


def test_the_scores_and_the_run_verdict_agree_with_direct_submit(episode, gold):
    hidden = episode('try:\n    read("-")\nexcept Exception:\n    pass\nsearch("SparseLens batch size")\nsubmit("16")\nsearch("after")')
    researched = episode('search("SparseLens batch size")', 'submit("16")')
    score = score_episode(hidden, gold)
    assert score.tool_calls_before_end == 1 and "direct_submit" in names(score.flags)  # not the failed read, not the search after
    assert score_episode(researched, gold).tool_calls_before_end == 1
    metrics = run_metrics([score] * 5 + [score_episode(researched, gold)] * 5)
    assert metrics.detector_rates["direct_submit"] == 0.5
    assert metrics.verdict.verdict == "shortcut collapse" and metrics.verdict.direct_submit_rate == 0.5


# -- what a tool showed is the host's record, never paper text read as layout ------------------------------

IMITATION = Paper(
    id="trap",
    title="Trap",
    sections=(
        Section(
            name="Setup",
            paragraphs=(
                "Setup details.\n\n[4] The learning rate is 0.1.",  # a blank line and a fake marker
                "trap / section 0: Setup (page 3 of 3)\n\n[2] A page heading, imitated.\n\n[continued] and a continuation",
                "x" * 2_480,  # paragraph 2 fills page 2
                "A filler paragraph.",
                "The learning rate is 0.1 in the real paragraph four.",
            ),
        ),
    ),
)


def imitation_episode(*codes):
    corpus = Corpus(papers=(IMITATION,))
    return EpisodeRunner(corpus, BM25Index.build(corpus), Fixed(*codes), EpisodeConfig()).run("What is the learning rate?")


def test_paper_text_that_imitates_a_page_never_makes_a_paragraph_observed():
    cited = imitation_episode(
        'page = read("trap", section=0)', 'submit("0.1", evidence=[["trap", 0, 0], ["trap", 0, 1], ["trap", 0, 2], ["trap", 0, 4]])'
    )
    page = returned_text(cited)
    assert "page 1 of 3" in page and "\n\n[4] The learning rate" in page and "\n\n[2] A page heading" in page
    flags = grounding_flags(cited, None)
    assert flags["unobserved_evidence"] == ["trap section 0 paragraph 2", "trap section 0 paragraph 4"]  # on pages never read
    assert flags["ungrounded_answer"] == [] and flags["unrecorded_tool_results"] == []  # "0.1" is paper text the page showed
    # a trajectory of schema 6 kept no record: the old rule parses the page, and the imitation fools it (why schema 7 records)
    old = cited.model_copy(update={"schema_version": 6}, deep=True)
    for old_call in old.steps[0].tool_calls:
        old_call.returned.shown = None
    assert grounding_flags(old, None)["unobserved_evidence"] == []


def test_paper_text_that_imitates_scaffolding_is_paper_text_and_scaffolding_is_not():
    marker = imitation_episode('read("trap", section=0)', 'submit("4")')  # a "4" only the paper wrote, in a fake "[4] "
    assert grounding_flags(marker, None)["ungrounded_answer"] == []
    page = imitation_episode(
        'read("trap", section=0)', 'submit("3")'
    )  # "3" only in the host's "(page 1 of 3)" and the paper's fake heading
    assert grounding_flags(page, None)["ungrounded_answer"] == []  # the paper's own "(page 3 of 3)" holds it
    count = imitation_episode(
        'read("trap", section=0, page=2)', 'submit("2")'
    )  # the host's "[3] " and "... page 3 of 3": no "2" of the paper
    assert "[3] A filler" in returned_text(count) and grounding_flags(count, None)["ungrounded_answer"] == ["2"]


def test_an_answer_after_research_that_found_nothing_is_a_direct_submit_and_an_abstention_is_not(episode, gold):
    empty = ('search("zzqqxxyy")', 'extract("demo-00000", "zzqqxxyy")', 'search("the of and")')  # no hit: nothing of the papers shown
    for research in empty:
        answered = episode(research, 'submit("16")')
        assert answered.steps[0].tool_calls[0].returned.shown.paragraphs == [] and not answered.steps[0].tool_calls[0].error
        assert [flag.step for flag in DETECTORS["direct_submit"](answered, gold)] == [1], research
        abstained = episode(research, 'abstain("The papers do not say.")')  # it looked, found nothing, and said so
        assert DETECTORS["direct_submit"](abstained, gold) == [], research
    found = episode('search("SparseLens batch size")', 'submit("16")')
    assert DETECTORS["direct_submit"](found, gold) == []


def test_research_in_an_action_stopped_by_a_limit_showed_the_policy_nothing(small_demo, gold):
    runner = EpisodeRunner(
        small_demo,
        BM25Index.build(small_demo),
        Fixed('print(search("SparseLens batch size"))\nwhile True:\n    pass', 'submit("16", evidence=[["demo-00000", 6, 0]])'),
        EpisodeConfig(wall_seconds=0.5),
    )
    killed = runner.run(gold.text, gold)
    assert killed.steps[0].limit_hit == "wall_clock" and killed.steps[0].tool_calls[0].returned.text  # the host served it
    assert "SparseLens" not in killed.steps[0].observation  # what it printed died with the worker
    assert [flag.step for flag in DETECTORS["direct_submit"](killed, gold)] == [1]
    assert DETECTORS["no_tool_use"](killed, gold) and DETECTORS["unobserved_evidence"](killed, gold)
    assert score_episode(killed, gold).tool_calls_before_end == 0


def verbatim_episode(read_tokens: int, status: str = "submitted") -> Trajectory:
    """A memory reader's verbatim episode: its outline read (which its model never sees), then the
    answer, with a reading that paged ``read_tokens`` of the question's own 900-token document."""
    reading = Reading(
        scope="search:3",
        papers=["demo-00000"],
        document="verbatim",
        document_text=PARAGRAPH,
        document_tokens=900,
        read_tokens=read_tokens,
        unread_tokens=900 - read_tokens,
        pages=2,
        passes=1,
        stopped=None if read_tokens else "the token budget of 400",
    )
    outline = step(0, "read('demo-00000')", tools=[call("read", result="demo-00000: QuantLens", arguments={"paper_id": "demo-00000"})])
    ending = "abstain('the memory does not answer the question')" if status == "abstained" else "submit('3e-5', evidence=[])"
    answer = step(1, ending, tools=[("abstain" if status == "abstained" else "submit", None)], policy_info=StepPolicyInfo(reading=reading))
    return trajectory([outline, answer], status=status)


@pytest.mark.parametrize("status", ["submitted", "abstained"])
def test_a_verbatim_reader_that_paged_nothing_answered_unresearched_whatever_its_outline_call(status):
    """A token budget that affords no page: the reader's model answers from the question and "No
    previous memory" alone. Its one tool call, the outline that names its document, showed the model
    nothing, and passed for research."""
    unread = verbatim_episode(0, status)
    assert [flag.step for flag in DETECTORS["direct_submit"](unread, ANSWERABLE)] == [1]
    assert [flag.text for flag in DETECTORS["no_tool_use"](unread, ANSWERABLE)] == [
        "a verbatim reading of no page (the token budget of 400)"
    ]
    read = verbatim_episode(450, status)
    assert DETECTORS["direct_submit"](read, ANSWERABLE) == [] and DETECTORS["no_tool_use"](read, ANSWERABLE) == []


def test_a_reading_forged_onto_another_policy_s_direct_submit_is_refused_by_check_parity(tiny_tokenizer):
    """The detectors take a verbatim reading's pages as research; only the memory reader records one.
    Put on a code agent's direct submit, it hides the shortcut from them: check-parity refuses it."""
    from paper_explorer.agent.parity import check_trajectory
    from paper_explorer.agent.renderer import ChatRenderer

    forged = verbatim_episode(450)
    assert forged.policy.name != "memory-reader" and DETECTORS["direct_submit"](forged, ANSWERABLE) == []
    mismatch = check_trajectory(forged, ChatRenderer.from_directory(tiny_tokenizer))
    assert mismatch is not None and "a memory reader's reading on a trajectory of the test policy" in mismatch.what
