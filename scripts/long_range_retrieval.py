#!/usr/bin/env python3
"""Notebook 06's retrieval run: every query head of SmolLM2-135M's extract, committed as data (data/long_range/).

An entry point: the job is ``kvcost.runs.long_range_retrieval``
(``python -m kvcost.runs.long_range_retrieval --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.long_range_retrieval import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
