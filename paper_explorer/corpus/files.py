"""Files as untrusted input: every file the project reads or writes for a user is opened here.

A corpus, a questions file, a run directory or a config may come from someone else, and a path
may name anything the file system holds. What is protected:

- Only regular files are read or written. A FIFO, socket or device is refused from its ``stat``,
  before it is opened (opening a device can act); the open itself is ``O_NONBLOCK``, so a FIFO
  swapped in after the ``stat`` cannot block, and ``fstat`` checks again what was opened.
- A file of a directory the user named (a run's ``manifest.json``, a corpus folder's files) stays
  in it: a symbolic link that leads out of the directory is refused (``inside``), and the file is
  opened ``O_NOFOLLOW`` at its resolved path. A file the user names itself is followed wherever
  its link points: the user asked for it.
- Sizes are bounded before reading (``fstat``) and while reading (a ``/proc`` file says 0 bytes):
  a file over its bound is refused in one line that says the bound.
- Text is UTF-8 without NUL (``decode``), a UTF-8 byte order mark dropped wherever text or JSON is
  read (``without_bom`` for JSON read undecoded): a binary file, or text in UTF-16 or UTF-32, is refused in
  one line instead of becoming a paper full of NUL characters.
- JSON and TOML (``parse_json``, ``parse_toml``) bound nesting (Python's recursion limit, caught)
  and number sizes, and refuse NaN and Infinity, which JSON does not have; each problem is one
  line naming the file and the line. Records with a pydantic model are parsed by pydantic's own
  JSON reader, which bounds nesting at 200 levels and numbers at 4,300 digits (``corpus.jsonl``).
- Outputs are never written through a symbolic link: appends open ``O_NOFOLLOW`` (a link, dangling
  or not, is refused; nothing is created where it points) and refuse a file with other names (a
  hard link) or one another user put in a sticky directory anyone may write (/tmp); whole files
  are written beside the target and renamed over it (``atomic_file``), which replaces a link
  instead of writing where it points. The temporary file gets its mode through its descriptor (a
  link swapped in at its name gets none) and is checked to be the file written before the rename;
  the umask is read, never set (set to 0 for an instant, it would give a file another thread
  creates mode 0666). A copy (``copy_file``) is read and written by the same rules, in blocks.

What is not: a race by someone who can write the directory while we read it (an intermediate
directory swapped for a link between the check and the open); a regular file that is merely
huge but under its bound (it is read, and costs its size in memory).

The OS's own refusals while reading or writing (EIO from ``/proc/self/mem``, EINVAL, a name too
long, a parent that is a file, no permission) are ``FileRefused`` too, with the OS's reason; a
file is hashed (``sha256``) within a bound and within the size it says it has.

Every problem is a ``FileRefused`` whose message is one line naming the file; each layer turns it
into its own error (``CorpusError``, ``EvaluationError``, ...), and the CLI prints it with exit 2.
A missing file stays ``FileNotFoundError``: only the caller knows what its absence means.

Why one module of this size: it is the one place a path becomes a descriptor, for reading and for
writing, and the one place file bytes become text, JSON or TOML; split, a reader could take one
half of the rules and skip the other.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from pydantic import BaseModel, ValidationError

MiB = 1 << 20
GiB = 1 << 30
DOCUMENT_BYTES = 64 * MiB  # one JSON or TOML document: a manifest, metrics, a config, a calibration
TEXT_BYTES = 64 * MiB  # one paper's text, an action file
DATA_BYTES = 1 * GiB  # a corpus, a questions file, a trajectory log, scores, training data
MAX_DIGITS = 100  # digits in one JSON or TOML number: counts, seeds and ids need 20; Python's own bound is 4,300
HASHED_BYTES = 64 * GiB  # a file hashed, never held: a run's log, a model's weights
READ_BLOCK = 1 << 16  # how much more than its stated size is asked of a file (a /proc file says 0)

PathLike = str | os.PathLike
M = TypeVar("M", bound=BaseModel)


class FileRefused(Exception):
    """A file that is not one to read or write as asked; the message is one line naming it."""


# -- reading ------------------------------------------------------------------------------------


def read_bytes(path: PathLike, *, limit: int, inside: PathLike | None = None, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, if it holds at most ``limit`` of them.

    ``inside``: the directory the user named, when ``path`` is a file of it the user did not name
    (a run's files, a corpus folder's): a symbolic link that leads out of it is refused. Without
    it, the user named ``path`` itself and a link is followed. ``what`` names the file in errors
    ("run manifest"). FileNotFoundError (a missing file, a dangling link) is left to the caller."""
    path = Path(path)
    with _opened(path, inside, what) as (fd, size):
        if size > limit:
            raise _too_large(path, limit, what, size)
        chunks, total = [], 0
        while total <= limit:  # one read as the size says; more only if the file holds more than it said
            chunk = _read(fd, min(max(size - total, 0) + READ_BLOCK, limit + 1 - total), path)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise _too_large(path, limit, what)
        return b"".join(chunks)


