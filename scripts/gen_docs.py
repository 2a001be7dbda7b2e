#!/usr/bin/env python3
"""Write the parameter tables of docs/notebooks.md from the schemas in kvcost.notebook_params.

An entry point: the job is ``kvcost.runs.gen_docs``
(``python -m kvcost.runs.gen_docs --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.gen_docs import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
