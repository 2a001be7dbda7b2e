"""One figure style for every notebook, and files that are byte-identical run to run."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from kvcost.output import FIGURE_DIR, FIGURE_DIR_ENV
from kvcost.paths import repo_root

__all__ = ["use_style", "save", "label_points", "FIGURE_DIR", "PALETTE", "MARKERS", "LINESTYLES"]

# Colour-blind-safe (Okabe-Ito) palette, one colour per series in a fixed order.
# Okabe-Ito without its yellow (unreadable on white); series also differ by marker and line style.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#56B4E9", "#E69F00", "#999999"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2))]

_STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": (matplotlib.cycler(color=PALETTE) + matplotlib.cycler(marker=MARKERS)
                        + matplotlib.cycler(linestyle=LINESTYLES)),
    "lines.markersize": 5,
    "font.size": 10,
    "legend.frameon": False,
    # Reproducible SVG: fixed element ids, text kept as paths (no font dependence in ids).
    "svg.hashsalt": "kvcost",
    "svg.fonttype": "path",
}


def label_points(ax: plt.Axes, xs: Sequence[float], ys: Sequence[float], names: Sequence[str], *,
                 color: str = "black", fontsize: float = 5.5, gap_pt: float | None = None,
                 width_pt: float = 60.0) -> None:
    """Name each point: a label to its right, labels that would overlap pushed down one under another, a thin
    leader line from a moved label to its point. Call it after the axes' scales and data are final (it places
    labels in display space). Deterministic: the same points give the same layout."""
    if not len(xs):
        return
    ax.autoscale_view()
    px_per_pt = ax.figure.dpi / 72.0
    gap = (gap_pt if gap_pt is not None else 1.25 * fontsize) * px_per_pt
    pts = ax.transData.transform(np.column_stack([np.asarray(xs, float), np.asarray(ys, float)]))
    placed: list[tuple[float, float]] = []
    for i in sorted(range(len(pts)), key=lambda i: (-pts[i][1], pts[i][0])):     # top first, then left
        x, y = pts[i]
        ty = y
        while any(abs(px - x) < width_pt * px_per_pt and abs(py - ty) < gap for px, py in placed):
            ty -= gap
        placed.append((x, ty))
        dy = (ty - y) / px_per_pt
        ax.annotate(names[i], (xs[i], ys[i]), xytext=(5, dy), textcoords="offset points", fontsize=fontsize,
                    va="center", color=color,
                    arrowprops=dict(arrowstyle="-", lw=0.3, color=color, shrinkA=0, shrinkB=2) if dy else None)


def use_style() -> None:
    """Apply the kvcost figure style (call once at the top of a notebook)."""
    matplotlib.rcParams.update(_STYLE)


def save(fig: plt.Figure, name: str, formats: Sequence[str] = ("png", "svg"),
         folder: str | Path | None = None) -> list[Path]:
    """Save ``fig`` as ``<folder>/<name>.png`` (200 dpi) and ``.svg``, volatile metadata stripped.

    Notebooks pass ``folder=p.figure_dir``: ``figures/`` for the default run, the run's
    ``out_dir`` otherwise, so a run with other parameters never overwrites a committed figure.

    PNG drops the Software tag, SVG and PDF drop the creation date, so the same machine
    writes the same bytes every run and ``make figures`` leaves ``git status`` clean.
    The folder is ``folder`` if given, else ``$KVCOST_FIGURE_DIR`` if set (sweeps use it so
    that runs with other parameters leave the committed figures alone), else ``figures/``.
    """
    allowed = ("png", "svg", "pdf")
    bad = [f for f in formats if f not in allowed]
    if bad:
        raise ValueError(f"parameter 'formats' must use {allowed}, got {bad}")
    if folder is None:
        folder = os.environ.get(FIGURE_DIR_ENV) or repo_root() / FIGURE_DIR
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = folder / f"{name}.{fmt}"
        metadata = {"png": {"Software": None},
                    "svg": {"Date": None, "Creator": None},
                    "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}[fmt]
        fig.savefig(path, format=fmt, metadata=metadata)
        paths.append(path)
    return paths
