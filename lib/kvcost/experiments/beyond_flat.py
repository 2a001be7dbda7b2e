"""Notebook 04b's tables: accumulation error on attention-like weights, flush intervals, DeepSeek's FP8 check."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..floats import round_to
from ..numerics import tensorcore
from ..numerics.accum import PROFILES, accumulate, error_bound, exact_sum, hopper_sum, weight_profile
from ..params import check_int

__all__ = ["DEEPSEEK_INPUTS", "deepseek_check", "error_sweep", "flush_sweep", "profile_matrix"]


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


def flush_sweep(intervals: list[int], n: int, tokens_per_step: int = 96, d: int = 8,
                needle_mass: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """The Hopper model's error at context ``n`` when the tensor-core accumulator is flushed
    into fp32 every ``interval`` flash-attention steps of ``tokens_per_step`` tokens (FA3's FP8
    KV block: 96 for decode at head_dim 128, 192 for prefill with two-level accumulation, 224
    without; ``kvcost.fa3.tile_sizes``).

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


#: Input distributions for the DeepSeek-V3 comparison: (name, mean of a, mean of b), unit spread,
#: uniform [0, 1) for ``uniform_positive``. The report does not state its inputs.
DEEPSEEK_INPUTS = (("normal", 0.0, 0.0), ("normal, channel mean 0.3", 0.3, 0.3), ("normal, mean 1", 1.0, 1.0),
                   ("uniform_positive", None, None))


def deepseek_check(K: int = 4096, trials: int = 200, frac_bits: tuple[int, ...] = (11, 12, 13, 14),
                   seed: int = 0) -> pd.DataFrame:
    """Normwise relative error of FP8 (e4m3) dot products of length K on the emulated tensor core
    (:func:`kvcost.tensorcore.dot`, instructions of 32, e8m{frac_bits} register), as the outputs of
    a K-deep GEMM: ||model - exact||_2 / ||exact||_2 over ``trials`` outputs, without promotion and
    with DeepSeek-V3's N_C = 128. Inputs: :data:`DEEPSEEK_INPUTS`. Rows: inputs, mean_over_spread
    (of the products), frac_bits, K, normwise_rel_error, normwise_rel_error_promoted,
    median_elementwise_rel_error (|error| / |exact| per output: near-zero outputs dominate its
    maximum, so only the median is kept)."""
    K = check_int("K", K, lo=1)
    trials = check_int("trials", trials, lo=1)
    rng = np.random.default_rng(seed)
    rows = []
    for name, ma, mb in DEEPSEEK_INPUTS:
        if ma is None:
            a, b = rng.random((K, trials)), rng.random((K, trials))
        else:
            a, b = ma + rng.standard_normal((K, trials)), mb + rng.standard_normal((K, trials))
        a, b = round_to(a, "fp8_e4m3"), round_to(b, "fp8_e4m3")
        x = a * b                                   # exact: products of e4m3 values fit in float64
        exact = exact_sum(x)
        norm = float(np.linalg.norm(exact))
        for fb in frac_bits:
            out = f"e8m{fb}"
            got = tensorcore.dot(a, b, frac_bits=fb, out=out)
            gotp = tensorcore.dot(a, b, frac_bits=fb, out=out, promote_every=128)
            rows.append({"inputs": name, "mean_over_spread": float(abs(x.mean()) / x.std()), "frac_bits": fb, "K": K,
                         "normwise_rel_error": float(np.linalg.norm(got - exact)) / norm,
                         "normwise_rel_error_promoted": float(np.linalg.norm(gotp - exact)) / norm,
                         "median_elementwise_rel_error": float(np.median(np.abs(got - exact) / np.abs(exact)))})
    return pd.DataFrame(rows)
