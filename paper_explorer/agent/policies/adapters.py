"""LoRA adapters loaded into a vLLM server at runtime, under names that cannot be confused.

vLLM's runtime LoRA endpoints (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; enabled
with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) know an adapter by its name
alone. Loading a name the server already holds answers HTTP 400 "already loaded" whatever path it
came from, so a run that takes that answer for success samples with another run's adapter while
recording its own. What protects against that:

- The name says whose and what: ``<run id>-r<N>-<sha12>`` (the run directory's name and a hash of
  its path, the round, and a hash of the adapter's files), so two runs, two rounds or two
  trainings never share a name.
- After loading, the server's own ``/v1/models`` must map that name to that path (its ``root``) on
  every replica; otherwise the run stops with one line before a request is sampled.
- "Already loaded" is accepted only when the server lists the name with this very path (an
  earlier try of the same run), and said; from another path it is an error.
- What a run loaded is unloaded when it ends; on Ctrl-C, or when unloading fails, the adapters are
  left loaded (a rerun of the same command reuses them) and one line names them.

Not protected: files changed at the same path after the server read them (the name carries the
hash of the files as they were when the run began, and vLLM may read the path again later); a
server that lists a path it did not load from; a process killed outright, which says nothing and
leaves its adapters loaded until a rerun ends.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import sys
import time
import urllib.parse
from pathlib import Path

from paper_explorer.agent.config import ServedAdapter
from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.models import file_hashes
from paper_explorer.agent.policies.servers import REFUSED_DETAIL_BYTES, HTTPStatus, ServerPool, api_key, read_capped
from paper_explorer.agent.terminal_text import visible
from paper_explorer.corpus.setting_names import setting

MODELS_LISTING_BYTES = 4 << 20  # a /v1/models answer larger than this is not a model list
ALREADY_LOADED = "has already been loaded"  # vLLM's 400 for a name it holds
NO_ADAPTER_FOUND = "No adapter found"  # vLLM's 404 for a path it cannot load


def adapter_sha256(directory: Path) -> str:
    """One SHA-256 over every file of an adapter directory (names and contents)."""
    if not (directory / "adapter_config.json").is_file():
        raise AgentError(
            f"{setting('policy.adapter')} {directory}: not a LoRA adapter directory (no adapter_config.json); "
            "name a checkpoint directory that explorer train or improve wrote"
        )
    listing = json.dumps(file_hashes(directory), sort_keys=True)
    return hashlib.sha256(listing.encode()).hexdigest()


def run_id(out: Path) -> str:
    """A run directory as a name part: its name (readable) and a hash of its absolute path (unique)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", out.resolve().name).strip("-.")[:40] or "run"
    return f"{readable}-{hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8]}"


def planned_adapter(directory: Path, run: str, round_number: int | None = None) -> ServedAdapter:
    """The name, absolute path and files' hash an adapter is served under by run ``run`` (and round)."""
    sha256 = adapter_sha256(directory)
    round_part = f"-r{round_number}" if round_number is not None else ""
    return ServedAdapter(name=f"{run}{round_part}-{sha256[:12]}", path=str(directory.resolve()), sha256=sha256)


def checked_adapter(directory: Path, recorded: ServedAdapter) -> ServedAdapter:
    """``recorded`` (a run's manifest), once the adapter's files and path are found unchanged."""
    path, sha256 = str(directory.resolve()), adapter_sha256(directory)
    if path != recorded.path:
        raise AgentError(f"{setting('policy.adapter')} {directory} is {path}, but the run loaded {recorded.path}; give the same adapter")
    if sha256 != recorded.sha256:
        raise AgentError(
            f"{setting('policy.adapter')} {directory}: its files changed since the run began (SHA-256 {recorded.sha256[:12]} "
            f"then, {sha256[:12]} now); restore them, or start a new run with another {setting('out')}"
        )
    return recorded


