"""Measure notebook 06's needle retrieval once at a heavier scale and commit it as data (data/long_range/).

    nice -n 10 .venv/bin/python scripts/long_range_needle.py      # the committed run (defaults)
    python -m kvcost.runs.long_range_needle --help                 # the same job

Runs :func:`kvcost.experiments.long_range_needle.context_grid` (every fix and the bf16-P/fp32 reference
kernel) for the notebook's default heads at one context, haystack seeds ``seed`` .. ``seed +
trials - 1``, in chunks appended to ``needle.partial.csv`` (an interrupted run resumes), then
writes ``needle.csv`` and ``provenance.json`` (command, date, package versions, git commit,
parameters, run time, sha256 of ``needle.csv`` and of the head-statistics inputs). Notebook 06
reads it through :func:`kvcost.experiments.long_range_needle.committed_needle`, which checks the sha256
and the parameters, and recomputes haystack 0 of every head live.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from kvcost import provenance
from kvcost.experiments import long_range_needle as lr
from kvcost.paths import repo_root
from kvcost.retrieval import haystacks

ROOT = repo_root()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-tokens", type=int, default=131072)
    ap.add_argument("--trials", type=int, default=20, help="haystacks per head")
    ap.add_argument("--source", default="smollm2", choices=list(haystacks.SOURCES))
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=96)
    ap.add_argument("--needle-weight", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=2, help="haystacks per head per appended chunk")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "long_range")
    args = ap.parse_args(argv)
    if args.trials < 1 or args.chunk < 1:
        ap.error("--trials and --chunk must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    picked = haystacks.pick_profiles(haystacks.load_profiles(args.source), args.heads)
    partial = args.out / "needle.partial.csv"
    done = pd.read_csv(partial) if partial.is_file() else pd.DataFrame(columns=["trial"])
    have = set(done["trial"]) if len(done) else set()
    t0 = time.time()
    for first in range(0, args.trials, args.chunk):
        todo = [t for t in range(first, min(args.trials, first + args.chunk)) if t not in have]
        if not todo:
            continue
        # trial t is haystack seed + t: one grid per trial keeps the rows identical to the notebook's
        df = pd.concat([lr.context_grid(picked, [args.n_tokens], args.head_dim, 1, args.needle_weight,
                                        args.seed + t, block_n=args.block_n).assign(trial=t) for t in todo])
        df.to_csv(partial, mode="a", header=not partial.is_file(), index=False)
        print(f"trials {todo} done, {time.time() - t0:.0f} s", flush=True)
    df = pd.read_csv(partial).drop_duplicates(["head", "trial", "fix"])
    df = df.sort_values(["head", "trial", "fix"], kind="stable").reset_index(drop=True)
    csv = args.out / "needle.csv"
    df.to_csv(csv, index=False, lineterminator="\n")
    provenance.write_run(
        args.out / "provenance.json",
        command="nice -n 10 .venv/bin/python scripts/long_range_needle.py" + (
            " " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else ""),
        git=True, cpus=True, versions=provenance.versions(("numpy", "pandas", "ml_dtypes", "numba", "kvcost")),
        inputs={rel: ROOT / rel for rel in haystacks.SOURCES[args.source] if rel},
        note={"parameters": {"n_tokens": args.n_tokens, "trials": args.trials, "source": args.source,
                             "heads": args.heads, "head_dim": args.head_dim, "block_n": args.block_n,
                             "needle_weight": args.needle_weight, "seed": args.seed},
              "heads": [h.label for h in picked], "rows": len(df),
              "run_seconds_this_session": round(time.time() - t0), "needle_csv_sha256": provenance.sha256(csv)},
        outputs=[csv])                 # "sha256": {"needle.csv": …}, what kvcost.provenance.checked reads
    partial.unlink()
    print(f"wrote {csv} ({len(df)} rows) and provenance.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
