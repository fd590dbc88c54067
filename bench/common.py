"""What every benchmark script shares: the machine line and its own section of RESULTS.md."""

from __future__ import annotations

import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from paper_explorer.agent.environment import hardware  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"


def machine(packages: tuple[str, ...]) -> str:
    info = hardware()
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return (
        f"{info['cpu']}, {info['cores']} cores, {info.get('memory_gib', 0):.0f} GiB; "
        f"Python {platform.python_version()}; {', '.join(versions)}"
    )


def write_results(heading: str, command: str, packages: tuple[str, ...], text: str) -> None:
    """Replace (or append) the section under ``heading``; other scripts' sections stay as they are."""
    body = f"{heading}\n\nMachine: {machine(packages)}. Measured {time.strftime('%Y-%m-%d')} with `{command}`.\n\n{text}\n"
    existing = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nEach section is written by the script it names.\n"
    if heading in existing:
        before, _, after = existing.partition(heading)
        rest = after.split("\n## ", 1)
        existing = before + body + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        existing = existing.rstrip("\n") + "\n\n" + body
    RESULTS.write_text(existing)
