"""Frames between the sandbox host and its worker: a 4-byte length, then one JSON object.

Both sides check a frame's length against a cap *before* reading its body, so a worker that
announces a gigabyte costs the host four bytes, not a gigabyte. The host's end never blocks: every
read and write waits with ``poll()`` (no 1024-descriptor ceiling) until a deadline, and a watchdog
may interrupt the wait (the host's CPU clock on the worker).

Frames are JSON in UTF-8, characters as themselves (``dumps``): at most 6 bytes a character, so
the bounds set in characters hold in bytes. Tool arguments cross as plain JSON. ``to_wire`` (worker side) copies what an action passes into
plain data and replaces what cannot cross (a function, a non-string key, a structure too deep or
too large) by a small marker, so that the *host* still sees the call, records it and refuses it
with its own message. Only the standard library is imported here: the worker uses this module.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">I")
MARKER_PREFIX = "\x00"  # a key no identifier-like field name starts with; see ``Marker``
# Bounds of ``to_wire``: one more than the host's own argument limits, so the host's check is what refuses.
WIRE_DEPTH = 8
WIRE_ITEMS = 1001
WIRE_NODES = 20_000


class ChannelClosed(Exception):
    """The other end closed the channel (the worker died, or the host went away)."""


class ChannelTimeout(Exception):
    """The deadline passed before the frame was complete."""


class FrameTooLarge(Exception):
    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"a frame of {size:,} bytes exceeds the cap of {cap:,} bytes")
        self.size = size


class FrameMalformed(Exception):
    """Not one JSON object (or JSON nested past the parser's recursion limit)."""


def dumps(value: Any) -> bytes:
    """``value`` as strict JSON in UTF-8, as frames carry it. Characters go as themselves, not as
    ``\\u`` escapes (ensure_ascii would send an astral character as 12 bytes, not 4, and make every
    reader undo them): only control characters and lone surrogates are escaped, at 6 bytes each, so a
    frame is never more than 6 bytes per character of its strings, and always valid UTF-8. A
    non-finite float raises ValueError here, at the sender's bug."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON allows one): its escape, inside the string it is in
        return LONE_SURROGATE.sub(_escaped, text).encode("utf-8")


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str json.dumps made, every surrogate is a lone one


def _escaped(match: re.Match) -> str:
    return f"\\u{ord(match.group()):04x}"


def size(value: Any) -> int:
    """How many bytes ``value`` takes in a frame."""
    return len(dumps(value))


def encode(payload: dict) -> bytes:
    """One frame: its length, then ``payload`` as ``dumps`` writes it."""
    data = dumps(payload)
    return HEADER.pack(len(data)) + data


def encode_around(envelope: dict, key: str, encoded: bytes) -> bytes:
    """One frame of ``envelope`` with ``encoded`` (a value ``dumps`` wrote) under ``key``: a large
    value encoded first, and figures about its encoding added after it."""
    head = dumps(envelope)
    data = head[:-1] + (b"," if envelope else b"") + dumps(key) + b":" + encoded + b"}"
    return HEADER.pack(len(data)) + data


# The largest integer a frame may carry: ``to_wire`` sends ints of at most 64 bits (either sign).
WIRE_INT_BITS = 64
WIRE_INT_DIGITS = len(str(2**WIRE_INT_BITS - 1))  # 20: a longer literal is refused before int() reads it


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite_float(literal: str) -> float:
    """A JSON number with a fraction or exponent; one too large for a float (1e999) would be infinity."""
    number = float(literal)
    if not math.isfinite(number):
        raise ValueError("a number too large for a float")
    return number


def _bounded_int(literal: str) -> int:
    """A JSON integer of at most 64 bits; a longer one is refused unparsed (int() of many digits is slow)."""
    if len(literal.lstrip("-")) > WIRE_INT_DIGITS:
        raise ValueError("an integer too large")
    number = int(literal)
    if abs(number).bit_length() > WIRE_INT_BITS:
        raise ValueError("an integer too large")
    return number


# An escaped backslash, or a \\u escape of a surrogate: a high one with its low partner, or a lone one.
SURROGATE_ESCAPE = re.compile(r"\\\\|\\u(d[89ab][0-9a-f]{2})(\\u(d[c-f][0-9a-f]{2}))?|\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE)


def _lone_surrogate_to_replacement(match: re.Match) -> str:
    text = match.group(0)
    if text == "\\\\" or match.group(2):  # an escaped backslash, or a proper pair
        return text
    return "\\ufffd"


def decode(body: bytes, object_hook: Callable[[dict], Any] | None = None) -> dict:
    """One strict JSON object in strict UTF-8: no NaN or Infinity, no number that overflows into one
    (1e999) and no integer beyond 64 bits, and no lone surrogates (their escapes become U+FFFD
    before parsing), so whatever a worker sends can be written to a trajectory and read back by any
    JSON parser."""
    try:
        text = body.decode("utf-8")
        if "\\u" in text:
            text = SURROGATE_ESCAPE.sub(_lone_surrogate_to_replacement, text)
        value = json.loads(
            text, object_hook=object_hook, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FrameMalformed(f"not a JSON frame ({type(error).__name__})") from None
    if type(value) is not dict:
        raise FrameMalformed("a frame must be a JSON object")
    return value


# -- the worker's side: blocking, on a descriptor it owns ----------------------------------------


def send_blocking(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def receive_blocking(fd: int, cap: int) -> dict | None:
    """One frame, or None at end of file; a frame over ``cap`` raises FrameTooLarge unread."""
    header = _read_blocking(fd, HEADER.size)
    if header is None:
        return None
    size = HEADER.unpack(header)[0]
    if size > cap:
        raise FrameTooLarge(size, cap)
    body = _read_blocking(fd, size)
    if body is None:
        return None
    return decode(body)


def _read_blocking(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# -- the host's side: non-blocking, every wait bounded -------------------------------------------


class HostChannel:
    """The host's end of one worker's channel (a non-blocking stream socket's descriptor)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.waited = 0.0  # seconds spent waiting on the other end: the rest of the host's time is its own work
        self._pollers = {}
        for events in (select.POLLIN, select.POLLOUT):
            self._pollers[events] = select.poll()
            self._pollers[events].register(fd, events)

    def pending(self) -> bool:
        """Whether the worker has written anything (or closed) that nobody asked for."""
        return bool(self._pollers[select.POLLIN].poll(0))

    def send(self, data: bytes, deadline: float, watchdog: Callable[[], float] | None = None) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                self._wait(select.POLLOUT, deadline, watchdog)
            except (BrokenPipeError, ConnectionResetError):
                raise ChannelClosed() from None

    def receive(
        self, cap: int, deadline: float, watchdog: Callable[[], float] | None = None, object_hook: Callable[[dict], Any] | None = None
    ) -> dict:
        size = HEADER.unpack(self._read(HEADER.size, deadline, watchdog))[0]
        if size > cap:
            raise FrameTooLarge(size, cap)
        return decode(self._read(size, deadline, watchdog), object_hook)

    def _read(self, size: int, deadline: float, watchdog: Callable[[], float] | None) -> bytes:
        chunks, remaining = [], size
        while remaining:
            try:
                chunk = os.read(self.fd, min(remaining, 1 << 20))
            except BlockingIOError:
                self._wait(select.POLLIN, deadline, watchdog)
                continue
            except ConnectionResetError:
                raise ChannelClosed() from None
            if not chunk:
                raise ChannelClosed()
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _wait(self, events: int, deadline: float, watchdog: Callable[[], float] | None) -> None:
        """Until the descriptor is ready; ``watchdog()`` raises to stop, or says how long to wait before asking again."""
        poller = self._pollers[events]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout()
            timeout = remaining if watchdog is None else max(min(remaining, watchdog()), 0.001)
            started = time.monotonic()
            ready = poller.poll(timeout * 1000)
            self.waited += time.monotonic() - started
            if ready:
                return


# -- tool arguments ----------------------------------------------------------------------------


def _marker(kind: str, detail: str = "") -> dict:
    return {MARKER_PREFIX + kind: detail}


def to_wire(value: Any) -> Any:
    """Plain JSON data for ``value``: exact builtin copies, and markers for what cannot cross."""
    budget = [WIRE_NODES]
    return _to_wire(value, 0, budget)


def _to_wire(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return _marker("toolarge")
    if depth > WIRE_DEPTH:
        return _marker("deep")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value) if abs(value).bit_length() <= 64 else _marker("unsupported", "a very large int")
    if isinstance(value, float):
        number = float.__float__(value)
        return number if number == number and abs(number) != float("inf") else _marker("unsupported", "a non-finite float")
    if isinstance(value, (list, tuple)):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        copied: list[Any] = []
        for item in items:
            if len(copied) >= WIRE_ITEMS:
                break
            copied.append(_to_wire(item, depth + 1, budget))
        return copied
    if isinstance(value, dict):
        copied_dict: dict[str, Any] = {}
        for key, item in dict.items(value):
            if not isinstance(key, str):
                return _marker("key", type(key).__name__)
            if str.startswith(key, MARKER_PREFIX):  # the host would read the dict as a marker
                return _marker("key", "a string starting with NUL")
            if len(copied_dict) >= WIRE_ITEMS:
                break
            copied_dict[str.__str__(key)] = _to_wire(item, depth + 1, budget)
        return copied_dict
    return _marker("unsupported", type(value).__name__)


class Marker:
    """What the host decodes a marker into: an argument that could not cross, and why."""

    __slots__ = ("kind", "detail")

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail

    def message(self) -> str:
        if self.kind == "deep":
            return "arguments are nested too deeply; pass plain strings, numbers, lists and dicts"
        if self.kind == "toolarge":
            return "arguments are too large; pass fewer and shorter values"
        if self.kind == "key":
            return "dict keys in arguments must be strings that do not start with NUL"
        detail = self.detail[:60] if isinstance(self.detail, str) else "?"
        return f"arguments must be plain data (str, int, float, bool, None, list, dict), not {detail}"


def marker_hook(item: dict) -> Any:
    """``json.loads`` object hook (host side): a one-key dict whose key starts with NUL is a Marker."""
    if len(item) == 1:
        ((key, detail),) = item.items()
        if key.startswith(MARKER_PREFIX):
            return Marker(key[1:], detail)
    return item
