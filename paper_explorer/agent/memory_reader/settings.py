"""The memory reader's settings around its ``[policy]`` fields: presets, and the episode budgets it reads under.

The reader prints whole papers into its observations (one action per paper) and never shows the
conversation to a model, so the code agent's episode budgets (an observation of 4,000 characters,
a conversation of 100,000, ten steps) would cut what it reads. Unless a config or a flag gives
them, its episodes get budgets that hold a paper whole and exactly the steps its fixed plan takes:
a search, the outlines, one read per paper, the answer. The values are written into the config,
so the manifest records them as they were used.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PRESETS_FILE = Path(__file__).parent / "presets.toml"
READER_EPISODE = {
    "observation_chars": 2_000_000,  # a paper's every page, printed one repr() line each
    "output_chars": 2_000_000,
    "context_chars": 50_000_000,  # the conversation is a log here: no model is shown it
}
# The outlines, the submit, and one step more: if submit() refused the answer, the reader's next
# act() ends the episode saying why (no_answer), where a limit at the submit would say only
# "no submit within N steps". The search (scope search:K) and one read per paper come on top.
PLAN_STEPS = 3


def presets() -> dict[str, dict[str, Any]]:
    return tomllib.loads(PRESETS_FILE.read_text(encoding="utf-8"))


def plan_steps(scope: str) -> int:
    """The steps the reader's plan takes at most (see PLAN_STEPS): scope paper searches for none and
    reads one paper; search:K searches once and reads up to K."""
    if scope == "paper":
        return PLAN_STEPS + 1
    _, _, count = scope.partition(":")
    return PLAN_STEPS + 1 + int(count) if count.isdigit() else PLAN_STEPS + 1


def with_reader_defaults(data: Any) -> Any:
    """``data`` (a run or eval config before validation) with the memory reader's preset and episode
    defaults filled in where nothing was given; other policies' configs are returned as they are."""
    if not isinstance(data, dict):
        return data
    policy = _given(data.get("policy"))
    if policy.get("name") != "memory-reader":
        return data
    episode = _given(data.get("episode"))
    preset = policy.get("preset")
    if isinstance(preset, str) and preset in presets():
        chosen = presets()[preset]
        policy = {**chosen.get("policy", {}), **policy}
        episode = {**chosen.get("episode", {}), **episode}
    scope = policy.get("scope", "search:3")
    episode = {**READER_EPISODE, "max_steps": plan_steps(scope if isinstance(scope, str) else ""), **episode}
    return {**data, "policy": policy, "episode": episode}


def _given(value: Any) -> dict[str, Any]:
    """The settings given in a table or a model instance (an instance: only those set explicitly)."""
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in value.model_fields_set}
    return dict(value) if isinstance(value, dict) else {}