def read_text(path: PathLike, *, limit: int, inside: PathLike | None = None, what: str = "file") -> str:
    """``read_bytes``, decoded as UTF-8 (a byte order mark allowed) with NUL refused (``decode``)."""
    return decode(read_bytes(path, limit=limit, inside=inside, what=what), path)


@contextmanager
def open_regular(path: PathLike, *, limit: int, inside: PathLike | None = None, what: str = "file") -> Iterator[IO[bytes]]:
    """The regular file ``path`` opened for reading in binary (for a reader that seeks: a zip, an
    ``np.load``), with the checks of ``read_bytes``; its size is bounded when it is opened."""
    path = Path(path)
    with _opened(path, inside, what) as (fd, size):
        if size > limit:
            raise _too_large(path, limit, what, size)
        with os.fdopen(os.dup(fd), "rb") as handle:
            yield handle


def read_stream(stream: IO | None, *, limit: int, name: str = "<stdin>", what: str = "input") -> str:
    """The text of a stream (standard input), at most ``limit`` bytes of it, decoded as ``decode``
    does: ``explorer exec - < /dev/zero`` ends at the bound instead of filling memory."""
    if stream is None:  # Python sets sys.stdin to None when descriptor 0 is closed
        raise FileRefused(f"{name}: closed; give the {what} on standard input, or name a file")
    binary = getattr(stream, "buffer", None)
    try:
        data = binary.read(limit + 1) if binary is not None else stream.read(limit + 1).encode("utf-8", "surrogateescape")
    except OSError as error:  # EBADF: standard input opened for writing only
        raise FileRefused(f"{name}: cannot be read ({_reason(error)})") from None
    if len(data) > limit:
        raise _too_large(Path(name), limit, what)
    return decode(data, name)


def sha256(path: PathLike, *, limit: int = HASHED_BYTES, inside: PathLike | None = None, what: str = "file") -> str:
    """The SHA-256 of a regular file of at most ``limit`` bytes, read in blocks, never whole.

    Bounded twice: by ``limit`` from ``fstat`` before reading, and by the size ``fstat`` said while
    reading, so a file that holds more than it says (a ``/proc`` file says 0 and holds terabytes
    of page map) is refused in one line instead of being hashed for hours."""
    path = Path(path)
    digest = hashlib.sha256()
    with _opened(path, inside, what) as (fd, size):
        if size > limit:
            raise _too_large(path, limit, what, size)
        for block in _blocks(fd, size, path, what):
            digest.update(block)
    return digest.hexdigest()


def copy_file(source: PathLike, target: PathLike, *, limit: int, inside: PathLike | None = None, what: str = "file") -> str:
    """Copy the regular file ``source`` (at most ``limit`` bytes) to ``target``; its SHA-256.

    Read as ``sha256`` reads (a FIFO or device refused, bounded by ``limit`` and by the size the
    file says it has, in blocks, never whole; ``inside`` as for ``read_bytes``), written as
    ``atomic_file`` writes: whole or not at all, never through a link at ``target``. Where
    ``shutil.copy`` would read ``/dev/zero`` until the disk fills, or write where a link points."""
    source = Path(source)
    digest = hashlib.sha256()
    with _opened(source, inside, what) as (fd, size):
        if size > limit:
            raise _too_large(source, limit, what, size)
        with atomic_file(target, binary=True) as handle:
            for block in _blocks(fd, size, source, what):
                digest.update(block)
                handle.write(block)
    return digest.hexdigest()


