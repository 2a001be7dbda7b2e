#!/usr/bin/env python3
"""Real decoder K/V: statistics of every layer and head, and a small extract (``make real-model``).

An entry point: the job is ``kvcost.runs.real_model_extract``
(``python -m kvcost.runs.real_model_extract --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.real_model_extract import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
