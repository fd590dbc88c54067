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

Why one module of this size: routing, cooldown and the health of replicas share one lock and one
count of requests in flight; they are read together to see that no request is lost.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import PolicyError
from paper_explorer.agent.terminal_text import visible
from paper_explorer.corpus.setting_names import setting

RETRIED_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# Answers that say the replica, not the request, is wrong (a redirect, no such endpoint): with
# another replica to go to, it is taken out like one that failed; alone, the request fails.
MISPLACED_STATUS = {301, 302, 303, 307, 308, 404, 405, 501}
ANSWER_BYTES = 64 << 20  # a completion this large (prompt ids echoed back included) is not one
REFUSED_DETAIL_BYTES = 4096  # what is kept of an error answer's body
STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def api_key() -> str:
    """The key every request carries as ``Authorization: Bearer``: ``OPENAI_API_KEY``, else "EMPTY"
    (what vLLM's examples send to a server that checks none).

    A key holding a character a header cannot carry (a carriage return from a key file saved on
    Windows, a line break, a non-ASCII character) is refused here, naming its place, never the key:
    ``http.client`` refuses such a header with the whole key in its message, which would be printed
    and recorded in the run's episodes."""
    key = os.environ.get("OPENAI_API_KEY", "EMPTY")
    bad = next((index for index, character in enumerate(key) if not " " <= character <= "~"), None)
    if bad is not None:
        kind = "a non-ASCII character" if ord(key[bad]) > 0x7E else f"the control character {ord(key[bad]):#04x}"
        raise AgentError(
            f"OPENAI_API_KEY holds {kind} at position {bad + 1} of {len(key)}, which an HTTP header cannot carry; "
            "set it to the key alone (a key file saved with Windows line ends leaves a carriage return: strip it)"
        )
    return key


def sends_key() -> bool:
    """Whether requests would carry a real key (one a server could keep), not "EMPTY" or nothing."""
    return api_key() not in ("", "EMPTY")