def _blocks(fd: int, size: int, path: Path, what: str) -> Iterator[bytes]:
    """The file's bytes in blocks, refused in one line once they pass the size it said it has:
    a /proc file says 0 bytes and may hold terabytes."""
    total = 0
    while block := _read(fd, 1 << 20, path):
        total += len(block)
        if total > size + READ_BLOCK:
            raise FileRefused(f"{path}: holds more than the {_size(size)} its size says (a /proc or special file?); name {a(what)} file")
        yield block


def _read(fd: int, count: int, path: Path) -> bytes:
    """``os.read``, with the OS's refusal (EIO from /proc/self/mem, EINVAL, EISDIR) as one line."""
    try:
        return os.read(fd, count)
    except OSError as error:
        raise FileRefused(f"{path}: cannot be read ({_reason(error)})") from None


@contextmanager
def _opened(path: Path, inside: PathLike | None, what: str) -> Iterator[tuple[int, int]]:
    """(descriptor, size) of the regular file ``path``, opened for reading; closed after."""
    target = _within(path, Path(inside)) if inside is not None else os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if inside is not None else 0)
    try:
        _regular(path, os.stat(target).st_mode, what)  # a FIFO or a device is refused before it is opened
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path)) from None  # named as the caller named it
    except FileRefused:
        raise
    except OSError as error:
        raise FileRefused(f"{path}: cannot be read ({_reason(error)})") from None
    try:
        try:
            status = os.fstat(fd)
        except OSError as error:
            raise FileRefused(f"{path}: cannot be read ({_reason(error)})") from None
        _regular(path, status.st_mode, what)  # what was opened, if it was swapped after the stat
        yield fd, status.st_size
    finally:
        os.close(fd)


def _within(path: Path, directory: Path) -> str:
    """``path`` resolved, if it stays inside ``directory`` (resolved too); else one line."""
    try:
        root, real = os.path.realpath(directory), os.path.realpath(path)
    except OSError as error:  # a name too long, a directory that may not be searched
        raise FileRefused(f"{path}: cannot be read ({_reason(error)})") from None
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise FileRefused(
            f"{path}: a symbolic link out of {directory} (to {real}); a file of the directory is read only from inside it: copy the file in"
        )
    return real


def _regular(path: Path, mode: int, what: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise FileRefused(f"{path}: is a directory; name {a(what)} file")
    raise FileRefused(f"{path}: is {_kind(mode)}, not a regular file; name {a(what)} file")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))
    return next((name for test, name in kinds if test(mode)), "a block device" if stat.S_ISBLK(mode) else "a special file")


def _too_large(path: Path, limit: int, what: str, size: int | None = None) -> FileRefused:
    """``size``: what ``fstat`` said, when it said more than the bound (a stream or a /proc file does not)."""
    said = f" ({_size(size)})" if size is not None else ""
    return FileRefused(f"{path}: more than {_size(limit)}{said}, larger than {a(what)} may be; is it the right file?")


