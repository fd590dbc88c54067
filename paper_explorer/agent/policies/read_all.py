"""``--policy read-all``: the top paper read section by section, keeping the sentences most like the question, then an answer."""

from __future__ import annotations

import json
import re
from typing import Literal

from paper_explorer.agent.policies.base import Memory, Plan, Policy, Reply, action, last_value, steps_taken
from paper_explorer.agent.policies.reading import decide, question_stems, sentences, stem
from paper_explorer.agent.policies.records import PolicySettings
from paper_explorer.agent.policies.scripted import key_terms
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.corpus.tokenize import tokenize


class ReadAllConfig(PromptRecording):
    """``--policy read-all``: the top paper read section by section."""

    name: Literal["read-all"] = "read-all"


@register_policy(ReadAllConfig)
def read_all(config: ReadAllConfig, max_steps: int) -> Policy:
    return ReadAll(max_steps=max_steps)


class ReadAllSettings(PolicySettings):
    memory: int  # sentences it keeps
    max_steps: int  # the episode's, within which it stops reading to answer


class ReadAll(Plan):
    """Reads the top paper section by section, keeping the sentences most like the question, then answers."""

    name = "read-all"

    def __init__(self, memory: int = 6, max_steps: int = 10) -> None:
        self.memory_size = memory
        self.max_steps = max_steps

    def settings(self) -> ReadAllSettings:
        return ReadAllSettings(memory=self.memory_size, max_steps=self.max_steps)

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
