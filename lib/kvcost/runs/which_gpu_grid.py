"""Notebook 10's committed runs: every kernel of kvcost.numerics.kernels.KERNELS on real-profile haystacks
at one or more contexts (``grid``), or FA3's no-fix pass at F = 13, 25, 35 kept fraction bits (``law``).

    nice -n 10 .venv/bin/python scripts/which_gpu_grid.py --what grid      # data/which_gpu/grid.csv
    nice -n 10 .venv/bin/python scripts/which_gpu_grid.py --what law       # data/which_gpu/law.csv
    nice -n 10 .venv/bin/python scripts/which_gpu_grid.py --what law --source gemma3-heads --heads all \
        --trials 1 --out data/which_gpu/law_gemma.csv                       # Gemma 3 270M's law (3.3 min)
    python -m kvcost.runs.which_gpu_grid --help                             # the same job

``--out`` is a folder (the table is ``<what>.csv`` in it) or a ``.csv`` path (as a sweep passes it:
sweeps/which_gpu.yaml). Rows go to ``<table>.partial.csv`` ``--chunk-heads`` heads at a time (each
chunk's haystacks built once and run through every kernel), so an interrupted run (or a long one spread over
several sessions: 1M tokens on every head) resumes where it stopped; the table is ordered by context, kernel,
head and trial as asked; at the end the table and ``<table stem>.json`` are written (command, date,
package versions, git commit, parameters, run time and the sha256 of the table, which
:func:`kvcost.provenance.checked` reads).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import multiprocessing
import sys
import time
from pathlib import Path

import pandas as pd

from kvcost import provenance
from kvcost.experiments import which_gpu as wg
from kvcost.numerics import kernels
from kvcost.paths import repo_root
from kvcost.retrieval import haystacks, measure

ROOT = repo_root()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=["grid", "law"], default="grid")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768, 131072])
    ap.add_argument("--heads", default="6",
                    help="query heads, spread over the extract's layers and heads, or 'all' (default 6)")
    ap.add_argument("--source", default="smollm2", choices=list(haystacks.QUERY_SOURCES),
                    help="the extract with real queries (smollm2-heads: every layer of SmolLM2)")
    ap.add_argument("--trials", type=int, default=2, help="haystacks per head")
    ap.add_argument("--needle-weight", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase", default="chunked prefill", choices=list(kernels.PHASES))
    ap.add_argument("--kernels", nargs="+", default=list(kernels.KERNELS), help="labels of kernels.KERNELS")
    ap.add_argument("--chunk-heads", type=int, default=16,
                    help="grid: heads per append to the partial table, the unit an interrupted run resumes by")
    ap.add_argument("--workers", type=int, default=1,
                    help="grid: processes running head chunks at once (each holds its own haystacks: about 5 GB "
                         "for SmolLM2 at 1M tokens)")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "which_gpu")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be positive, got {args.workers}")
    if args.chunk_heads < 1:
        ap.error(f"--chunk-heads must be positive, got {args.chunk_heads}")
    if args.trials < 1:
        ap.error(f"--trials must be positive, got {args.trials}")
    if args.heads != "all" and not (args.heads.isdigit() and int(args.heads) >= 2):
        ap.error(f"--heads must be an integer of at least 2 or 'all', got {args.heads!r}")
    bad = [k for k in args.kernels if k not in kernels.KERNELS]
    if bad:
        ap.error(f"--kernels: {bad} not among {list(kernels.KERNELS)}")
    return args


def _heads_to_do(done: pd.DataFrame, n: int, kernel: str, heads: list, trials: int) -> list:
    """The heads of ``heads`` without all ``trials`` haystacks of ``kernel`` at context ``n`` in the partial
    table ``done`` (a head's rows are appended together, so a head is either done or redone whole)."""
    if not len(done):
        return list(heads)
    mine = done[(done["n_tokens"] == n) & (done["kernel"] == kernel)]
    have = mine.groupby("head")["trial"].nunique()
    return [h for h in heads if have.get(h.label, 0) < trials]


@functools.lru_cache(maxsize=2)
def _query_heads(source: str) -> tuple:
    """The extract's query heads, loaded (and its sha256 checked) once per process."""
    return tuple(haystacks.query_heads(source))


def _grid_chunk(source: str, phase: str, trials: int, needle_weight: float, seed: int, n: int, kernel_labels: list,
                head_labels: list) -> tuple[int, pd.DataFrame]:
    """One chunk of the grid (plain arguments, so that a worker process can run it): ``(n, rows)``."""
    heads = [h for h in _query_heads(source) if h.label in set(head_labels)]
    ks = kernels.lineup(kernel_labels, phase=phase, head_dim=heads[0].k.shape[1])
    return n, wg.grid(ks, heads, n, trials, needle_weight, seed)


@contextlib.contextmanager
def _pool(workers: int):
    """``map(fn, argument tuples)`` yielding results as they finish: in this process for one worker, else in
    ``workers`` spawned processes (a head's rows do not depend on which process ran it)."""
    if workers == 1:
        yield lambda fn, items: (fn(*a) for a in items)
        return
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        def run(fn, items):
            futures = [ex.submit(fn, *a) for a in items]
            for f in concurrent.futures.as_completed(futures):
                yield f.result()
        yield run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    csv = args.out if args.out.suffix == ".csv" else args.out / f"{args.what}.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    every = haystacks.query_heads(args.source)
    heads = every if args.heads == "all" else wg.pick_heads(int(args.heads), args.source)
    d = heads[0].k.shape[1]
    partial = csv.with_name(f"{csv.stem}.partial.csv")
    done = pd.read_csv(partial) if partial.is_file() else pd.DataFrame()
    t0 = time.time()
    if args.what == "grid":
        ks = kernels.lineup(args.kernels, phase=args.phase, head_dim=d)
        jobs = []
        for n in args.contexts:
            # each chunk's haystacks are built once and run through every kernel still missing on them
            missing = {k.label: {h.label for h in _heads_to_do(done, n, k.label, heads, args.trials)} for k in ks}
            todo = [h for h in heads if any(h.label in m for m in missing.values())]
            for c0 in range(0, len(todo), args.chunk_heads):
                chunk = todo[c0:c0 + args.chunk_heads]
                need = [k.label for k in ks if any(h.label in missing[k.label] for h in chunk)]
                jobs.append((n, need, [h.label for h in chunk]))
        left = {n: sum(len(j[2]) for j in jobs if j[0] == n) for n in args.contexts}
        with _pool(args.workers) as pool:
            for n, df in pool(_grid_chunk, [(args.source, args.phase, args.trials, args.needle_weight, args.seed, *j)
                                            for j in jobs]):
                df.to_csv(partial, mode="a", header=not partial.is_file(), index=False)
                left[n] -= df["head"].nunique()
                print(f"{n}: {len(heads) - left[n]}/{len(heads)} heads, {df['kernel'].nunique()} kernels, "
                      f"{time.time() - t0:.0f} s", flush=True)
        key = ["kernel", "n_tokens", "head", "trial"]
    else:
        for n in args.contexts:
            if len(done) and (done["n_tokens"] == n).any():
                continue
            df = wg.law_grid(heads, [n], args.trials, args.needle_weight, args.seed)
            df.to_csv(partial, mode="a", header=not partial.is_file(), index=False)
            print(f"{n}: {time.time() - t0:.0f} s", flush=True)
        key = ["frac_bits", "n_tokens", "head", "trial"]
    df = pd.read_csv(partial).drop_duplicates(key)
    df = df[df["n_tokens"].isin(args.contexts)]          # rows of an earlier, longer run left in the partial
    if args.what == "grid":
        df = df[df["kernel"].isin(args.kernels)]
        # context, kernel, head, trial in the order asked, whatever order the chunks were run in
        rank = {"n_tokens": {n: i for i, n in enumerate(args.contexts)},
                "kernel": {k: i for i, k in enumerate(args.kernels)},
                "head": {h.label: i for i, h in enumerate(heads)}}
        df = df.sort_values(["n_tokens", "kernel", "head", "trial"], kind="stable",
                            key=lambda c: c.map(rank[c.name]) if c.name in rank else c)
    df = df.reset_index(drop=True)
    df.to_csv(csv, index=False, lineterminator="\n")
    src = haystacks.QUERY_SOURCES[args.source]
    provenance.write_run(
        csv.with_suffix(".json"),
        command="nice -n 10 .venv/bin/python scripts/which_gpu_grid.py " + " ".join(
            f"'{a}'" if " " in a else a for a in (sys.argv[1:] if argv is None else argv)),
        git=True, cpus=True, versions=provenance.versions(("numpy", "pandas", "ml_dtypes", "numba", "kvcost")),
        inputs={src: ROOT / src, "data/attention_kernels.csv": ROOT / "data" / "attention_kernels.csv"},
        note={"parameters": {"what": args.what, "contexts": args.contexts, "source": args.source,
                             "heads": int(args.heads) if args.heads.isdigit() else args.heads,
                             "trials": args.trials, "needle_weight": args.needle_weight, "seed": args.seed,
                             "phase": args.phase, "kernels": args.kernels if args.what == "grid" else [],
                             "keep": list(measure.KEEP), "head_labels": [h.label for h in heads]},
              "rows": len(df), "run_seconds_this_session": round(time.time() - t0)},
        outputs=[csv])
    partial.unlink()
    print(f"wrote {csv} ({len(df)} rows) and {csv.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
