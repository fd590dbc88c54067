"""``--policy single-shot-rag``: one search, then an answer from the top hit's text (the classic retrieve-then-read baseline)."""

from __future__ import annotations

import json
from typing import Literal

from paper_explorer.agent.policies.base import Policy, Reply, action, last_value, steps_taken
from paper_explorer.agent.policies.reading import decide, sentences
from paper_explorer.agent.policies.records import PolicySettings
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy


class SingleShotRagConfig(PromptRecording):
    """``--policy single-shot-rag``: one search, an answer from the top hit."""

    name: Literal["single-shot-rag"] = "single-shot-rag"


@register_policy(SingleShotRagConfig)
def single_shot_rag(config: SingleShotRagConfig, max_steps: int) -> Policy:
    return SingleShotRag()


class SingleShotRagSettings(PolicySettings):
    k: int  # hits its one search asks for


class SingleShotRag(Policy):
    """One search, then an answer from the top hit's text: the classic retrieve-then-read baseline."""

    name = "single-shot-rag"

    def __init__(self, k: int = 1) -> None:
        self.k = k

    def settings(self) -> SingleShotRagSettings:
        return SingleShotRagSettings(k=self.k)

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
