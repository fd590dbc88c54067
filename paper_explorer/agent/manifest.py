"""The run manifest: what a run directory's ``manifest.json`` says about how its episodes were made."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.trajectory import Hashes, Trajectory

MANIFEST_VERSION: Literal[2] = 2  # 2: the config is an EvalConfig; isolation recorded


class RecordedEvalConfig(EvalConfig):
    """The run's config as given, and what it selected from the corpus."""

    questions: int
    selected_questions_sha256: str


class RunManifest(BaseModel):
    """Written first, before any episode, and never rewritten; ``eval --resume`` reads it back."""

    model_config = ConfigDict(extra="forbid")

    manifest_version: Literal[2] = MANIFEST_VERSION
    created_at: str
    command: list[str]
    corpus: list[str]  # the files the corpus was loaded from (empty: the generated demo corpus)
    file_sha256: dict[str, str] = Field(default_factory=dict, exclude_if=lambda files: not files)
    """The SHA-256 of each file read, the corpus's and a questions file's, as stored: the files a
    run used, pinned (left out when none was read: the demo corpus; older manifests lack it)."""
    config: RecordedEvalConfig
    hashes: Hashes
    isolation: str  # the sandbox's layers on this machine (tools.sandbox)
    versions: dict[str, str]
    git_commit: str | None
    hardware: dict[str, Any]


# Policy settings that say where and how patiently a server was asked, not what acted: a resumed
# run or another shard may differ in them.
CONNECTION_SETTINGS = ("url", "replicas", "timeout", "retries")


def acting_settings(trajectory: Trajectory) -> dict[str, Any]:
    return {key: value for key, value in trajectory.policy.settings.items() if key not in CONNECTION_SETTINGS}


def differing_settings(ours: BaseModel, theirs: BaseModel) -> list[str]:
    """The fields two settings records differ in, by value (a dump leaves out probe settings when no
    probe was asked, so comparing dumps would name none)."""
    return sorted(name for name in type(ours).model_fields if getattr(ours, name) != getattr(theirs, name, None))


def stranger(trajectory: Trajectory, manifest: RunManifest, settings: dict[str, Any] | None) -> str | None:
    """Why a log line was not made by the run ``manifest`` describes (another policy, other
    episode settings or hashes, other policy ``settings`` than the run's other lines), or None."""
    if trajectory.hashes != manifest.hashes:
        changed = sorted(key for key, value in manifest.hashes.model_dump().items() if trajectory.hashes.model_dump()[key] != value)
        return f"its {', '.join(changed)} differ from the run's"
    if trajectory.policy.name != manifest.config.policy.name:
        return f"it was made by policy {trajectory.policy.name!r}; the run's is {manifest.config.policy.name!r}"
    if trajectory.config != manifest.config.episode:
        return f"its episode settings differ from the run's ({', '.join(differing_settings(manifest.config.episode, trajectory.config))})"
    if settings is not None and acting_settings(trajectory) != settings:
        theirs = acting_settings(trajectory)
        changed = sorted(key for key in set(settings) | set(theirs) if settings.get(key) != theirs.get(key))
        return f"its policy settings differ from the run's other episodes ({', '.join(changed)})"
    return None
