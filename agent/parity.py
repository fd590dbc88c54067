"""Train/serve parity: at every step, prompt + action tokens are a prefix of the training sequence."""

from __future__ import annotations

from dataclasses import dataclass

from agent.renderer import ChatRenderer
from agent.trajectory import Trajectory
from tools.page import tool_page

CONTEXT_TOKENS = 12


@dataclass
class Mismatch:
    episode_id: str
    step: int
    what: str
    position: int | None = None
    served: str = ""
    trained: str = ""

    def __str__(self) -> str:
        where = f"episode {self.episode_id} step {self.step + 1}"
        if self.position is None:
            return f"{where}: {self.what}"
        return f"{where}: {self.what} at token {self.position}\n  served:  {self.served!r}\n  trained: {self.trained!r}"


def check_trajectory(trajectory: Trajectory, renderer: ChatRenderer) -> Mismatch | None:
    """The first place where serving and training disagree for this trajectory, or None."""
    messages = trajectory.messages()
    training = renderer.render(messages).ids
    page = tool_page()
    for step in trajectory.steps:
        before = messages[: 2 + 2 * step.index]
        copies = sum(message["content"].count(page) for message in before)
        if copies != 1:
            return Mismatch(trajectory.episode_id, step.index, f"the tool page appears {copies} times in the prompt, not once")
        prompt = renderer.prompt(before)
        served = prompt + renderer.action(step.action_text)
        recorded = step.generation.prompt_tokens if step.generation else None
        if recorded is not None and recorded != len(prompt):
            return Mismatch(trajectory.episode_id, step.index, f"the policy recorded a prompt of {recorded} tokens; the renderer builds {len(prompt)}")
        for position, (a, b) in enumerate(zip(served, training)):
            if a != b:
                return _mismatch(trajectory, step.index, "served and training tokens differ", position, served, training, renderer)
        if len(served) > len(training):
            return _mismatch(trajectory, step.index, "the training sequence ends before the served tokens", len(training), served, training, renderer)
    return None


def _mismatch(trajectory, step, what, position, served, training, renderer) -> Mismatch:
    start = max(position - CONTEXT_TOKENS, 0)
    return Mismatch(
        trajectory.episode_id, step, what, position,
        renderer.decode(served[start:position + CONTEXT_TOKENS]), renderer.decode(training[start:position + CONTEXT_TOKENS]),
    )