class ServerAdapters:
    """The adapters one run loads into a server, on each of its replicas; as a context manager it
    unloads them when the run ends (see the module docstring for Ctrl-C and failures)."""

    def __init__(self, base_urls: list[str] | str, timeout: float = 120.0, say=None) -> None:
        self.api_key = api_key()
        self.pool = ServerPool(base_urls, self.api_key, timeout=timeout, retries=0)  # checks the URLs; reads /v1/models
        self.timeout = timeout
        self.loaded: list[tuple[str, ServedAdapter]] = []  # (replica, adapter), in loading order
        self._say = say if say is not None else (lambda line: print(visible(line), file=sys.stderr, flush=True))  # it quotes servers

    def load(self, adapter: ServedAdapter) -> None:
        """``adapter`` servable under its name on every replica, as the server itself lists it."""
        for base in self.pool.bases:
            self._load_one(base, adapter)

    def _load_one(self, base: str, adapter: ServedAdapter) -> None:
        url = base + "/load_lora_adapter"
        status, detail = self._post(base, "/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path})
        already = status == 400 and ALREADY_LOADED in detail
        if status != 200 and not already:
            raise AgentError(_refusal(url, adapter, status, detail))
        root = self._listed_root(base, adapter.name)
        if already and root != adapter.path:
            raise AgentError(
                f"{base}: the adapter name {adapter.name!r} is already loaded from {root or 'a path it does not list'}, "
                f"not from {adapter.path}; unload it (POST {base}/unload_lora_adapter with its lora_name) or use another {setting('out')}"
            )
        if root != adapter.path:
            raise AgentError(
                f"{base}/models lists {adapter.name!r} {f'from {root}' if root else 'nowhere'} after loading it from "
                f"{adapter.path}: the server would not sample with this adapter; unload that name or restart the server"
            )
        if already:
            self._say(
                f"note: adapter {adapter.name} is already loaded from {adapter.path} on {base} (an earlier try of this run); "
                "it is used as it is"
            )
        if (base, adapter) not in self.loaded:
            self.loaded.append((base, adapter))

    def _listed_root(self, base: str, name: str) -> str | None:
        """The path the server says it serves ``name`` from (None: it does not list it)."""
        url = base + "/models"
        try:
            listing = self.pool.get(base, "/models", MODELS_LISTING_BYTES, min(self.timeout, 30))
        except HTTPStatus as error:
            raise AgentError(
                f"{url} answered HTTP {error.status}, so which adapter the server serves cannot be checked; "
                "use a vLLM server (it lists each adapter's path)"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            raise AgentError(
                f"no server answers at {url} ({type(error).__name__}: {error}); start it or fix {setting('policy.base_url')}"
            ) from None
        except ValueError as error:
            raise AgentError(f"{url} did not answer a model list ({str(error)[:80]}); is it a vLLM server?") from None
        data = listing.get("data") if isinstance(listing, dict) else None
        for item in data if isinstance(data, list) else []:
            if isinstance(item, dict) and item.get("id") == name:
                return str(item.get("root")) if item.get("root") is not None else None
        return None

    def unload_all(self) -> list[tuple[str, ServedAdapter]]:
        """Unload what was loaded, latest first; returns those that could not be (they are said)."""
        left = []
        for base, adapter in reversed(self.loaded):
            try:
                status, _ = self._post(base, "/unload_lora_adapter", {"lora_name": adapter.name})
            except AgentError:
                status = 0  # no answer
            if status not in (200, 404):  # 404: no longer loaded (someone unloaded it): nothing left
                left.append((base, adapter))
        self.loaded = []
        if left:
            self._say_left(left, "could not be unloaded")
        return left

    def __enter__(self) -> ServerAdapters:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if not self.loaded:
            return
        if kind is not None and issubclass(kind, KeyboardInterrupt):  # out at once; a rerun reuses them
            self._say_left(list(self.loaded), "were left loaded (interrupted)")
            self.loaded = []
            return
        self.unload_all()

    def _say_left(self, left: list[tuple[str, ServedAdapter]], why: str) -> None:
        named = ", ".join(f"{adapter.name} ({base})" for base, adapter in left)
        self._say(
            f"note: {len(left)} adapter(s) {why}: {named}; a rerun of the same command reuses them, "
            'or unload each with POST <base-url>/unload_lora_adapter {"lora_name": NAME}'
        )

    def _post(self, base: str, endpoint: str, body: dict) -> tuple[int, str]:
        """One POST, no retry, no redirect, no proxy: the status and the answer's text (vLLM's
        success answers are plain text), the API key redacted."""
        parts = urllib.parse.urlsplit(base)
        if not parts.hostname:
            raise AgentError(f"{setting('policy.base_url')} {base!r} names no host")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        try:
            connection.request("POST", parts.path + endpoint, body=json.dumps(body).encode(), headers=headers)
            answer = connection.getresponse()
            text = read_capped(answer, REFUSED_DETAIL_BYTES, time.monotonic() + self.timeout).decode(errors="replace")
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise AgentError(
                f"no server answers at {base + endpoint} ({self.pool._redact(f'{type(error).__name__}: {error}')}); "
                f"start it or fix {setting('policy.base_url')}"
            ) from None
        finally:
            connection.close()
        return answer.status, self.pool._redact(_message(text))


def _message(text: str) -> str:
    """vLLM's error message from its JSON answer ({"error": {"message": ...}} or {"detail": ...}), else the text."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", text))[:300]
    if isinstance(answer, dict) and "detail" in answer:
        return str(answer["detail"])[:300]
    return text.strip()[:300]


def _refusal(url: str, adapter: ServedAdapter, status: int, detail: str) -> str:
    """One line for a load the server refused: what, where, how to fix."""
    if status == 404 and NO_ADAPTER_FOUND in detail:
        return (
            f"{url}: the server found no adapter at {adapter.path} ({detail}); it must see that directory "
            "(the same machine, or the same path on a shared filesystem)"
        )
    if status in (404, 405, 501):  # no such endpoint
        return (
            f"{url} answered HTTP {status}: the server loads no adapters at runtime; start vLLM with --enable-lora "
            "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
        )
    return (
        f"{url}: the server refused to load {adapter.path} (HTTP {status}: {detail}); check vLLM's --max-lora-rank "
        "(at least the adapter's r) and its log"
    )


__all__ = ["ServerAdapters", "adapter_sha256", "checked_adapter", "planned_adapter", "run_id"]
