#!/usr/bin/env python3
"""Write Gemma 3 270M's retrieval verdicts into its data README from the committed grids.

An entry point: the job is ``kvcost.runs.retrieval_readme_table``
(``python -m kvcost.runs.retrieval_readme_table --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.retrieval_readme_table import main, parse_args, render  # noqa: F401 (parse_args, render: its names, for tests and sweeps)

if __name__ == "__main__":
    raise SystemExit(main())
