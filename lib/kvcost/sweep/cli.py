"""``python -m kvcost.sweep list | run NAME_OR_PATH | status NAME_OR_PATH | publish NAME_OR_PATH``
(``make sweep``), and ``append TABLE RUN_CSV...`` (a direct script run's rows, :mod:`kvcost.sweep.append`).

``list``, ``status`` and ``publish`` never import a sweep's script; ``run`` does (its ``parse_args``
checks every run's flags first), and only for a script in the repository's ``scripts/`` or one named
with ``--script PATH``. ``--out`` must be new, empty or this sweep's earlier folder, and outside the
repository's own folders. Bad input: one ``error:`` line, exit 2."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from kvcost.params import shorten
from kvcost.paths import repo_root
from kvcost.runner import LOG_FILE, check_out
from kvcost.sweep.append import append_rows
from kvcost.sweep.coverage import run_coverage
from kvcost.sweep.execute import Outcome, run_sweep
from kvcost.sweep.spec import Sweep, available, describe, load, publish_key
from kvcost.sweep.store import is_sweep_folder, publish, record, run_dir, seconds_per_run, state

__all__ = ["duration", "main"]

_SCHEDULER = re.compile(r"(tcp|tls|ucx|ws|wss|inproc)://\S+")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:                 # one line, exit 2
        self.exit(2, f"error: {message}\n")


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return f"{path.relative_to(repo_root())}" if path.is_relative_to(repo_root()) else str(path)


def _estimate(sweep: Sweep, out: Path, runs: int) -> str:
    per_run = seconds_per_run(sweep, out)
    if per_run is None:
        return "not measured"
    seconds, source = per_run
    return f"~{duration(seconds * runs)} ({duration(seconds)}/run, {source})"


def _list() -> int:
    rows = []
    for path in available():
        try:
            sweep = load(path, check_scripts=False)
        except ValueError as err:
            rows.append((path.stem, "?", "?", "?", f"INVALID: {err}"))
            continue
        out = sweep.default_out()
        done = sum(state(out, run.key) == "finished" for run in sweep.runs)
        rows.append((sweep.name, sweep.target, str(len(sweep.runs)), f"{done}",
                     f"{_estimate(sweep, out, len(sweep.runs))}  {sweep.description}"))
    head = ("sweep", "notebook/script", "runs", "finished", "estimated time (one run at a time)  description")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for row in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
    return 0


def _status(sweep: Sweep, out: Path) -> int:
    counts = {"finished": 0, "failed": 0, "not run": 0}
    cover = run_coverage(sweep) if sweep.publish is not None else {}
    print(f"{sweep.name}: {len(sweep.runs)} runs of {sweep.target} "
          f"in {_shown(out)}/" + (f"; 'committed': its rows already in {_shown(sweep.publish)}" if cover else ""))
    for run in sweep.runs:
        st = state(out, run.key)
        counts[st] += 1
        rec = record(out, run.key) or {}
        cost = (f"{duration(rec.get('seconds', 0))}, {rec.get('peak_memory_mib', 0):.0f} MiB"
                if st != "not run" else "")
        note = f"  {rec.get('error', '')}" if st == "failed" else ""
        have = f"committed {cover[run.key][0]}/{cover[run.key][1]}  " if cover else ""
        print(f"  run {run.index:<3d} {st:9s} {cost:18s} {have}{describe(run.params, sweep.grid_names)}{note}")
    print(f"{counts['finished']} finished, {counts['failed']} failed, {counts['not run']} not run")
    if cover:
        whole = sum(h == n for h, n in cover.values())
        rows = sum(h for h, _ in cover.values()), sum(n for _, n in cover.values())
        print(f"committed: {rows[0]} of the grid's {rows[1]} rows; {whole} of {len(sweep.runs)} runs have every row "
              f"(sweep run --skip-committed leaves those out)")
    return 0 if counts["finished"] == len(sweep.runs) else 1


def _python() -> str:
    """The interpreter running this, as a shell word that works from the current folder: kvcost is
    installed in it (a bare ``python`` outside the venv has no kvcost)."""
    exe = Path(sys.executable)
    try:
        shown = exe.relative_to(Path.cwd())
    except ValueError:
        shown = exe
    return shlex.quote(str(shown) if shown.is_absolute() or str(shown).startswith(".") else f"./{shown}")


def _report(sweep: Sweep, out: Path, outcome: Outcome, resume: str) -> int:
    where = _shown(out)
    if outcome.interrupted:
        print(f"interrupted: {outcome.finished} of {outcome.total} runs finished ({outcome.finished_now} this time, "
              f"{outcome.finished_before} earlier), "
              f"results in {where}/; resume with: {resume}", file=sys.stderr)
        return 130
    for run, error in outcome.failed:
        print(f"run {run.index} ({describe(run.params, sweep.grid_names)}) failed: {error}\n"
              f"  log: {_shown(run_dir(out, run.key))}/{LOG_FILE}", file=sys.stderr)
    if outcome.committed_skipped:
        print(f"{outcome.committed_skipped} run(s) left out: every row they write is committed already "
              f"(--skip-committed)", file=sys.stderr)
    if outcome.failed_skipped:
        print(f"{len(outcome.failed_skipped)} run(s) failed earlier and were not retried "
              f"({', '.join(str(r.index) for r in outcome.failed_skipped)}); --retry-failed retries them",
              file=sys.stderr)
    tables = ", ".join(outcome.tables) or "none"
    earlier = f", {outcome.finished_before} finished earlier and skipped" if outcome.finished_before else ""
    print(f"{sweep.name}: {outcome.finished} of {outcome.total} runs finished ({outcome.finished_now} now, "
          f"in {duration(outcome.seconds)}{earlier}); tables in {where}/: {tables}")
    return 0 if outcome.complete else 1


#: ``append``'s key where no sweep publishes the table: a retrieval grid's.
DEFAULT_APPEND_KEY = ("context", "trial", "variant")


def _append(args: argparse.Namespace) -> int:
    if args.key is None:                  # the table's own key, as the sweep that publishes it names it
        key = tuple(publish_key(args.table) or DEFAULT_APPEND_KEY)
    else:
        key = tuple(k.strip() for k in args.key.split(",") if k.strip())
    if not key:
        raise ValueError(f"--key must name at least one column, got {args.key!r}")
    done = append_rows(args.table, args.runs, key=key, trials=args.trials, note=args.note, dry_run=args.dry_run)
    cells = ", ".join("/".join(c) for c in done.cells[:6]) + (" …" if len(done.cells) > 6 else "")
    verb = "would add" if args.dry_run else "added"
    print(f"{_shown(done.table)}: {verb} {done.added} row(s) in {len(done.cells)} cell(s)"
          + (f" ({cells})" if cells else "") + (f"; {done.agreement}" if done.agreement else ""))
    print(f"commands entry: {done.entry}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="python -m kvcost.sweep",
                     description="Parameter sweeps over the notebooks (YAML files in sweeps/).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="the predefined sweeps: runs, finished, estimated time")
    run_p = sub.add_parser("run", help="run a sweep's unfinished runs (finished runs are skipped)")
    status_p = sub.add_parser("status", help="each run of a sweep: finished, failed or not run")
    publish_p = sub.add_parser("publish", help="a script sweep's finished rows into its committed file "
                                               "(the YAML's 'publish'); rows already there are kept")
    append_p = sub.add_parser("append", help="a direct script run's new rows (its --out CSV files) into a committed "
                                             "table, checked like publish; re-run rows are compared, not appended")
    append_p.add_argument("table", help="the committed table, e.g. data/real_model/gemma3_270m/niah_multikey_1.csv")
    append_p.add_argument("runs", nargs="+", metavar="RUN_CSV", help="the runs' --out files (a .json beside each)")
    append_p.add_argument("--key", default=None,
                          help="the columns that identify a row, comma-separated (default: the 'publish' key of the "
                               f"sweep that publishes the table, else {','.join(DEFAULT_APPEND_KEY)})")
    append_p.add_argument("--trials", type=int, help="each new cell must hold exactly trials 0..N-1")
    append_p.add_argument("--note", default="", help="what the command line cannot say (worktree, what ran beside)")
    append_p.add_argument("--dry-run", action="store_true", help="check and report; change nothing")
    for p in (run_p, status_p, publish_p):
        p.add_argument("sweep", metavar="NAME_OR_PATH", help="a name in sweeps/ or a path to a YAML file")
        p.add_argument("--out", help="the sweep's folder (default results/sweeps/<name>)")
    run_p.add_argument("--jobs", type=int, default=None,
                       help="runs at once on this machine, or LocalCluster workers with --scheduler local")
    run_p.add_argument("--scheduler", metavar="ADDRESS|local",
                       help="a Dask scheduler (tcp://host:8786), or 'local' for a LocalCluster")
    run_p.add_argument("--retry-failed", action="store_true", help="run again the runs that failed before")
    run_p.add_argument("--skip-committed", action="store_true",
                       help="leave out the runs whose every row is in the sweep's committed file (its 'publish')")
    run_p.add_argument("--kernel", default="python3", help="Jupyter kernel (default python3)")
    run_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    run_p.add_argument("--script", action="append", default=[], metavar="PATH",
                       help="allow this script outside the repository's scripts/ to be imported and run")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:               # argparse has printed its usage and one error line
        return 2 if exc.code else 0
    try:
        if args.command == "list":
            return _list()
        if args.command == "append":
            return _append(args)
        sweep = load(args.sweep, scripts=args.script if args.command == "run" else (),
                     check_scripts=args.command == "run")
        if args.command == "run":
            out = check_out(args.out or sweep.default_out(), what="sweep",
                            previous=lambda folder: is_sweep_folder(folder, sweep.name))
        else:
            out = Path(args.out).resolve() if args.out else sweep.default_out()
        if args.command == "status":
            return _status(sweep, out)
        if args.command == "publish":
            dest, added, present = publish(sweep, out)
            print(f"{sweep.name}: {added} row(s) added to {_shown(dest)}, {present} already there")
            return 0
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
        if args.scheduler is not None and args.scheduler != "local" and not _SCHEDULER.fullmatch(args.scheduler):
            raise ValueError(f"--scheduler must be 'local' or a Dask scheduler address such as tcp://host:8786 or "
                             f"tls://host:8786, got {shorten(args.scheduler)}")
        jobs = args.jobs or ((os.cpu_count() or 1) if args.scheduler == "local" else 1)
        if args.skip_committed and sweep.publish is None:
            raise ValueError(f"--skip-committed needs a sweep that publishes into a committed file; "
                             f"{sweep.name!r} has no 'publish'")
        skip = ({k for k, (have, rows) in run_coverage(sweep).items() if have == rows} if args.skip_committed
                else set())
        before = sum(state(out, run.key) == "finished" for run in sweep.runs)
        resuming = f"; {before} finished earlier, skipped (resuming)" if before else ""
        print(f"{sweep.name}: {len(sweep.runs)} runs of {sweep.target} -> {_shown(out)}/{resuming}", flush=True)
        outcome = run_sweep(sweep, out, jobs=jobs, scheduler=args.scheduler, retry_failed=args.retry_failed,
                            kernel=args.kernel, progress=not args.no_progress, skip=skip)
        return _report(sweep, out, outcome, f"{_python()} -m kvcost.sweep " + shlex.join(argv))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:       # something a sweep imported or ran tried to exit: one line, not its code
        print(f"error: exited with code {exc.code!r} while loading or running the sweep", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before any run started", file=sys.stderr)
        return 130
