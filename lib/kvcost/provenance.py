"""Provenance of committed results: file digests, package versions, the git commit.

Every heavy run whose results are committed as data (``kvcost.runs``, started by ``scripts/*.py``)
records these beside its table through :func:`write_run`, so a reader can tell what produced it and a
notebook can refuse a table that changed.

Every committed data table (``data/**/*.csv``, ``*.npz``) has its sha256 recorded in a JSON file
beside it, in that file's ``"sha256": {file name: digest}`` mapping: the table's own provenance
(``passkey.json`` for ``passkey.csv``, ``smollm2_kv.json`` for the extract and its statistics) or
the folder's ``provenance.json``. Every reader goes through :func:`checked`, which refuses a table
whose bytes no longer have the recorded digest, naming both. A run that appends to a committed
table (:func:`appending`, ``sweep publish``) records the new digest with :func:`record`; after a
deliberate hand edit, ``python -m kvcost.provenance record data/<file>`` does.

A row is also its own record: a table whose columns end in :data:`CODE_COLUMN` gets, in each row
:func:`appending` writes, the kvcost version and git commit of the code that wrote it
(:func:`code_version`, e.g. ``kvcost 0.1.0 30dfeb3a1b2c``, ``+dirty`` where ``lib/`` had uncommitted
changes), so rows appended over many sessions at many commits each say which they came from.
"""
from __future__ import annotations

import csv
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from kvcost.paths import data_dir, repo_root

__all__ = ["sha256", "versions", "git_commit", "code_version", "finished_keys", "appending", "checked", "recorded",
           "record", "add_command", "write_run", "is_committed", "CODE_COLUMN", "DIGESTS_FILE"]

#: The column in which a results table names the code that wrote each row (:func:`code_version`).
CODE_COLUMN = "code"
DIGESTS_FILE = "provenance.json"   # a folder's record for tables without a provenance file of their own
_MAX_JSON = 1 << 20                # a provenance file is small: larger JSON files are not read for digests
_DIGEST_CACHE: dict[tuple[str, int, int], str] = {}


def sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(path: Path) -> str:
    """sha256 of ``path``, remembered for this process while its size and modification time stay."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGEST_CACHE:
        _DIGEST_CACHE[key] = sha256(path)
    return _DIGEST_CACHE[key]


def _rel(path: Path) -> str:
    """``path`` as a reader knows it: ``data/…`` for the package data (in a checkout or installed), else
    relative to the repository root where it lies under it."""
    for base in (data_dir().parent, repo_root().resolve()):
        try:
            return str(Path(path).resolve().relative_to(base))
        except ValueError:
            pass
    return str(path)


def is_committed(path: str | Path) -> bool:
    """True for a file in the package data, ``data/`` (a committed input or result; :mod:`kvcost.paths`)."""
    return Path(path).resolve().is_relative_to(data_dir())


def _records(path: Path) -> list[Path]:
    """The JSON files that may record ``path``'s digest, in the order they are consulted."""
    folder = path.parent
    first = [folder / f"{path.stem}.json", folder / DIGESTS_FILE]
    rest = sorted(p for p in folder.glob("*.json") if p not in first)
    return [p for p in [*first, *rest] if p.is_file() and p != path and p.stat().st_size <= _MAX_JSON]