def _size(count: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{count} bytes"


def _reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "a symbolic link where a file of its own was expected"
    return error.strerror or str(error)


def a(noun: str) -> str:
    """'a trajectory', 'an episode score'."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


# -- text ---------------------------------------------------------------------------------------

_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def decode(data: bytes, path: PathLike) -> str:
    """UTF-8 text (a UTF-8 byte order mark dropped); a file in another encoding, or holding a NUL
    byte (a binary file, or UTF-16 without its mark), is one line naming the file and the line."""
    refuse_binary(data, path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise FileRefused(
            f"{path}:{line_of(data, error.start)}: bytes that are not UTF-8 at offset {error.start} "
            f"({data[error.start : error.start + 4]!r}); re-encode the file as UTF-8"
        ) from None


def without_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte order mark, which ``decode`` drops too: for bytes
    parsed as JSON undecoded (pydantic's JSON reader refuses the mark as invalid JSON), so that a
    file an editor saved with one reads as it does everywhere else."""
    return data.removeprefix(codecs.BOM_UTF8)


def refuse_binary(data: bytes, path: PathLike) -> None:
    """One line if ``data`` is text in UTF-16 or UTF-32, or holds a NUL byte (no UTF-8 text does)."""
    for bom, encoding in _WIDE_BOMS:
        if data.startswith(bom):
            raise FileRefused(f"{path}: text in {encoding} (its byte order mark says so); save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise FileRefused(
            f"{path}:{line_of(data, nul)}: a NUL byte at offset {nul}: a binary file, or text in UTF-16 or UTF-32; name a UTF-8 text file"
        )


def line_of(data: bytes | str, offset: int) -> int:
    """The 1-based line that holds ``offset``."""
    if isinstance(data, bytes):
        return data.count(b"\n", 0, offset) + 1
    return data.count("\n", 0, offset) + 1


# -- JSON and TOML ------------------------------------------------------------------------------


class _Bound(ValueError):
    """Raised inside a parse by a hook; turned into one FileRefused line with its place."""


def _number(text: str, convert: Callable[[str], Any]) -> Any:
    if len(text) > MAX_DIGITS:
        raise _Bound(f"a number of {len(text)} characters (at most {MAX_DIGITS})")
    value = convert(text)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise _Bound(f"the number {text} (not a finite number)")
    return value


def _constant(name: str) -> Any:
    raise _Bound(f"{name}, which JSON does not have")


def _int(text: str) -> int:
    return _number(text, int)


def _float(text: str) -> float:
    return _number(text, float)


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
# A JSON number or string (so that digits inside a string are passed over), for finding a bad number's line.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[-+]?\d[\d.eE+_-]*|NaN|-?Infinity|[-+]?\b(?:nan|inf)\b|[\[\]{}]', re.DOTALL)


def parse_json(text: str | bytes, path: PathLike, line: int | None = None, object_pairs_hook: Callable | None = None) -> Any:
    """``json.loads`` within bounds: nesting as deep as Python's recursion limit allows, numbers of
    at most MAX_DIGITS characters and finite; NaN and Infinity refused. A bound is one FileRefused
    line naming the file and the line (``line``: the line of a JSON-lines file ``text`` is);
    invalid JSON stays ``json.JSONDecodeError``, for the caller to word."""
    if isinstance(text, bytes):
        text = text.decode("utf-8-sig")
    decoder = (
        _DECODER
        if object_pairs_hook is None
        else json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant, object_pairs_hook=object_pairs_hook)
    )
    try:
        value = decoder.decode(text)
    except RecursionError:
        raise FileRefused(f"{_place(path, line, text, _too_deep(text))}: {_depth_message()}") from None
    except json.JSONDecodeError:
        raise
    except ValueError as error:  # _Bound, or Python's own bound on an integer's digits
        raise _bad_number(path, line, text, error) from None
    _refuse_lone_surrogate(text, value, path, line)
    return value


# An escaped surrogate (JSON's "\ud800"); in a decoded string one is left only if it had no partner.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# A number pydantic's JSON reader takes as infinite or NaN (it allows NaN, Infinity and 1e400).
_MAYBE_NOT_FINITE = re.compile(rb"NaN|Infinity|[eE]\+?[0-9]{3}|[0-9]{300}")


def _refuse_lone_surrogate(text: str, value: Any, path: PathLike, line: int | None) -> None:
    """A lone surrogate is valid JSON but not Unicode: it cannot be written back as UTF-8 (a later
    write, or a chat template, would fail). A user's file holding one is refused, not mended
    (replacing it with U+FFFD would change the text silently); one line with the file and line."""
    found = _SURROGATE_ESCAPE.search(text)
    if found is None:
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise FileRefused(
            f"{_place(path, line, text, found.start())}: a lone surrogate ({found.group()}), which is not a character; "
            "not text this file may hold: remove it or write the character it stood for"
        ) from None


