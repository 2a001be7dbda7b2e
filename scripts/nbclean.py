#!/usr/bin/env python3
"""Rewrite executed notebooks in their committed form (volatile metadata stripped): ``kvcost.nbclean``.

    python scripts/nbclean.py notebooks/01_sizing.ipynb [...]

Exit 1 when an output holds a machine path (a notebook must never print one).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))   # a checkout without `make setup`

from kvcost.nbclean import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
