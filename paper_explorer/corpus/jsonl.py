"""JSON lines, read and written in one place: every ``.jsonl`` file the project writes (trajectory
logs, scores, built training data, validation records, questions, corpora) is cut into lines here.

What is protected:

- A line is the bytes between two ``b"\\n"``, nothing else. JSON escapes ``\\n``, ``\\r`` and the other
  C0 controls inside strings, so a record is always one line; but ``json.dumps(ensure_ascii=False)``
  and pydantic write U+0085, U+2028 and U+2029 raw, and ``str.splitlines()`` splits on those and on
  ``\\r``, ``\\x0b``, ``\\x0c`` and ``\\x1c``-``\\x1e`` (a text-mode file splits on ``\\r``): a reader that used
  it would cut one model answer in two and refuse the whole file. Splitting bytes also means a kill
  in the middle of a UTF-8 character tears one line, not the decoding of the whole file.
- A bad line is one ``JsonLinesError`` naming the file and the line, and what is wrong with it: not
  UTF-8, not JSON, or not the record asked for (its first invalid field). A missing file is left
  to the caller (``FileNotFoundError``): only it knows what the missing file means.
- Appends (``AppendOnlyLines``) write each record as one whole line (``O_APPEND``, one ``write`` call)
  and fsync once per batch (a group commit). A kill leaves at most one torn last line, the bytes
  after the final newline; ``repair`` cuts it off, logged, before the next append, and a reader of
  a log that may still be written steps around it (``read_numbered``). Only the start of a JSON
  object is cut (what a kill leaves of a record): a whole record lacking its newline gets it, and
  a file whose last line is anything else (notes, another tool's output) is refused untouched.
- Whole files (``write_records``, ``write_lines``) appear whole or not at all (``corpus.files.atomic_file``).
- Files are opened by ``corpus.files``: a regular file, bounded (DATA_BYTES), not binary, not a
  link out of the directory the user named (``inside``); an append never follows a link. A line
  of a pydantic record is parsed by pydantic's JSON reader (nesting and numbers bounded), a plain
  one by ``corpus.files.parse_json``.

What is not: two processes appending to one file at once (each line stays whole under
``O_APPEND`` on a local filesystem, but nothing orders them, and a repair may race an append);
lines changed by hand in the middle of a file (each is a bad line, reported); formats: the bytes
of a record are exactly what pydantic's ``model_dump_json`` (or ``json.dumps(ensure_ascii=False)``
for a plain dict) gives, so U+2028 stays raw in the file and other tools' readers must split on
``\\n`` too.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, overload

from pydantic import BaseModel, ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
NEWLINE = b"\n"
BLANK = b" \t\r"  # JSON's whitespace but the newline itself: a line of only these holds no record


class JsonLinesError(Exception):
    """A JSON-lines file that cannot be read as asked; the message names the file and the line."""


@dataclass(frozen=True)
class Line:
    """One line of a file, as written."""

    number: int  # 1-based, as an editor counts lines
    data: bytes  # without its newline


@dataclass(frozen=True)
class TornLine:
    """The unterminated last line of an append-only log (what a kill leaves)."""

    number: int  # 1-based
    size: int  # bytes


@dataclass(frozen=True)
class Record(Generic[T]):
    """A line read back: its number, the record it holds, and its bytes (to copy it as written)."""

    number: int
    value: T
    data: bytes


def split_lines(data: bytes) -> tuple[list[Line], Line | None]:
    """The non-blank lines that end in a newline, and the non-blank bytes after the last newline
    (None when there are none). The only place a file of JSON lines is cut into lines."""
    *whole, tail = data.split(NEWLINE)
    lines = [Line(number, raw) for number, raw in enumerate(whole, 1) if raw.strip(BLANK)]
    return lines, (Line(len(whole) + 1, tail) if tail.strip(BLANK) else None)


def every_line(data: bytes) -> list[Line]:
    """Every non-blank line, an unterminated last one included: for a file written whole (or by
    hand), which nothing tears, and which a hand edit may leave without its final newline."""
    lines, tail = split_lines(data)
    return lines if tail is None else [*lines, tail]


def read_bytes(path: Path, what: str, inside: Path | None = None) -> bytes:
    """A file's bytes (``corpus.files``: a regular file, bounded, not out of ``inside`` by a link,
    not binary), a UTF-8 byte order mark dropped as ``corpus.files.decode`` drops it; FileNotFoundError is the caller's to name, other problems are one line."""
    try:
        data = files.read_bytes(path, limit=files.DATA_BYTES, inside=inside, what=what)
        files.refuse_binary(data, path)
    except files.FileRefused as error:
        raise JsonLinesError(str(error)) from None
    return files.without_bom(data)  # a mark an editor added is not part of the first record


@overload
def parse(path: Path, line: Line, model: type[M], what: str) -> M: ...


@overload
def parse(path: Path, line: Line, model: None, what: str) -> Any: ...


