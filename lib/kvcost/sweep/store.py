"""A sweep's folder: one folder per run, keyed, written atomically; combined tables.

    <out>/runs/<key>/      the run's executed notebook, tables, figures, run.log, run.json
    <out>/<table>.csv      each table stacked over the finished runs, in grid order

A run folder is first written as ``runs/.<key>.partial`` and renamed into place with its
``run.json`` inside, so a folder with ``run.json`` saying ``finished`` is a complete run.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from ..runner import RESULT_FILE, atomic_write
from .spec import Sweep

__all__ = ["MISSING_COLUMN", "TABLES_FILE", "combine", "publish", "record", "run_dir", "save_run", "seconds_per_run",
           "state"]

MISSING_COLUMN = "missing_runs"
TABLES_FILE = "tables.json"     # the combined tables last written (only these are ever removed)


def run_dir(out: Path, key: str) -> Path:
    return Path(out) / "runs" / key


def record(out: Path, key: str) -> dict[str, Any] | None:
    """The run's ``run.json``, or None if it never ran (or its record is unreadable)."""
    try:
        return json.loads((run_dir(out, key) / RESULT_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def state(out: Path, key: str) -> str:
    """``finished``, ``failed`` or ``not run``."""
    rec = record(out, key)
    return rec["status"] if rec and rec.get("status") in ("finished", "failed") else "not run"


def save_run(out: Path, key: str, files: Mapping[str, bytes], result: Mapping[str, Any]) -> Path:
    """Write a run's files and its ``run.json`` into ``runs/<key>`` in one rename."""
    final = run_dir(out, key)
    staging = final.with_name(f".{key}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, data in files.items():
        (staging / Path(name).name).write_bytes(data)
    (staging / RESULT_FILE).write_text(json.dumps(dict(result), indent=1) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def combine(sweep: Sweep, out: Path) -> dict[str, Path]:
    """Stack each CSV table over the finished runs: ``run``, ``param_<name>`` for each grid
    parameter, the table's own columns, then ``missing_runs`` (the numbers of the runs that
    have not finished, space-separated; empty once the sweep is complete).

    Values are copied as text, so the combined tables are byte-identical however the runs
    were scheduled. A table of an earlier combine that no finished run has now is removed.
    """
    out = Path(out)
    finished = [run for run in sweep.runs if state(out, run.key) == "finished"]
    missing = " ".join(str(run.index) for run in sweep.runs if run not in finished)
    frames: dict[str, list[pd.DataFrame]] = {}
    for run in finished:
        for csv in sorted(run_dir(out, run.key).glob("*.csv")):
            df = pd.read_csv(csv, dtype=str, keep_default_na=False)
            lead = {"run": str(run.index), **{f"param_{k}": _cell(run.params[k]) for k in sweep.grid_names}}
            df = pd.concat([pd.DataFrame({k: [v] * len(df) for k, v in lead.items()}, index=df.index), df], axis=1)
            frames.setdefault(csv.name, []).append(df)
    written = {}
    for name, parts in sorted(frames.items()):
        df = pd.concat(parts, ignore_index=True).fillna("")
        df[MISSING_COLUMN] = missing
        path = out / name
        atomic_write(path, df.to_csv(index=False, lineterminator="\n"))
        written[name] = path
    manifest = out / TABLES_FILE
    before = json.loads(manifest.read_text()) if manifest.is_file() else []
    for stale in set(before) - set(written):
        (out / stale).unlink(missing_ok=True)
    atomic_write(manifest, json.dumps(sorted(written)) + "\n")
    return written


def seconds_per_run(sweep: Sweep, out: Path) -> tuple[float, str] | None:
    """(seconds, source) for one run: the most recently finished run in ``out``, else the
    sweep file's ``seconds_per_run``, else None."""
    latest: tuple[datetime, float] | None = None
    for path in (Path(out) / "runs").glob(f"*/{RESULT_FILE}"):
        try:
            rec = json.loads(path.read_text())
            when = datetime.fromisoformat(rec["finished_at"])
        except (OSError, ValueError, KeyError):
            continue
        if rec.get("status") == "finished" and (latest is None or when > latest[0]):
            latest = (when, float(rec["seconds"]))
    if latest:
        return latest[1], f"measured {latest[0]:%Y-%m-%d}"
    if sweep.seconds_per_run:
        return float(sweep.seconds_per_run), "sweep file"
    return None


def publish(sweep: Sweep, out: Path) -> tuple[Path, int, int]:
    """Append the finished rows of a script sweep's table to its ``publish`` file.

    Rows are taken from the finished runs in grid order, with the destination's own columns;
    a row whose ``publish_key`` is already in the destination is left as it is there. New rows are
    appended to the file, each line whole, as the scripts themselves append (rewriting it under a
    new name would cut off a script still appending to it); a new file is written atomically.
    Returns (path, rows added, rows already present).
    """
    if sweep.publish is None:
        raise ValueError(f"sweep {sweep.name!r} names no 'publish' file")
    dest = sweep.publish
    old = pd.read_csv(dest, dtype=str, keep_default_na=False) if dest.is_file() else None
    key = sweep.publish_key
    seen = set(map(tuple, old[key].to_numpy())) if old is not None else set()
    added, present, rows = 0, 0, []
    columns = list(old.columns) if old is not None else None
    for run in sweep.runs:
        csv = run_dir(out, run.key) / sweep.table
        if state(out, run.key) != "finished" or not csv.is_file():
            continue
        df = pd.read_csv(csv, dtype=str, keep_default_na=False)
        columns = columns or list(df.columns)
        missing = [c for c in [*key, *columns] if c not in df.columns]
        if missing:
            raise ValueError(f"run {run.index}: {sweep.table} lacks the column(s) {missing} of {dest.name}")
        for rec in df.to_dict("records"):
            k = tuple(rec[c] for c in key)
            if k in seen:
                present += 1
                continue
            seen.add(k)
            rows.append([rec[c] for c in columns])
            added += 1
    if added:
        new = pd.DataFrame(rows, columns=columns)
        if old is None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(dest, new.to_csv(index=False, lineterminator="\n"))
        else:
            with open(dest, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                newline = fh.read(1) != b"\n"
            with open(dest, "a", encoding="utf-8", newline="") as fh:
                fh.write(("\n" if newline else "") + new.to_csv(index=False, header=False, lineterminator="\n"))
    return dest, added, present
