"""Notebook 06's retrieval run: every query head of SmolLM2-135M's committed extract, real score profiles,
the needle's carried weight and the output's gain per GPU and fix, committed as data (data/long_range/).

    nice -n 10 .venv/bin/python scripts/long_range_retrieval.py      # the committed run (defaults)
    python -m kvcost.runs.long_range_retrieval --help                 # the same job

Runs :func:`kvcost.experiments.long_range_needle.retrieval_grid` (each haystack with the needle and with its
value replaced by the haystack mean) for all 45 query heads (:func:`~kvcost.experiments.haystacks.query_heads`)
at one context, haystack seeds ``seed`` .. ``seed + trials - 1``, one head per chunk appended to
``retrieval.partial.csv`` (an interrupted run resumes), then writes ``retrieval.csv`` and
``retrieval.json`` (command, date, package versions, git commit, parameters, cells, run time, the sha256 of
``retrieval.csv`` and of its input). Notebook 06 reads it through
:func:`kvcost.experiments.long_range_needle.committed_retrieval`, which checks the sha256 and the parameters, and
recomputes some of its rows live.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from kvcost.experiments import long_range_needle as lr
from kvcost.paths import repo_root
from kvcost.retrieval import haystacks, measure
from kvcost.runs import tables
from kvcost.script_args import int_at_least

ROOT = repo_root()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-tokens", type=int, default=131072)
    ap.add_argument("--trials", type=int_at_least(1), default=2, help="haystacks per query head")
    ap.add_argument("--block-n", type=int, default=128, help="FA3's FP8 decode tile at head_dim 64")
    ap.add_argument("--needle-weight", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "long_range")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    heads = haystacks.query_heads("smollm2")
    cells = [tuple(c) for c in lr.RETRIEVAL_CELLS]
    partial = args.out / "retrieval.partial.csv"
    by_label = {h.label: h for h in heads}
    t0 = time.time()

    def grid(todo: list[str]) -> pd.DataFrame:
        return lr.retrieval_grid([by_label[label] for label in todo], args.n_tokens, args.trials,
                                 args.needle_weight, args.seed, cells, block_n=args.block_n)

    rows = tables.append_in_chunks(partial, [[h.label] for h in heads], grid, key="head",
                                   say=lambda todo, s: f"{todo[0]} done, {s:.0f} s")
    df = rows.drop_duplicates(["head", "trial", "arch", "fix"])
    df = df[df["trial"] < args.trials]          # a chunk run with more trials before a restart
    order = {h.label: i for i, h in enumerate(heads)}
    df = df.sort_values(["head", "trial", "arch", "fix"], key=lambda c: c.map(order) if c.name == "head" else c,
                        kind="stable").reset_index(drop=True)
    src = haystacks.SOURCES["smollm2"][0]
    tables.write_table(
        df, args.out / "retrieval.csv", args.out / "retrieval.json", partial, started=t0,
        command="nice -n 10 .venv/bin/python scripts/long_range_retrieval.py" + (
            " " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else ""),
        packages=("numpy", "pandas", "ml_dtypes", "numba", "kvcost"), inputs={src: ROOT / src},
        note={"parameters": {"n_tokens": args.n_tokens, "trials": args.trials, "source": "smollm2",
                             "block_n": args.block_n, "needle_weight": args.needle_weight, "seed": args.seed,
                             "recent": haystacks.RECENT, "keep": list(measure.KEEP)},
              "cells": [list(c) for c in cells], "heads": [h.label for h in heads]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
