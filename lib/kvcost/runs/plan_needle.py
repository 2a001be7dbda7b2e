"""Measure notebook 09's needle once at full scale and commit it as data (data/plan_needle/).

    nice -n 10 .venv/bin/python scripts/plan_needle.py            # the committed run (defaults)
    python -m kvcost.runs.plan_needle --help                       # the same job

Runs :func:`kvcost.experiments.plan.needle_by_format` for every context, K/V format and trial, in
chunks of trials appended to ``needle.partial.csv`` (an interrupted run resumes where it stopped),
then writes ``needle.csv`` (sorted) and ``provenance.json``: the command, the date, package versions,
the git commit, the parameters, the run time and the sha256 of ``needle.csv`` and of its input
(``data/real_kv/minilm_l6_kv.npz``). Notebook 09 reads the result through
:func:`kvcost.experiments.plan.committed_format_needle`, which checks that sha256, and recomputes a slice live.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from kvcost import provenance
from kvcost.experiments import plan as plan_exp
from kvcost.paths import repo_root
from kvcost.runs import tables
from kvcost.script_args import int_at_least

ROOT = repo_root()
REAL_KV = ROOT / "data" / "real_kv" / "minilm_l6_kv.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp8_e4m3", "q8_0", "q4_0", "q8_0/q4_0"])
    ap.add_argument("--trials", type=int_at_least(1), default=200)
    ap.add_argument("--needle-weight", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int_at_least(1), default=20, help="trials per appended chunk")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "plan_needle")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "needle.partial.csv"
    t0 = time.time()

    def needle(chunk: list[tuple[int, int]]) -> pd.DataFrame:
        """The rows of ``chunk``, one context's consecutive ``(n_tokens, trial)`` keys, in one call from the
        chunk's first trial on."""
        (n, first), count = chunk[0], len(chunk)
        return plan_exp.needle_by_format([n], args.dtypes, trials=count, needle_weight=args.needle_weight,
                                         seed=args.seed, first_trial=first)

    def said(chunk: list[tuple[int, int]], seconds: float) -> str:
        return f"{chunk[0][0]:>8,} tokens, trials {chunk[0][1]}-{chunk[-1][1]}: {seconds:.0f} s"

    chunks = [[(n, t) for t in range(first, min(args.trials, first + args.chunk))]
              for n in args.contexts for first in range(0, args.trials, args.chunk)]
    rows = tables.append_in_chunks(partial, chunks, needle, key=("n_tokens", "trial"), say=said, whole=True)
    full = rows.drop_duplicates(["n_tokens", "trial", "storage"])
    order = {s: i for i, s in enumerate(dict.fromkeys(full.storage))}
    full = full.sort_values(["n_tokens", "trial", "storage"], key=lambda c: c.map(order) if c.name == "storage" else c)
    full = full[full.n_tokens.isin(args.contexts) & (full.trial < args.trials)]
    tables.write_table(
        full, args.out / "needle.csv", args.out / "provenance.json", partial, started=t0,
        digest="needle_csv_sha256",
        command="nice -n 10 .venv/bin/python scripts/plan_needle.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        packages=("numpy", "pandas", "ml_dtypes", "kvcost"),
        note={"parameters": {"contexts": args.contexts, "dtypes": args.dtypes, "trials": args.trials,
                             "needle_weight": args.needle_weight, "seed": args.seed, "head_dim": 64},
              "input": {"path": str(REAL_KV.relative_to(ROOT)), "sha256": provenance.sha256(REAL_KV)}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