def parse(path: Path, line: Line, model: type[M] | None, what: str) -> M | Any:
    """The record a line holds: an instance of ``model``, or plain JSON when model is None.

    A model's line is parsed by pydantic's JSON reader (twice as fast as ``json.loads`` and a
    validation; nesting bounded at 200 levels, numbers at 4,300 digits); a line it refuses is read
    again by ``corpus.files.parse_json``, for the error's wording and for the JSON it is stricter
    about than Python (an escaped lone surrogate)."""
    if model is not None:
        try:
            files.refuse_not_finite(line.data, path, line.number)
        except files.FileRefused as refused:
            raise JsonLinesError(str(refused)) from None
        try:
            return model.model_validate_json(line.data)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            if first["type"] != "json_invalid":
                raise _not_a(path, line, what, error) from None
            if "recursion limit" in first["msg"] or "number out of range" in first["msg"]:
                bound = first["msg"].removeprefix("Invalid JSON: ").partition(" at line")[0]
                raise JsonLinesError(f"{path}:{line.number}: not {_a(what)} ({bound}: nested too deeply, or a number too large)") from None
    try:
        text = line.data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JsonLinesError(f"{path}:{line.number}: not UTF-8 (byte {error.start + 1} of the line); is this {_a(what)} file?") from None
    try:
        value = files.parse_json(text, path, line.number)
    except json.JSONDecodeError as error:
        raise JsonLinesError(f"{path}:{line.number}: not JSON ({error.msg} at column {error.colno})") from None
    except files.FileRefused as error:
        raise JsonLinesError(str(error)) from None
    if model is None:
        return value
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise _not_a(path, line, what, error) from None


def _not_a(path: Path, line: Line, what: str, error: ValidationError) -> JsonLinesError:
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "(the record itself)"
    return JsonLinesError(f"{path}:{line.number}: not {_a(what)}: field '{where}': {first['msg']}")


@overload
def read_records(path: Path, model: type[M], *, what: str, inside: Path | None = None) -> list[M]: ...


@overload
def read_records(path: Path, model: None = None, *, what: str, inside: Path | None = None) -> list[Any]: ...


def read_records(path: Path, model: type[M] | None = None, *, what: str, inside: Path | None = None) -> list[M] | list[Any]:
    """Every record of a file written whole (scores, built data, questions), the unterminated last
    line included (``every_line``). ``inside``: the directory the user named, when the file is one
    of its files rather than one the user named (``corpus.files.read_bytes``)."""
    return [parse(path, line, model, what) for line in every_line(read_bytes(path, what, inside))]


def read_numbered(path: Path, model: type[M], *, what: str, inside: Path | None = None) -> tuple[list[Record[M]], TornLine | None]:
    """Every whole line of an append-only log, and its torn last line (None when there is none),
    which is skipped: a log may still be written while it is read. Only the last line may be torn;
    any other bad line is an error. ``inside`` as for ``read_records``."""
    lines, tail = split_lines(read_bytes(path, what, inside))
    records = [Record(line.number, parse(path, line, model, what), line.data) for line in lines]
    return records, (TornLine(tail.number, len(tail.data)) if tail is not None else None)


_a = files.a


# -- writing ------------------------------------------------------------------------------------


def encode(record: BaseModel | Mapping, **dump: Any) -> bytes:
    """A record as one line with its newline: ``model_dump_json(**dump)`` for a model, compact
    ``json.dumps(ensure_ascii=False)`` for a plain mapping (the corpus JSONL format)."""
    if isinstance(record, BaseModel):
        text = record.model_dump_json(**dump)
    else:
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), **dump)
    return _checked(text.encode("utf-8"))


def _checked(line: bytes) -> bytes:
    if NEWLINE in line:  # JSON never writes one unless indented; such a record would read back as several lines
        raise ValueError(f"a JSON line may not hold a newline (an indented dump?): {line[:80]!r}")
    return line + NEWLINE


def write_lines(path: str | os.PathLike, lines: Iterable[bytes]) -> None:
    """A whole file of lines given as bytes without their newline (lines copied as written), atomically."""
    with atomic_file(path, binary=True) as handle:
        handle.writelines(_checked(line) for line in lines)


def write_records(path: str | os.PathLike, records: Iterable[BaseModel | Mapping], **dump: Any) -> None:
    """A whole file of records, one per line (``encode``), atomically."""
    with atomic_file(path, binary=True) as handle:
        handle.writelines(encode(record, **dump) for record in records)


