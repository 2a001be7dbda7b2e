"""Provenance of committed results: file digests, package versions, the git commit.

Every heavy run whose results are committed as data (scripts/*.py) records these beside its
table, so a reader can tell what produced it and a notebook can refuse a table that changed.
"""
from __future__ import annotations

import csv
import hashlib
import platform
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from .output import repo_root

__all__ = ["sha256", "versions", "git_commit", "finished_keys", "appending"]


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


def finished_keys(path: str | Path, key: Sequence[tuple[str, Callable[[str], object]]]) -> set[tuple]:
    """The keys of the rows a resumable run already wrote to ``path`` (empty when it does not exist).

    ``key`` names the columns that identify a row and how to read each, e.g.
    ``[("context", int), ("window", int), ("format", str)]``.
    """
    path = Path(path)
    if not path.is_file():
        return set()
    with open(path, newline="", encoding="utf-8") as f:
        return {tuple(conv(r[col]) for col, conv in key) for r in csv.DictReader(f)}


@contextmanager
def appending(path: str | Path, fields: Sequence[str]) -> Iterator[Callable[[dict], None]]:
    """``write(row)`` appending rows to the CSV ``path`` (header first when the file is new).

    Each row is flushed as it is written, so an interrupted run loses at most the row in progress
    and resumes from :func:`finished_keys`.
    """
    path = Path(path)
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        if new:
            writer.writeheader()

        def write(row: dict) -> None:
            writer.writerow(row)
            fh.flush()

        yield write
