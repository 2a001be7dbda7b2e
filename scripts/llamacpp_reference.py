#!/usr/bin/env python3
"""llama.cpp's own answer: the same GGUF on the same token windows with each cache type.

An entry point: the job is ``kvcost.runs.llamacpp_reference``
(``python -m kvcost.runs.llamacpp_reference --help``), with the same flags, defaults and output.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.runs.llamacpp_reference import main, parse_args  # noqa: F401 (a sweep checks flags with parse_args)

if __name__ == "__main__":
    raise SystemExit(main())
