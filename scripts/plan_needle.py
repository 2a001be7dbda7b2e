#!/usr/bin/env python3
"""Measure notebook 09's needle once at full scale and commit it as data (data/plan_needle/).

An entry point: the job is ``kvcost.runs.plan_needle``
(``python -m kvcost.runs.plan_needle --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.plan_needle import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
