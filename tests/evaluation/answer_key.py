"""``--policy answer-key``, for tests: a scripted policy that ends each episode as a JSON file says,
keyed by the question's text, so a run's answers and failures are known before it runs.

    {"Who wrote it?": "Marie Curie", "Where?": {"end": "policy_error"}}

A string is submitted as the answer. ``{"end": ...}`` ends the episode otherwise: "abstain",
"policy_error" (the policy fails), "no_answer" (its own answer is invalid, as the memory reader's
cut at its cap), "step_limit" (it never decides). A question the key lacks is a policy error.
Registered while ``registered()`` is entered, so a run of it loads (``Run.load`` reads the manifest's
policy) only there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import Field

from paper_explorer.agent import policy_registry
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies import Policy, PolicyConfig, PolicyError, Reply, register_policy
from paper_explorer.agent.policies.base import NoAnswer, action


class AnswerKeyConfig(PolicyConfig):
    name: Literal["answer-key"] = "answer-key"
    # optional, as every policy's setting is: a required one would be asked of every other policy's run
    answer_key: Path | None = Field(None, description="JSON: question text -> the answer to submit, or {'end': how the episode ends}.")


class AnswerKey(Policy):
    name = "answer-key"

    def __init__(self, config: AnswerKeyConfig) -> None:
        if config.answer_key is None:
            raise AgentError("--policy answer-key needs --answer-key KEY.json")
        self.config = config
        self.key = json.loads(config.answer_key.read_text())

    def settings(self) -> AnswerKeyConfig:
        return self.config

    def act(self, messages: list[dict[str, str]]) -> Reply:
        said = self.key.get(self.episode.question)
        if isinstance(said, str):
            return Reply(action(f"submit({json.dumps(said)}, evidence=[])"))
        end = None if said is None else said["end"]
        if end == "abstain":
            return Reply(action('abstain("The key says so.")'))
        if end == "no_answer":
            raise NoAnswer("the final answer was cut at its cap")
        if end == "step_limit":
            return Reply(action("print('still reading')"))
        raise PolicyError(f"the key ends this question with {end!r}")


@contextmanager
def registered() -> Iterator[None]:
    """The policy registered, and the registry as it was afterwards."""
    saved = dict(policy_registry.registered())
    register_policy(AnswerKeyConfig)(lambda config, max_steps: AnswerKey(config))
    try:
        yield
    finally:
        policy_registry._registry.clear()
        policy_registry._registry.update(saved)
        policy_registry._checked.clear()
        policy_registry.union_adapter.cache_clear()
