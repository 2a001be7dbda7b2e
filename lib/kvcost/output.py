"""Where results go: the repository root, per-notebook result folders, full-precision CSV."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvcost.paths import repo_root

if TYPE_CHECKING:   # pandas only for the annotation: the CLI imports this module and stays light
    import pandas as pd

__all__ = ["resolve_out_dir", "write_table", "FIGURE_DIR", "FIGURE_DIR_ENV"]

FIGURE_DIR = "figures"                 # the committed figures, written only by default runs
FIGURE_DIR_ENV = "KVCOST_FIGURE_DIR"   # set by the runner and sweeps: where a run's figures go


def resolve_out_dir(out_dir: str | Path | None, stem: str) -> Path:
    """Resolve a notebook's ``out_dir`` parameter (nothing is created: validating parameters writes
    nothing; :func:`write_table` creates the folder when a table is written).

    Empty or ``None`` means ``results/<stem>/``; a relative path is taken relative to the
    repository root (docs/notebooks.md), whatever the working directory is.
    """
    if out_dir is not None and not isinstance(out_dir, (str, Path)):
        raise ValueError(f"parameter 'out_dir' must be a path string, got {out_dir!r}")
    path = Path(out_dir) if out_dir else Path("results") / stem
    if not path.is_absolute():
        path = repo_root() / path
    return path


def write_table(df: pd.DataFrame, out_dir: Path, filename: str) -> Path:
    """Write ``df`` as CSV at full precision (floats round-trip exactly; no display rounding), creating
    ``out_dir`` if needed."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / filename
    df.to_csv(path, index=False, float_format=None, lineterminator="\n")
    return path
