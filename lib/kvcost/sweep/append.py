"""A direct script run's rows into a committed table, checked as ``publish`` checks a sweep's.

A grid too long for one sweep run (a 32k cell of a real decoder is most of an hour) is run as the
script itself, often as several processes each writing its own ``--out`` CSV with the run's
provenance JSON beside it. ``append`` takes those files into the committed table:

* the table is first checked against its recorded sha256; each file must have its columns;
* a row whose ``key`` the table already holds is a re-run: it is compared with the committed row,
  column by column, and never appended (the comparison is reported and recorded);
* the new rows are checked against the table's schema (:func:`kvcost.sweep.store.check_rows`),
  must not repeat a key among themselves, and with ``trials`` each new cell (the key without its
  ``trial`` column) must hold exactly the trials ``0 … trials − 1``: whole cells or nothing;
* each file's provenance JSON must name the same package versions (and GGUF) as the table's;
* the rows are appended in the order of their cells' first appearance, trial by trial, and the
  table's JSON gains one entry in ``commands`` (each run's command, date, machine, the rows added,
  seconds per row, the re-runs' agreement and ``note``) and its new sha256.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvcost import provenance
from kvcost.sweep.store import check_rows

__all__ = ["Appended", "append_rows"]

#: Columns a re-run may differ in without meaning anything (wall time, the code that wrote it).
VOLATILE = ("seconds", "code")


@dataclass(frozen=True)
class Appended:
    """What :func:`append_rows` did (or, with ``dry_run``, would do)."""

    table: Path
    added: int
    cells: tuple[tuple[str, ...], ...]      # the new cells, each the key without 'trial'
    rerun: int                              # rows already in the table, compared and not appended
    agreement: str                          # how the re-run rows compare with the committed ones
    entry: str                              # the entry recorded in the table's "commands"


def _run_meta(csv: Path) -> dict:
    meta = csv.with_suffix(".json")
    if not meta.is_file():
        raise ValueError(f"{csv}: no provenance JSON beside it ({meta.name}, which the script writes)")
    data = json.loads(meta.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("command"), str):
        raise ValueError(f"{meta}: not a run's provenance (a JSON object with a 'command')")
    return data


def _same_stack(table_meta: dict, run_meta: dict, where: Path) -> None:
    for field in ("versions",):
        want, got = table_meta.get(field) or {}, run_meta.get(field) or {}
        differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        if differ:
            raise ValueError(f"{where}: versions differ from the table's: "
                             f"{', '.join(f'{k} {got[k]} here, {want[k]} there' for k in differ)} "
                             "(rows of one table come from one software stack)")
    for field in ("gguf_sha256", "model", "task"):
        if field in table_meta and field in run_meta and table_meta[field] != run_meta[field]:
            raise ValueError(f"{where}: {field} {run_meta[field]!r} is not the table's {table_meta[field]!r}")


def _agreement(old: pd.DataFrame, rerun: pd.DataFrame, key: Sequence[str]) -> str:
    """Each compared column of the re-run rows against the committed rows with the same key."""
    if rerun.empty:
        return ""
    both = rerun.merge(old, on=list(key), suffixes=("", "__old"))
    parts = []
    for col in [c for c in rerun.columns if c not in key and c not in VOLATILE]:
        a = pd.to_numeric(both[col], errors="coerce")
        b = pd.to_numeric(both[col + "__old"], errors="coerce")
        gap = float((a - b).abs().max()) if a.notna().all() and b.notna().all() else math.nan
        if gap > 0 and not (a.round() == a).all():
            parts.append(f"{col} within {gap:.2g}")
        else:
            n = int((both[col] != both[col + "__old"]).sum())
            parts.append(f"{col} {'identical' if n == 0 else f'differs in {n}'}")
    return f"{len(rerun)} re-run rows not appended ({', '.join(parts)})"


def _seconds(rows: pd.DataFrame) -> str:
    if "seconds" not in rows.columns or rows.empty:
        return ""
    s = pd.to_numeric(rows["seconds"], errors="coerce").dropna().tolist()
    if not s:
        return ""
    return f"{min(s):.0f}-{max(s):.0f} s a row (median {statistics.median(s):.0f})"     # whole seconds: timing noise


def _machine(m: dict) -> str:
    if "cpu" in m and "cpus" in m:
        return f"{m['cpu']}, {m['cpus']} CPUs" + (f" ({m['torch_cpu_capability']})" if m.get("torch_cpu_capability")
                                                  else "")
    return ", ".join(f"{k} {v}" for k, v in sorted(m.items())) or "not recorded"


def _command(meta: dict) -> str:
    return re.sub(r"--out /\S+", "--out <scratch>", meta["command"])


def append_rows(table: str | Path, runs: Sequence[str | Path], key: Sequence[str] = ("context", "trial", "variant"),
                trials: int | None = None, note: str = "", dry_run: bool = False) -> Appended:
    """Append the new rows of the direct runs' CSV files ``runs`` to the committed ``table`` (module docstring)."""
    table = provenance.checked(Path(table))
    if not table.is_file():
        raise ValueError(f"{table}: no such table (append adds rows to a committed one)")
    if not runs:
        raise ValueError("runs: give at least one run's CSV file")
    if trials is not None and (trials < 1 or "trial" not in key):
        raise ValueError(f"trials must be at least 1 and the key must have a 'trial' column, got {trials} and {key}")
    rec = provenance.recorded(table)
    meta_path = rec[1] if rec is not None else table.with_suffix(".json")
    table_meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    old = pd.read_csv(table, dtype=str, keep_default_na=False)
    columns = list(old.columns)
    missing = [c for c in key if c not in columns]
    if missing:
        raise ValueError(f"key: {table.name} has no column(s) {missing}; its columns are {columns}")
    frames, metas = [], []
    for run in map(Path, runs):
        if not run.is_file():
            raise ValueError(f"runs: {run} is not a file")
        df = pd.read_csv(run, dtype=str, keep_default_na=False)
        if list(df.columns) != columns:
            raise ValueError(f"{run}: columns {list(df.columns)} are not {table.name}'s {columns}")
        meta = _run_meta(run)
        _same_stack(table_meta, meta, run)
        frames.append(df)
        metas.append(meta)
    rows = pd.concat(frames, ignore_index=True)
    have = set(map(tuple, old[list(key)].to_numpy()))
    is_old = [tuple(k) in have for k in rows[list(key)].to_numpy()]
    rerun, new = rows[is_old], rows[[not o for o in is_old]]
    dup = new[new.duplicated(list(key), keep=False)]
    if len(dup):
        raise ValueError(f"runs: the key {tuple(dup.iloc[0][list(key)])} appears {len(dup)} times among "
                         "the new rows (each (key) once)")
    cell_cols = [c for c in key if c != "trial"]
    cells = list(dict.fromkeys(map(tuple, new[cell_cols].to_numpy())))
    if trials is not None:
        for cell in cells:
            got = sorted(int(t) for t in new.loc[(new[cell_cols] == list(cell)).all(axis=1), "trial"])
            if got != list(range(trials)):
                lack = sorted(set(range(trials)) - set(got))
                raise ValueError(f"trials: cell {dict(zip(cell_cols, cell))} holds {len(got)} of trials "
                                 f"0-{trials - 1} (lacking {lack[:8]}{'…' if len(lack) > 8 else ''}); "
                                 "finish it or leave its rows out")
    order = {c: i for i, c in enumerate(cells)}
    if len(new):
        new = new.assign(_cell=[order[tuple(c)] for c in new[cell_cols].to_numpy()],
                         _trial=pd.to_numeric(new["trial"]) if "trial" in columns else 0)
        new = new.sort_values(["_cell", "_trial"], kind="stable").drop(columns=["_cell", "_trial"])
        check_rows(table.name, columns, new.to_numpy().tolist(), old)
    agreement = _agreement(old, rerun, key)
    machine = "; ".join(sorted({_machine(m.get("machine") or {}) for m in metas}))
    started = ", ".join(sorted({str(m.get("started", "")) for m in metas} - {""}))
    together = f", as {len(metas)} processes at once" if len(metas) > 1 else ""
    details = [d for d in (f"{len(new)} rows appended here" if len(new) else "no rows appended", _seconds(new),
                           agreement, note) if d]
    entry = (" + ".join(_command(m) for m in metas) + f"{together} ({started}; machine: {machine}): "
             + "; ".join(details))
    if not dry_run and len(new):
        with open(table, "rb") as fh:
            fh.seek(-1, 2)
            newline = fh.read(1) != b"\n"
        with open(table, "a", encoding="utf-8", newline="") as fh:
            fh.write(("\n" if newline else "") + new.to_csv(index=False, header=False, lineterminator="\n"))
        provenance.add_command(table, entry)
        provenance.record(table)
    return Appended(table, len(new), tuple(cells), len(rerun), agreement, entry)

