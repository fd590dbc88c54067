"""Behavioural detectors: small functions that read one trajectory and flag what went wrong,
with the evidence (the step and the text), so nobody has to read transcripts to find it.

Each detector takes the trajectory and its gold question (None when there is none) and returns
a list of flags; an empty list means the episode is clean for that detector.

Which record each one trusts (its docstring says it too). The host writes the tool calls (name,
arguments, error), what each tool returned (``ToolCallRecord.returned``), what each research call
showed of the papers (``Returned.shown``) and the outcome; the worker writes the observation (what
the action printed and its last value), so an observation is evidence of nothing: an action can
print an answer no tool ever gave.

What an episode did is defined once, in ``agent.trajectory``, and read the same way by these
detectors, the scores and SFT: the step that ended it with an answer or an abstention
(``ending_step``: from the host's outcome, whatever else that action called, failed or not), and
the research calls that succeeded before that end (``research_before_end``), and from them the
direct submit (``is_direct_submit``: it answered before any research had shown it anything). So
``direct_submit`` judges that the episode ended unresearched, not which call came first, and
``no_tool_use`` counts no failed call and none after the end: every answered episode that
``no_tool_use`` flags is a direct submit. A memory reader's verbatim reading (``verbatim_reading``)
researches by the pages its model read, none or some, and its one tool call (the outline that names
the document) is no research: it shows its model nothing.

The grounding detectors (``ungrounded_answer``, ``placeholder_answer``, ``unobserved_evidence``)
read what the host's research tools showed, never the observations, and of it only the papers'
text and the paragraphs shown: the host's own scaffolding (paragraph markers, headings, numbering,
ids, scores) grounds nothing, and a cited paragraph is observed by its location, not by a sentence
it may share with others. From schema 7 they read the structured record the host wrote as it
rendered each result (``tools.records.Shown``: the paragraphs shown, and where in the kept text
each piece of paper text lies), never the result's text as layout, so no paper text can make a
paragraph count as shown (a blank line and "[4] " inside a paragraph, a fake heading, a line
imitating a page). Schemas 4 to 6 kept no such record: they are scored as they always were, their
results read back in the exact form the host's tools wrote them then (``tools.legacy_layout.legacy_shown``,
the one module that owns the layout), which paper text imitating that form can mislead. Trajectories older than schema 4 did not record results: there the detectors
fall back to the observations, and every flag they raise says so.

Where results were not kept whole (cut at the cap for one result, or past the action's budget:
only their length and sha256), a flag says that what was not kept may hold the answer (or, past
the budget, show the paragraph); ``unrecorded_tool_results`` flags every submitted episode judged
from less than every result, so no verdict of theirs is silently clean or silently damning. The
other detectors read the tool calls, outcome, code, action text, generation record and status
(host or policy records); ``repeated_prompt`` reads the observations because the observation is
what the next prompt shows, whoever wrote it.

Which tools are research and which end an episode is the tool registry's (``tools.registry``:
each tool declares the record it makes). Why one module of this size: sixteen small detectors, each
a function and its docstring; they share the grounding helpers and are read as one list
(``DETECTORS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from paper_explorer.agent.trajectory import (
    ENDING_STATUSES,
    ToolCallRecord,
    Trajectory,
    is_direct_submit,
    read_verbatim,
    research_before_end,
    verbatim_reading,
)
from paper_explorer.corpus.schema import Question
from paper_explorer.tools import layout, legacy_layout, registry
from paper_explorer.tools.page import tool_page

POLAR = {"yes", "no"}
SHORTCUT_COLLAPSE_RATE = 0.5  # the run-level verdict when this share of episodes submits at once
RESULTS_RECORDED = 4  # the trajectory schema version from which tool calls keep what they returned
SHOWN_RECORDED = 7  # the one from which research calls also keep what they showed (Returned.shown)
FROM_OBSERVATIONS = "judged from observations (what the action printed): this trajectory predates recorded tool results"


@dataclass(frozen=True)
class Flag:
    detector: str
    step: int | None  # 0-based step index; None when the flag is about the whole episode
    text: str

    def to_json(self) -> dict:
        return asdict(self)


Detector = Callable[[Trajectory, "Question | None"], list[Flag]]


def _calls(trajectory: Trajectory):
    for step in trajectory.steps:
        for call in step.tool_calls:
            yield step, call


def direct_submit(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The episode ended with an answer or an abstention before any research had shown the policy
    anything: in its first action, whatever else that action called, in any order, failed or not
    (it answered before it could read what any of it returned), or after actions that researched
    nothing (``agent.trajectory.is_direct_submit``). Flagged at the step that answered. Reads: the
    host's outcome and the host's tool calls of the steps before it (their errors)."""
    if not is_direct_submit(trajectory):
        return []
    end = trajectory.steps[-1]
    return [Flag("direct_submit", end.index, end.code or end.action_text)]


