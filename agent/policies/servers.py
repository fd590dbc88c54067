"""The servers an ``openai`` policy sends its requests to: one, or several replicas of one model.

Several ``--base-url``s are replicas serving the same model (vLLM data-parallel, one per GPU or
node). Each request goes to the least busy healthy replica: the one with the fewest requests in
flight from this process. A replica whose request fails at the network or with a 5xx answer is
taken out for ``cooldown`` seconds and the request goes on to another one at once (no backoff
while a healthy replica is left); once the cooldown is over, the next request tries it again, and
it is back when that request succeeds. Each event is kept in ``ServerPool.events`` and said on
stderr; each step records the replica that answered and the failures on the way
(``Generation.replica``, ``Generation.replica_errors``).

Connections are kept alive, one per thread and replica: hundreds of episodes in flight would
otherwise open a TCP connection per request. A kept connection the server has closed meanwhile
is reopened once, without counting as a failure (that is how HTTP keep-alive ends). Answers are
read up to a byte cap and an overall deadline (a server that drips a byte at a time is cut off).
Redirects are not followed, and no proxy is used: the replicas are the servers named.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from agent.errors import AgentError
from agent.policies.base import PolicyError

RETRIED_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
ANSWER_BYTES = 64 << 20  # a completion this large (prompt ids echoed back included) is not one
REFUSED_DETAIL_BYTES = 4096  # what is kept of an error answer's body
STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def api_base(base_url: str) -> str:
    """The server's ``.../v1`` root, from a --base-url given with or without it."""
    if not base_url.startswith(("http://", "https://")):
        raise AgentError(f"--base-url {base_url!r} must start with http:// or https://")
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def read_capped(answer, limit: int, deadline: float) -> bytes:
    """The body, refused past ``limit`` bytes or ``deadline`` (the socket timeout bounds each
    read, not a server that drips a byte at a time)."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
        chunk = answer.read1(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"an answer over {limit} bytes")
        chunks.append(chunk)


@dataclass
class Answer:
    body: dict
    replica: str  # the base URL that answered
    retries: int  # requests retried before this one succeeded
    failures: list[str] = field(default_factory=list)  # "URL: what went wrong", one per failed request


@dataclass
class ReplicaEvent:
    at: float  # seconds since the pool was made
    replica: str
    event: str  # "out" (taken out after a failure) or "back" (answered again after its cooldown)
    reason: str = ""


class HTTPStatus(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


@dataclass
class _Replica:
    base: str
    scheme: str
    host: str
    port: int | None
    prefix: str  # the path before the endpoint, e.g. /v1
    in_flight: int = 0
    out_until: float = 0.0  # monotonic time its cooldown ends; 0 when healthy
    served: int = 0
    failed: int = 0


class ServerPool:
    """Thread-safe: one pool serves every episode in flight (each episode's policy is a shallow copy)."""

    def __init__(self, base_urls: list[str] | str, api_key: str, timeout: float = 120.0, retries: int = 4,
                 backoff: float = 1.0, cooldown: float = 10.0, say=None) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise AgentError("--base-url: give the server's URL")
        bases = [api_base(url) for url in urls]
        repeated = sorted({base for base in bases if bases.count(base) > 1})
        if repeated:
            raise AgentError(f"--base-url {repeated[0]} is given twice; name each replica once")
        self.replicas = [_replica(base) for base in bases]
        self.api_key, self.timeout, self.retries, self.backoff, self.cooldown = api_key, timeout, retries, backoff, cooldown
        self.events: list[ReplicaEvent] = []
        self._say = say if say is not None else (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._local = threading.local()
        self._started = time.monotonic()

    @property
    def bases(self) -> list[str]:
        return [replica.base for replica in self.replicas]

    def __len__(self) -> int:
        return len(self.replicas)

    # -- choosing a replica --------------------------------------------------------------------

    def _acquire(self, avoid: _Replica | None) -> tuple[_Replica, bool]:
        """The replica for the next request, and whether it is healthy. Among healthy ones, the
        least busy (``avoid``, the one that just failed, only if it is the only one); when none is
        healthy, the one whose cooldown ends first (it is retried early rather than not at all)."""
        with self._lock:
            now = time.monotonic()
            healthy = [r for r in self.replicas if r.out_until <= now]
            candidates = [r for r in healthy if r is not avoid] or healthy
            if candidates:
                chosen, ok = min(candidates, key=lambda r: r.in_flight), True  # min keeps the first of equals: the order given
            else:
                chosen, ok = min(self.replicas, key=lambda r: r.out_until), False
            chosen.in_flight += 1
            return chosen, ok

    def take_out(self, base: str, reason: str) -> None:
        """Out of use for a cooldown (a replica that did not answer the preflight)."""
        replica = next(r for r in self.replicas if r.base == base)
        with self._lock:
            replica.in_flight += 1
        self._release(replica, reason, answered=False)

    def _release(self, replica: _Replica, error: str | None, answered: bool = True) -> None:
        """``error``: why the replica is taken out (None: it is healthy); ``answered``: it served the request."""
        with self._lock:
            replica.in_flight -= 1
            was_out = replica.out_until > 0
            if error is None:
                replica.served += answered
                if was_out:
                    replica.out_until = 0.0
                    self._event(replica, "back")
                return
            replica.failed += 1
            replica.out_until = time.monotonic() + self.cooldown
            if not was_out:
                self._event(replica, "out", error)

    def _event(self, replica: _Replica, event: str, reason: str = "") -> None:
        record = ReplicaEvent(round(time.monotonic() - self._started, 3), replica.base, event, reason)
        self.events.append(record)
        if len(self.replicas) > 1:
            said = (f"replica {replica.base} taken out ({reason}); it is tried again in {self.cooldown:g} s" if event == "out"
                    else f"replica {replica.base} answers again; it is back in use")
            self._say(f"note: {said}")

    # -- requests ------------------------------------------------------------------------------

    def post(self, endpoint: str, body: dict) -> Answer:
        """POST ``body`` as JSON to ``endpoint`` (e.g. ``/completions``) of a replica; the parsed
        answer. 429, 5xx and network failures are retried (on another replica first); a request
        that still fails raises PolicyError, which ends the episode as policy_error."""
        data = json.dumps(body).encode()
        failures: list[str] = []
        failed: _Replica | None = None
        for attempt in range(self.retries + 1):
            replica, healthy = self._acquire(failed)
            if attempt and (replica is failed or not healthy):
                time.sleep(self.backoff * 2 ** (attempt - 1))  # nowhere else to go: give the server time
            try:
                answer = self._request(replica, "POST", endpoint, data)
            except HTTPStatus as error:
                message = self._redact(str(error))
                self._release(replica, message if error.status >= 500 else None, answered=False)
                failures.append(f"{replica.base}: {message}")
                if error.status not in RETRIED_STATUS:
                    break
                failed = replica
                continue
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, truncated
                message = self._redact(f"{type(error).__name__}: {error}")
                self._release(replica, message)
                failures.append(f"{replica.base}: {message}")
                failed = replica
                continue
            except ValueError as error:  # not JSON, not UTF-8, or too large: the server answered, wrongly
                self._release(replica, None, answered=False)
                failures.append(f"{replica.base}: the answer was not JSON ({str(error)[:80]})")
                failed = replica
                continue
            self._release(replica, None)
            return Answer(answer, replica.base, attempt, failures)
        raise PolicyError(f"{replica.base}{endpoint}: request failed after {attempt + 1} attempt(s): "
                          f"{failures[-1].partition(': ')[2]}", retries=attempt)

    def get(self, base: str, endpoint: str, limit: int, timeout: float) -> dict:
        """One GET to one replica, no retry (preflight); raises HTTPStatus, OSError, ValueError."""
        replica = next(r for r in self.replicas if r.base == base)
        return self._request(replica, "GET", endpoint, None, limit=limit, timeout=timeout)

    def _request(self, replica: _Replica, method: str, endpoint: str, data: bytes | None, limit: int = ANSWER_BYTES,
                 timeout: float | None = None) -> dict:
        timeout = timeout or self.timeout
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for fresh in (False, True):
            connection, reused = self._connection(replica, timeout, fresh)
            try:
                connection.request(method, replica.prefix + endpoint, body=data, headers=headers)
                response = connection.getresponse()
            except STALE_CONNECTION:
                connection.close()
                if reused and not fresh:
                    continue  # the server closed a kept connection: once more on a new one
                raise
            except BaseException:
                connection.close()
                raise
            break
        deadline = time.monotonic() + timeout
        try:
            if response.status != 200:
                detail = read_capped(response, REFUSED_DETAIL_BYTES, deadline)[:200].decode(errors="replace")
                response.close()
                raise HTTPStatus(response.status, detail)
            raw = read_capped(response, limit, deadline)
        except BaseException:
            connection.close()  # a half-read answer leaves the connection unusable
            raise
        response.close()  # read to its end (read1 does not mark it so): the connection may carry the next request
        if response.will_close:
            connection.close()
        return json.loads(raw)

    def _connection(self, replica: _Replica, timeout: float, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's kept connection to ``replica`` (a new one when ``fresh``), and whether it was used before."""
        if getattr(self._local, "pid", None) != os.getpid():  # a forked worker must not talk on its parent's sockets
            self._local.connections, self._local.pid = {}, os.getpid()
        kept = self._local.connections
        connection = kept.get(replica.base)
        if connection is not None and not fresh and connection.timeout == timeout:
            return connection, connection.sock is not None
        if connection is not None:
            connection.close()
        kind = http.client.HTTPSConnection if replica.scheme == "https" else http.client.HTTPConnection
        connection = kind(replica.host, replica.port, timeout=timeout)
        kept[replica.base] = connection
        return connection, False

    def _redact(self, text: str) -> str:
        if self.api_key not in ("", "EMPTY"):  # a server may echo the key back in its error
            return text.replace(self.api_key, "[OPENAI_API_KEY]")
        return text

    def summary(self) -> list[dict]:
        """Requests each replica answered and failed, for the run's record."""
        with self._lock:
            return [{"replica": r.base, "served": r.served, "failed": r.failed} for r in self.replicas]


def _replica(base: str) -> _Replica:
    parts = urllib.parse.urlsplit(base)
    if not parts.hostname:
        raise AgentError(f"--base-url {base!r} names no host")
    try:
        port = parts.port
    except ValueError:
        raise AgentError(f"--base-url {base!r}: the port is not a number from 0 to 65535") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return _Replica(base, parts.scheme, host, port, parts.path)
