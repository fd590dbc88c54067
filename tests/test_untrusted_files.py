"""Files are untrusted input, met as a user meets them: a corpus folder, a run directory, a
questions, calibration or config file may hold a link out of the directory, a FIFO, a device,
a huge, binary or UTF-16 file, JSON nested 100,000 deep or a 5,000-digit number. Every command
says what is wrong in one line (exit 2), never reads where a link leads out of the directory the
user named, never blocks or eats memory, and never writes, truncates or creates through a link.

Commands that could block on a FIFO or read /dev/zero for ever run in a fresh process bounded in
time and address space (``bounded_cli``): a regression fails the test instead of hanging the suite
or exhausting the machine."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import checkout_environment, explorer_command, run_cli
from tests.test_run_directory_errors import one_line

SECONDS = 180  # a command's start on a loaded machine takes seconds; a blocked one never ends
ADDRESS_SPACE = 4 << 30  # a reader of /dev/zero stops at this instead of taking the machine
SECRET = "the-secret-of-another-user"
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000


def bounded_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`explorer ARGS` in a fresh process with at most ADDRESS_SPACE of memory and SECONDS of time
    (``stdin``: a file to read standard input from)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    try:
        with open(stdin or os.devnull, "rb") as source:
            return subprocess.run(
                explorer_command(*args),
                stdin=source,
                capture_output=True,
                text=True,
                env=checkout_environment(),
                timeout=SECONDS,
                preexec_fn=limit,
            )
    except subprocess.TimeoutExpired:
        pytest.fail(f"explorer {' '.join(args)}: still running after {SECONDS} s (blocked on a FIFO?)")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("untrusted") / "run"
    done = run_cli("eval", "--split", "all", "--limit", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run", symlinks=True))


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text(f"# {SECRET}\n\n{SECRET} paragraph\n")
    return path


def replace_with(path: Path, kind: str, secret: Path) -> None:
    """Put ``kind`` where the file ``path`` was: a link to /dev/zero, to /proc/self/environ, to a
    file outside the directory, or a FIFO."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to({"dev-zero": "/dev/zero", "environ": "/proc/self/environ", "outside": str(secret)}[kind])


# -- corpus from-text ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["outside", "environ", "dev-zero"])
def test_from_text_never_follows_a_link_out_of_the_folder(tmp_path, secret, target):
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "paper.md").write_text("# A paper\n\nIts only paragraph.\n")
    (folder / "linked.txt").symlink_to({"outside": str(secret), "environ": "/proc/self/environ", "dev-zero": "/dev/zero"}[target])
    out = tmp_path / "corpus.jsonl"
    done = bounded_cli("corpus", "from-text", str(folder), "--out", str(out))
    one_line(done, "linked.txt", "out of")
    assert not out.exists() and SECRET not in done.stderr + done.stdout


def test_from_text_refuses_a_fifo_in_the_folder_and_named_itself(tmp_path):
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "paper.md").write_text("# A paper\n\nIts only paragraph.\n")
    os.mkfifo(folder / "pipe.txt")
    for named in (folder, folder / "pipe.txt"):
        one_line(bounded_cli("corpus", "from-text", str(named), "--out", str(tmp_path / "c.jsonl")), "pipe.txt", "FIFO")
    one_line(bounded_cli("corpus", "from-text", "/dev/zero", "--out", str(tmp_path / "c.jsonl")), "character device")


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("# Title\n\nA paragraph.\n".encode("utf-16"), "UTF-16"),
        ("# Title\n\nA paragraph.\n".encode("utf-16-le"), "NUL byte"),
        (b"# Title\n\nA paragraph \x00\x01\x02 of a binary file.\n", "NUL byte"),
    ],
)
def test_from_text_refuses_binary_and_utf16_files(tmp_path, data, said):
    (tmp_path / "paper.txt").write_bytes(data)
    done = run_cli("corpus", "from-text", str(tmp_path / "paper.txt"), "--out", str(tmp_path / "c.jsonl"))
    one_line(done, "paper.txt", said)
    assert not (tmp_path / "c.jsonl").exists()


def test_from_text_refuses_a_huge_file_before_reading_it(tmp_path):
    huge = tmp_path / "paper.txt"
    with open(huge, "wb") as handle:
        handle.truncate(3 << 30)  # sparse: 3 GiB that take no disk
    one_line(bounded_cli("corpus", "from-text", str(huge), "--out", str(tmp_path / "c.jsonl")), "paper.txt", "more than 64 MiB")


def test_from_text_names_a_file_whose_name_holds_a_control_character(tmp_path):
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "bad\x1bname.md").write_text("# A paper\n\nIts only paragraph.\n")
    line = one_line(run_cli("corpus", "from-text", str(folder), "--out", str(tmp_path / "c.jsonl")), "rename the file")
    assert "\x1b" not in line and "pydantic" not in line and "validation error" not in line


