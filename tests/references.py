"""Shared test references: the exact arithmetic the numerics and storage tests hold kvcost to.

Each reference is written from the definition it names (textbook rounding of an exact rational, the
tensor-core instruction as the probes describe it, the post's Block 2 quantizer as printed), in Python's
``fractions.Fraction`` or in plain NumPy/ml_dtypes, and calls none of the kvcost functions it checks: no
``kvcost.floats`` rounding, no ``kvcost.tensorcore`` / ``kvcost.accum`` arithmetic, no
``kvcost.storage.quant``. The one thing read from kvcost is a format's parameters (``parse_format``: its
mantissa bits, minimum exponent, largest finite value and whether it has an infinity) — a table, not the
rounding code under test.

The tests import it as ``from references import ...`` (tests/ is on ``sys.path`` under pytest's
rootdir-based import, as for ``sweep_toys``); conftest.py keeps the session's settings.
"""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

from kvcost.floats import parse_format

__all__ = ["attention_exact", "chain_exact", "cut", "e4m3", "floor_log2", "mma_exact", "post_block2_quant",
           "round_rational"]


# ------------------------------------------------------------------ exact rationals
def floor_log2(a: Fraction) -> int:
    """floor(log2 a) of a positive exact rational, found by integer comparisons only (no float log)."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def cut(t: Fraction, q: Fraction, nearest: bool) -> Fraction:
    """t to a multiple of the quantum q: toward zero, or to nearest with ties to even (Python rounds a
    Fraction half to even)."""
    y = t / q
    if not nearest:
        n = abs(y.numerator) // y.denominator
        return (n if y >= 0 else -n) * q
    return round(y) * q


def round_rational(v: Fraction, fmt: str, mode: str = "nearest", saturate: bool = False) -> Fraction | float:
    """Textbook rounding of an exact rational into the binary format ``fmt``: the quantum of v's binade
    (no lower than the subnormal one), then a cut to nearest-even or toward zero. The result stays an
    exact Fraction, so chained references round once per step and nowhere else. Past the largest finite
    value: that value when rounding toward zero or saturating, else ±inf (NaN where the format has no inf).
    An exact zero comes back as Fraction(0): its sign is the caller's to keep."""
    f = parse_format(fmt)
    v = Fraction(v)
    if v == 0:
        return Fraction(0)
    a = abs(v)
    r = cut(a, Fraction(2) ** (max(floor_log2(a), f.emin) - f.man_bits), mode == "nearest")
    if r > Fraction(f.max):
        if mode == "toward_zero" or saturate:
            r = Fraction(f.max)
        else:
            return math.copysign(math.inf, v) if f.has_inf else math.nan
    return r if v > 0 else -r


# ------------------------------------------------------------------ the tensor-core instruction
def mma_exact(c: Fraction | float, prods, frac_bits: int = 13, rounding: str = "toward_zero",
              out: str = "e8m13") -> Fraction:
    """One FP8 tensor-core instruction, in exact rationals: the accumulator c and the exact products are
    aligned to the largest magnitude among them, each term cut to ``frac_bits`` fraction bits below it
    (toward zero, or nearest-even), the cut terms summed exactly, and the sum returned exact, rounded to
    nearest-even fp32, or truncated to ``eNmM`` (M fraction bits, normal range from 2^-126)."""
    terms = [Fraction(c)] + [Fraction(p) for p in prods]
    mx = max(abs(t) for t in terms)
    if mx == 0:
        return Fraction(0)
    q = Fraction(2) ** (floor_log2(mx) - frac_bits)
    s = sum(cut(t, q, rounding == "nearest") for t in terms)
    if out == "exact":
        return s
    if out == "fp32":
        return round_rational(s, "fp32")
    if s == 0:
        return s
    return cut(s, Fraction(2) ** (max(floor_log2(abs(s)), -126) - int(out[3:])), False)


def chain_exact(terms, group: int, promote_every: int | None = None, frac_bits: int = 13,
                rounding: str = "toward_zero", out: str = "e8m13") -> Fraction:
    """A dot product as a chain of instructions (``mma_exact``) over groups of ``group`` terms, the
    result of one the accumulator of the next; with ``promote_every``, the accumulator is added into an
    fp32 register (round to nearest-even) and restarted from zero once that many terms have gone in, and
    after the last group."""
    terms = [Fraction(float(t)) for t in terms]
    reg, tc, since = Fraction(0), Fraction(0), 0
    for i0 in range(0, len(terms), group):
        chunk = terms[i0:i0 + group]
        tc = mma_exact(tc, chunk, frac_bits, rounding, out)
        since += len(chunk)
        if promote_every and (since >= promote_every or i0 + group >= len(terms)):
            reg = round_rational(reg + tc, "fp32")
            tc, since = Fraction(0), 0
    return reg if promote_every else tc


# ------------------------------------------------------------------ attention
def attention_exact(q, k, v, *, causal: bool = False) -> np.ndarray:
    """float64 attention, softmax(q kᵀ / sqrt(d)) v, from its definition (not kvcost.fa3.exact_attention):
    q (hq, nq, d), k and v (hk, nk, ·) with hq a multiple of hk (query head h reads kv head h // (hq / hk));
    causal masks aligned to the end (query i sees keys up to nk - nq + i), as the decode/prefill kernels."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq, nq, d = q.shape
    hk, nk, _ = k.shape
    group = hq // hk
    out = np.zeros((hq, nq, v.shape[2]))
    for h in range(hq):
        for i in range(nq):
            s = k[h // group] @ q[h, i] / math.sqrt(d)
            seen = nk - nq + i + 1 if causal else nk
            w = np.exp(s[:seen] - s[:seen].max())
            out[h, i] = w @ v[h // group, :seen] / w.sum()
    return out


# ------------------------------------------------------------------ formats, by another library
def e4m3(x) -> np.ndarray:
    """x in OCP FP8 E4M3 (float8_e4m3fn) as float32, by ml_dtypes' cast after clipping to ±448 (the
    "satfinite" store): round to nearest-even, NaN kept."""
    return np.clip(np.asarray(x), -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


# ------------------------------------------------------------------ the post's code, as printed
def post_block2_quant(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The post's Block 2 quantizer, transcribed from the post (not from kvcost.storage.quant):
    symmetric absmax int-``bits`` along ``axis``, an all-zero slice given scale 1, then dequantized."""
    qmax = 2 ** (bits - 1) - 1
    scale = np.abs(x).max(axis=axis, keepdims=True) / qmax
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(x / scale), -qmax, qmax) * scale
