#!/usr/bin/env python3
"""Notebook 10's committed runs: every attention kernel on real-profile haystacks (grid), or FA3's law (law).

An entry point: the job is ``kvcost.runs.which_gpu_grid``
(``python -m kvcost.runs.which_gpu_grid --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.which_gpu_grid import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