def api_base(base_url: str) -> str:
    """The server's ``.../v1`` root, from a --base-url given with or without it."""
    if not base_url.startswith(("http://", "https://")):
        raise AgentError(f"{setting('policy.base_url')} {base_url!r} must start with http:// or https://")
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def read_capped(answer, limit: int, deadline: float) -> bytes:
    """The body, refused past ``limit`` bytes or ``deadline`` (the socket timeout bounds each
    read, not a server that drips a byte at a time)."""
    chunks: list[bytes] = []
    size = 0
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

    def __init__(
        self,
        base_urls: list[str] | str,
        api_key: str,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 1.0,
        cooldown: float = 10.0,
        say=None,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise AgentError(f"{setting('policy.base_url')}: give the server's URL")
        bases = [api_base(url) for url in urls]
        repeated = sorted({base for base in bases if bases.count(base) > 1})
        if repeated:
            raise AgentError(f"{setting('policy.base_url')} {repeated[0]} is given twice; name each replica once")
        self.replicas = [_replica(base) for base in bases]
        self.api_key, self.timeout, self.retries, self.backoff, self.cooldown = api_key, timeout, retries, backoff, cooldown
        self.events: list[ReplicaEvent] = []
        self._say = say if say is not None else (lambda line: print(visible(line), file=sys.stderr, flush=True))  # it quotes servers
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
            said = (
                f"replica {replica.base} taken out ({reason}); it is tried again in {self.cooldown:g} s"
                if event == "out"
                else f"replica {replica.base} answers again; it is back in use"
            )
            self._say(f"note: {said}")

    # -- requests ------------------------------------------------------------------------------

    def post(self, endpoint: str, body: dict, accept=None) -> Answer:
        """POST ``body`` as JSON to ``endpoint`` (e.g. ``/completions``) of a replica; the parsed
        answer. 429, 5xx and network failures are retried (on another replica first), as is an
        answer that is not JSON or that ``accept`` (answer -> what is wrong, or None) refuses; a
        request that still fails raises PolicyError, which ends the episode as policy_error and
        names every failed attempt."""
        data = json.dumps(body).encode()
        failures: list[str] = []
        failed: _Replica | None = None
        for attempt in range(self.retries + 1):
            replica, healthy = self._acquire(failed)
            if attempt and (replica is failed or not healthy):
                time.sleep(self.backoff * 2 ** (attempt - 1))  # nowhere else to go: give the server time
            try:
                answer = self._request(replica, "POST", endpoint, data)
                wrong = accept(answer) if accept is not None else None
            except HTTPStatus as error:
                misplaced = error.status in MISPLACED_STATUS and len(self.replicas) > 1
                message = str(error)
                self._release(replica, message if error.status >= 500 or misplaced else None, answered=False)
                failures.append(f"{replica.base}: {message}")
                if error.status not in RETRIED_STATUS and not misplaced:
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
                what = f"the answer was not JSON ({error})" if isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)) else str(error)
                failures.append(f"{replica.base}: {self._redact(what)[:200]}")
                failed = replica
                continue
            if wrong is not None:  # JSON, but not an answer of this API
                self._release(replica, None, answered=False)
                failures.append(f"{replica.base}: {self._redact(wrong)[:200]}")
                failed = replica
                continue
            self._release(replica, None)
            return Answer(answer, replica.base, attempt, failures)
        tried = "; ".join(failure[:240] for failure in failures[-4:])
        earlier = f" ({len(failures) - 4} earlier not shown)" if len(failures) > 4 else ""
        raise PolicyError(f"{endpoint}: request failed after {attempt + 1} attempt(s): {tried}{earlier}", retries=attempt)

    def get(self, base: str, endpoint: str, limit: int, timeout: float) -> dict:
        """One GET to one replica, no retry (preflight); raises HTTPStatus, OSError, ValueError."""
        replica = next(r for r in self.replicas if r.base == base)
        return self._request(replica, "GET", endpoint, None, limit=limit, timeout=timeout)

    def post_once(self, base: str, endpoint: str, body: dict, timeout: float) -> dict:
        """One POST to one replica, no retry (preflight's probe); raises HTTPStatus, OSError, ValueError."""
        replica = next(r for r in self.replicas if r.base == base)
        return self._request(replica, "POST", endpoint, json.dumps(body).encode(), timeout=timeout)

    def _request(
        self, replica: _Replica, method: str, endpoint: str, data: bytes | None, limit: int = ANSWER_BYTES, timeout: float | None = None
    ) -> dict:
        """One request on this thread's kept connection, bounded as a whole by ``timeout``: from
        sending to the last byte of the answer, headers included (a server that drips its status
        line is cut off by the watchdog, not only one that drips its body)."""
        timeout = timeout or self.timeout
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + timeout
        for fresh in (False, True):
            connection, reused = self._connection(replica, timeout, fresh)
            try:
                if connection.sock is None:
                    connection.connect()
                with _WATCHDOG.guard(connection.sock, deadline) as guard:
                    try:
                        connection.request(method, replica.prefix + endpoint, body=data, headers=headers)
                        response = connection.getresponse()
                        if response.status != 200:
                            detail = self._redact(read_capped(response, REFUSED_DETAIL_BYTES, deadline).decode(errors="replace"))
                            response.close()
                            raise HTTPStatus(response.status, detail[:200])
                        raw = read_capped(response, limit, deadline)
                    except (OSError, http.client.HTTPException, HTTPStatus):
                        if guard.fired:
                            raise TimeoutError(f"no whole answer within the timeout of {timeout:g} s") from None
                        raise
                if guard.fired:  # the socket was shut at the deadline: what was read may end there, not at the answer's end
                    raise TimeoutError(f"no whole answer within the timeout of {timeout:g} s")
            except STALE_CONNECTION:
                connection.close()
                if reused and not fresh:
                    continue  # the server closed a kept connection: once more on a new one
                raise
            except BaseException:
                connection.close()  # a half-read answer leaves the connection unusable
                raise
            break
        response.close()  # read to its end (read1 does not mark it so): the connection may carry the next request
        if response.will_close:
            connection.close()
        if self.api_key not in ("", "EMPTY"):  # nothing a server echoes of the key is recorded
            raw = raw.replace(self.api_key.encode(), b"[OPENAI_API_KEY]")
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
        """Without the key, whole or cut at the end of ``text`` (a server may echo it back)."""
        key = self.api_key
        if key in ("", "EMPTY"):
            return text
        text = text.replace(key, "[OPENAI_API_KEY]").replace(repr(key)[1:-1], "[OPENAI_API_KEY]")  # as Python quotes it, too
        for length in range(len(key) - 1, 5, -1):  # a prefix the server's or our cut left at the end
            if text.endswith(key[:length]):
                return text[:-length] + "[OPENAI_API_KEY]"
        return text

    def summary(self) -> list[dict]:
        """Requests each replica answered and failed, for the run's record."""
        with self._lock:
            return [{"replica": r.base, "served": r.served, "failed": r.failed} for r in self.replicas]


