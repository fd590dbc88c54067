"""Your own policies, tools and answer metrics on the command line: the modules ``EXPLORER_PLUGINS``
names are imported before the commands are built, so what they register has its flags, and a run
made with it can be inspected, compared and reported by ``explorer`` as a built-in one.

``EXPLORER_PLUGINS`` holds entries separated by ``os.pathsep`` (``:``), as ``PYTHONPATH`` does:
a ``.py`` file (imported under its file's name, its folder first on ``sys.path`` so its siblings
import) or an importable module's dotted name. A module already imported from the same file is not
run again (a registry refuses a second registration). What cannot be imported is one line, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from paper_explorer.agent.terminal_text import visible

VARIABLE = "EXPLORER_PLUGINS"


class PluginError(Exception):
    """A module EXPLORER_PLUGINS names that cannot be imported."""


def load_plugins(entries: str | None) -> list[str]:
    """Import every module ``entries`` names, in order; the names of the modules imported."""
    loaded = []
    for entry in (entries or "").split(os.pathsep):
        if entry.strip():
            loaded.append(_load(entry.strip()))
    return loaded


def _load(entry: str) -> str:
    try:
        if entry.endswith(".py"):
            return _load_file(Path(entry).expanduser().resolve())
        return importlib.import_module(entry).__name__
    except PluginError:
        raise
    except Exception as error:  # the plugin's own code: whatever it raised is its message
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PluginError(f"{VARIABLE}: {entry}: {type(error).__name__}: {reason}; fix the module or leave it out of {VARIABLE}") from None


def _load_file(path: Path) -> str:
    if not path.is_file():
        raise PluginError(f"{VARIABLE}: {path}: no such file; name a .py file or an importable module")
    name = path.stem
    known = sys.modules.get(name)
    if known is not None:
        where = getattr(known, "__file__", None)
        if where is not None and Path(where).resolve() == path:
            return name  # imported already: its registrations stand
        raise PluginError(f"{VARIABLE}: {path}: a module named {name!r} is imported already from elsewhere; rename the file")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{VARIABLE}: {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return name


def load_plugins_named_by_the_environment() -> None:
    """For the command line: the modules $EXPLORER_PLUGINS names, or one line on stderr and exit 2."""
    try:
        load_plugins(os.environ.get(VARIABLE))
    except PluginError as error:
        sys.stderr.write(f"error: {visible(str(error))}\n")
        raise SystemExit(2) from None
