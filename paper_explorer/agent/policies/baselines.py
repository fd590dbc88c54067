"""Reference baselines: the direct-submit shortcut, one-shot RAG and reading a paper end to end."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from paper_explorer.agent.policies.base import Memory, Plan, Policy, Reply, action, last_value, steps_taken
from paper_explorer.agent.policies.reading import decide, is_polar, names_in, question_stems, stem
from paper_explorer.agent.policies.scripted import key_terms
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.corpus.tokenize import tokenize


def sentences(text: str) -> list[str]:
    """The tools' sentence splitter, imported when a baseline reads (it brings the corpus index's numpy and scipy)."""
    from paper_explorer.tools.paper_tools import sentences as split

    return split(text)


class DirectSubmitConfig(PromptRecording):
    """``--policy direct-submit``: the shortcut, answering at once without a tool."""

    name: Literal["direct-submit"] = "direct-submit"


class SingleShotRagConfig(PromptRecording):
    """``--policy single-shot-rag``: one search, an answer from the top hit."""

    name: Literal["single-shot-rag"] = "single-shot-rag"


class ReadAllConfig(PromptRecording):
    """``--policy read-all``: the top paper read section by section."""

    name: Literal["read-all"] = "read-all"


@register_policy(DirectSubmitConfig)
def direct_submit(config: DirectSubmitConfig, max_steps: int) -> Policy:
    return DirectSubmit()


@register_policy(SingleShotRagConfig)
def single_shot_rag(config: SingleShotRagConfig, max_steps: int) -> Policy:
    return SingleShotRag()


@register_policy(ReadAllConfig)
def read_all(config: ReadAllConfig, max_steps: int) -> Policy:
    return ReadAll(max_steps=max_steps)


class DirectSubmit(Policy):
    """Answers at once without any tool: the shortcut a collapsed fine-tuned policy takes."""

    name = "direct-submit"

    def act(self, messages: list[dict[str, str]]) -> Reply:
        question = self.episode.question
        names = names_in(question)
        guess = "Yes" if is_polar(question) else (names[0] if names else question.rstrip("?").split()[-1])
        return Reply(action(f"submit({json.dumps(guess)}, evidence=[])"))


class SingleShotRag(Policy):
    """One search, then an answer from the top hit's text: the classic retrieve-then-read baseline."""

    name = "single-shot-rag"

    def __init__(self, k: int = 1) -> None:
        self.k = k

    def settings(self) -> dict[str, Any]:
        return {"k": self.k}

    def act(self, messages: list[dict[str, str]]) -> Reply:
        question = self.episode.question
        if steps_taken(messages) == 0:
            return Reply(
                action(
                    f"hits = search({json.dumps(question)}, k={self.k})\n"
                    "[(h['paper_id'], h['section'], h['paragraph'], h['snippet'].lstrip('. ')) for h in hits]"
                )
            )
        hits = last_value(messages) or []
        if not hits:
            return Reply(action('abstain("The search returned nothing.")'))
        paper_id, section, paragraph, snippet = hits[0]
        decision = decide(question, [s for s in sentences(snippet)] or [snippet])
        answer = decision.answer or snippet  # RAG answers from what it retrieved, never abstains
        return Reply(action(f"submit({json.dumps(answer)}, evidence=[{json.dumps([paper_id, section, paragraph])}])"))


class ReadAll(Plan):
    """Reads the top paper section by section, keeping the sentences most like the question, then answers."""

    name = "read-all"

    def __init__(self, memory: int = 6, max_steps: int = 10) -> None:
        self.memory_size = memory
        self.max_steps = max_steps

    def settings(self) -> dict[str, Any]:
        return {"memory": self.memory_size, "max_steps": self.max_steps}

    def next_step(self, messages: list[dict[str, str]], step: int) -> Reply:
        question = self.episode.question
        if step == 0:
            self.memory = Memory(self.memory_size)
            self.stems = question_stems(question)
            return Reply(action(f"hits = search({json.dumps(key_terms(question))}, k=1)\nhits[0]['paper_id'], hits[0]['title']"))
        if step == 1:
            found = last_value(messages)
            if not found:
                return Reply(action('abstain("The search returned nothing.")'))
            self.paper_id = found[0]
            return Reply(action(f"outline = read({json.dumps(self.paper_id)})\nprint(outline)"))
        if step == 2:
            self.sections = len(re.findall(r"^\s*\d+\. ", messages[-1]["content"], re.MULTILINE)) or 1
            self.section = 0
        else:
            self._remember(messages[-1]["content"])
        if self.section < self.sections and steps_taken(messages) < self.max_steps - 1:  # the episode's steps, retries included
            self.section += 1
            return Reply(action(f"print(read({json.dumps(self.paper_id)}, section={self.section - 1}))"))
        remembered = [item for _, item in self.memory.items]
        decision = decide(question, [text for text, _ in remembered])
        if decision.answer is None:
            return Reply(action(f"abstain({json.dumps(decision.reason)})"))
        location = next(loc for text, loc in remembered if text == decision.sentence)
        return Reply(action(f"submit({json.dumps(decision.answer)}, evidence=[{json.dumps([self.paper_id, *location])}])"))

    def _remember(self, observation: str) -> None:
        section = self.section - 1
        for match in re.finditer(r"^\[(\d+)\] (.*)$", observation, re.MULTILINE):
            paragraph = int(match.group(1))
            for sentence in sentences(match.group(2)):
                overlap = len({stem(t) for t in tokenize(sentence)} & self.stems)
                if overlap:
                    self.memory.add(overlap, (sentence, (section, paragraph)))
