"""What the jobs share in writing their tables: a committed data table measured in chunks that an
interrupted run resumes, and a generated block of a committed document that ``--check`` compares.

- :func:`append_in_chunks` appends each chunk's rows to a partial CSV, skipping the keys a previous run
  finished, and :func:`write_table` writes the whole table with its provenance
  (:func:`kvcost.provenance.write_run`) and removes the partial one (``long_range_needle``,
  ``long_range_retrieval``, ``plan_needle``); their ``--trials`` and ``--chunk`` are
  :func:`kvcost.script_args.int_at_least` ``(1)``, which names the flag and the values it takes;
- :func:`write_or_check` rewrites a document from its generator, or with ``--check`` (:func:`check_args`)
  only says (exit 1) that the committed one is out of date and what rewrites it (``gen_docs``,
  ``plan_readme_table``).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from kvcost import provenance
from kvcost.paths import repo_root

__all__ = ["append_in_chunks", "write_table", "check_args", "write_or_check", "replace_between"]


def append_in_chunks(partial: Path, chunks: Iterable[Sequence[Hashable]],
                     compute: Callable[[list[Hashable]], pd.DataFrame], *, key: str | Sequence[str],
                     say: Callable[[list[Hashable], float], str], whole: bool = False) -> pd.DataFrame:
    """The rows of ``partial`` (a CSV) once every chunk's are in it; an interrupted run resumes.

    ``key`` names the partial's column (a value a key) or columns (a tuple of values a key) that tell one
    unit of work; each of ``chunks`` is a list of keys. A chunk's keys already in ``partial`` are done:
    ``compute(todo)`` gets the others (all of the chunk's, with ``whole``: for a computation that takes a
    chunk at a time), is skipped when none are left, and returns their rows, which are appended to
    ``partial`` (header first when it is new) before the next chunk starts; then ``say(todo, seconds since
    the call began)`` is printed. The rows come back as read from ``partial``: a resumed chunk of ``whole``
    appends rows again, so the caller drops duplicate rows.
    """
    columns = [key] if isinstance(key, str) else list(key)
    have: set[Hashable] = set()
    if partial.is_file():
        done = pd.read_csv(partial)
        keys = done[columns].itertuples(index=False, name=None)
        have = {k[0] for k in keys} if isinstance(key, str) else set(keys)
    t0 = time.time()
    for chunk in chunks:
        todo = [k for k in chunk if k not in have]
        if not todo:
            continue
        if whole:
            todo = list(chunk)
        compute(todo).to_csv(partial, mode="a", header=not partial.is_file(), index=False)
        print(say(todo, time.time() - t0), flush=True)
    return pd.read_csv(partial)


def write_table(table: pd.DataFrame, csv: Path, meta: Path, partial: Path, *, command: str,
                packages: Sequence[str], note: Mapping[str, Any], started: float,
                inputs: Mapping[str, str | Path] | None = None, digest: str | None = None) -> None:
    """Write ``table`` to ``csv`` (no index, ``\\n`` line ends), then its provenance ``meta`` and remove
    ``partial``, the CSV :func:`append_in_chunks` filled (last, so a failed write leaves the run resumable).

    ``meta`` is :func:`kvcost.provenance.write_run`'s record with the git commit, the CPU count, the versions
    of ``packages``, the sha256 of ``inputs`` and of ``csv`` (under ``"sha256"``, what
    :func:`kvcost.provenance.checked` reads) and ``note``'s entries, to which it adds ``"rows"``,
    ``"run_seconds_this_session"`` (since the time ``started``) and, under the name ``digest`` when given, the
    sha256 of ``csv`` again (where a reader looks for it in the note).
    """
    table.to_csv(csv, index=False, lineterminator="\n")
    note = {**note, "rows": len(table), "run_seconds_this_session": round(time.time() - started)}
    if digest is not None:
        note[digest] = provenance.sha256(csv)
    provenance.write_run(meta, command=command, git=True, cpus=True, versions=provenance.versions(packages),
                         inputs=inputs, note=note, outputs=[csv])
    partial.unlink()
    print(f"wrote {csv} ({len(table)} rows) and {meta.name}")


def check_args(description: str, check_help: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of a job that writes a generated document: ``--check`` (help ``check_help``) alone."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help=check_help)
    return ap.parse_args(argv)


def write_or_check(path: Path, render: Callable[[str], str], *, check: bool, command: str) -> int:
    """Write ``render(text)`` over ``path``'s text and return 0, or with ``check`` write nothing: 0 when
    ``path`` is already what ``render`` makes of it, else 1 and a message that names the file and the
    ``command`` that rewrites it."""
    text = path.read_text(encoding="utf-8")
    new = render(text)
    if not check:
        path.write_text(new, encoding="utf-8")
        return 0
    if new == text:
        return 0
    try:
        shown = path.relative_to(repo_root())
    except ValueError:
        shown = path
    print(f"{shown} is out of date (not what its generator writes now); run {command}")
    return 1


def replace_between(text: str, start: str, end: str, body: str, name: str) -> str:
    """``text`` with the lines between the markers ``start`` and ``end`` replaced by ``body`` (the markers
    kept); a document ``name`` that lacks either marker stops the job with a message naming both."""
    if start not in text or end not in text:
        raise SystemExit(f"error: {name} lacks the markers {start} and {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"
