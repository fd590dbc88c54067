"""Behavioural detectors: small functions that read one trajectory and flag what went wrong,
with the evidence (the step and the text), so nobody has to read transcripts to find it.

Each detector takes the trajectory and its gold question (None when there is none) and returns
a list of flags; an empty list means the episode is clean for that detector.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from agent.trajectory import Trajectory
from corpus.schema import Question
from tools.page import tool_page

RESEARCH_TOOLS = {"search", "read", "extract"}
ENDING_TOOLS = {"submit", "abstain"}
ENDING_STATUSES = ("submitted", "abstained")
POLAR = {"yes", "no"}
SHORTCUT_COLLAPSE_RATE = 0.5  # the run-level verdict when this share of episodes submits at once


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
    """The first action already ends the episode (submit or abstain), before any research."""
    if not trajectory.steps:
        return []
    first = trajectory.steps[0]
    names = [call.name for call in first.tool_calls]
    if names and names[0] in ENDING_TOOLS:
        return [Flag("direct_submit", 0, first.code or first.action_text)]
    return []


def no_tool_use(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Not one search, read or extract in the whole episode."""
    if any(call.name in RESEARCH_TOOLS for _, call in _calls(trajectory)):
        return []
    return [Flag("no_tool_use", None, f"{len(trajectory.steps)} steps, tools called: "
                 f"{', '.join(call.name for _, call in _calls(trajectory)) or 'none'}")]


def _observed(trajectory: Trajectory) -> str:
    """What the episode saw before answering (the submit's own confirmation echoes the answer)."""
    return "\n".join(step.observation for step in trajectory.steps
                     if not any(call.name in ENDING_TOOLS for call in step.tool_calls))


def _words(text: str) -> str:
    """Lower case, punctuation as spaces: code such as submit("3e-5") still shows the words 3e 5."""
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _in(needle: str, haystack: str) -> bool:
    needle = _words(needle)
    return bool(needle) and f" {needle} " in f" {_words(haystack)} "


def placeholder_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The answer is text from the prompt itself (the tool page or its examples), not from anything observed."""
    answer = trajectory.outcome.answer
    if trajectory.outcome.status != "submitted" or not answer or answer.strip().lower() in POLAR:
        return []
    if _in(answer, trajectory.system_prompt) and not _in(answer, _observed(trajectory)):
        return [Flag("placeholder_answer", len(trajectory.steps) - 1, answer)]
    return []


def repeated_prompt(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The tool page or the question shows up again in a prompt (a train/serve mismatch)."""
    page, flags = tool_page(), []
    for step in trajectory.steps:
        if page in step.observation:
            flags.append(Flag("repeated_prompt", step.index, "the tool page is repeated in the observation"))
        elif len(trajectory.question) > 20 and trajectory.question in step.observation:
            flags.append(Flag("repeated_prompt", step.index, "the question is repeated in the observation"))
    return flags


def repeated_actions(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """An action identical to an earlier one in the same episode (the policy is looping)."""
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
    if trajectory.outcome.status == "step_limit":
        return [Flag("step_limit", None, trajectory.outcome.reason or "")]
    return []


def format_errors(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    return [Flag("format_errors", step.index, step.action_text[:120]) for step in trajectory.steps if step.format_error]


def consecutive_tool_errors(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Two or more steps in a row whose action failed (a tool error or an exception)."""
    flags, run = [], 0
    for step in trajectory.steps:
        failed = bool(step.error) or any(call.error for call in step.tool_calls)
        run = run + 1 if failed else 0
        if run >= 2:
            flags.append(Flag("consecutive_tool_errors", step.index, step.error or next(c.error for c in step.tool_calls if c.error)))
    return flags


def hit_generation_cap(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    return [Flag("hit_generation_cap", step.index, f"{step.generation.generated_tokens} tokens")
            for step in trajectory.steps if step.generation and step.generation.hit_cap]


def ungrounded_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """A submitted span that appears in nothing the episode observed (yes/no answers excepted)."""
    answer = trajectory.outcome.answer
    if trajectory.outcome.status != "submitted" or not answer or answer.strip().lower() in POLAR:
        return []
    if _in(answer, _observed(trajectory)):
        return []
    return [Flag("ungrounded_answer", len(trajectory.steps) - 1, answer)]


def unobserved_evidence(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """Cited paragraphs the episode never saw: no sentence of them appeared in an observation."""
    observed = " ".join(_observed(trajectory).split())
    flags = []
    for item in trajectory.outcome.evidence:
        sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", item.text) if len(s.split()) >= 4]
        if not any(sentence[:80] in observed for sentence in sentences):
            flags.append(Flag("unobserved_evidence", len(trajectory.steps) - 1, f"{item.paper_id} section {item.section} paragraph {item.paragraph}"))
    return flags


def no_answer(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    """The episode ended without a submit or an abstain (step limit, context limit, policy error)."""
    if trajectory.outcome.status in ENDING_STATUSES:
        return []
    return [Flag("no_answer", len(trajectory.steps) - 1 if trajectory.steps else None,
                 f"{trajectory.outcome.status}: {trajectory.outcome.reason or ''}")]


def false_abstention(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    if gold is not None and gold.answerable and trajectory.outcome.status == "abstained":
        return [Flag("false_abstention", len(trajectory.steps) - 1, trajectory.outcome.reason or "")]
    return []


def missed_abstention(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    if gold is not None and not gold.answerable and trajectory.outcome.status == "submitted":
        return [Flag("missed_abstention", len(trajectory.steps) - 1, trajectory.outcome.answer or "")]
    return []


DETECTORS: dict[str, Detector] = {
    detector.__name__: detector for detector in (
        direct_submit, no_tool_use, placeholder_answer, repeated_prompt, repeated_actions, step_limit, format_errors,
        consecutive_tool_errors, hit_generation_cap, ungrounded_answer, unobserved_evidence, no_answer, false_abstention,
        missed_abstention,
    )
}


def detect(trajectory: Trajectory, gold: Question | None) -> list[Flag]:
    return [flag for detector in DETECTORS.values() for flag in detector(trajectory, gold)]


def detector_rates(flags_by_episode: list[list[Flag]]) -> dict[str, float]:
    """The share of episodes each detector flagged at least once."""
    total = len(flags_by_episode)
    return {name: (sum(1 for flags in flags_by_episode if any(f.detector == name for f in flags)) / total if total else 0.0)
            for name in DETECTORS}


def verdict(rates: dict[str, float], threshold: float = SHORTCUT_COLLAPSE_RATE) -> dict:
    """The run-level call: "shortcut collapse" when direct submits pass the threshold."""
    collapsed = rates.get("direct_submit", 0.0) >= threshold
    return {
        "verdict": "shortcut collapse" if collapsed else "no shortcut collapse",
        "direct_submit_rate": rates.get("direct_submit", 0.0), "threshold": threshold,
    }
