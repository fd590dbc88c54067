"""Where a run happened: package versions, git commit, hardware."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("paper-explorer", "pydantic", "RestrictedPython", "pyseccomp", "numpy", "scipy", "torch", "transformers", "peft")


@functools.cache
def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def versions() -> dict[str, str]:
    """Looked up once per process: package metadata does not change under a running program."""
    return dict(_versions())


def git_commit() -> str | None:
    """The commit of the checkout this code runs from, with ``+dirty`` when it has changes."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        )
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def hardware() -> dict[str, object]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, object] = {"cpu": cpu, "cores": os.cpu_count(), "platform": sys.platform}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if "torch" in sys.modules:  # only report a GPU when a model policy already loaded torch
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info
