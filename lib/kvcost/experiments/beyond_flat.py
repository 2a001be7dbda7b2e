"""Notebook 04b's tables: accumulation error on attention-like weights, flush intervals, DeepSeek's FP8 check."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..accum import PROFILES, accumulate, error_bound, exact_sum, hopper_sum, weight_profile
from ..floats import round_to
from ..params import check_int

__all__ = ["deepseek_check", "error_sweep", "flush_sweep", "profile_matrix"]


def profile_matrix(n: int, d: int, needle_mass: float, seed: int) -> tuple[np.ndarray, list[str]]:
    """All profiles' terms as columns of one (n, 5 + d) matrix, rounded to float32 (products
    as a kernel would produce them); and the profile name of each column."""
    cols, names = [], []
    for kind in PROFILES:
        t = weight_profile(kind, n, needle_mass=needle_mass, d=d, seed=seed)
        t = t.reshape(n, -1)
        cols.append(t)
        names += [kind] * t.shape[1]
    x = np.concatenate(cols, axis=1).astype(np.float32).astype(np.float64)
    return np.ascontiguousarray(x), names


def error_sweep(ns: list[int], formats: list[str], strategies: list[str], block: int = 128,
                d: int = 8, needle_mass: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """Error of every format x strategy on every weight profile, for each n.

    Strategies: those of :func:`kvcost.accum.accumulate` except ``hopper`` (that one is the
    fp32 tensor-core model, asked for as ``hopper`` and ``hopper_promoted`` (N_C = 128) and
    reported under format ``fp32``). Rows: profile, format, strategy, n, rel_error =
    max over the profile's columns of |computed - exact| / sum|x|, and the bounds
    (recursive, pairwise, blocked, probabilistic) in the same units.
    """
    block = check_int("block", block, lo=1)
    rows = []
    for n in ns:
        n = check_int("ns", n, lo=1)
        x, names = profile_matrix(n, d, needle_mass, seed)
        exact = exact_sum(x)
        abs_sum = exact_sum(np.abs(x))
        names_arr = np.array(names)
        runs = []
        for fmt in formats:
            for strat in strategies:
                if strat in ("hopper", "hopper_promoted"):
                    continue
                runs.append((fmt, strat, lambda fmt=fmt, strat=strat, x=x: accumulate(
                    x, fmt, strat, block=block if strat == "two_level" else None)))
        if "hopper" in strategies:
            runs.append(("fp32", "hopper", lambda x=x: hopper_sum(x)))
        if "hopper_promoted" in strategies:
            runs.append(("fp32", "hopper_promoted", lambda x=x: hopper_sum(x, promote=128)))
        for fmt, strat, fn in runs:
            got = fn()
            with np.errstate(invalid="ignore"):
                err = np.abs(got - exact) / abs_sum
            for prof in PROFILES:
                sel = names_arr == prof
                rows.append({"profile": prof, "format": fmt, "strategy": strat, "n": n,
                             "rel_error": float(np.max(err[sel]))})
    df = pd.DataFrame(rows)
    for kind in ("recursive", "pairwise", "probabilistic"):
        df[f"bound_{kind}"] = [float(error_bound(kind, r.n, r.format)) for r in df.itertuples()]
    df["bound_blocked"] = [float(error_bound("blocked", r.n, r.format, block=block)) for r in df.itertuples()]
    return df


def flush_sweep(intervals: list[int], n: int, tokens_per_step: int = 128, d: int = 8,
                needle_mass: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """The Hopper model's error at context ``n`` when the tensor-core accumulator is flushed
    into fp32 every ``interval`` flash-attention steps of ``tokens_per_step`` tokens.

    Rows: interval, promote (terms), profile, rel_error (max over columns, / sum|x|)."""
    n = check_int("n", n, lo=1)
    tokens_per_step = check_int("tokens_per_step", tokens_per_step, lo=1)
    x, names = profile_matrix(n, d, needle_mass, seed)
    exact = exact_sum(x)
    abs_sum = exact_sum(np.abs(x))
    names_arr = np.array(names)
    rows = []
    for iv in [*intervals, None]:
        promote = None if iv is None else check_int("intervals", iv, lo=1) * tokens_per_step
        got = hopper_sum(x, promote=promote)
        err = np.abs(got - exact) / abs_sum
        for prof in PROFILES:
            sel = names_arr == prof
            rows.append({"interval": "never" if iv is None else str(iv), "promote": promote or 0, "profile": prof,
                         "rel_error": float(np.max(err[sel]))})
    return pd.DataFrame(rows)


def deepseek_check(K: int = 4096, trials: int = 200, keep_bits: tuple[int, ...] = (12, 13, 14, 15, 16),
                   seed: int = 0) -> pd.DataFrame:
    """Relative error of the Hopper model on FP8 (e4m3) dot products of length K, no
    promotion, for inputs N(0, 1) and U(0, 1) (all positive): median and max over trials of
    |model - exact| / |exact|, and the promoted (N_C = 128) max for comparison."""
    K = check_int("K", K, lo=1)
    trials = check_int("trials", trials, lo=1)
    rng = np.random.default_rng(seed)
    rows = []
    for dist in ("normal", "uniform_positive"):
        draw = rng.standard_normal if dist == "normal" else rng.random
        a = round_to(draw((K, trials)), "fp8_e4m3")
        b = round_to(draw((K, trials)), "fp8_e4m3")
        x = a * b                                   # exact: products of e4m3 values fit in float64
        exact = exact_sum(x)
        for kb in keep_bits:
            rel = np.abs(hopper_sum(x, keep_bits=kb) - exact) / np.abs(exact)
            relp = np.abs(hopper_sum(x, keep_bits=kb, promote=128) - exact) / np.abs(exact)
            rows.append({"inputs": dist, "keep_bits": kb, "K": K, "median_rel_error": float(np.median(rel)),
                         "max_rel_error": float(np.max(rel)), "max_rel_error_promoted": float(np.max(relp))})
    return pd.DataFrame(rows)