class AppendOnlyLines:
    """``with AppendOnlyLines(path) as out: out.append_all(records)``; a torn last line left by a
    kill is cut off when the file is opened (``torn_bytes`` says how many bytes went). The file is
    opened by ``corpus.files.open_append``: never through a symbolic link, never a FIFO or device."""

    def __init__(self, path: Path, **dump: Any) -> None:
        self.path, self._dump = path, dump
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = files.open_append(path, what="log")
        try:
            self.torn_bytes = _cut_torn_line(self._fd, path)
        except BaseException:
            self.close()
            raise

    def append(self, record: BaseModel | Mapping) -> None:
        self.append_all([record])

    def append_all(self, records: Iterable[BaseModel | Mapping]) -> None:
        """Each a whole line, then one fsync for them all (a group commit: records that come
        together, as episodes in flight finish together, cost one disk flush, not one each)."""
        try:
            for record in records:
                view = memoryview(encode(record, **self._dump))
                while view:  # O_APPEND and one write call per line; loop only for a short write
                    view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as error:  # a full disk, a quota: one line (a partial line is a torn one, cut at the next open)
            raise files.FileRefused(f"{self.path}: cannot be written ({error.strerror or error})") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def append_records(path: Path, records: Iterable[BaseModel | Mapping], **dump: Any) -> None:
    """Open, append whole lines, fsync, close: for a log written a record at a time."""
    with AppendOnlyLines(path, **dump) as out:
        out.append_all(records)


def repair(path: Path) -> int:
    """Cut an unterminated last line (a record torn by a kill); return how many bytes went. The
    file is opened as an append is (``corpus.files.open_append``); a missing one raises FileNotFoundError."""
    fd = files.open_append(path, what="log", create=False)
    try:
        return _cut_torn_line(fd, path)
    finally:
        os.close(fd)


def _cut_torn_line(fd: int, path: Path) -> int:
    """Cut the bytes after the last newline if they are a record of ours torn by a kill (the start
    of a JSON object, ``_torn_record``); add the newline if they are a whole record that lacks only
    it (kept); refuse the file, touching nothing, if they are anything else: a file of notes or
    another tool's output named as a log would otherwise lose its last line."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == NEWLINE:
        return 0
    keep = _after_last_newline(fd, size)
    if keep == 0 and os.pread(fd, len(codecs.BOM_UTF8), 0) == codecs.BOM_UTF8:
        keep = len(codecs.BOM_UTF8)  # a byte order mark is no part of the first record: kept, as readers drop it
        if keep == size:
            return 0
    tail = os.pread(fd, min(size - keep, files.DATA_BYTES), keep)
    kind = _torn_record(tail)
    if kind == "whole":
        os.write(fd, NEWLINE)
        os.fsync(fd)
        log.warning("%s: a last record without its newline (%d bytes); the newline added", path, size - keep)
        return 0
    if kind != "torn":
        raise files.FileRefused(
            f"{path}:{_line_count(fd, keep) + 1}: its last line is neither a record nor one torn by an interrupted run; "
            f"not a log written here (nothing was changed): choose another {setting('out')}"
        )
    os.ftruncate(fd, keep)
    os.fsync(fd)
    log.warning("%s: removed a torn last line (%d bytes) left by an interrupted run", path, size - keep)
    return size - keep


def _torn_record(tail: bytes) -> str:
    """'whole' (a JSON object: a record lacking only its newline), 'torn' (the start of one, as a
    kill leaves it: JSON up to its end, perhaps inside a string or a UTF-8 character), or 'other'."""
    if not tail.lstrip(BLANK).startswith(b"{"):
        return "other"
    text = tail.decode("utf-8", "ignore") if _cut_character(tail) else None
    if text is None:
        try:
            text = tail.decode("utf-8")
        except UnicodeDecodeError:
            return "other"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return "torn" if _cut_short(error, text) else "other"
    except ValueError:
        return "other"
    return "whole" if isinstance(value, dict) else "other"


def _cut_short(error: json.JSONDecodeError, text: str) -> bool:
    """Whether the JSON of ``text`` is good up to its end, where it stops: inside a string, an
    escape, a number or a literal, or where a value, a comma or a colon would come next."""
    rest = text[error.pos :].rstrip(" \t\r")
    if error.msg.startswith("Unterminated string") or not rest:
        return True
    if error.msg.startswith("Invalid \\uXXXX escape"):
        return re.fullmatch(r"u[0-9a-fA-F]{0,3}", rest) is not None
    if error.msg.startswith("Expecting"):
        return any(word.startswith(rest) for word in ("true", "false", "null")) or re.fullmatch(r"-?[0-9.eE+-]*", rest) is not None
    return False


def _cut_character(data: bytes) -> bool:
    """Whether ``data`` ends inside a UTF-8 character (a kill may tear one) and is UTF-8 before it."""
    for cut in range(1, 4):
        try:
            data[:-cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False
    return False


def _line_count(fd: int, end: int) -> int:
    count, position = 0, 0
    while position < end:
        block = os.pread(fd, min(1 << 20, end - position), position)
        if not block:
            break
        count += block.count(NEWLINE)
        position += len(block)
    return count


def _after_last_newline(fd: int, size: int) -> int:
    """The offset just past the file's last newline (0 when it has none), scanning back in blocks."""
    position, block = size, 1 << 16
    while position > 0:
        start = max(position - block, 0)
        newline = os.pread(fd, position - start, start).rfind(NEWLINE)
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0
