"""`explorer --help` starts without the heavy libraries: what a process imports is a process matter,
so each check runs in a child of its own (tests.conftest.run_cli runs commands in this process, where
they are loaded already)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import HANG_SECONDS, checkout_environment

# Seconds to import on a laptop, more on a loaded machine: help never needs them.
HEAVY = ("numpy", "scipy", "torch", "transformers", "pandas")

LOADED = f"sorted({{name.partition('.')[0] for name in sys.modules}} & set({HEAVY!r}))"


def child(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_SECONDS, env=checkout_environment())


@pytest.mark.parametrize("args", [["--help"], ["eval", "--help"]], ids=" ".join)
def test_help_loads_no_heavy_library(args):
    probe = (
        "import sys, atexit\n"
        f"atexit.register(lambda: print('heavy:', {LOADED}))\n"
        f"sys.argv = ['explorer', *{args!r}]\n"
        "from paper_explorer.cli.main import main\nmain()\n"
    )
    done = child(probe)
    assert done.returncode == 0, done.stderr
    assert "Usage: explorer" in done.stdout
    assert "heavy: []" in done.stdout, done.stdout[-300:]


def test_no_command_help_loads_a_heavy_library():
    """Every command's and group's --help in one child, in turn: the first that loads one is named."""
    probe = (
        "import contextlib, io, json, sys\n"
        "import typer\n"
        "from paper_explorer.cli.main import app, main\n"
        "def paths(command, path):\n"
        "    yield path\n"
        "    for name, sub in sorted(getattr(command, 'commands', {}).items()):\n"
        "        yield from paths(sub, [*path, name])\n"
        "found = {}\n"
        "for path in paths(typer.main.get_command(app), []):\n"
        "    sys.argv = ['explorer', *path, '--help']\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit:\n"
        "            pass\n"
        f"    found[' '.join(['explorer', *path])] = {LOADED}\n"
        "print(json.dumps(found))\n"
    )
    done = child(probe)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert len(found) > 10 and "explorer eval" in found and "explorer corpus search" in found
    first = next(((path, heavy) for path, heavy in found.items() if heavy), None)  # later ones inherit it
    assert first is None, f"{first[0]} --help loads {first[1]}"


def test_the_corpus_package_loads_bm25_only_when_it_is_named():
    probe = (
        "import sys\n"
        "from paper_explorer.corpus import Corpus, CorpusError, DemoConfig, generate, load, tokenize\n"
        f"print('before:', {LOADED})\n"
        "from paper_explorer.corpus import BM25Index\n"
        "import paper_explorer.corpus.index\n"
        f"print('after:', {LOADED}, BM25Index is paper_explorer.corpus.index.BM25Index, callable(tokenize))\n"
    )
    done = child(probe)
    assert done.returncode == 0, done.stderr
    assert "before: []" in done.stdout and "after: ['numpy', 'scipy'] True True" in done.stdout, done.stdout
