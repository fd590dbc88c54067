"""Policies by name. Language-model policies register here too, imported lazily (torch is heavy)."""

from __future__ import annotations

from pathlib import Path

from agent.errors import UsageError
from agent.policies.base import ContextExceeded, EpisodeStart, Policy, PolicyError, Reply
from agent.policies.baselines import DirectSubmit, ReadAll, SingleShotRag
from agent.policies.replay import Replay
from agent.policies.scripted import Scripted

POLICY_NAMES = ("scripted", "direct-submit", "single-shot-rag", "read-all", "replay")


def make_policy(name: str, *, replay: Path | None = None, max_steps: int = 10) -> Policy:
    """The named policy; bad names and missing options are one clear line."""
    if name == "replay":
        if replay is None:
            raise UsageError("--policy replay needs --replay TRAJECTORIES.jsonl (the episodes to replay)")
        from agent.writer import read_trajectories

        return Replay(read_trajectories(replay), source=replay)
    if replay is not None:
        raise UsageError(f"--replay is only for --policy replay, not {name!r}")
    if name == "scripted":
        return Scripted()
    if name == "direct-submit":
        return DirectSubmit()
    if name == "single-shot-rag":
        return SingleShotRag()
    if name == "read-all":
        return ReadAll(max_steps=max_steps)
    raise UsageError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


__all__ = ["ContextExceeded", "EpisodeStart", "POLICY_NAMES", "Policy", "PolicyError", "Reply", "make_policy"]
