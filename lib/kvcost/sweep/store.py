"""A sweep's folder: one folder per run, keyed, written atomically; combined tables.

    <out>/runs/<key>/      the run's executed notebook, tables, figures, run.log, run.json
    <out>/<table>.csv      each table stacked over the finished runs, in grid order

    <out>/sweep.json       which sweep the folder belongs to (a --out holding anything else is refused)

A run folder is first written as ``runs/.<key>.partial-<pid>-<thread>`` and renamed into place with
its ``run.json`` inside, so a folder with ``run.json`` saying ``finished`` is a complete run; what a
killed sweep left half-written is removed when the next one starts (:func:`clean_partial`).

``publish`` appends a script sweep's finished rows to a committed table only after checking the
table against its recorded sha256 and every new row against the table's schema
(:data:`SCHEMAS`, or the kinds of the values already there), then records the new sha256.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from kvcost import provenance
from kvcost.params import shorten
from kvcost.retrieval.ruler import TASKS, results_name
from kvcost.runner import RESULT_FILE, atomic_write, inside
from kvcost.sweep.spec import Sweep

__all__ = ["MISSING_COLUMN", "SCHEMAS", "SWEEP_FILE", "TABLES_FILE", "check_rows", "clean_partial", "combine",
           "is_sweep_folder", "mark", "publish", "record", "run_dir", "save_run", "seconds_per_run", "state"]

MISSING_COLUMN = "missing_runs"
TABLES_FILE = "tables.json"     # the combined tables last written (only these are ever removed)
SWEEP_FILE = "sweep.json"       # {"tool": "kvcost.sweep", "sweep": name}


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


def mark(sweep: Sweep, out: Path) -> None:
    """Write ``sweep.json``: ``out`` holds this sweep's runs."""
    Path(out).mkdir(parents=True, exist_ok=True)
    if not (Path(out) / SWEEP_FILE).is_file():
        atomic_write(Path(out) / SWEEP_FILE, json.dumps({"tool": "kvcost.sweep", "sweep": sweep.name}) + "\n")


def is_sweep_folder(folder: Path, name: str | None = None) -> bool:
    """True when ``folder`` holds an earlier run of a sweep (of sweep ``name`` when given): its
    ``sweep.json``, or the ``runs/`` folder of a sweep folder written before there was one."""
    folder = Path(folder)
    try:
        rec = json.loads((folder / SWEEP_FILE).read_text())
    except FileNotFoundError:
        return (folder / "runs").is_dir()
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("tool") == "kvcost.sweep" and name in (None, rec.get("sweep"))


