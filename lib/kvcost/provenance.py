"""Provenance of committed results: file digests, package versions, the git commit.

Every heavy run whose results are committed as data (scripts/*.py) records these beside its
table, so a reader can tell what produced it and a notebook can refuse a table that changed.
"""
from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from .output import repo_root

__all__ = ["sha256", "versions", "git_commit"]


def sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions(packages: Sequence[str] = ("numpy", "pandas", "ml_dtypes", "numba", "kvcost"),
             missing: str = "not installed") -> dict[str, str]:
    """Python's version and each installed distribution's (``missing`` for absent ones)."""
    out = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = missing
    return out


def git_commit(root: str | Path | None = None) -> str:
    """The checkout's HEAD commit, or ``"unknown"`` outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root or repo_root(), capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
