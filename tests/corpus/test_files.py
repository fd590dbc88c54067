"""``corpus.files``, one adversarial property per test: what a path names is looked at before it
is read or written (a FIFO never blocks, a device is never read, a link never leads out of the
directory the user named nor carries a write elsewhere), sizes are bounded before reading, text
is UTF-8 without NUL, and JSON/TOML bounds are one line with the file and the line.

A reader that regresses to blocking on a FIFO must fail, not hang the suite: such calls run in a
thread given ``SECONDS``, and the FIFO is then opened for writing so that the thread ends."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel

from paper_explorer.corpus import files
from paper_explorer.corpus.jsonl import AppendOnlyLines, JsonLinesError, read_numbered, read_records, repair
from paper_explorer.corpus.schema import Question

SECONDS = 30


def bounded(call, fifo: Path | None = None):
    """``call()``'s result or exception, failing the test if it has not returned in SECONDS."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(SECONDS)
    if thread.is_alive():
        if fifo is not None:  # let the blocked open/read return, so no thread outlives the test
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"still blocked after {SECONDS} s (on a FIFO?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


# -- what a path names --------------------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(fifo):
    with pytest.raises(files.FileRefused, match="FIFO"):
        bounded(lambda: files.read_bytes(fifo, limit=100), fifo)


def test_a_fifo_inside_a_named_directory_is_refused_without_blocking(fifo):
    with pytest.raises(files.FileRefused, match="FIFO"):
        bounded(lambda: files.read_bytes(fifo, limit=100, inside=fifo.parent), fifo)


def test_a_link_to_a_fifo_is_refused_without_blocking(fifo):
    link = fifo.parent / "link.jsonl"
    link.symlink_to(fifo)
    with pytest.raises(files.FileRefused, match="FIFO"):
        bounded(lambda: files.read_bytes(link, limit=100), fifo)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_is_refused_before_it_is_read(tmp_path, device):
    link = tmp_path / "metrics.json"
    link.symlink_to(device)
    for path in (Path(device), link):
        with pytest.raises(files.FileRefused, match="character device"):
            files.read_bytes(path, limit=files.DOCUMENT_BYTES)
    with pytest.raises(files.FileRefused, match="character device"):
        files.sha256(link)


def test_a_socket_and_a_directory_are_refused(tmp_path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "s.json"))
    try:
        with pytest.raises(files.FileRefused, match="a socket"):
            files.read_bytes(tmp_path / "s.json", limit=100)
    finally:
        server.close()
    with pytest.raises(files.FileRefused, match="is a directory"):
        files.read_bytes(tmp_path, limit=100)


def test_a_link_out_of_the_named_directory_is_refused_and_one_the_user_names_is_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "scores.jsonl").symlink_to(secret)
    with pytest.raises(files.FileRefused, match="symbolic link out of") as refused:
        files.read_bytes(run / "scores.jsonl", limit=100, inside=run)
    assert "the secret" not in str(refused.value)
    assert files.read_bytes(run / "scores.jsonl", limit=100) == b"the secret\n"  # named itself: followed


def test_a_link_that_stays_inside_the_directory_is_read(tmp_path):
    (tmp_path / "old.jsonl").write_text("{}\n")
    (tmp_path / "new.jsonl").symlink_to("old.jsonl")
    assert files.read_bytes(tmp_path / "new.jsonl", limit=100, inside=tmp_path) == b"{}\n"


def test_a_link_through_a_linked_subdirectory_out_of_the_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples").symlink_to(outside)
    with pytest.raises(files.FileRefused, match="out of"):
        files.read_bytes(run / "samples" / "manifest.json", limit=100, inside=run)


def test_missing_files_and_dangling_links_stay_file_not_found(tmp_path):
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    for name in ("absent.json", "dangling.json"):
        with pytest.raises(FileNotFoundError) as missing:
            files.read_bytes(tmp_path / name, limit=100, inside=tmp_path)
        assert Path(missing.value.filename).name == name


# -- sizes --------------------------------------------------------------------------------------


