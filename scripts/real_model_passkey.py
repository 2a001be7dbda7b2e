#!/usr/bin/env python3
"""Passkey and RULER retrieval on a real decoder (SmolLM2-135M or Gemma 3 270M): a resumable grid of cells.

An entry point: the job is ``kvcost.runs.real_model_passkey``
(``python -m kvcost.runs.real_model_passkey --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.real_model_passkey import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