def no_tool_use(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Not one search, read or extract that succeeded before the episode's submit or abstain (a
    failed call showed nothing; ``agent.trajectory.research_before_end``); for a memory reader's
    verbatim reading, not one page read. Reads: the host's tool calls and their errors, or the reading."""
    reading = verbatim_reading(trajectory)
    if reading is not None:  # its research is its pages, read in its process; its outline call showed its model nothing
        if reading.read_tokens > 0:
            return []
        return [Flag("no_tool_use", None, f"a verbatim reading of no page ({reading.stopped or 'nothing was paged'})")]
    if any(True for _ in research_before_end(trajectory)):
        return []
    called = ", ".join(call.name + (" (failed)" if call.error else "") for _, call in _calls(trajectory))
    return [Flag("no_tool_use", None, f"{len(trajectory.steps)} steps, tools called: {called or 'none'}")]


Place = tuple[str, int, int]  # (paper_id, section, paragraph): where a paragraph is


@dataclass(frozen=True)
class _Shown:
    """What one tool result showed of the papers: their text, and which paragraphs."""

    texts: list[str]  # paper text only (paragraphs, sentences, snippets, titles, abstracts, section names)
    places: set[Place]  # paragraphs the result showed, or named as a hit


@dataclass(frozen=True)
class _Returned:
    """What the grounding detectors search, and what their verdict could not see."""

    texts: list[str]  # the paper text each research tool returned; for an old trajectory, its observations
    places: set[Place] | None  # paragraphs shown; None for an old trajectory (judged by sentences instead)
    note: str  # "" when every result was kept whole and read; else said in each flag
    places_note: str  # the same for the paragraphs shown (schema 7 keeps all of a cut result's)


def _returned(trajectory: Trajectory) -> _Returned:
    """The paper text the host's research tools returned before the episode ended, each piece on its
    own (a paragraph of a read page, a hit's title or snippet, an extracted sentence): an answer
    pieced together from two of them is found in none. Only paper text: the host's scaffolding
    (paragraph markers, page headings, outline numbering, "more" lines, ids, scores, JSON keys) is
    not, or a small number would be grounded by a marker like ``[2]``. Failed calls returned
    nothing the policy saw, and calls after the submit cannot have grounded it. From schema 7, as
    the host recorded it (``_recorded``); before, parsed from the result (``_parsed``)."""
    if trajectory.schema_version < RESULTS_RECORDED:
        return _Returned([_observed(trajectory)], None, FROM_OBSERVATIONS, FROM_OBSERVATIONS)
    recorded = trajectory.schema_version >= SHOWN_RECORDED
    texts: list[str] = []
    places: set[Place] = set()
    not_kept = not_kept_at_all = unread = 0
    for _, call in research_before_end(trajectory):
        not_kept += not _kept_whole(call)
        not_kept_at_all += call.returned is None or call.returned.text is None
        shown = _recorded(call) if recorded else _parsed(call)
        unread += shown is None
        if shown is not None:
            texts += shown.texts
            places |= shown.places
    reading = read_verbatim(trajectory)
    left_unread: list[str] = []
    if reading is not None and reading.document_text is not None:
        if reading.unread_tokens == 0:
            texts.append(reading.document_text)  # the memory reader's pages: its own document, read whole
        else:
            left_unread = [f"the reader left {reading.unread_tokens} tokens of its document unread, and its text was searched for nothing"]
    form = "had no record of what they showed that fits them" if recorded else "were not in the form the host's tools write"
    wrong = [f"{unread} tool result(s) {form}, and were searched for nothing"] if unread else []
    note = "; ".join(_not_kept(not_kept) + wrong + left_unread)
    # schema 7 keeps every paragraph a cut result showed: only a result not kept at all hides some
    places_note = "; ".join(_not_kept(not_kept_at_all if recorded else not_kept) + wrong)
    return _Returned(texts, places, note, places_note)


