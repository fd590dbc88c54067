"""What every benchmark script shares: the machine line and its own section of RESULTS.md."""

from __future__ import annotations

import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"


def machine(packages: tuple[str, ...]) -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}; {', '.join(versions)}"


def write_results(heading: str, command: str, packages: tuple[str, ...], text: str) -> None:
    """Replace (or append) the section under ``heading``; other scripts' sections stay as they are."""
    body = (
        f"{heading}\n\nMachine: {machine(packages)}. Measured {time.strftime('%Y-%m-%d')} with `{command}`.\n\n"
        f"{text}\n"
    )
    existing = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nEach section is written by the script it names.\n"
    if heading in existing:
        before, _, after = existing.partition(heading)
        rest = after.split("\n## ", 1)
        existing = before + body + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        existing = existing.rstrip("\n") + "\n\n" + body
    RESULTS.write_text(existing)
