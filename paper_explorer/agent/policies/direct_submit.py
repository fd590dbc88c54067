"""``--policy direct-submit``: the shortcut a collapsed fine-tuned policy takes, answering at once without a tool."""

from __future__ import annotations

import json
from typing import Literal

from paper_explorer.agent.policies.base import Policy, Reply, action
from paper_explorer.agent.policies.reading import is_polar, names_in
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy


class DirectSubmitConfig(PromptRecording):
    """``--policy direct-submit``: the shortcut, answering at once without a tool."""

    name: Literal["direct-submit"] = "direct-submit"


@register_policy(DirectSubmitConfig)
def direct_submit(config: DirectSubmitConfig, max_steps: int) -> Policy:
    return DirectSubmit()


class DirectSubmit(Policy):
    """Answers at once without any tool: the shortcut a collapsed fine-tuned policy takes."""

    name = "direct-submit"

    def act(self, messages: list[dict[str, str]]) -> Reply:
        question = self.episode.question
        names = names_in(question)
        guess = "Yes" if is_polar(question) else (names[0] if names else question.rstrip("?").split()[-1])
        return Reply(action(f"submit({json.dumps(guess)}, evidence=[])"))