# -- reading a run directory --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["manifest.json", "metrics.json", "scores.jsonl", "trajectories.jsonl"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "outside"])
def test_inspect_refuses_a_run_file_that_is_not_a_file_of_the_run(run_copy, secret, name, kind):
    replace_with(run_copy / name, kind, secret)
    done = bounded_cli("inspect", str(run_copy), "--episode", "no-such-episode")  # --episode reads the trajectories too
    one_line(done, name, "FIFO" if kind == "fifo" else "out of")  # /dev/zero is outside the run too
    assert SECRET not in done.stdout + done.stderr


def test_run_load_refuses_a_link_out_of_the_run_in_its_own_error(run_copy, secret):
    from paper_explorer.evaluation.errors import EvaluationError
    from paper_explorer.evaluation.run_directory import Run

    (run_copy / "metrics.json").rename(secret.parent / "metrics.json")
    (run_copy / "metrics.json").symlink_to(secret.parent / "metrics.json")
    with pytest.raises(EvaluationError, match="out of"):
        Run.load(run_copy)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_calibrate_apply_refuses_a_calibration_that_is_not_a_file(run_copy, tmp_path, kind):
    calibration = tmp_path / "calibration.json"
    calibration.write_text("{}")
    replace_with(calibration, kind, calibration)
    one_line(bounded_cli("calibrate", "apply", str(run_copy), "--calibration", str(calibration)), "calibration.json")


@pytest.mark.parametrize("name", ["metrics.json", "scores.jsonl"])
def test_calibrate_apply_refuses_a_run_file_linked_to_dev_zero(run_copy, tmp_path, name):
    replace_with(run_copy / name, "dev-zero", tmp_path)
    (tmp_path / "calibration.json").write_text("{}")
    one_line(bounded_cli("calibrate", "apply", str(run_copy), "--calibration", str(tmp_path / "calibration.json")), name)


# -- writing ------------------------------------------------------------------------------------


def test_run_never_appends_through_a_linked_log(tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b'{"a line of someone else": 1}\n{"and a torn one')
    out = tmp_path / "runs"
    out.mkdir()
    (out / "trajectories.jsonl").symlink_to(elsewhere)
    one_line(bounded_cli("run", "--out", str(out)), "trajectories.jsonl", "symbolic link")
    assert elsewhere.read_bytes() == b'{"a line of someone else": 1}\n{"and a torn one'


def test_run_never_creates_a_dangling_links_target(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "trajectories.jsonl").symlink_to(tmp_path / "created-elsewhere.jsonl")
    one_line(bounded_cli("run", "--out", str(out)), "symbolic link")
    assert not (tmp_path / "created-elsewhere.jsonl").exists()


@pytest.mark.parametrize("inside", [False, True])
def test_resume_never_reads_or_writes_through_a_linked_log(run_copy, tmp_path, inside):
    """A log linked out of the run is refused when read; one linked inside it is read, and
    refused when appended to: neither is truncated nor appended to."""
    log = run_copy / "trajectories.jsonl"
    target = (run_copy / "kept.jsonl") if inside else (tmp_path / "elsewhere.jsonl")
    torn = log.read_bytes() + b'{"torn'
    target.write_bytes(torn)
    log.unlink()
    log.symlink_to(target)
    (run_copy / "metrics.json").unlink()  # an unfinished run: a resume has work to do
    done = bounded_cli("eval", "--out", str(run_copy), "--resume")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    error = done.stderr.strip().splitlines()[-1]  # after the resume's notes
    assert error.startswith("error: ") and "trajectories.jsonl" in error and "symbolic link" in error  # refused at the start
    assert target.read_bytes() == torn


# -- parsers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "text", "said"), [(".json", DEEP, "nested"), (".jsonl", '{"a": ' + HUGE + "}", "number")])
def test_a_corpus_nested_too_deep_or_with_a_huge_number_is_one_line(tmp_path, suffix, text, said):
    corpus = tmp_path / f"corpus{suffix}"
    corpus.write_text("\n" + text + "\n")
    one_line(run_cli("corpus", "stats", "--corpus", str(corpus)), f"corpus{suffix}:2", said)


@pytest.mark.parametrize(("text", "said"), [(DEEP, "nested"), ('{"id": ' + HUGE + "}", "number")])
def test_a_questions_file_nested_too_deep_or_with_a_huge_number_is_one_line(tmp_path, text, said):
    questions = tmp_path / "questions.jsonl"
    questions.write_text("\n" + text + "\n")
    one_line(run_cli("questions", "check", str(questions)), "questions.jsonl:2", said)


@pytest.mark.parametrize("name", ["manifest.json", "metrics.json", "scores.jsonl", "trajectories.jsonl"])  # the .json: guards
@pytest.mark.parametrize("value", [DEEP, HUGE])
def test_a_run_file_nested_too_deep_or_with_a_huge_number_is_one_line(run_copy, name, value):
    path = run_copy / name
    if name.endswith(".jsonl"):
        first, rest = path.read_bytes().split(b"\n", 1)
        path.write_bytes(first + b"\n" + json.dumps({"x": 1}).replace("1", value).encode() + b"\n" + rest)
    else:
        path.write_text(path.read_text().replace("{", '{"x": ' + value + ",", 1))
    one_line(run_cli("inspect", str(run_copy), "--episode", "no-such-episode"), name)
    if name == "trajectories.jsonl":
        one_line(run_cli("show", str(path)), f"{name}:2")


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, HUGE, "nan"])
def test_a_config_file_nested_too_deep_or_with_a_huge_number_is_one_line(tmp_path, value):
    config = tmp_path / "config.toml"
    config.write_text(f"[episode]\nmax_steps = {value}\n")
    one_line(run_cli("eval", "--config", str(config), "--out", str(tmp_path / "run")), "config.toml")