def _not_kept(count: int) -> list[str]:
    return [f"{count} tool result(s) were not kept whole, and what was not kept may hold it"] if count else []


def _kept_whole(call: ToolCallRecord) -> bool:
    return call.returned is not None and call.returned.cut is None


def _recorded(call: ToolCallRecord) -> _Shown | None:
    """What one research call showed, as the host recorded it while writing the result (schema 7
    on, ``tools.records.Shown``): its paragraphs, and each piece of paper text cut out of the kept
    text where the host said it lies (``tools.layout.shown_texts``). Nothing in the text is parsed
    as layout. None when a kept result has no such record, or one that does not fit its text (the
    host never writes either): it counts as nothing seen, and the flags say so (a catalog tool's
    record that does not fit is refused before this, when the trajectory is read: ``tools.layout.misfit``).
    A result not kept (over the action's budget) showed nothing we can see."""
    returned = call.returned
    if returned is None or returned.text is None:
        return _Shown([], set())
    if returned.shown is None:
        return None
    found = layout.shown_texts(returned.text, returned.shown)
    if found is None:
        return None
    return _Shown([text for _, text in found], set(returned.shown.paragraphs))


def _parsed(call: ToolCallRecord) -> _Shown | None:
    """Schemas 4 to 6 kept no ``Shown`` record: what one research call's kept result showed, read
    back in the form the host's tools wrote then (``tools.legacy_layout.legacy_shown``), as those
    trajectories were always scored; paper text that imitates that form can mislead it. None when
    it is not in that form. A result not kept showed nothing we can see."""
    returned = call.returned
    if returned is None or returned.text is None:
        return _Shown([], set())
    legacy = legacy_layout.legacy_shown(call.name, call.arguments, returned.text, cut=returned.cut is not None)
    return None if legacy is None else _Shown(legacy.texts, legacy.places)


def _observed(trajectory: Trajectory) -> str:
    """What the actions printed before answering (the submit's own confirmation echoes the answer).
    Worker-written: only trajectories that predate recorded tool results are judged from it."""
    ending = registry.ending_tools()
    return "\n".join(step.observation for step in trajectory.steps if not any(call.name in ending for call in step.tool_calls))


def _noted(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


def _words(text: str) -> str:
    """Lower case, punctuation as spaces: code such as submit("3e-5") still shows the words 3e 5."""
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _in(needle: str, haystack: str) -> bool:
    needle = _words(needle)
    return bool(needle) and f" {needle} " in f" {_words(haystack)} "


def _in_any(needle: str, haystacks: list[str]) -> bool:
    return any(_in(needle, haystack) for haystack in haystacks)


def _span_answer(trajectory: Trajectory) -> str | None:
    """The submitted answer when it is a span to look for (yes and no are not)."""
    answer = trajectory.outcome.answer
    if trajectory.outcome.status != "submitted" or not answer or answer.strip().lower() in POLAR:
        return None
    return answer


def placeholder_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The answer is text from the prompt itself (the tool page or its examples) that no tool returned.
    Reads: the system prompt and the paper text the host's research tools returned (``_returned``:
    not their scaffolding, ids or numbers)."""
    answer = _span_answer(trajectory)
    if answer is None or not _in(answer, trajectory.system_prompt):
        return []
    returned = _returned(trajectory)
    if _in_any(answer, returned.texts):
        return []
    return [Flag("placeholder_answer", len(trajectory.steps) - 1, _noted(answer, returned.note))]


def repeated_prompt(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The tool page or the question shows up again in a prompt (a train/serve mismatch). Reads: the
    observations, because they are what the next prompt shows, whoever wrote them."""
    page, flags = tool_page(), []
    for step in trajectory.steps:
        if page in step.observation:
            flags.append(Flag("repeated_prompt", step.index, "the tool page is repeated in the observation"))
        elif len(trajectory.question) > 20 and trajectory.question in step.observation:
            flags.append(Flag("repeated_prompt", step.index, "the question is repeated in the observation"))
    return flags


