import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
QASPER_MINI = FIXTURES / "qasper-mini-v0.3.json"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """Index caches go to a per-session temporary directory, never to the user's ~/.cache."""
    directory = tmp_path_factory.getbasetemp() / "explorer-cache"
    monkeypatch.setenv("EXPLORER_CACHE_DIR", str(directory))
    return directory


@pytest.fixture(scope="session")
def small_demo():
    from corpus import DemoConfig, generate

    return generate(DemoConfig(papers=40, seed=7))


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`explorer ARGS` as a user types it, in a fresh process."""
    environment = {**os.environ, **(env or {})}
    explorer = Path(sys.executable).parent / "explorer"
    return subprocess.run([str(explorer), *args], capture_output=True, text=True, cwd=cwd, env=environment, timeout=120)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory, small_demo):
    """A Qwen3-style tokenizer trained on the small demo corpus and the prompts (built, never downloaded)."""
    from agent.prompt import system_prompt
    from agent.tiny_tokenizer import build_tokenizer

    texts = [system_prompt()] + [p.text for p in small_demo.paragraphs()] + [q.text for q in small_demo.questions]
    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"), texts)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """`explorer tiny-model`'s output, built once per test session (a few seconds, nothing downloaded)."""
    from agent.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
