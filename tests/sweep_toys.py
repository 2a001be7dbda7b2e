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