def _write_json(target: Path, data: Mapping[str, Any], ensure_ascii: bool = True) -> None:
    """``data`` as provenance files are laid out (sorted keys, one-space indent, a final newline), replacing
    ``target`` atomically."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=ensure_ascii) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded(path: str | Path) -> tuple[str, Path] | None:
    """(digest, the JSON file recording it) for ``path``, or None when no file beside it records one."""
    path = Path(path)
    for meta in _records(path):
        digests = _load_json(meta).get("sha256")
        if isinstance(digests, dict) and isinstance(digests.get(path.name), str):
            return digests[path.name], meta
    return None


def checked(path: str | Path) -> Path:
    """``path``, once its bytes are known to have the sha256 recorded beside it.

    ValueError naming the file and both digests when they differ (the table was edited after it was
    recorded), and for a committed file (:func:`is_committed`) with no recorded digest. A file outside
    ``data/`` with no record beside it (a user's own table) is returned unchecked.
    """
    path = Path(path)
    rec = recorded(path)
    if rec is None:
        if is_committed(path) and path.is_file():
            raise ValueError(f"{_rel(path)}: no sha256 is recorded for this committed file (a \"sha256\" entry in "
                             f"a JSON file beside it); record it with: python -m kvcost.provenance record {_rel(path)}")
        return path
    want, meta = rec
    if not path.is_file():
        raise ValueError(f"{_rel(path)}: missing (its sha256 is recorded in {_rel(meta)})")
    got = _digest(path)
    if got != want:
        raise ValueError(f"{_rel(path)}: sha256 {got} is not the {want} recorded in {_rel(meta)}: the file changed "
                         f"after it was recorded; restore it (git checkout -- {_rel(path)}) or rerun what made it")
    return path


def record(path: str | Path, meta: str | Path | None = None) -> Path:
    """Record ``path``'s current sha256 (in the JSON file that records it already, else ``meta``, else
    ``<stem>.json`` beside it when that exists, else the folder's ``provenance.json``); returns that file.
    The JSON keeps its layout (sorted keys, one-space indent) and is replaced atomically."""
    path = Path(path)
    rec = recorded(path)
    if rec is not None:
        target = rec[1]
    elif meta is not None:
        target = Path(meta)
    else:
        own = path.with_suffix(".json")
        target = own if own.is_file() and own != path else path.parent / DIGESTS_FILE
    text = target.read_text(encoding="utf-8") if target.is_file() else "{}"
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{_rel(target)}: not a JSON object, cannot record a sha256 in it")
    digests = data.setdefault("sha256", {})
    digests[path.name] = sha256(path)
    _write_json(target, data, ensure_ascii=text.isascii())
    return target


def add_command(path: str | Path, entry: str) -> Path:
    """Append ``entry`` (a command and what it added) to the ``commands`` of the JSON that records ``path``
    (:func:`recorded`, else ``<stem>.json`` beside it), a single ``command`` becoming the first of them; returns
    that JSON file. Record the file's new sha256 (:func:`record`) after it changes."""
    path = Path(path)
    rec = recorded(path)
    target = rec[1] if rec is not None else path.with_suffix(".json")
    text = target.read_text(encoding="utf-8") if target.is_file() else "{}"
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{_rel(target)}: not a JSON object, cannot add a command to it")
    commands = data.pop("commands", None)
    if commands is None:
        commands = [data.pop("command")] if isinstance(data.get("command"), str) else []
    data["commands"] = [*([commands] if isinstance(commands, str) else commands), entry]
    _write_json(target, data, ensure_ascii=text.isascii())
    return target


def write_run(out_json: str | Path, *, command: str | None, outputs: Iterable[str | Path] = (),
              inputs: Mapping[str, str | Path] | None = None, versions: Mapping[str, str] | None = None,
              note: Mapping[str, Any] | None = None, git: bool = False, cpus: bool = False,
              started: bool = False, machine: bool = False) -> Path:
    """Write a run's provenance, ``out_json``, the one way every job in :mod:`kvcost.runs` does; returns it.

    The JSON object holds ``note``'s entries (the run's own: parameters, model digests, row counts …), then,
    each replacing an entry of ``note`` by the same name: ``"command"`` (unless None), the UTC date as
    ``YYYY-MM-DD`` (under ``"date"``, or ``"started"`` for a resumable run), ``"versions"`` (when given),
    ``"git_commit"`` (``git``), ``"cpus"`` (``cpus``: ``os.cpu_count()``), ``"machine"`` (``machine``:
    :func:`machine_record`, for results whose last bits follow the CPU), ``"inputs"`` (``{name: sha256 of
    path}`` for each of ``inputs``) and ``"sha256"`` (``{file name: digest}`` of each of ``outputs``: what
    :func:`checked` reads). Sorted keys, one-space indent, replaced atomically (as :func:`record` writes).

    ``started``: the record of a resumable run that appends to its table (:func:`appending` records the
    table's digest in it row by row): written only when ``out_json`` does not exist yet, so a resumed run
    keeps the command and date that started the table.
    """
    out_json = Path(out_json)
    if started and out_json.is_file():
        return out_json
    data: dict[str, Any] = dict(note or {})
    if command is not None:
        data["command"] = command
    data["started" if started else "date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    if versions is not None:
        data["versions"] = dict(versions)
    if git:
        data["git_commit"] = git_commit()
    if cpus:
        data["cpus"] = os.cpu_count()
    if machine:
        data["machine"] = machine_record()
    if inputs is not None:
        data["inputs"] = {name: sha256(path) for name, path in inputs.items()}
    outputs = [Path(p) for p in outputs]
    if outputs:
        data["sha256"] = {p.name: sha256(p) for p in outputs}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    _write_json(out_json, data)
    return out_json


def machine_record() -> dict[str, Any]:
    """The CPU a run ran on, for a result that moves with it (a coarse storage format's perplexity does:
    data/real_model/README.md, 'How far a row reproduces'): the processor's model name (Linux's /proc/cpuinfo;
    ``platform.processor()`` elsewhere), the architecture, the core count and, when torch is already imported,
    the vector instructions its CPU kernels use."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out: dict[str, Any] = {"cpu": model or platform.processor() or "unknown", "arch": platform.machine(),
                           "cpus": os.cpu_count()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


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


def code_version(root: str | Path | None = None) -> str:
    """What wrote a row: ``"kvcost <version> <commit, 12 hex digits>"``, with ``+dirty`` where the checkout's
    ``lib/`` has uncommitted changes (the code then is not the commit's) and ``unknown`` outside git."""
    try:
        version = metadata.version("kvcost")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = root or repo_root()
    commit = git_commit(root)
    if commit == "unknown":
        return f"kvcost {version} unknown"
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lib"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        dirty = ""
    return f"kvcost {version} {commit[:12]}{'+dirty' if dirty else ''}"


def finished_keys(path: str | Path, key: Sequence[tuple[str, Callable[[str], object]]]) -> set[tuple]:
    """The keys of the rows a resumable run already wrote to ``path`` (empty when it does not exist).

    ``key`` names the columns that identify a row and how to read each, e.g.
    ``[("context", int), ("window", int), ("format", str)]``.
    """
    path = Path(path)
    if not path.is_file():
        return set()
    with open(checked(path), newline="", encoding="utf-8") as f:
        return {tuple(conv(r[col]) for col, conv in key) for r in csv.DictReader(f)}


@contextmanager
def appending(path: str | Path, fields: Sequence[str]) -> Iterator[Callable[[dict], None]]:
    """``write(row)`` appending rows to the CSV ``path`` (header first when the file is new).

    Each row is flushed as it is written, so an interrupted run loses at most the row in progress
    and resumes from :func:`finished_keys`. A file with a recorded sha256 (a committed table) is
    checked before anything is appended, and its new digest is recorded after each row. An existing
    file must have exactly the columns ``fields`` (ValueError naming both otherwise: a row written under
    another header would land in the wrong columns). Where ``fields`` has :data:`CODE_COLUMN`, a row
    without it is given :func:`code_version`, taken once when the run starts.
    """
    path = Path(path)
    new = not path.is_file()
    if not new:
        checked(path)
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
        if header != list(fields):
            raise ValueError(f"{_rel(path)} has the columns {header}; this run writes {list(fields)} "
                             f"(a table from before a column was added needs it first)")
    code = code_version() if CODE_COLUMN in fields else None
    tracked = is_committed(path) or recorded(path) is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), lineterminator="\n")
        if new:
            writer.writeheader()
            fh.flush()
            if tracked:
                record(path)

        def write(row: dict) -> None:
            if code is not None and CODE_COLUMN not in row:
                row = {**row, CODE_COLUMN: code}
            writer.writerow(row)
            fh.flush()
            if tracked or recorded(path) is not None:     # a record made meanwhile (sweep publish) counts too
                record(path)

        yield write


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcost.provenance check|record PATH...``: check files against their recorded sha256,
    or record their current one (after a deliberate edit of a committed table)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("check", "record"):
        print("usage: python -m kvcost.provenance check|record PATH...", file=sys.stderr)
        return 2
    code = 0
    for name in args[1:]:
        path = Path(name)
        if not path.is_file():
            print(f"error: {name}: no such file", file=sys.stderr)
            code = 2
            continue
        try:
            if args[0] == "record":
                print(f"{_rel(path)}: sha256 {sha256(path)} recorded in {_rel(record(path))}")
            else:
                checked(path)
                print(f"{_rel(path)}: ok")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            code = 2
    return code


if __name__ == "__main__":
    sys.exit(main())
