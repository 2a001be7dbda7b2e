#!/usr/bin/env python3
"""Hold every tensor-core unit to MMA-Sim on >= 100,000 instructions each and commit the count as data.

An entry point: the job is ``kvcost.runs.tensorcore_validation``
(``python -m kvcost.runs.tensorcore_validation --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.tensorcore_validation import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