def test_a_file_over_its_bound_is_refused_before_it_is_read(tmp_path):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(3 << 30)  # 3 GiB, sparse: nothing of it is on the disk
    with pytest.raises(files.FileRefused, match=r"more than 1 GiB \(3 GiB\)"):
        files.read_bytes(huge, limit=files.DATA_BYTES)


def test_a_file_that_says_it_is_empty_is_still_bounded():
    """A /proc file says 0 bytes and holds more: the bound holds while reading."""
    with pytest.raises(files.FileRefused, match="more than 16 bytes"):
        files.read_bytes("/proc/self/status", limit=16)


# -- text ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("a paper\n".encode("utf-16"), "UTF-16"),
        ("a paper\n".encode("utf-32"), "UTF-32"),
        ("a paper\n".encode("utf-16-le"), "NUL byte"),  # no byte order mark: every other byte NUL
        (b"text\nmore\x00binary", ":2: a NUL byte"),
        (b"caf\xe9\n", "not UTF-8"),
    ],
)
def test_text_that_is_not_utf8_is_one_line(tmp_path, data, said):
    path = tmp_path / "paper.txt"
    path.write_bytes(data)
    with pytest.raises(files.FileRefused, match=said) as refused:
        files.read_text(path, limit=files.TEXT_BYTES)
    assert "\n" not in str(refused.value)


def test_utf8_with_its_byte_order_mark_is_text(tmp_path):
    path = tmp_path / "paper.txt"
    path.write_bytes(b"\xef\xbb\xbfa paper\n")
    assert files.read_text(path, limit=100) == "a paper\n"


class Counted(BaseModel):
    count: int


def test_json_and_json_lines_with_a_byte_order_mark_read_as_without_it(tmp_path):
    """decode drops the mark; so do the readers that hand bytes to a JSON parser undecoded."""
    document, log = tmp_path / "metrics.json", tmp_path / "scores.jsonl"
    document.write_bytes(b'\xef\xbb\xbf{"count": 3}')
    assert files.read_model(document, Counted, what="count").count == 3
    assert files.parse_json(document.read_bytes(), document) == {"count": 3}
    log.write_bytes(b'\xef\xbb\xbf{"count": 1}\n{"count": 2}\n')
    assert read_records(log, Counted, what="count") == [Counted(count=1), Counted(count=2)]
    records, torn = read_numbered(log, Counted, what="count")
    assert [r.data for r in records] == [b'{"count": 1}', b'{"count": 2}'] and torn is None


@pytest.mark.parametrize("after", [b"", b'{"cou', b'{"count": 1}'])
def test_an_append_keeps_a_byte_order_mark_and_mends_the_line_after_it(tmp_path, after):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + after)
    with AppendOnlyLines(path) as log:
        log.append({"count": 2})
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read_records(path, what="record") == [*([{"count": 1}] if after.endswith(b"}") else []), {"count": 2}]


# -- JSON and TOML ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("\n" + "[" * 100_000 + "]" * 100_000, "F:2: nested more deeply"),
        ('{"seed": ' + "1" * 5000 + "}", "F:1: a number of 5000 characters"),
        ('{\n"t": NaN}', "F:2: NaN, which JSON does not have"),
        ('{"t": -Infinity}', "-Infinity, which JSON does not have"),
        ('{"t": 1e999}', "not a finite number"),
    ],
)
def test_json_bounds_are_one_line_with_the_file_and_line(text, said):
    with pytest.raises(files.FileRefused, match=said) as refused:
        files.parse_json(text, "F")
    assert "\n" not in str(refused.value)


def test_json_within_bounds_reads_as_json_does():
    text = json.dumps({"a": [1, 2.5, -3e10, "NaN", "1" * 5000, None, True]})  # a lone surrogate: refused, tested below
    assert files.parse_json(text, "F") == json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        files.parse_json("{", "F")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a = " + "[" * 5000 + "]" * 5000, "nested more deeply"),
        ("a = 1\nb = " + "1" * 5000, "T:2: Exceeds the limit"),
        ("a = nan", "not a finite number"),
        ("a = [", "not valid TOML"),
    ],
)
def test_toml_bounds_are_one_line(text, said):
    with pytest.raises(files.FileRefused, match=said):
        files.parse_toml(text, "T")


