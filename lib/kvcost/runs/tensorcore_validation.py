"""Hold every tensor-core unit to MMA-Sim on >= 100,000 instructions each and commit the count as data.

    nice -n 10 .venv/bin/python scripts/tensorcore_validation.py               # the committed run
    .venv/bin/python scripts/tensorcore_validation.py --unit 'Hopper|m64n8k32.f32.e4m3.e4m3' --instructions 2000
    python -m kvcost.runs.tensorcore_validation --help                          # the same job

Runs :func:`kvcost.numerics.oracle.validate` (every case of ``oracle.CASES``: C = 0, significands near 2,
large C, subnormals, tiny products, cancellation, long K chains, zero blocks and scales, NaN and inf,
overflow) for each unit and appends to ``validation.csv`` (a row per unit and case: instructions, outputs,
mismatches), one unit at a time: a unit already in the file is skipped, so an interrupted run resumes.
``validation.json`` beside it is rewritten after each unit: the commands, the date, the versions (mmasim and
torch included), the git commit, per-unit totals and the sha256 of the CSV. ``tests/test_units.py`` reads it.
MMA-Sim is slow (about 1,400 s per 100,000 m64n8k32 instructions on a shared 2-core machine), so the
cheapest units run first.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from kvcost import provenance
from kvcost.numerics import instructions, oracle
from kvcost.paths import repo_root
from kvcost.script_args import int_at_least

#: The stable units docs/api.md lists; tests/test_units.py samples more on every run.
UNITS = [
    "Ada Lovelace|m16n8k32.f32.e4m3.e4m3.f32", "RTX Blackwell|m16n8k32.f32.e4m3.e4m3.f32", "CDNA3|f32_16x16x32_fp8_fp8",
    "Hopper|m64n8k32.f32.e4m3.e4m3", "Hopper|m64n8k16.f32.bf16.bf16", "Hopper|m64n8k32.f32.e5m2.e4m3",
    "Blackwell|m64n8k32.kind::f8f6f4.f32.e4m3.e4m3",
    "Blackwell|m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0",
    "Blackwell|m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0",
    "Blackwell|m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3",
]


#: What the units are held to (validation.json's "oracle").
ORACLE = ("MMA-Sim (PyPI mmasim 2.1.1, microsoft/MMA-Sim, arXiv 2511.10909): sim(A, B, C[, scale_a, scale_b]) "
          "chained along K, one instruction per step")


def _unit(text: str) -> instructions.Unit:
    arch, _, instr = text.partition("|")
    return instructions.get(arch, instr)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line: adds ``units``, the units to run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", action="append", help="'ARCH|INSTR' (repeatable; default: every unit of UNITS)")
    ap.add_argument("--instructions", type=int_at_least(1), default=100_000, help="instructions per unit")
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--out", type=Path, default=repo_root() / "data" / "tensorcore" / "validation.csv")
    args = ap.parse_args(argv)
    try:
        args.units = [_unit(u) for u in (args.unit or UNITS)]
    except ValueError as err:
        ap.error(f"--unit: {err}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    units = args.units
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = args.out.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and args.out.is_file() else {"units": [],
                                                                                                   "commands": []}
    done = {(t["arch"], t["instr"]) for t in meta["units"]}
    command = "python scripts/tensorcore_validation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta["commands"] = [*meta.get("commands", []), command.strip()]
    for u in units:
        if (u.arch, u.instr) in done:
            print(f"{u.arch} {u.instr}: in {args.out.name} already, skipped", flush=True)
            continue
        t0 = time.time()
        got = oracle.validate(u, args.instructions, args.seed)
        secs = time.time() - t0
        rows = pd.DataFrame([{"arch": u.arch, "instr": u.instr, **r} for r in got])
        rows.to_csv(args.out, mode="a", header=not args.out.is_file(), index=False)
        tot = {"arch": u.arch, "instr": u.instr, "instructions": int(rows["instructions"].sum()),
               "outputs": int(rows["outputs"].sum()), "mismatches": int(rows["mismatches"].sum()),
               "seconds": round(secs), "seed": args.seed}
        meta["units"].append(tot)
        provenance.write_run(
            meta_path, command=None, note={**meta, "oracle": ORACLE}, git=True,
            versions=provenance.versions(["numpy", "numba", "ml_dtypes", "torch", "mmasim"]),
            outputs=[args.out])                        # the commands and units so far, and the CSV's sha256
        print(f"{u.arch} {u.instr}: {tot['instructions']} instructions, {tot['mismatches']} mismatches "
              f"({secs:.0f} s)", flush=True)
    return 0 if all(t["mismatches"] == 0 for t in meta["units"]) else 1


if __name__ == "__main__":
    sys.exit(main())