def clean_partial(out: Path) -> list[Path]:
    """Remove the half-written run folders a killed sweep left in ``out`` (call it holding ``out``)."""
    stale = list((Path(out) / "runs").glob(".*.partial*"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def save_run(out: Path, key: str, files: Mapping[str, bytes], result: Mapping[str, Any]) -> Path:
    """Write a run's files and its ``run.json`` into ``runs/<key>`` in one rename."""
    final = run_dir(out, key)
    staging = final.with_name(f".{key}.partial-{os.getpid()}-{threading.get_ident()}")
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
    try:
        before = json.loads(manifest.read_text()) if manifest.is_file() else []
    except ValueError:
        before = []
    for stale in set(before if isinstance(before, list) else []) - set(written):
        try:        # only a plain *.csv name inside this folder: tables.json is not trusted to name paths
            target = inside(out, stale)
        except ValueError:
            continue
        if target.suffix == ".csv" and target.is_file() and not target.is_symlink():
            target.unlink()
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


# --------------------------------------------------------------------------- publishing

#: A column's rule: (kind, lo, hi); kind ``int``, ``float`` (finite) or ``str`` (non-empty).
Column = tuple[str, float | None, float | None]
_WINDOW_COLUMNS: dict[str, Column] = {
    "context": ("int", 1, None), "window": ("int", 0, None), "format": ("str", None, None), "n": ("int", 1, None),
    "nll_sum": ("float", 0, None), "kl_fp32_sum": ("float", 0, None), "kl_fp16_sum": ("float", 0, None),
    "top1_fp32": ("int", 0, None), "top1_fp16": ("int", 0, None), "correct": ("int", 0, None),
    "seconds": ("float", 0, None)}


def _passkey_rules(row: dict[str, Any]) -> str | None:
    if row["success"] != (row["margin"] > 0) and row["margin"] != 0:
        return (f"'success' {int(row['success'])} contradicts 'margin' {row['margin']!r} (a trial succeeds "
                f"exactly when its margin is positive)")
    if row["tokens"] > row["context"]:
        return f"'tokens' {row['tokens']} exceeds 'context' {row['context']}"
    return None


def _window_rules(row: dict[str, Any]) -> str | None:
    for col in ("top1_fp32", "top1_fp16", "correct"):
        if row[col] > row["n"]:
            return f"'{col}' {row[col]} exceeds 'n' {row['n']} (the tokens scored in the window)"
    return None


#: A retrieval table's columns (one per RULER task, kvcost.retrieval.ruler.results_name: the same columns, the
#: same rules).
_PASSKEY_COLUMNS: dict[str, Column] = {
    "context": ("int", 1, None), "trial": ("int", 0, None), "depth": ("float", 0, 1), "tokens": ("int", 1, None),
    "variant": ("str", None, None), "success": ("bool01", None, None), "margin": ("float", None, None),
    "seconds": ("float", 0, None)}
#: The committed tables ``sweep publish`` appends to, by file name: each column's rule, and the rules
#: that tie a row's columns together.
SCHEMAS: dict[str, tuple[dict[str, Column], Callable[[dict[str, Any]], str | None] | None]] = {
    **{results_name(task): (_PASSKEY_COLUMNS, _passkey_rules) for task in TASKS},
    "ppl_windows.csv": (_WINDOW_COLUMNS, _window_rules),
    "llamacpp_windows.csv": (_WINDOW_COLUMNS, _window_rules),
}


def _value(kind: str, text: str) -> Any:
    """``text`` as ``kind``; ValueError when it is not one."""
    if kind == "str":
        if not text.strip():
            raise ValueError("must not be empty")
        return text
    if kind == "bool01":
        if text not in ("0", "1"):
            raise ValueError("must be 0 or 1")
        return text == "1"
    if kind == "int":
        if not text.strip().lstrip("+-").isdigit():
            raise ValueError("must be an integer")
        return int(text)
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _infer(values: list[str]) -> Column:
    """The rule the values a table already holds follow: int, float, else text (any). The values may be
    text or what pandas read them as (a column of numpy integers is a column of integers)."""
    for kind in ("int", "float"):
        try:
            for v in values:
                _value(kind, str(v))
        except ValueError:
            continue
        return kind, None, None
    return "any", None, None


def check_rows(name: str, columns: list[str], rows: list[list[str]], existing: pd.DataFrame | None = None,
               where: Callable[[int], str] = lambda i: f"row {i + 1}") -> None:
    """Raise ValueError naming the row, the column and what is allowed for the first row of ``rows``
    (text values in ``columns`` order) that breaks table ``name``'s schema (:data:`SCHEMAS`; for another
    table, the kinds of the values ``existing`` already holds: a column of integers takes integers)."""
    rules, tie = SCHEMAS.get(name, ({}, None))
    if not rules and existing is not None and len(existing):
        rules = {c: _infer(list(existing[c])) for c in existing.columns}
    missing = [c for c in rules if c not in columns]
    if missing and name in SCHEMAS:
        raise ValueError(f"{name}: the rows lack the column(s) {missing} its schema requires")
    for i, row in enumerate(rows):
        values: dict[str, Any] = {}
        for col, text in zip(columns, row):
            kind, lo, hi = rules.get(col, ("any", None, None))
            if kind == "any":
                values[col] = text
                continue
            try:
                value = _value(kind, text)
                if (lo is not None and value < lo) or (hi is not None and value > hi):
                    bounds = " and ".join(b for b in (f">= {lo}" if lo is not None else "",
                                                      f"<= {hi}" if hi is not None else "") if b)
                    raise ValueError(f"must be {bounds}")
            except ValueError as err:
                raise ValueError(f"{where(i)}: column {col!r} {err}, got {shorten(text)}") from None
            values[col] = value
        problem = tie(values) if tie is not None and set(rules) <= set(values) else None
        if problem:
            raise ValueError(f"{where(i)}: {problem}")


def publish(sweep: Sweep, out: Path) -> tuple[Path, int, int]:
    """Append the finished rows of a script sweep's table to its ``publish`` file.

    Rows are taken from the finished runs in grid order, with the destination's own columns;
    a row whose ``publish_key`` is already in the destination is left as it is there. New rows are
    appended to the file, each line whole, as the scripts themselves append (rewriting it under a
    new name would cut off a script still appending to it); a new file is written atomically.
    The destination is first checked against its recorded sha256, every new row against its schema
    (:func:`check_rows`: nothing is appended when one row is wrong), and its new sha256 is recorded.
    One publish at a time per folder. Returns (path, rows added, rows already present).
    """
    if sweep.publish is None:
        raise ValueError(f"sweep {sweep.name!r} names no 'publish' file")
    dest = sweep.publish
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)      # a second publish into this folder waits for this one
        return _publish_locked(sweep, out, dest)
    finally:
        os.close(fd)


def _publish_locked(sweep: Sweep, out: Path, dest: Path) -> tuple[Path, int, int]:
    old = pd.read_csv(provenance.checked(dest), dtype=str, keep_default_na=False) if dest.is_file() else None
    key = sweep.publish_key
    missing_key = [c for c in key if old is not None and c not in old.columns]
    if missing_key:
        raise ValueError(f"{dest.name} has no column(s) {missing_key} (the sweep's publish 'key')")
    seen = set(map(tuple, old[key].to_numpy())) if old is not None else set()
    added, present, rows, where = 0, 0, [], []
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
        for n, rec in enumerate(df.to_dict("records")):
            k = tuple(rec[c] for c in key)
            if k in seen:
                present += 1
                continue
            seen.add(k)
            rows.append([rec[c] for c in columns])
            where.append(f"run {run.index} ({_shown_run(run_dir(out, run.key))}/{sweep.table} row {n + 1})")
            added += 1
    if added:
        check_rows(dest.name, columns, rows, old, where=lambda i: where[i])
        new = pd.DataFrame(rows, columns=columns)
        if old is None:
            atomic_write(dest, new.to_csv(index=False, lineterminator="\n"))
        else:
            with open(dest, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                newline = fh.read(1) != b"\n"
            with open(dest, "a", encoding="utf-8", newline="") as fh:
                fh.write(("\n" if newline else "") + new.to_csv(index=False, header=False, lineterminator="\n"))
        provenance.record(dest)
    return dest, added, present


def _shown_run(folder: Path) -> str:
    return f"runs/{Path(folder).name}"
