"""One figure style for every notebook, and files that are byte-identical run to run."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from .output import repo_root

__all__ = ["use_style", "save", "FIGURE_DIR", "PALETTE"]

FIGURE_DIR = "figures"
FIGURE_DIR_ENV = "KVCOST_FIGURE_DIR"

# Colour-blind-safe (Okabe-Ito) palette, one colour per series in a fixed order.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

_STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "font.size": 10,
    "legend.frameon": False,
    # Reproducible SVG: fixed element ids, text kept as paths (no font dependence in ids).
    "svg.hashsalt": "kvcost",
    "svg.fonttype": "path",
}


def use_style() -> None:
    """Apply the kvcost figure style (call once at the top of a notebook)."""
    matplotlib.rcParams.update(_STYLE)


def save(fig: plt.Figure, name: str, formats: Sequence[str] = ("png",),
         folder: str | Path | None = None) -> list[Path]:
    """Save ``fig`` as ``figures/<name>.<fmt>`` with volatile metadata stripped.

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