def _replica(base: str) -> _Replica:
    try:
        parts = urllib.parse.urlsplit(base)
        port = parts.port
    except ValueError as error:
        raise AgentError(f"{setting('policy.base_url')} {base!r} is not a URL ({error}); e.g. http://localhost:8000/v1") from None
    if not parts.hostname:
        raise AgentError(f"{setting('policy.base_url')} {base!r} names no host")
    if parts.query or parts.fragment or "?" in base or "#" in base:
        raise AgentError(f"{setting('policy.base_url')} {base!r}: give the server's root, without ?query or #fragment")
    if parts.username is not None or parts.password is not None:
        raise AgentError(f"{setting('policy.base_url')} {base!r}: no user or password in the URL; the key comes from OPENAI_API_KEY")
    return _Replica(base, parts.scheme, parts.hostname, port, parts.path)  # IPv6 without its brackets: http.client wants it so


class _Guard:
    def __init__(self, sock, deadline: float) -> None:
        self.sock, self.deadline, self.fired, self.done = sock, deadline, False, False


class _Watchdog:
    """One thread for every request in flight: it shuts down the socket of a request still
    running at its deadline (the socket timeout bounds each read, not their sum). Deadlines wait
    in a heap; the thread is woken only by one earlier than all it waits for."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, _Guard]] = []
        self._count = 0
        self._finished = 0  # guards done but still in the heap
        self._pid: int | None = None

    @contextlib.contextmanager
    def guard(self, sock, deadline: float):
        guard = _Guard(sock, deadline)
        with self._condition:
            if self._pid != os.getpid():  # first use, or a forked child: its own thread
                self._heap, self._finished, self._pid = [], 0, os.getpid()
                threading.Thread(target=self._watch, name="request-deadlines", daemon=True).start()
            self._count += 1
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (deadline, self._count, guard))
            if earliest is None or deadline < earliest:
                self._condition.notify()
        try:
            yield guard
        finally:
            with self._condition:
                guard.done, guard.sock = True, None
                self._finished += 1
                if self._finished > 1024 and 2 * self._finished > len(self._heap):  # a heap of mostly finished requests
                    self._heap = [entry for entry in self._heap if not entry[2].done]
                    heapq.heapify(self._heap)
                    self._finished = 0

    def _watch(self) -> None:
        with self._condition:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, _, guard = heapq.heappop(self._heap)
                    if guard.done:
                        self._finished -= 1
                    else:
                        guard.fired = True
                        try:
                            guard.sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                self._condition.wait(timeout=self._heap[0][0] - now if self._heap else None)


_WATCHDOG = _Watchdog()
# A lock held by the parent's watchdog thread at the fork would never be released: the child starts its own.
os.register_at_fork(after_in_child=lambda: _Watchdog.__init__(_WATCHDOG))
