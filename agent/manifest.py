"""The run manifest: what a run directory's ``manifest.json`` says about how its episodes were made."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent.config import EvalConfig
from agent.trajectory import Hashes

MANIFEST_VERSION = 2  # 2: the config is an EvalConfig; isolation recorded


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
    config: RecordedEvalConfig
    hashes: Hashes
    isolation: str  # the sandbox's layers on this machine (tools.sandbox)
    versions: dict[str, str]
    git_commit: str | None
    hardware: dict[str, Any]