@pytest.mark.parametrize("value", [DEEP, HUGE, "NaN"])
def test_a_calibration_file_nested_too_deep_or_with_a_huge_number_is_one_line(run_copy, tmp_path, value):
    calibration = tmp_path / "calibration.json"
    calibration.write_text('{"format": 1,\n "temperature": ' + value + "}")
    one_line(run_cli("calibrate", "apply", str(run_copy), "--calibration", str(calibration)), "calibration.json")


@pytest.mark.parametrize("broken", ["fifo", "empty", "invalid-report"])
def test_train_dry_run_reads_a_dataset_directory_safely(tmp_path, broken):
    data = tmp_path / "data"
    data.mkdir()
    (data / "build_report.json").write_text('{"x": [' if broken == "invalid-report" else "{}")
    (data / "train.jsonl").write_text("")
    if broken == "fifo":
        replace_with(data / "train.jsonl", "fifo", tmp_path)
    done = bounded_cli("train", "--data", str(data), "--dry-run")
    one_line(done, "train.jsonl" if broken == "fifo" else "build_report.json")  # empty: no examples is no traceback


def test_exec_reads_a_bounded_action_from_standard_input():
    one_line(bounded_cli("exec", "-", stdin="/dev/zero"), "<stdin>", "more than 64 MiB")


# -- the OS's refusals and the error line itself ------------------------------------------------


def test_a_file_the_os_refuses_to_read_is_one_line():
    one_line(bounded_cli("corpus", "from-text", "/proc/self/mem", "--out", os.devnull + "-never"), "/proc/self/mem", "cannot be read")


@pytest.mark.parametrize("command", [("inspect",), ("show",), ("corpus", "stats")])
def test_a_path_too_long_is_one_line_naming_it(tmp_path, command):
    long = str(tmp_path / ("x" * 300))
    one_line(run_cli(*command, long), "xxxx", absent=("Traceback",))


def test_a_line_break_in_a_path_cannot_forge_a_second_error_line(tmp_path):
    forged = tmp_path / "a\nerror: forged\u2028b\rc\u0085d.txt"
    forged.mkfifo() if hasattr(forged, "mkfifo") else os.mkfifo(forged)
    line = one_line(bounded_cli("corpus", "from-text", str(forged), "--out", str(tmp_path / "c.jsonl")), "a\\nerror: forged")
    assert "\u2028" not in line and "\r" not in line and "\u0085" not in line


def test_an_error_line_is_cut_at_its_bound_saying_how_much():
    from paper_explorer.cli.errors import ERROR_LINE_CHARACTERS, error_line

    line = error_line("k" * 10_000_000)
    assert len(line) < ERROR_LINE_CHARACTERS + 100 and "more characters cut" in line and "\n" not in line


@pytest.mark.parametrize("stdin", ["closed", "write-only"])
def test_exec_with_a_standard_input_it_cannot_read_is_one_line(tmp_path, stdin):
    target = tmp_path / "w"
    target.write_text("")
    with open(target, "wb") as write_only:
        done = subprocess.run(
            explorer_command("exec", "-"),
            stdin=subprocess.DEVNULL if stdin == "closed" else write_only,
            capture_output=True,
            text=True,
            env=checkout_environment(),
            timeout=SECONDS,
            preexec_fn=(lambda: os.close(0)) if stdin == "closed" else None,
        )
    one_line(done, "<stdin>")


@pytest.mark.parametrize("name", ["metrics.json", "scores.jsonl"])
@pytest.mark.parametrize("kind", ["fifo", "outside"])
def test_eval_refuses_an_output_that_is_not_a_file_before_any_episode(tmp_path, secret, name, kind):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text("")
    replace_with(out / name, kind, secret)
    before = secret.read_text()
    one_line(bounded_cli("eval", "--split", "all", "--limit", "1", "--out", str(out)), name, "choose another --out")
    assert not (out / "trajectories.jsonl").exists() and secret.read_text() == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_attention_heads", 0), ("hidden_size", "4096"), ("num_hidden_layers", -36), ("vocab_size", 1e30), ("head_dim", True)],
)
def test_train_dry_run_refuses_a_model_config_with_a_bad_dimension(tmp_path, field, value):
    config = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    one_line(run_cli("train", "--dry-run", "--model", str(tmp_path)), "config.json", field)


def test_a_log_line_quoting_a_path_with_a_newline_stays_one_line():
    import logging

    from paper_explorer.cli.main import VisibleFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "%s: removed a torn last line", ("a\nWARNING: forged",), None)
    line = VisibleFormatter("%(levelname)s: %(message)s").format(record)
    assert "\n" not in line and "a\\nWARNING: forged" in line