def repeated_actions(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """An action identical to an earlier one in the same episode (the policy is looping). Reads: the
    policy's code (or its text, for a step without code)."""
    seen: dict[str, int] = {}
    flags = []
    for step in trajectory.steps:
        key = (step.code or step.action_text).strip()
        if key in seen:
            flags.append(Flag("repeated_actions", step.index, f"same as step {seen[key] + 1}: {key[:120]}"))
        else:
            seen[key] = step.index
    return flags


def step_limit(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The episode ran out of steps. Reads: the outcome's status and reason (set by the loop)."""
    if trajectory.outcome.status == "step_limit":
        return [Flag("step_limit", None, trajectory.outcome.reason or "")]
    return []


def invalid_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The policy ended without a valid answer of its own (status no_answer: the memory reader's
    final answer was empty, or cut at its cap), scored zero. Reads: the outcome's status and reason
    (set by the loop from the policy's error)."""
    if trajectory.outcome.status == "no_answer":
        return [Flag("invalid_answer", len(trajectory.steps) - 1 if trajectory.steps else None, trajectory.outcome.reason or "")]
    return []


def format_errors(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Steps whose text held no action. Reads: the loop's format_error mark and the policy's text."""
    return [Flag("format_errors", step.index, step.action_text[:120]) for step in trajectory.steps if step.format_error]


def consecutive_tool_errors(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Two or more steps in a row whose action failed (a tool error or an exception). Reads: the
    host's tool-call errors and the step's error (an exception the worker reported: a claim, but
    only about the action's own failure)."""
    flags, run = [], 0
    for step in trajectory.steps:
        failed = bool(step.error) or any(call.error for call in step.tool_calls)
        run = run + 1 if failed else 0
        if run >= 2:
            flags.append(Flag("consecutive_tool_errors", step.index, step.error or next(c.error for c in step.tool_calls if c.error)))
    return flags


def hit_generation_cap(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Steps cut at the generation's token cap. Reads: the policy's generation record."""
    return [
        Flag("hit_generation_cap", step.index, f"{step.generation.generated_tokens} tokens")
        for step in trajectory.steps
        if step.generation and step.generation.hit_cap
    ]


def ungrounded_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """A submitted span that no tool returned as paper text (yes/no answers excepted): printed,
    computed or pieced together by the action instead, or found only in the host's scaffolding (a
    "[2]" paragraph marker, a page heading, the outline's numbering, a hit's section or score).
    Reads: the paper text the host's research tools returned (``_returned``), one paragraph,
    sentence, snippet, title, abstract or section name at a time; never what the action printed.
    Words are compared with punctuation as spaces, so "2" is in "FusionPrompt-2"."""
    answer = _span_answer(trajectory)
    if answer is None:
        return []
    returned = _returned(trajectory)
    if _in_any(answer, returned.texts):
        return []
    return [Flag("ungrounded_answer", len(trajectory.steps) - 1, _noted(answer, returned.note))]


def unobserved_evidence(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Cited paragraphs no tool showed the episode, judged by location: a cited (paper, section,
    paragraph) is observed only where a search or extract before the submit returned a hit naming
    exactly it, or a read page showed it (a paragraph split over pages counts once its first piece,
    the one with its "[i] " marker, was shown). Text is not enough: many paragraphs share template
    sentences. Reads: the outcome's evidence and the paragraphs the host recorded each research call
    showing (``Returned.shown``, schema 7 on; for schemas 4 to 6, parsed from the results by the
    old rule); in a trajectory older than schema 4, the observations, where a paragraph counts as
    observed when one of its sentences is there (and its flags say so)."""
    returned = _returned(trajectory)
    flags = []
    for item in trajectory.outcome.evidence:
        if returned.places is None:
            seen = _a_sentence_in(item.text, returned.texts)
        else:
            seen = (item.paper_id, item.section, item.paragraph) in returned.places
        if not seen:
            where = f"{item.paper_id} section {item.section} paragraph {item.paragraph}"
            flags.append(Flag("unobserved_evidence", len(trajectory.steps) - 1, _noted(where, returned.places_note)))
    return flags


def _a_sentence_in(paragraph: str, texts: list[str]) -> bool:
    """The old rule, for old trajectories: the first 80 characters of one of the paragraph's sentences
    (of four words or more) appear in one of the texts."""
    texts = [" ".join(text.split()) for text in texts]
    sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", paragraph) if len(s.split()) >= 4]
    return any(sentence[:80] in text for sentence in sentences for text in texts)


def unrecorded_tool_results(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """A submitted episode whose grounding was judged from less than every tool result: a trajectory
    older than schema 4 (no results kept, so judged from the observations), or results cut at their
    cap or kept as length and sha256 only (past the action's budget). Reads: the schema version and
    the host's tool calls with what they kept."""
    if trajectory.outcome.status != "submitted":
        return []
    if trajectory.schema_version < RESULTS_RECORDED:
        return [Flag("unrecorded_tool_results", None, f"schema {trajectory.schema_version}: the grounding detectors {FROM_OBSERVATIONS}")]
    missing: dict[int, list[ToolCallRecord]] = {}
    for step, call in research_before_end(trajectory):
        if not _kept_whole(call):
            missing.setdefault(step.index, []).append(call)
    flags = []
    for index, calls in missing.items():
        first = calls[0]
        why = first.returned.cut if first.returned is not None else "no result recorded"
        flags.append(Flag("unrecorded_tool_results", index, f"{len(calls)} result(s) not kept whole; the first, of {first.name}: {why}"))
    return flags


def no_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The episode ended without a submit or an abstain (step limit, context limit, policy error,
    or no_answer: the policy's own answer was invalid). Reads: the outcome's status and reason."""
    if trajectory.outcome.status in ENDING_STATUSES:
        return []
    return [
        Flag(
            "no_answer",
            len(trajectory.steps) - 1 if trajectory.steps else None,
            f"{trajectory.outcome.status}: {trajectory.outcome.reason or ''}",
        )
    ]


def false_abstention(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """An abstention on a question the gold answers. Reads: the outcome and the gold question."""
    if gold is not None and gold.answerable and trajectory.outcome.status == "abstained":
        return [Flag("false_abstention", len(trajectory.steps) - 1, trajectory.outcome.reason or "")]
    return []


def missed_abstention(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """A submission on a question the gold calls unanswerable. Reads: the outcome and the gold question."""
    if gold is not None and not gold.answerable and trajectory.outcome.status == "submitted":
        return [Flag("missed_abstention", len(trajectory.steps) - 1, trajectory.outcome.answer or "")]
    return []


DETECTORS: dict[str, Detector] = {
    detector.__name__: detector
    for detector in (
        direct_submit,
        no_tool_use,
        placeholder_answer,
        repeated_prompt,
        repeated_actions,
        step_limit,
        invalid_answer,
        format_errors,
        consecutive_tool_errors,
        hit_generation_cap,
        ungrounded_answer,
        unobserved_evidence,
        unrecorded_tool_results,
        no_answer,
        false_abstention,
        missed_abstention,
    )
}


def detect(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    return [flag for detector in DETECTORS.values() for flag in detector(trajectory, gold)]


def detector_rates(flags_by_episode: list[list[Flag]]) -> dict[str, float]:
    """The share of episodes each detector flagged at least once."""
    total = len(flags_by_episode)
    return {
        name: (sum(1 for flags in flags_by_episode if any(f.detector == name for f in flags)) / total if total else 0.0)
        for name in DETECTORS
    }


def verdict(rates: dict[str, float], threshold: float = SHORTCUT_COLLAPSE_RATE) -> dict:
    """The run-level call: "shortcut collapse" when direct submits pass the threshold."""
    collapsed = rates.get("direct_submit", 0.0) >= threshold
    return {
        "verdict": "shortcut collapse" if collapsed else "no shortcut collapse",
        "direct_submit_rate": rates.get("direct_submit", 0.0),
        "threshold": threshold,
    }
