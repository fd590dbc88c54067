"""Click's usage errors as a user meets them: one line on stderr, exit 2; help stays as it was."""

import pytest

from tests.conftest import run_cli

# (arguments, fragments the one line must hold): the kinds of usage error click raises,
# at the root, in a command and in a subgroup's command.
USAGE_ERRORS = [
    (["run", "--bogus"], ["explorer run: no such option: --bogus", "see explorer run --help"]),
    (["--bogus"], ["explorer: no such option: --bogus", "see explorer --help"]),
    (["eval", "--workers", "abc"], ["explorer eval: invalid value for '--workers'", "see explorer eval --help"]),
    (["corpus", "search", "x", "-k", "0"], ["explorer corpus search: invalid value for '-k'"]),
    (["sft", "build"], ["explorer sft build: missing option '--trajectories'", "see explorer sft build --help"]),
    (["corpus", "search"], ["explorer corpus search: missing argument 'query'"]),
    (["nosuchcommand"], ["explorer: no such command 'nosuchcommand'", "see explorer --help"]),
    (["corpus", "nosuchcommand"], ["explorer corpus: no such command 'nosuchcommand'", "see explorer corpus --help"]),
    # click attaches no command to these two; the line must still name the right one
    (["run", "--corpus"], ["explorer run: option '--corpus' requires an argument", "see explorer run --help"]),
    (["corpus", "stats", "--json=yes"], ["explorer corpus stats: option '--json' does not take a value"]),
    (["corpus", "search", "x", "extra"], ["explorer corpus search: got unexpected extra argument"]),
]


@pytest.mark.parametrize(("args", "fragments"), USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_a_usage_error_is_one_line_and_exit_2(args, fragments):
    done = run_cli(*args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert lines[0].endswith("--help)"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert done.stdout == ""


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["sft", "--help"], ["run", "-h"], ["corpus", "stats", "-h"]], ids=" ".join)
def test_help_still_prints_and_exits_0(args):
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Usage: explorer" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("args", [[], ["corpus"], ["sft"]], ids=lambda args: " ".join(args) or "root")
def test_a_bare_group_prints_its_help_and_exits_2_as_before(args):
    """no_args_is_help: click signals it with a usage error, which must not become an error line."""
    done = run_cli(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Usage: explorer" in done.stdout and "Commands" in done.stdout and done.stderr == ""


def test_version_still_prints_one_line():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("explorer ") and len(done.stdout.splitlines()) == 1
