#!/usr/bin/env python3
"""Measure notebook 06's needle retrieval once at a heavier scale and commit it as data (data/long_range/).

An entry point: the job is ``kvcost.runs.long_range_needle``
(``python -m kvcost.runs.long_range_needle --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.long_range_needle import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
