"""The n·2^-b law on a real decoder's passkey: where a narrowed tensor-core register's retrieval collapses.

FlashAttention's FP8 accumulation error is a function of x = n·2^-b (n terms, b fraction bits of the
register; notebook 06), so narrowing the P·V register by k bits stands in for a context 2^k times longer. A
passkey grid over ``fa3:frac_bits=b`` variants (kvcost.experiments.real_decoder_passkey) collapses at the
largest b whose success rate is at most half exact attention's; x_c = n·2^-b_c should then be the same at
every context, and a ``full_bits`` register fails at n = x_c·2^full_bits. :func:`collapse_table` reads it off
a table of rates, :func:`collapse_bootstrap` off raw trials with the uncertainty carried through. Notebooks 08
and 08b read both decoders' grids through it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["frac_bits_of", "collapse_table", "collapse_bootstrap"]


def frac_bits_of(variant: str, full_bits: int = 13) -> int | None:
    """The register's fraction bits of a plain fast-mode kernel variant (``fa3`` -> ``full_bits``,
    ``fa3:frac_bits=b`` -> b), None for any other variant."""
    if variant == "fa3":
        return full_bits
    if variant.startswith("fa3:frac_bits=") and "," not in variant:
        return int(variant.split("=")[1])
    return None


def collapse_table(table: pd.DataFrame, full_bits: int = 13, min_trials: int = 20) -> pd.DataFrame:
    """Per context with a ``frac_bits`` sweep: the exact rate, the largest b whose success rate is at
    most half the exact rate (``collapse_bits``, None when none is), x_c = context·2^-b, and the
    context at which a ``full_bits`` register reaches the same x (``n_fail_full``). If the kernel's
    loss is a function of n·2^-b (notebook 06's scaling law), x_c is the same at every context
    (within the factor 2 of the b grid). Only cells of at least ``min_trials`` trials count (the
    exact one included): a rate from a few trials would move the collapse by chance."""
    rows = []
    for c, g in table.groupby("context"):
        g = g[g["trials"] >= min_trials].set_index("variant")
        bits = {b: float(g.loc[v, "rate"]) for v in g.index if (b := frac_bits_of(v, full_bits)) is not None}
        if "exact" not in g.index or len(bits) < 2:
            continue
        exact = float(g.loc["exact", "rate"])
        collapsed = [b for b, r in bits.items() if r <= exact / 2]
        b_c = max(collapsed) if collapsed else None
        rows.append({"context": int(c), "exact_rate": exact, "bits_tried": " ".join(map(str, sorted(bits))),
                     "collapse_bits": b_c, "x_c": c / 2 ** b_c if b_c is not None else math.nan,
                     "n_fail_full": c * 2 ** (full_bits - b_c) if b_c is not None else math.nan,
                     "lowest_bits_holding": min((b for b, r in bits.items() if r > exact / 2), default=None)})
    return pd.DataFrame(rows)


def _collapse_bracket(n: float, bits: np.ndarray, narrow: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """Where the rate crosses half the ``exact`` rate, bracketed by the widths tried (``narrow``: trials x
    variants of ``bits``): ``(floor, x_c)`` with x_c = n·2^-b_c for the largest b_c whose rate is at most half
    exact's and floor = n·2^-b_up for the next width tried above it, which held (0 when b_c is the widest
    tried: the crossing may lie at any wider register). The crossing lies in (floor, x_c]: a grid with a gap
    of several bits between b_c and b_up says no more than that. None collapsed: ``(n·2^-b_min, +inf)``."""
    hit = narrow.mean(axis=0) <= exact.mean() / 2
    if not hit.any():
        return n / 2.0 ** bits.min(), math.inf
    b_c = bits[hit].max()
    above = bits[bits > b_c]
    return (n / 2.0 ** above.min() if above.size else 0.0), n / 2.0 ** b_c


def collapse_bootstrap(rows: pd.DataFrame, full_bits: int = 13, boot: int = 2000, seed: int = 0,
                       min_trials: int = 14) -> tuple[pd.DataFrame, dict]:
    """The register's collapse point with its uncertainty, from raw passkey rows (context, trial, variant,
    success; e.g. ``data/real_model/passkey_unit.csv``).

    Per context: the trials that ran exact attention and every ``frac_bits`` variant of that context (at least
    ``min_trials`` of them) are resampled with replacement, the same trials for every variant (the cells are
    paired); in each resample the collapse b_c is the largest b whose rate is at most half the exact rate (None
    when no b collapses), x_c = n·2^-b_c. The widths tried bracket the crossing: it lies above the x of the next
    width tried, which held (``x_floor``; :func:`_collapse_bracket`), so a grid of 2, 5 and 13 bits that collapses
    at 2 places x_c anywhere in (n·2^-5, n·2^-2]. Returned per context: the point b_c, x_c and x_floor of the
    trials as run, and the interval from the 2.5 percentile of x_floor to the 97.5 percentile of x_c over
    resamples (a resample without a collapse has x_c = ``+inf`` and x_floor = n·2^-b for the narrowest b tried),
    so both the trials and the grid's gaps widen it. Then the model's x_c — the geometric mean over the contexts
    whose trials as run collapse, each context resampled on its own (a context without a collapse bounds x_c from
    below only) — with its interval (the same percentiles of the pooled floors and points), and the context at
    which a ``full_bits`` register reaches it, n = x_c·2^full_bits, with the interval carried through. If the
    contexts' intervals do not overlap the law n·2^-b is not seen to hold and ``law_holds`` is False."""
    rng = np.random.default_rng(seed)
    per, draws = [], []
    for c, g in rows.groupby("context", sort=True):
        g = g.assign(bits=[frac_bits_of(v, full_bits) for v in g["variant"]])
        cells = g[(g["variant"] == "exact") | g["bits"].notna()]
        counts = cells.groupby("variant")["trial"].nunique()
        keep = counts[counts >= min_trials].index                  # variants run on enough trials
        wide = cells[cells["variant"].isin(keep)].pivot_table(index="trial", columns="variant", values="success",
                                                              aggfunc="first").dropna()
        narrow = [v for v in wide.columns if v != "exact"]
        if "exact" not in wide.columns or len(narrow) < 2 or len(wide) < min_trials:
            continue
        bits = np.array([frac_bits_of(v, full_bits) for v in narrow])
        m, e = wide[narrow].to_numpy(float), wide["exact"].to_numpy(float)
        idx = rng.integers(0, len(wide), size=(boot, len(wide)))
        fl, xs = np.array([_collapse_bracket(float(c), bits, m[i], e[i]) for i in idx]).T
        f0, x0 = _collapse_bracket(float(c), bits, m, e)
        draws.append((fl, xs))
        per.append({"context": int(c), "trials": len(wide), "bits_tried": " ".join(map(str, sorted(bits))),
                    "x_c": x0, "collapse_bits": None if math.isinf(x0) else round(math.log2(c / x0)),
                    "x_floor": f0,
                    "x_lo": float(np.quantile(fl, 0.025, method="lower")),
                    "x_hi": float(np.quantile(xs, 0.975, method="higher")),
                    "no_collapse_share": float(np.isinf(xs).mean())})
    table = pd.DataFrame(per)
    if table.empty:
        return table, {}
    # pooled over the contexts where the trials as run collapse (a context without one bounds x_c from below only)
    fin = np.isfinite(table["x_c"].to_numpy())
    if not fin.any():
        lo = float(table["x_lo"].max())
        return table, {"contexts": 0, "x_c": math.inf, "x_lo": lo, "x_hi": math.inf, "full_bits": full_bits,
                       "n_fail": math.inf, "n_lo": lo * 2.0 ** full_bits, "n_hi": math.inf, "law_holds": False,
                       "boot": boot}
    with np.errstate(divide="ignore"):      # geometric means over contexts, per resample (a floor of 0 stays 0)
        floors = np.exp(np.log(np.stack([f for f, _ in draws])[fin]).mean(axis=0))
        pooled = np.exp(np.log(np.stack([x for _, x in draws])[fin]).mean(axis=0))
    x0 = float(np.exp(np.mean(np.log(table["x_c"][fin]))))
    with np.errstate(divide="ignore"):
        f0 = float(np.exp(np.mean(np.log(table["x_floor"][fin]))))
    lo = float(np.quantile(floors, 0.025, method="lower"))
    hi = float(np.quantile(pooled, 0.975, method="higher"))
    overlap = float(table["x_lo"].max()) <= float(table["x_hi"].min())
    fit = {"contexts": int(fin.sum()), "x_c": x0, "x_floor": f0, "x_lo": lo, "x_hi": hi, "full_bits": full_bits,
           "n_fail": x0 * 2.0 ** full_bits, "n_lo": lo * 2.0 ** full_bits, "n_hi": hi * 2.0 ** full_bits,
           "law_holds": bool(overlap and len(table) > 1), "boot": boot}
    return table, fit