def test_a_json_lines_file_with_a_deep_or_huge_line_is_one_line(tmp_path):
    path = tmp_path / "questions.jsonl"
    for line, said in (("[" * 50_000 + "]" * 50_000, "nested"), ('{"id": ' + "9" * 5000 + "}", "number")):
        path.write_text("\n" + line + "\n")  # line 1 blank: the bad line is line 2
        for read in (lambda: read_records(path, what="question"), lambda: read_records(path, Question, what="question")):
            with pytest.raises(JsonLinesError, match=f"{path}:2: .*{said}"):
                read()


def test_a_json_lines_file_with_a_nul_byte_is_refused_as_binary(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(b'{"a": 1}\n\x00\x00\n')
    with pytest.raises(JsonLinesError, match=":2: a NUL byte"):
        read_records(path, what="episode score")


# -- writing ------------------------------------------------------------------------------------


def test_an_append_never_follows_a_link(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(b'{"kept": 1}\n{"torn')  # a "torn last line" a repair would cut
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectories.jsonl").symlink_to(target)
    with pytest.raises(files.FileRefused, match="symbolic link"):
        AppendOnlyLines(out / "trajectories.jsonl")
    with pytest.raises(files.FileRefused, match="symbolic link"):
        repair(out / "trajectories.jsonl")
    assert target.read_bytes() == b'{"kept": 1}\n{"torn'


def test_an_append_never_creates_a_dangling_links_target(tmp_path):
    (tmp_path / "trajectories.jsonl").symlink_to(tmp_path / "created-elsewhere.jsonl")
    with pytest.raises(files.FileRefused, match="symbolic link"):
        AppendOnlyLines(tmp_path / "trajectories.jsonl")
    assert not (tmp_path / "created-elsewhere.jsonl").exists()


def test_an_append_to_a_fifo_or_a_hard_link_is_refused(fifo, tmp_path):
    with pytest.raises(files.FileRefused, match="FIFO"):
        bounded(lambda: files.open_append(fifo), fifo)
    original = tmp_path / "original.jsonl"
    original.write_text("{}\n")
    os.link(original, tmp_path / "second-name.jsonl")
    with pytest.raises(files.FileRefused, match="hard link"):
        files.open_append(tmp_path / "second-name.jsonl")


def test_an_append_to_a_file_another_user_put_in_a_sticky_directory_is_refused(tmp_path):
    """/tmp with fs.protected_regular off: someone else's log.jsonl, made before ours, would get
    our episodes (and its own lines would read back as ours). Refused as the kernel refuses it where
    the setting is on; a file of our own there is appended to."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "log.jsonl"
    planted.write_text('{"forged": 1}\n')
    try:
        os.chown(planted, 54321, 54321)
    except PermissionError:
        pytest.skip("only root gives a file to another user")
    with pytest.raises(files.FileRefused, match=r"log.jsonl: a file of another user \(uid 54321\) in .*anyone may write"):
        AppendOnlyLines(planted)
    own = shared / "own.jsonl"
    with AppendOnlyLines(own) as log:
        log.append({"a": 1})
    assert own.read_text() == '{"a":1}\n' or json.loads(own.read_text()) == {"a": 1}


def test_an_append_creates_a_file_and_cuts_its_torn_line(tmp_path):
    path = tmp_path / "log.jsonl"
    with AppendOnlyLines(path) as log:
        log.append({"a": 1})
    path.write_bytes(path.read_bytes() + b'{"to')
    with AppendOnlyLines(path) as log:
        assert log.torn_bytes == 4
        log.append({"b": 2})
    assert read_records(path, what="record") == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("tail", [b"my notes, not a record", b'{"a": 1} and more', b"[1, 2"])
def test_an_append_never_cuts_a_last_line_that_is_not_a_torn_record(tmp_path, tail):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"first line\n" + tail)
    with pytest.raises(files.FileRefused, match=r"notes.txt:2: .*not a log written here .*choose another out"):
        AppendOnlyLines(path)
    with pytest.raises(files.FileRefused, match="not a log written here"):
        repair(path)
    assert path.read_bytes() == b"first line\n" + tail


@pytest.mark.parametrize("torn", [b'{"a": tr', b'{"a": "x\\u12', b'{"a": -', b'{"a": [1, {"b": 2}', b'{"a": "\xc3'])
def test_an_append_cuts_a_record_torn_anywhere(tmp_path, torn):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"kept": 1}\n' + torn)
    with AppendOnlyLines(path) as log:
        assert log.torn_bytes == len(torn)
    assert path.read_bytes() == b'{"kept": 1}\n'


def test_an_append_keeps_a_whole_last_record_that_lacks_only_its_newline(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    with AppendOnlyLines(path) as log:
        assert log.torn_bytes == 0
        log.append({"c": 3})
    assert read_records(path, what="record") == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_a_whole_file_replaces_a_link_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    (tmp_path / "metrics.json").symlink_to(target)
    with files.atomic_file(tmp_path / "metrics.json") as handle:
        handle.write("{}")
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "metrics.json").is_symlink() and (tmp_path / "metrics.json").read_text() == "{}"


def test_a_whole_file_is_not_written_over_a_fifo_or_a_directory(fifo, tmp_path):
    (tmp_path / "report.html").mkdir()
    for path in (fifo, tmp_path / "report.html"):
        with pytest.raises(files.FileRefused, match="FIFO|directory"), files.atomic_file(path) as handle:
            handle.write("x")


# -- directories --------------------------------------------------------------------------------


def test_a_directory_listing_refuses_what_is_not_a_file_of_it(tmp_path):
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    (folder / "sub.txt").mkdir()  # a directory is not a file: passed over
    assert files.files_in(folder, (".txt",)) == [folder / "a.txt"]
    (tmp_path / "secret.txt").write_text("secret\n")
    for name, target, said in (
        ("env.txt", "/proc/self/environ", "out of"),
        ("leak.txt", tmp_path / "secret.txt", "out of"),
        ("zero.txt", "/dev/zero", "out of"),
        ("gone.txt", folder / "gone", "to nothing"),
    ):
        (folder / name).symlink_to(target)
        with pytest.raises(files.FileRefused, match=said):
            files.files_in(folder, (".txt",))
        (folder / name).unlink()
    os.mkfifo(folder / "pipe.TXT")
    with pytest.raises(files.FileRefused, match="FIFO"):
        files.files_in(folder, (".txt",))


def test_a_log_read_back_through_a_link_out_of_its_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("{}\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").symlink_to(elsewhere)
    with pytest.raises(JsonLinesError, match="out of"):
        read_numbered(run / "trajectories.jsonl", Question, what="trajectory", inside=run)


# -- the OS's own refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/proc/self/mem", "/proc/self/pagemap"])
def test_a_file_the_os_refuses_to_read_is_one_line_naming_it(name):
    """/proc/self/mem says EIO at offset 0, /proc/self/pagemap EINVAL for a read not of 8 bytes."""
    with pytest.raises(files.FileRefused, match=f"^{name}: cannot be read"):
        files.read_bytes(name, limit=files.TEXT_BYTES)
    with pytest.raises(files.FileRefused, match=f"^{name}: (cannot be read|holds more than)"):
        files.sha256(name)


def test_a_hash_is_bounded_by_its_limit_and_by_the_size_the_file_says(tmp_path):
    sparse = tmp_path / "weights.bin"
    with open(sparse, "wb") as handle:
        handle.truncate(3 << 30)
    with pytest.raises(files.FileRefused, match="more than 1 GiB"):
        files.sha256(sparse, limit=files.GiB)


def test_a_name_too_long_is_one_line_inside_a_directory(tmp_path):
    with pytest.raises(files.FileRefused, match="cannot be read"):
        files.read_bytes(tmp_path / ("x" * 300), limit=10, inside=tmp_path)


def test_writing_under_a_file_or_a_missing_directory_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(files.FileRefused, match="cannot be written"):
        with files.atomic_file(tmp_path / "file" / "out.json") as handle:
            handle.write("{}")
    with pytest.raises(files.FileRefused, match="does not exist"):
        files.open_append(tmp_path / "missing" / "log.jsonl")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_a_name_at_the_bound_of_the_file_system_is_written_whole(tmp_path):
    """The temporary file beside it has a short name of its own, not the target's name and more."""
    target = tmp_path / ("n" * 255)
    with files.atomic_file(target) as handle:
        handle.write("whole")
    assert target.read_text() == "whole"
    assert [path.name for path in tmp_path.iterdir()] == [target.name]


def test_writing_where_writing_is_not_permitted_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user the permission does not stop (root)")
        with pytest.raises(files.FileRefused, match="cannot be written"):
            with files.atomic_file(locked / "out.json") as handle:
                handle.write("{}")
    finally:
        locked.chmod(0o700)


def swapping_the_temporary(monkeypatch, target: Path) -> None:
    """``mkstemp`` as someone who can write the directory would leave it: its name at once replaced
    by a link to ``target`` (a race they win with inotify; here, every time)."""
    made = files.tempfile.mkstemp

    def swapped(*args, **kwargs):
        fd, name = made(*args, **kwargs)
        os.unlink(name)
        os.symlink(target, name)
        return fd, name

    monkeypatch.setattr(files.tempfile, "mkstemp", swapped)


def test_a_link_swapped_in_for_the_temporary_file_gets_no_mode_and_never_becomes_the_output(tmp_path, monkeypatch):
    """The mode is set on the descriptor, not through the name (a key made readable by all), and
    the name is checked to be the file written before it is renamed over the output."""
    key = tmp_path / "key"
    key.write_text("secret")
    key.chmod(0o600)
    out = tmp_path / "shared" / "report.html"
    swapping_the_temporary(monkeypatch, key)
    with pytest.raises(files.FileRefused, match=r"report.html: cannot be written \(its temporary file .* was removed or replaced"):
        with files.atomic_file(out) as handle:
            handle.write("<html>")
    assert oct(key.stat().st_mode & 0o777) == oct(0o600) and key.read_text() == "secret"
    assert not out.exists() and not out.is_symlink() and list(out.parent.iterdir()) == []


def test_the_mode_of_a_whole_file_comes_from_the_umask_without_setting_it(tmp_path, monkeypatch):
    """Setting the umask to 0 and back to read it would give a file another thread creates meanwhile mode 0666."""
    mask = os.umask(0o027)
    os.umask(0o027)
    try:
        monkeypatch.setattr(files.os, "umask", lambda *_: pytest.fail("the umask was set"))
        with files.atomic_file(tmp_path / "out.json") as handle:
            handle.write("{}")
    finally:
        monkeypatch.undo()
        os.umask(mask)
    assert oct((tmp_path / "out.json").stat().st_mode & 0o777) == oct(0o640)


def test_a_file_the_os_refuses_to_replace_is_one_line_naming_it_not_the_temporary(tmp_path, monkeypatch):
    """In a sticky directory (/tmp) another user's file at the output's name cannot be replaced
    (EPERM): the line names the output and says why, not a temporary name the user never gave."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)

    def refused(source, target):
        raise PermissionError(1, os.strerror(1))

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(files.FileRefused) as error:
        with files.atomic_file(shared / "report.html") as handle:
            handle.write("<html>")
    assert str(error.value).startswith(f"{shared / 'report.html'}: cannot be replaced (a file of another user"), error.value
    assert ".tmp" not in str(error.value) and list(shared.iterdir()) == []


def test_a_directory_is_published_with_the_mkdir_mode_and_never_through_a_link(tmp_path):
    """merge builds the run in a directory of its own (mode 0700) and gives it mkdir's mode before
    renaming it into place: a link put at its name gives the directory it points to no mode."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    building = tmp_path / ".out.merging-x"
    building.symlink_to(private)
    with pytest.raises(files.FileRefused, match="out.merging-x: cannot be given its mode"):
        files.publish_directory(building)
    assert oct(private.stat().st_mode & 0o777) == oct(0o700)
    building.unlink()
    building.mkdir(mode=0o700)
    mask = os.umask(0o022)
    try:
        files.publish_directory(building)
    finally:
        os.umask(mask)
    assert oct(building.stat().st_mode & 0o777) == oct(0o755)


# -- text JSON has but Unicode and numbers do not -----------------------------------------------


def test_a_lone_surrogate_is_refused_with_its_line_and_a_pair_is_read(tmp_path):
    with pytest.raises(files.FileRefused, match=r"^f.json:2: a lone surrogate \(\\udc00\)"):
        files.parse_json('{"a": "x",\n "b": "\\udc00"}', "f.json")
    assert files.parse_json('{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}', "f.json") == {"a": "\U0001f600", "b": "\\ud800"}
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": "q\\ud800"}\n')
    with pytest.raises(JsonLinesError, match="q.jsonl:1: a lone surrogate"):
        read_records(path, Question, what="question")


class Metric(BaseModel):
    value: float


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_that_is_not_finite_is_refused_where_pydantic_reads(tmp_path, number):
    document = tmp_path / "metrics.json"
    document.write_text('{"value":\n ' + number + "}")
    with pytest.raises(files.FileRefused, match="metrics.json:2: .*not a value this file may hold"):
        files.read_model(document, Metric, what="metrics file")
    lines = tmp_path / "scores.jsonl"
    lines.write_text('{"value": 1.5}\n{"value": ' + number + "}\n")
    with pytest.raises(JsonLinesError, match="scores.jsonl:2: "):
        read_records(lines, Metric, what="score")


def test_finite_numbers_and_words_in_strings_are_read(tmp_path):
    lines = tmp_path / "scores.jsonl"
    lines.write_text('{"value": 1e300}\n{"value": 2.5, "note": "NaN Infinity"}\n')
    assert [m.value for m in read_records(lines, Metric, what="score")] == [1e300, 2.5]


def test_a_toml_key_of_too_many_dotted_parts_is_refused_before_parsing():
    deep = "x = 1\n" + ".".join(["a"] * 40_000) + " = 1\n"
    with pytest.raises(files.FileRefused, match=r"^c.toml:2: a dotted key of more than 64 parts"):
        bounded(lambda: files.parse_toml(deep, "c.toml"))
    quoted = "[" + ".".join(['"a"'] * 100) + "]\n"
    with pytest.raises(files.FileRefused, match="dotted key"):
        files.parse_toml(quoted, "c.toml")
    assert files.parse_toml(".".join(["a"] * 64) + " = 1\nurl = 'http://a.b.c'\n", "c.toml")["url"] == "http://a.b.c"


def test_a_full_disk_while_writing_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def full(fd):
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(files.FileRefused, match="metrics.json: cannot be written .*nothing was written"):
        with files.atomic_file(target) as handle:
            handle.write("new")
    assert target.read_text() == "old" and [path.name for path in tmp_path.iterdir()] == ["metrics.json"]


def test_a_full_disk_while_appending_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    with AppendOnlyLines(path) as log:
        monkeypatch.setattr("paper_explorer.corpus.jsonl.os.fsync", lambda fd: (_ for _ in ()).throw(OSError(28, os.strerror(28))))
        with pytest.raises(files.FileRefused, match="log.jsonl: cannot be written"):
            log.append({"a": 1})


def test_a_copy_reads_a_bounded_regular_file_and_never_writes_through_a_link(tmp_path):
    source, target, elsewhere = tmp_path / "tokenizer.json", tmp_path / "out" / "tokenizer.json", tmp_path / "elsewhere"
    source.write_bytes(b"{}")
    elsewhere.write_bytes(b"mine")
    target.parent.mkdir()
    target.symlink_to(elsewhere)
    assert files.copy_file(source, target, limit=10) == files.sha256(source)
    assert target.read_bytes() == b"{}" and not target.is_symlink() and elsewhere.read_bytes() == b"mine"
    with pytest.raises(files.FileRefused, match="more than 1 bytes"):
        files.copy_file(source, target, limit=1)
    for special in ("/dev/zero", "/proc/self/pagemap"):
        with pytest.raises(files.FileRefused, match="character device|cannot be read|holds more than"):
            files.copy_file(special, tmp_path / "copy", limit=files.GiB)
    assert not (tmp_path / "copy").exists() and [p.name for p in target.parent.iterdir()] == ["tokenizer.json"]
