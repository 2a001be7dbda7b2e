#!/usr/bin/env python3
"""Extract real keys and values from all-MiniLM-L6-v2 into data/real_kv/minilm_l6_kv.npz (``make real-kv``).

An entry point: the job is ``kvcost.runs.extract_real_kv``
(``python -m kvcost.runs.extract_real_kv --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.extract_real_kv import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
