"""EXPLORER_PLUGINS: the docs' own policy (docs/extending.md) on the command line, in a fresh
process as a user runs it (a plugin registers for the whole process, so never in the test's)."""

from __future__ import annotations

import subprocess

from tests.agent.test_policy_registry import docs_block
from tests.conftest import HANG_SECONDS, ROOT, checkout_environment, explorer_command


def explorer(*args: str, cwd, plugins: str | None = None) -> subprocess.CompletedProcess:
    environment = checkout_environment()
    environment.pop("EXPLORER_PLUGINS", None)  # the user's own, if any, is not this test's
    if plugins is not None:
        environment["EXPLORER_PLUGINS"] = plugins
    return subprocess.run(explorer_command(*args), cwd=cwd, env=environment, capture_output=True, text=True, timeout=HANG_SECONDS)


def test_a_plugin_policy_has_its_flags_and_its_runs_are_read_by_every_command(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "first_hit.py").write_text(docs_block(ROOT / "docs" / "extending.md", "plugins/first_hit.py"))
    plugin = "plugins/first_hit.py"
    made = explorer("eval", "--policy", "first-hit", "--hits", "1", "--limit", "3", "--out", "runs/fh", cwd=tmp_path, plugins=plugin)
    assert made.returncode == 0, made.stderr
    assert '"first-hit"' in (tmp_path / "runs" / "fh" / "manifest.json").read_text()
    read = explorer("inspect", "runs/fh", cwd=tmp_path, plugins=plugin)
    assert read.returncode == 0, read.stderr
    without = explorer("inspect", "runs/fh", cwd=tmp_path)
    assert without.returncode == 2 and "unknown policy 'first-hit'" in without.stderr and len(without.stderr.splitlines()) == 1


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('half written')\n")
    for plugins, said in (
        ("broken.py", "broken.py: RuntimeError: half written"),
        ("absent.py", "absent.py: no such file"),
        ("no_such.module", "no_such.module: ModuleNotFoundError"),
    ):
        done = explorer("corpus", "stats", cwd=tmp_path, plugins=plugins)
        assert done.returncode == 2, (plugins, done.stderr)
        assert done.stderr.startswith("error: EXPLORER_PLUGINS: ") and said in done.stderr and len(done.stderr.splitlines()) == 1, (
            done.stderr
        )
