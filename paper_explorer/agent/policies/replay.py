"""Replays a recorded trajectory's actions against the current runtime and records where the
observations now differ (for reproducing an episode and for catching drift)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import EpisodeStart, Policy, PolicyError, Reply
from paper_explorer.agent.policies.records import PolicySettings
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.agent.trajectory import Drift, StepPolicyInfo, Trajectory
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.corpus.setting_names import setting


class ReplayConfig(PromptRecording):
    """``--policy replay``: re-run a recording's actions."""

    name: Literal["replay"] = "replay"
    replay: Path | None = Field(None, description="The trajectories (.jsonl) whose actions are re-run.")


@register_policy(ReplayConfig)
def replay(config: ReplayConfig, max_steps: int) -> Policy:
    if config.replay is None:
        raise AgentError(f"{setting('policy.name', 'replay')} needs {setting('policy.replay')} TRAJECTORIES.jsonl (the episodes to replay)")
    return Replay(read_trajectories(config.replay), source=config.replay)


class ReplaySettings(PolicySettings):
    trajectories: str | None  # the recording's file
    episodes: int  # the recorded episodes, one per question text


class Replay(Policy):
    name = "replay"

    def __init__(self, recorded: list[Trajectory], source: Path | None = None) -> None:
        self.source = source
        self.by_question: dict[str, Trajectory] = {}
        self.by_text: dict[str, Trajectory] = {}
        self._corpora = {trajectory.hashes.corpus_sha256 for trajectory in recorded}
        for trajectory in recorded:
            if trajectory.question_id is not None:
                self.by_question.setdefault(trajectory.question_id, trajectory)
            self.by_text.setdefault(trajectory.question, trajectory)

    def settings(self) -> ReplaySettings:
        return ReplaySettings(trajectories=str(self.source) if self.source else None, episodes=len(self.by_text))

    def corpus_hashes(self) -> set[str]:
        """The ``corpus_sha256`` the recorded episodes were made on (one, unless the recording mixes corpora)."""
        return set(self._corpora)

    def questions(self) -> list[str]:
        """Question ids in the recording, in its order (what ``eval --policy replay`` runs)."""
        return list(self.by_question)

    def start(self, episode: EpisodeStart) -> None:
        super().start(episode)
        recorded = self.by_question.get(episode.question_id) if episode.question_id else None
        self.recorded = recorded or self.by_text.get(episode.question)
        if self.recorded is None:
            raise PolicyError(f"the recording has no episode for question {episode.question_id or episode.question!r}")

    def act(self, messages: list[dict[str, str]]) -> Reply:
        assert self.recorded is not None
        steps = self.recorded.steps
        index = sum(1 for message in messages if message["role"] == "assistant")
        if index >= len(steps):
            raise PolicyError(f"the recording ends after {len(steps)} steps but the episode goes on: the runtime has drifted")
        if index == 0:
            return Reply(steps[index].action_text, info=StepPolicyInfo(replayed_step=index))
        matches, drift = _compare(steps[index - 1].observation, messages[-1]["content"])
        return Reply(steps[index].action_text, info=StepPolicyInfo(replayed_step=index, previous_observation_matches=matches, drift=drift))

    def finish(self, messages: list[dict[str, str]]) -> dict[str, Any] | None:
        """The last observation, which no further action would otherwise compare (merged into the
        last step's ``StepPolicyInfo`` by the loop)."""
        assert self.recorded is not None
        index = sum(1 for message in messages if message["role"] == "assistant")
        if index == 0 or index > len(self.recorded.steps) or messages[-1]["role"] != "user":
            return None
        matches, drift = _compare(self.recorded.steps[index - 1].observation, messages[-1]["content"])
        return {"final_observation_matches": matches, **({"final_drift": drift} if drift is not None else {})}


def _compare(then: str, now: str) -> tuple[bool, Drift | None]:
    """Whether the observation is the recorded one, and where it first differs when not."""
    return then == now, (first_difference(then, now) if then != now else None)


def first_difference(recorded: str, current: str, context: int = 40) -> Drift:
    position = next((i for i, (a, b) in enumerate(zip(recorded, current)) if a != b), min(len(recorded), len(current)))
    start = max(position - context, 0)
    return Drift(position=position, recorded=recorded[start : position + context], current=current[start : position + context])
