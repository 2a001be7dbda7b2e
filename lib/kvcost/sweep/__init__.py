"""Parameter sweeps over the notebooks: YAML files in ``sweeps/``, resumable, local or on Dask.

    python -m kvcost.sweep list
    python -m kvcost.sweep run sizing_contexts [--jobs N] [--scheduler tcp://host:8786|local]
    python -m kvcost.sweep status sizing_contexts
    python -m kvcost.sweep run gemma_passkey --skip-committed
    python -m kvcost.sweep append data/real_model/gemma3_270m/passkey.csv even.csv odd.csv --trials 20

``spec`` reads and checks a sweep file, ``store`` keeps each run's folder and the combined
tables, ``coverage`` reads a publishing sweep's grid against its committed file, ``execute``
schedules the runs, ``append`` takes a direct script run's rows into a committed table, ``cli``
is the command line (README: Sweeps).
"""
from kvcost.sweep.cli import main
from kvcost.sweep.coverage import run_coverage
from kvcost.sweep.execute import Outcome, pending, run_sweep
from kvcost.sweep.spec import Run, Sweep, available, expand, load
from kvcost.sweep.store import MISSING_COLUMN, combine, record, run_dir, state

__all__ = [
           "MISSING_COLUMN",
           "Outcome",
           "Run",
           "Sweep",
           "available",
           "combine",
           "expand",
           "load",
           "main",
           "pending",
           "record",
           "run_coverage",
           "run_dir",
           "run_sweep",
           "state",
]
