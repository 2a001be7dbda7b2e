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

from kvcost.experiments import long_range_needle as lr
from kvcost.paths import repo_root
from kvcost.retrieval import haystacks
from kvcost.runs import tables
from kvcost.script_args import int_at_least

ROOT = repo_root()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-tokens", type=int, default=131072)
    ap.add_argument("--trials", type=int_at_least(1), default=20, help="haystacks per head")
    ap.add_argument("--source", default="smollm2", choices=list(haystacks.SOURCES))
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=96)
    ap.add_argument("--needle-weight", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int_at_least(1), default=2, help="haystacks per head per appended chunk")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "long_range")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    picked = haystacks.pick_profiles(haystacks.load_profiles(args.source), args.heads)
    partial = args.out / "needle.partial.csv"
    t0 = time.time()

    def grid(todo: list[int]) -> pd.DataFrame:
        # trial t is haystack seed + t: one grid per trial keeps the rows identical to the notebook's
        return pd.concat([lr.context_grid(picked, [args.n_tokens], args.head_dim, 1, args.needle_weight,
                                          args.seed + t, block_n=args.block_n).assign(trial=t) for t in todo])

    chunks = [range(first, min(args.trials, first + args.chunk)) for first in range(0, args.trials, args.chunk)]
    rows = tables.append_in_chunks(partial, chunks, grid, key="trial",
                                   say=lambda todo, s: f"trials {todo} done, {s:.0f} s")
    df = rows.drop_duplicates(["head", "trial", "fix"])
    df = df.sort_values(["head", "trial", "fix"], kind="stable").reset_index(drop=True)
    tables.write_table(
        df, args.out / "needle.csv", args.out / "provenance.json", partial, started=t0, digest="needle_csv_sha256",
        command="nice -n 10 .venv/bin/python scripts/long_range_needle.py" + (
            " " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else ""),
        packages=("numpy", "pandas", "ml_dtypes", "numba", "kvcost"),
        inputs={rel: ROOT / rel for rel in haystacks.SOURCES[args.source] if rel},
        note={"parameters": {"n_tokens": args.n_tokens, "trials": args.trials, "source": args.source,
                             "heads": args.heads, "head_dim": args.head_dim, "block_n": args.block_n,
                             "needle_weight": args.needle_weight, "seed": args.seed},
              "heads": [h.label for h in picked]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
