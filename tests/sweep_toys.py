"""A toy notebook (about a second per run) and its schema, for the runner and sweep tests."""
from __future__ import annotations

from pathlib import Path

import nbformat

from kvcost import notebook_params
from kvcost.params import Int, PathStr, Schema

STEM = "toy_sweep"

PARAMETERS = """x = 0
fail_at = -1
counter = ""
out_dir = ""
"""

BODY = """import os
import pathlib

if counter:
    with open(counter, "a") as f:
        f.write(f"{x}\\n")
if x == fail_at:
    raise RuntimeError(f"toy failure at x={x}")
out = pathlib.Path(out_dir)
if not out.is_absolute():
    out = pathlib.Path("..") / out
out.mkdir(parents=True, exist_ok=True)
(out / "toy.csv").write_text(f"x,third,label\\n{x},{x / 3!r},\\"a, b\\"\\n{x + 1},{(x + 1) / 3!r},\\n")
(out / "other.csv").write_text(f"x\\n{x * x}\\n")
(pathlib.Path(os.environ["KVCOST_FIGURE_DIR"]) / "toy.png").write_bytes(b"not really a png")
print("toy", x)
from IPython.display import Markdown, display
display(Markdown(f"**Verdict.** toy {x}"))
"""

SCHEMA = Schema(STEM, [Int("x", 0, lo=0, hi=1000), Int("fail_at", -1), PathStr("counter", "")])


def write_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(PARAMETERS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(BODY)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(folder) / f"{STEM}.ipynb"
    nbformat.write(nb, path)
    return path


def install(monkeypatch, folder: Path) -> Path:
    """Register the toy schema and write the notebook into ``folder``; returns its path."""
    monkeypatch.setitem(notebook_params.SCHEMAS, STEM, SCHEMA)
    return write_notebook(folder)


#: A toy script for script sweeps: its flags are checked by ``parse_args``; it appends a row per
#: value of ``--x`` to the CSV at ``--out`` (and a provenance JSON beside it), counts its runs in
#: ``--counter`` and fails at ``--fail-at``.
SCRIPT = '''"""A toy script run by sweeps."""
import argparse
import json
import sys
from pathlib import Path


def _small(text):
    value = int(text)
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be in [0, 1000], got {text}")
    return value


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=_small, nargs="+", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--loud", action="store_true")
    ap.add_argument("--fail-at", type=int, default=-1)
    ap.add_argument("--counter", default="")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.counter:
        with open(args.counter, "a") as f:
            f.write(" ".join(map(str, args.x)) + "\\n")
    if args.fail_at in args.x:
        print("toy script failing at", args.fail_at, flush=True)
        return 3
    rows = "".join(f"{x},{x * args.scale!r},{int(args.loud)}\\n" for x in args.x)
    args.out.write_text("x,scaled,loud\\n" + rows)
    args.out.with_suffix(".json").write_text(json.dumps({"argv": sys.argv[1:]}))
    print("toy script", args.x, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write_script(folder: Path) -> Path:
    path = Path(folder) / "toy_script.py"
    path.write_text(SCRIPT)
    return path