def refuse_not_finite(data: bytes, path: PathLike, line: int | None = None) -> None:
    """For a document pydantic's JSON reader will read (it takes NaN, Infinity and 1e400 as
    numbers): the same check as ``parse_json``'s, one line naming the file and the line, run only
    when the bytes hold something that may be such a number. Invalid JSON is left to pydantic."""
    if _MAYBE_NOT_FINITE.search(data) is None:
        return
    try:
        parse_json(data.decode("utf-8-sig"), path, line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return


MAX_KEY_PARTS = 64  # parts of one dotted TOML key ("a.b.c" has 3)
# MAX_KEY_PARTS + 1 key parts (bare or quoted) joined by dots: a key, or a table's name, too long.
_DOTTED_KEY = re.compile(r"""(?:(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')[ \t]*\.[ \t]*){""" + str(MAX_KEY_PARTS) + "}")


def parse_toml(text: str, path: PathLike) -> dict[str, Any]:
    """``tomllib.loads`` within the same bounds; every problem, invalid TOML included, is one
    FileRefused line naming the file (TOML's own message names the line). A dotted key of more
    than MAX_KEY_PARTS parts is refused before parsing: tomllib's time and memory grow with the
    square of a key's parts (40,000 cost 21 s and 6 GB); a config's keys have a handful."""
    dotted = _DOTTED_KEY.search(text)
    if dotted is not None:
        raise FileRefused(
            f"{path}:{line_of(text, dotted.start())}: a dotted key of more than {MAX_KEY_PARTS} parts "
            f"near {text[dotted.start() : dotted.start() + 30]!r}; not a key this file may hold"
        )
    try:
        return tomllib.loads(text, parse_float=_float)
    except tomllib.TOMLDecodeError as error:
        raise FileRefused(f"{path}: not valid TOML ({error})") from None
    except RecursionError:
        raise FileRefused(f"{_place(path, None, text, _too_deep(text))}: {_depth_message()}") from None
    except ValueError as error:  # _Bound, or an integer past Python's bound on digits
        raise _bad_number(path, None, text, error) from None


def _bad_number(path: PathLike, line: int | None, text: str, error: ValueError) -> FileRefused:
    """'FILE:LINE: a number of 5000 characters (at most 100) near '"seed": 1111...'; ...'."""
    offset = _first_bad_number(text)
    near = ""
    if offset is not None:
        start = max(text.rfind("\n", 0, offset) + 1, offset - 30)
        end = text.find("\n", offset)
        near = f" near {text[start : min(offset + 12, end if end >= 0 else len(text))]!r}"
    reason = str(error).split(":")[0] if not isinstance(error, _Bound) else str(error)
    return FileRefused(f"{_place(path, line, text, offset)}: {reason}{near}; not a value this file may hold")


def _depth_message() -> str:
    return f"nested more deeply than can be read (about {sys.getrecursionlimit()} levels); is it the right file?"


def _place(path: PathLike, line: int | None, text: str, offset: int | None) -> str:
    if line is not None:
        return f"{path}:{line}"
    return f"{path}:{line_of(text, offset)}" if offset is not None else str(path)


def _too_deep(text: str, depth: int = 100) -> int | None:
    """Where the nesting first passes ``depth`` levels (for an error's line; slow, so only then)."""
    level = 0
    for token in _TOKEN.finditer(text):
        first = token.group()[0]
        if first in "[{":
            level += 1
            if level > depth:
                return token.start()
        elif first in "]}":
            level -= 1
    return None


def _first_bad_number(text: str) -> int | None:
    """Where the first number that breaks a bound is (for an error's line)."""
    for token in _TOKEN.finditer(text):
        value = token.group()
        number = value.lstrip("+-")
        if number[:1] in "0123456789NIni" and (len(value) > MAX_DIGITS or number in ("NaN", "Infinity", "nan", "inf") or _overflows(value)):
            return token.start()
    return None


def _overflows(value: str) -> bool:
    try:
        number = float(value.replace("_", ""))
    except ValueError:
        return False
    return number in (float("inf"), float("-inf"))


def read_model(path: PathLike, model: type[M], *, what: str, inside: PathLike | None = None, limit: int = DOCUMENT_BYTES) -> M:
    """A JSON document (a manifest, a summary, a record) read by ``read_bytes`` and validated by
    ``model`` with pydantic's JSON reader (nesting bounded at 200 levels, numbers at 4,300 digits).
    Invalid JSON or a bad field is one FileRefused line naming the file, and the line or the field."""
    data = without_bom(read_bytes(path, limit=limit, inside=inside, what=what))
    refuse_not_finite(data, path)
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise FileRefused(invalid(path, error, what)) from None


def invalid(path: PathLike, error: ValidationError, what: str) -> str:
    """A pydantic error about a file, as one line: where the JSON breaks, or the first bad field."""
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        reason = str(first.get("ctx", {}).get("error") or first["msg"])
        found = re.search(r" at line (\d+) column (\d+)$", reason)
        if found:
            return f"{path}:{found.group(1)}: not valid JSON ({reason[: found.start()]} at column {found.group(2)}); not {a(what)}"
        return f"{path}: not valid JSON ({reason}); not {a(what)}"
    where = ".".join(str(part) for part in first["loc"]) or "(the document itself)"
    return f"{path}: not {a(what)}: field '{where}': {first['msg']}"


# -- writing ------------------------------------------------------------------------------------


def open_append(path: PathLike, *, what: str = "file", create: bool = True) -> int:
    """A descriptor (read and append) of the regular file ``path``, created when absent (``create``).

    Never through a symbolic link: ``O_NOFOLLOW`` refuses a link, dangling or not, so nothing is
    written, truncated or created where it points; nor a FIFO or device (refused from ``lstat``,
    before the open), nor a file with another name (a hard link would carry the writes elsewhere),
    nor another user's file in a sticky directory anyone may write (``_not_planted``).
    The caller closes it."""
    path = Path(path)
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as error:  # a name too long, a directory that may not be searched
        raise FileRefused(f"{path}: cannot be written ({_reason(error)})") from None
    else:
        _writable(path, status, what)
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if not create:
            raise
        raise FileRefused(f"{path}: cannot be written (its directory {path.parent} does not exist)") from None
    except OSError as error:
        raise FileRefused(f"{path}: cannot be written ({_reason(error)})") from None
    try:
        _writable(path, os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _writable(path: Path, status: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(status.st_mode):
        raise FileRefused(
            f"{path}: a symbolic link; {a(what)} file is written only as a file of its own, never where a link points: "
            "remove the link, or choose another place"
        )
    _regular(path, status.st_mode, what)
    if status.st_nlink > 1:
        raise FileRefused(f"{path}: a file with {status.st_nlink} names (a hard link); writing it would change the others: copy it")
    _not_planted(path, status, what)


def _not_planted(path: Path, status: os.stat_result, what: str) -> None:
    """A file of another user in a sticky directory anyone may write (/tmp) is refused, as Linux's
    ``fs.protected_regular`` does where it is on: someone put it there before us, and would read
    what we append (and had written what we would read back as ours)."""
    if status.st_uid == os.geteuid():
        return
    try:
        directory = os.stat(path.parent)
    except OSError:
        return
    shared = directory.st_mode & stat.S_ISVTX and directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and status.st_uid != directory.st_uid:
        raise FileRefused(
            f"{path}: a file of another user (uid {status.st_uid}) in {path.parent}, a directory anyone may write; "
            f"{a(what)} is not appended to a file someone else put there: choose a directory of your own"
        )


@contextmanager
def atomic_file(path: PathLike, binary: bool = False) -> Iterator[IO]:
    """A file that appears whole or not at all: written beside the target, fsynced, renamed over
    it. A crash mid-write leaves the old file (or none), never half of one; a symbolic link at
    ``path`` is replaced, never written through; a directory or a special file there is refused."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        status = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as error:  # a parent that is a file, a read-only place, a name too long
        raise FileRefused(f"{path}: cannot be written ({_reason(error)})") from None
    else:
        if not (stat.S_ISREG(status.st_mode) or stat.S_ISLNK(status.st_mode)):
            _regular(path, status.st_mode, "output")
    try:
        # A short name of its own (13 characters): the target's name plus a suffix could pass the
        # file system's bound on a name when the target's own name is near it.
        fd, temporary = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise FileRefused(f"{path}: cannot be written ({_reason(error)})") from None
    try:
        # mkstemp makes 0600; the file should get the mode open() would give. Set on the descriptor,
        # not the name: a link put at the name by someone who can write the directory would carry
        # the new mode to the file it points to (a key made readable by all).
        os.fchmod(fd, 0o666 & ~_umask())
        mode = "wb" if binary else "w"
        encoding = None if binary else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding, newline=None if binary else "\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
            _still_ours(temporary, os.fstat(handle.fileno()), path)
        _replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        if error.errno not in _WRITE_ERRNOS:
            raise
        raise FileRefused(f"{path}: cannot be written ({_reason(error)}); nothing was written") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# What the file system says when a write cannot go on: full, over a size or quota bound, read-only, failing.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO})


def _still_ours(temporary: str, written: os.stat_result, path: Path) -> None:
    """The name ``temporary`` still names the file written through the descriptor: renamed over
    ``path`` otherwise, whatever someone who can write the directory put there (a link to a file of
    their choice) would become the output."""
    try:
        now = os.lstat(temporary)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
        raise FileRefused(
            f"{path}: cannot be written (its temporary file {temporary} was removed or replaced while it was written: "
            "someone else writes this directory); nothing was written: write it in a directory only you can write"
        )


def _replace(temporary: str, path: Path) -> None:
    """``os.replace``, with the OS's refusal as one line naming the target, not the temporary name
    (a file of another user in a sticky directory such as /tmp cannot be replaced: EPERM)."""
    try:
        os.replace(temporary, path)
    except OSError as error:
        if error.errno in _WRITE_ERRNOS:
            raise
        sticky = error.errno == errno.EPERM and _is_sticky(path.parent)
        why = "a file of another user in a directory where only a file's owner may replace it" if sticky else _reason(error)
        raise FileRefused(f"{path}: cannot be replaced ({why}); nothing was written: remove it, or choose another place") from None


def _is_sticky(directory: Path) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_ISVTX)
    except OSError:
        return False


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``):
    setting it to 0 and back, even for an instant, would give a file another thread creates then
    the mode 0666 (a directory 0777)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- directories --------------------------------------------------------------------------------


def publish_directory(directory: PathLike) -> None:
    """Give a directory of our own (``tempfile.mkdtemp``: mode 0700) the mode ``mkdir`` would have
    given it, before it is renamed into place: set on a descriptor opened without following a link,
    so that a link put at its name gives no other directory that mode; the umask is not set."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise FileRefused(
            f"{directory}: cannot be given its mode ({_reason(error)}): was it removed or replaced while it was written? "
            "Someone else may write the directory it is in"
        ) from None
    try:
        os.fchmod(fd, 0o777 & ~_umask())
    finally:
        os.close(fd)


def files_in(directory: PathLike, suffixes: tuple[str, ...], what: str = "file") -> list[Path]:
    """The files of ``directory`` whose names end in one of ``suffixes`` (any case), in name order.

    A name that ends so but is not a regular file inside the directory (a FIFO, a device, a link
    out of the directory or to nothing) is refused in one line, not passed over: a file the user
    meant to load would go missing in silence. A subdirectory is not a file and is passed over."""
    directory = Path(directory)
    found = []
    try:
        names = sorted(directory.iterdir())
    except OSError as error:
        raise FileRefused(f"{directory}: cannot be listed ({_reason(error)})") from None
    for path in names:
        if not path.name.lower().endswith(suffixes) or path.is_dir():
            continue
        if path.is_symlink():
            _within(path, directory)
        try:
            _regular(path, os.stat(path).st_mode, what)
        except FileNotFoundError:
            raise FileRefused(f"{path}: a symbolic link to nothing; remove it or mend it") from None
        except OSError as error:
            raise FileRefused(f"{path}: cannot be read ({_reason(error)})") from None
        found.append(path)
    return found
