"""A real vLLM server (its CPU build, installed by `make vllm`) in front of the tiny model, for what
only a real server can tell: what it returns, what it refuses, what it loads.

The session's server starts once per pytest process that runs a test asking for it: under
`make test`'s `--dist loadscope` one module goes to one worker, so keep the tests that share it in
one module (tests/integration/test_vllm.py). It listens on 127.0.0.1 at a free port, with runtime
LoRA loading on, and is stopped by its process group (the API server, its engine core and its
workers) at the end. Without the vLLM environment its tests skip and say how to install it; under
CI=true they fail, since CI installs it. Tests that must kill a server start their own with
`running_vllm`.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from paper_explorer.agent.testing import vllm_server as launcher
from paper_explorer.agent.testing.vllm_server import MAX_LORA_RANK, MAX_MODEL_LEN, SERVED_NAME, VLLM_PYTHON, VllmServer, free_port
from tests.conftest import HANG_SECONDS

__all__ = ["MAX_LORA_RANK", "MAX_MODEL_LEN", "SERVED_NAME", "VLLM_PYTHON", "VllmServer", "free_port", "running_vllm", "vllm_python"]


def vllm_python() -> Path:
    if VLLM_PYTHON.exists():
        return VLLM_PYTHON
    reason = f"no vLLM environment at {VLLM_PYTHON.parent.parent}: install it with `make vllm` (a few minutes)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@contextmanager
def running_vllm(model_dir: Path, log: Path, port: int | None = None, **settings) -> Iterator[VllmServer]:
    """agent.testing.vllm_server.running_vllm, skipped without the vLLM environment (failed under
    CI), a server that does not start failing the test with its log's tail."""
    python = vllm_python()
    try:
        with launcher.running_vllm(model_dir, log, port, python=python, deadline_seconds=HANG_SECONDS, **settings) as server:
            yield server
    except launcher.ServerFailed as failure:
        pytest.fail(str(failure))


@pytest.fixture(scope="session")
def vllm_server(request, tmp_path_factory) -> Iterator[VllmServer]:
    """One real vLLM serving the tiny model, shared by the tests of this process."""
    vllm_python()  # skip (or fail under CI) before building anything
    model_dir = request.getfixturevalue("tiny_model")
    with running_vllm(model_dir, tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server
