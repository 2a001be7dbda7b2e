"""Parameter sweeps over the notebooks with papermill (``make sweep``).

Each sweep runs one notebook once per parameter set, from ``notebooks/`` as the
notebooks expect; executed copies go to ``build/sweeps/<sweep>/`` and each run's tables to
``results/sweeps/<sweep>/<run>/``. Every CSV table of a sweep is then stacked into
``results/sweeps/<sweep>/<table>.csv`` with the run's parameters as leading columns, ready
for pandas.

    python -m kvcost.sweep --list
    python -m kvcost.sweep needle_margin axis_seeds
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .output import repo_root
from .plotting import FIGURE_DIR_ENV

__all__ = ["Sweep", "SWEEPS", "run_sweep", "collect", "main"]


@dataclass(frozen=True)
class Sweep:
    """One notebook and the parameter sets to run it with."""

    notebook: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    about: str = ""


SWEEPS: dict[str, Sweep] = {
    "needle_margin": Sweep("03_needle_cliff.ipynb",
                           [{"margin": m, "sweep_trials": 100} for m in (0.25, 0.5, 1.0, 2.0, 4.0)],
                           "the post's needle table at five margins (200 trials each)"),
    "needle_seeds": Sweep("03_needle_cliff.ipynb", [{"seed": s} for s in range(7, 12)],
                          "the post's needle table on five random streams: how lucky was 1/200?"),
    "axis_seeds": Sweep("02_axis_choice.ipynb", [{"seed": s} for s in range(7, 17)],
                        "the axis table on ten random streams: is the 2-bit flip robust?"),
    "accumulator_long": Sweep("04_accumulator_floor.ipynb",
                              [{"n_tokens": [2 ** k for k in range(6, 26)]}],
                              "the flat-sum table from 64 to 33,554,432 terms"),
    "long_needle_d128": Sweep("06_long_range_needle.ipynb",
                              [{"head_dim": 128, "trials": 5, "needle_weights": [0.5, 0.1, 0.01],
                                "positions": ["start", "middle", "end"]}],
                              "notebook 06 at Llama-3.1-8B's head_dim, 5 haystacks, every needle position"),
    "sizing_contexts": Sweep("01_sizing.ipynb",
                             [{"context": c} for c in (8192, 32768, 131072, 262144, 1048576)],
                             "the post's sizing table at five context lengths"),
}


def run_sweep(name: str, kernel: str = "python3") -> Path:
    """Run every parameter set of sweep ``name``; returns ``results/sweeps/<name>``."""
    import papermill as pm  # imported here: the library itself does not need papermill

    if name not in SWEEPS:
        raise ValueError(f"unknown sweep {name!r}; known: {sorted(SWEEPS)}")
    sweep = SWEEPS[name]
    root = repo_root()
    nb_dir = root / "notebooks"
    build = root / "build" / "sweeps" / name
    results = root / "results" / "sweeps" / name
    build.mkdir(parents=True, exist_ok=True)
    # Figures of runs with other parameters must not overwrite the committed ones.
    os.environ[FIGURE_DIR_ENV] = str(build / "figures")
    for i, params in enumerate(sweep.runs):
        run_dir = results / f"run{i:02d}"
        print(f"{name} run {i + 1}/{len(sweep.runs)}: {json.dumps(params)}", flush=True)
        pm.execute_notebook(str(nb_dir / sweep.notebook), str(build / f"run{i:02d}.ipynb"),
                            parameters={**params, "out_dir": str(run_dir.relative_to(root))},
                            cwd=str(nb_dir), kernel_name=kernel, progress_bar=False)
    return results


def collect(name: str) -> dict[str, Path]:
    """Stack each table of a finished sweep across its runs: ``run``, then ``param_<name>``
    columns for the run's parameters, then the table's own columns."""
    sweep = SWEEPS[name]
    results = repo_root() / "results" / "sweeps" / name
    tables: dict[str, list[pd.DataFrame]] = {}
    for i, params in enumerate(sweep.runs):
        for csv in sorted((results / f"run{i:02d}").glob("*.csv")):
            df = pd.read_csv(csv)
            for j, (key, value) in enumerate(params.items()):
                # prefixed: a table may have a column of the same name (e.g. context)
                df.insert(j, f"param_{key}", json.dumps(value) if isinstance(value, list) else value)
            df.insert(0, "run", i)
            tables.setdefault(csv.name, []).append(df)
    written = {}
    for table, frames in tables.items():
        path = results / table
        pd.concat(frames, ignore_index=True).to_csv(path, index=False, lineterminator="\n")
        written[table] = path
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcost.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="*", help=f"sweeps to run (default: all): {', '.join(SWEEPS)}")
    parser.add_argument("--list", action="store_true", help="list the sweeps and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, sweep in SWEEPS.items():
            print(f"{name:18s} {sweep.notebook:28s} {len(sweep.runs):2d} runs  {sweep.about}")
        return 0
    unknown = [s for s in args.sweeps if s not in SWEEPS]
    if unknown:
        parser.error(f"unknown sweep(s) {unknown}; known: {sorted(SWEEPS)}")
    for name in args.sweeps or list(SWEEPS):
        run_sweep(name)
        for table, path in collect(name).items():
            print(f"  {table}: {path.relative_to(repo_root())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
