#!/usr/bin/env python3
"""Strip volatile metadata from executed notebooks so re-running them changes no bytes.

Removes papermill's notebook/cell metadata, per-cell execution timestamps and the
interpreter's version, keeps
outputs and execution counts (nbval needs both), and refuses a notebook whose outputs
hold a machine path (a notebook must never print one).

    python scripts/nbclean.py notebooks/01_sizing.ipynb [...]
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MACHINE_PATH = re.compile(r"/(?:work|root|tmp|home|farm|Users)/[^\s\"']+")
VOLATILE_CELL_KEYS = ("papermill", "execution", "collapsed", "scrolled")


def clean(nb: dict) -> dict:
    nb.get("metadata", {}).pop("papermill", None)
    nb["metadata"].pop("widgets", None)
    # the interpreter's patch version is the machine's, not the notebook's
    nb["metadata"].get("language_info", {}).pop("version", None)
    for cell in nb.get("cells", []):
        meta = cell.setdefault("metadata", {})
        for key in VOLATILE_CELL_KEYS:
            meta.pop(key, None)
        tags = [t for t in meta.get("tags", []) if t != "injected-parameters"]
        if "tags" in meta:
            meta["tags"] = tags
            if not tags:
                del meta["tags"]
    return nb


def main(paths: list[str]) -> int:
    status = 0
    for name in paths:
        path = Path(name)
        nb = clean(json.loads(path.read_text()))
        text = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        match = MACHINE_PATH.search(text)
        if match:
            print(f"{path}: output holds a machine path {match.group(0)[:80]!r}", file=sys.stderr)
            status = 1
        path.write_text(text)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
