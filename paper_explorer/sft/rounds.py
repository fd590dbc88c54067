"""What the two round-based trainers (``explorer improve``, ``explorer rl``) share about their OUT:
it is new, and gets the settings written into it, or it holds a run of the same command with the
same settings, which the same command resumes."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

import paper_explorer.corpus.files as files
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting
from paper_explorer.sft.errors import TrainingError


def settings_recorded(
    out: Path, settings: BaseModel, file: str, command: str, *, new_directory: bool = True, may_change: frozenset[str] = frozenset()
) -> None:
    """Write ``settings`` to ``out/file`` for a new run; for a run already there, refuse other
    settings by name (a resume must train what the first start would have) and another kind of
    directory by what it is. ``new_directory``: a run starts only in a new or empty directory
    (explorer improve, which predates the rule, also starts in one that holds its round directories).
    ``may_change``: settings a resume may change without changing what the rounds done so far
    trained (explorer rl's number of rounds, its reporter); the file is rewritten with them."""
    from paper_explorer.evaluation.run_directory import kind_of

    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: is a file; {setting('out')} names a directory")
    if out.is_symlink() and not out.exists():
        raise TrainingError(f"{out}: a symbolic link to {os.readlink(out)}, which does not exist; {setting('out')} names a directory")
    other = kind_of(out)
    recorded = out / file
    if other is not None and not recorded.exists():
        raise TrainingError(f"{other.named(out)}, not an {command} run; {other.taken_by(out)}; choose another {setting('out')}")
    if recorded.exists():
        try:
            then = files.read_model(recorded, type(settings), what=f"{command} run's settings", inside=out)
        except files.FileRefused as error:
            raise TrainingError(f"{error}; restore it, or choose another {setting('out')}") from None
        now, before = settings.model_dump(mode="json"), then.model_dump(mode="json")
        changed = sorted(name for name in now.keys() | before.keys() if now.get(name) != before.get(name))
        refused = [name for name in changed if name not in may_change]
        if refused:
            raise TrainingError(
                f"{out}: holds an {command} run with other settings ({', '.join(refused)}); use them, or another {setting('out')}"
            )
        if changed:  # only what may change: recorded as it now is
            with atomic_file(recorded) as handle:
                handle.write(settings.model_dump_json(indent=2))
        return
    if new_directory and out.is_dir() and any(out.iterdir()):
        raise TrainingError(f"{out}: not empty and not an {command} run; {setting('out')} names a new directory")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(recorded) as handle:
        handle.write(settings.model_dump_json(indent=2))
