"""Run a sweep's pending runs: one at a time, ``jobs`` at once here, or on a Dask cluster.

Every run executes :func:`kvcost.runner.execute_run` (papermill in a kernel of its own, or the
sweep's script, in a temporary folder); its files come back as bytes and are saved here by the calling process
only, so the results are the same bytes whichever way the runs were scheduled.
"""
from __future__ import annotations

import logging
import signal
import sys
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvcost import __version__
from kvcost.runner import allow_runs, execute_run, folder_lock, terminate_children
from kvcost.sweep.spec import Run, Sweep
from kvcost.sweep.store import clean_partial, combine, mark, save_run, state

__all__ = ["Outcome", "pending", "run_sweep"]


@dataclass
class Outcome:
    """What a call to :func:`run_sweep` did."""

    total: int
    finished_before: int
    finished_now: int = 0
    failed: list[tuple[Run, str]] = field(default_factory=list)      # failed this time
    failed_skipped: list[Run] = field(default_factory=list)          # failed earlier, not retried
    committed_skipped: int = 0                                        # left out: their rows are committed
    interrupted: bool = False
    seconds: float = 0.0
    tables: dict[str, Path] = field(default_factory=dict)

    @property
    def finished(self) -> int:
        return self.finished_before + self.finished_now

    @property
    def complete(self) -> bool:
        return self.finished + self.committed_skipped == self.total


def pending(sweep: Sweep, out: Path, retry_failed: bool = False,
            skip: Collection[str] = ()) -> tuple[list[Run], list[Run], int]:
    """(runs to do, failed runs left alone, runs already finished); runs whose key is in ``skip`` are in
    none of them."""
    todo, skipped, done = [], [], 0
    for run in sweep.runs:
        if run.key in skip:
            continue
        st = state(out, run.key)
        if st == "finished":
            done += 1
        elif st == "failed" and not retry_failed:
            skipped.append(run)
        else:
            todo.append(run)
    return todo, skipped, done


def _failure(run: Run, sweep: Sweep, error: str) -> dict[str, Any]:
    return {"result": {"notebook": sweep.stem, "params": run.params, "key": run.key, "status": "failed",
                       "error": error}, "files": {}}


def _local(todo: list[Run], tasks: dict[str, dict], jobs: int, accept: Callable[[Run, dict], None]) -> None:
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kvcost-run")
    futures = {pool.submit(execute_run, tasks[run.key]): run for run in todo}
    try:
        for fut in as_completed(futures):
            accept(futures[fut], fut.result())
    except BaseException:
        terminate_children()           # each run stops its kernel; no new run starts
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


def _dask(todo: list[Run], tasks: dict[str, dict], jobs: int, address: str, sweep: Sweep,
          accept: Callable[[Run, dict], None]) -> None:
    # imported here: only sweeps sent to a cluster need distributed (slow to import)
    from distributed import Client, LocalCluster
    from distributed import as_completed as dask_completed

    logging.getLogger("distributed").setLevel(logging.ERROR)
    cluster = None
    if address == "local":
        # the worker processes inherit an ignored SIGINT: Ctrl-C reaches this process alone, which
        # closes the cluster (no worker tracebacks); each run's child stops when its worker goes
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
        finally:
            signal.signal(signal.SIGINT, previous)
    client = Client(cluster if cluster is not None else address, timeout="30s")
    futures: dict[Any, Run] = {}
    try:
        for run in todo:
            fut = client.submit(execute_run, tasks[run.key], key=f"kvcost-{run.key}-{uuid.uuid4().hex[:8]}",
                                pure=False)
            futures[fut] = run
        for fut in dask_completed(list(futures)):
            run = futures[fut]
            if fut.status == "finished":
                accept(run, fut.result())
            else:   # the task itself failed (e.g. the worker could not import kvcost)
                accept(run, _failure(run, sweep, f"on the cluster: {fut.exception()!r}"))
    finally:
        client.cancel(list(futures))
        client.close()
        if cluster is not None:
            cluster.close()


def run_sweep(sweep: Sweep, out: Path | None = None, *, jobs: int = 1, scheduler: str | None = None,
              retry_failed: bool = False, kernel: str = "python3", progress: bool = True,
              on_result: Callable[[Run, dict[str, Any]], None] | None = None,
              skip: Collection[str] = ()) -> Outcome:
    """Run every run of ``sweep`` not yet finished in ``out`` (default ``results/sweeps/<name>``).

    ``scheduler``: None (this machine, ``jobs`` at a time), ``"local"`` (a Dask LocalCluster of
    ``jobs`` workers) or a Dask scheduler address (``tcp://host:8786``). Failed runs are
    recorded and retried only with ``retry_failed``. Ctrl-C stops the runs in flight; the
    combined tables are rebuilt from whatever finished in every case. ``on_result(run, result)``
    is called after each run is saved. Runs whose key is in ``skip`` are left out (``--skip-committed``:
    :func:`kvcost.sweep.coverage.run_coverage`) and counted in ``Outcome.committed_skipped``.

    ``out`` is held by this call alone (ValueError at once if another sweep holds it: two at once
    would run every run twice); what a killed sweep left half-written there is removed first.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be an integer of at least 1, got {jobs!r}")
    out = Path(out) if out else sweep.default_out()
    with folder_lock(out, "sweep"):
        clean_partial(out)
        mark(sweep, out)
        return _run_locked(sweep, out, jobs, scheduler, retry_failed, kernel, progress, on_result, set(skip))


def _run_locked(sweep: Sweep, out: Path, jobs: int, scheduler: str | None, retry_failed: bool, kernel: str,
                progress: bool, on_result: Callable[[Run, dict[str, Any]], None] | None, skip: set[str]) -> Outcome:
    todo, skipped, done = pending(sweep, out, retry_failed, skip)
    outcome = Outcome(len(sweep.runs), done, failed_skipped=skipped,
                      committed_skipped=sum(run.key in skip for run in sweep.runs))
    source = sweep.nb.read_text()
    script = {"table": sweep.table} if sweep.kind == "script" else {}
    tasks = {run.key: {"stem": sweep.stem, "source": source, "params": run.params, "kernel": kernel,
                       "kvcost_version": __version__, "key": run.key, **script} for run in todo}
    bar = tqdm(total=len(todo), unit="run", desc=sweep.name, file=sys.stderr, disable=not progress or not todo,
               dynamic_ncols=True)

    def accept(run: Run, payload: dict[str, Any]) -> None:
        result = payload["result"]
        if result["status"] == "interrupted":
            return
        save_run(out, run.key, payload["files"], {**result, "sweep": sweep.name, "run": run.index})
        if result["status"] == "finished":
            outcome.finished_now += 1
        else:
            outcome.failed.append((run, result.get("error", "")))
            tqdm.write(f"run {run.index} failed: {result.get('error', '')}", file=sys.stderr)
        if outcome.failed:
            bar.set_postfix(failed=len(outcome.failed), refresh=False)
        bar.update(1)
        if on_result is not None:
            on_result(run, result)

    allow_runs()
    start = time.perf_counter()
    try:
        if not todo:
            pass
        elif scheduler:
            _dask(todo, tasks, jobs, scheduler, sweep, accept)
        else:
            _local(todo, tasks, jobs, accept)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
        outcome.seconds = time.perf_counter() - start
        outcome.tables = combine(sweep, out)
    return outcome
