"""Hopper's FP8 tensor-core accumulation, emulated bit for bit (as the public probes describe it).

One FP8 WGMMA instruction adds k = 32 exact products (along the contraction) to the
accumulator C of each output element. Per column, with emax = floor(log2 max(|C|, |p_i|)),
every term (C included) is cut to a multiple of 2^(emax - frac_bits) -- toward zero in
sign-magnitude on Hopper -- the cut terms are summed exactly, and the sum is truncated
toward zero to e8m13 (13 fraction bits): what the probes measure (SageAttention2, arXiv
2411.10958; huweim/emulation_sys ``tc_acc_bitwidth_fp8.cu``; DeepSeek-V3 §3.3.2 says "around
14 bits"). Sources and what each says: ``data/fa3_kernel_facts.md``.

- :func:`mma`: one instruction, ``c`` (cols,) and ``products`` (k, cols);
- :func:`dot`: a chain of instructions over consecutive groups of ``k`` terms, optionally
  promoted into a true fp32 register every ``promote_every`` terms (CUTLASS'
  ``GmmaFP8Accumulation``, DeepSeek-V3's N_C = 128);
- :func:`dot_reference`: the same arithmetic in plain numpy (slow; the tests and
  ``make bench`` compare the two).

``rounding="nearest"`` cuts the terms to nearest (ties to even) instead; ``out="fp32"``
rounds the sum to nearest fp32, ``out="exact"`` keeps it, and ``out="e8mN"`` truncates to N
fraction bits (the register of a narrower unit: ``frac_bits=N, out="e8mN"``). Products must
be exact in float64 (true when each operand has at most 26 significant bits: every FP8,
bf16 and fp32 operand). NaN or inf among the terms gives their IEEE sum.

The compiled kernel ``_mma_rows`` (one instruction for a row of outputs) and its float32-lane twin
``_mma_rows32`` (e4m3 operands, truncating register) are shared with :mod:`kvcost.fa3`.
"""
from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .accum import _add_nb, _round_nb
from .floats import FloatFormat, parse_format, round_pair, round_to

__all__ = ["FRAC_BITS", "K_FP8", "OUTS", "ROUNDINGS", "dot", "dot_reference", "mma", "out_args", "register_format"]

ROUNDINGS = ("toward_zero", "nearest")
#: ``exact``, ``fp32`` (round to nearest), or any ``e8mN`` format (truncated toward zero).
OUTS = ("e8m13", "fp32", "exact", "e8mN")
K_FP8 = 32           # products per FP8 WGMMA instruction along the contraction
FRAC_BITS = 13       # fraction bits the probes measure on Hopper
_TWO52 = 4503599627370496.0
_FP32_MAN, _FP32_EMIN, _FP32_MAX = 23, -126, float(np.finfo(np.float32).max)
_OUT_EXACT, _OUT_TRUNC, _OUT_FP32 = 0, 1, 2


# ------------------------------------------------------------------ compiled kernels
@njit(inline="always")
def _trunc_nb(x: float, m: int, emin: int, fmax: float) -> float:
    """x truncated toward zero into a format with m fraction bits, smallest normal exponent
    emin, largest finite fmax (overflow gives fmax, as IEEE truncation does)."""
    if x != x or x == 0.0:
        return x
    a = abs(x)
    if a == math.inf:
        r = fmax
    else:
        b = np.float64(a).view(np.int64)
        e = (b >> 52) - 1023
        if e < -1022:                        # float64 subnormal: far below any e8 format
            r = 0.0
        else:
            shift = 52 - m + max(emin - e, 0)
            if shift > 52:
                r = 0.0
            else:
                one = np.int64(1)
                r = np.int64(b & ~((one << shift) - one)).view(np.float64)
            if r > fmax:
                r = fmax
    return r if x > 0.0 else -r


@njit(inline="always")
def _finish(s: float, okind: int, om: int, oemin: int, ofmax: float) -> float:
    """The exact instruction sum s written to the accumulator (see OUTS)."""
    if okind == _OUT_TRUNC:
        return _trunc_nb(s, om, oemin, ofmax)
    if okind == _OUT_FP32:
        return _round_nb(s, 0.0, _FP32_MAN, _FP32_EMIN, _FP32_MAX, math.inf)
    return s


@njit(inline="always")
def _quanta(mx: float, fb: int) -> tuple[float, float]:
    """(1/q, q) with q = 2^(floor(log2 mx) - fb), from mx's float64 exponent bits (mx >= 0;
    mx = 0 or below 2^-1000 gives q for 2^-1000: every term is then cut to zero or kept)."""
    e = ((np.float64(mx).view(np.int64) >> 52) & 0x7FF) - 1023
    e = max(e, -1000)
    inv = np.int64((1023 + fb - e) << 52).view(np.float64)
    q = np.int64((1023 + e - fb) << 52).view(np.float64)
    return inv, q


@njit(inline="always")
def _mma_rows(tc, prod, kk, ncol, scr, fb, nearest, okind, om, oemin, ofmax):
    """One instruction for ncol outputs at once: tc[j] += the kk exact products prod[:kk, j],
    each term cut on the grid of its column's largest term (tc updated in place; scr is a
    (3, >= ncol) scratch array). The hot loops run along j, branch-free, so they vectorize."""
    inv = scr[0]
    chk = scr[1]
    acc = scr[2]
    for j in range(ncol):
        inv[j] = abs(tc[j])
        chk[j] = tc[j]
    for i in range(kk):
        pr = prod[i]                      # 1-D row views: numba's 2-D indexing defeats the vectorizer
        for j in range(ncol):
            p = pr[j]
            inv[j] = max(inv[j], abs(p))
            chk[j] += p
    for j in range(ncol):
        inv[j] = _quanta(inv[j], fb)[0]
    if nearest:
        for j in range(ncol):
            acc[j] = np.rint(tc[j] * inv[j])
        for i in range(kk):
            pr = prod[i]
            for j in range(ncol):
                acc[j] += np.rint(pr[j] * inv[j])
    elif fb <= 29:       # |term| / q < 2^(fb + 1) <= 2^30: int32 conversion truncates, and vectorizes
        for j in range(ncol):
            acc[j] = np.float64(np.int32(tc[j] * inv[j]))
        for i in range(kk):
            pr = prod[i]
            for j in range(ncol):
                acc[j] += np.float64(np.int32(pr[j] * inv[j]))
    else:
        for j in range(ncol):
            acc[j] = np.trunc(tc[j] * inv[j])
        for i in range(kk):
            pr = prod[i]
            for j in range(ncol):
                acc[j] += np.trunc(pr[j] * inv[j])
    for j in range(ncol):
        c = chk[j]
        if c != c or abs(c) == math.inf:          # NaN/inf among the terms: their IEEE sum
            sm = tc[j]
            for i in range(kk):
                sm += prod[i, j]
            tc[j] = sm
        else:
            tc[j] = _finish(acc[j] / inv[j], okind, om, oemin, ofmax)


@njit(inline="always")
def _mma_rows32(tc, prod, kk, ncol, scr, fb, om, ofmax):
    """:func:`_mma_rows` in float32 lanes (twice the vector width), bit for bit, for a truncating cut
    and a truncating e8m{om} output (om <= 23), fb <= 17, finite terms whose products were exact in
    float32 (e4m3 operands). tc (>= ncol) float32 is updated in place; scr is (2, >= ncol) float32.

    Exact because: the cut terms |t|/q < 2^(fb+1) are integers after the int32 conversion, and 33 of
    them sum below 2^24 (so the sum converts to float32 exactly); the grid q = 2^(e - fb) stays
    >= 2^-126, so acc * q is exact in float32, subnormals included, and truncating to om fraction
    bits is clearing the low 23 - om bits (in float32's subnormal range too, where e8m{om}'s grid
    is 2^(-126-om)). A column whose largest term is below 2^(fb - 126) (a rescaled accumulator
    with every product zero) sends the instruction through :func:`_mma_rows` in float64."""
    inv = scr[0]
    acc = scr[1].view(np.int32)       # the cut terms are integers: summed as int32 (exact below 2^31)
    for j in range(ncol):
        inv[j] = abs(tc[j])
    for i in range(kk):
        pr = prod[i]                  # 1-D row views: numba's 2-D indexing here defeats the vectorizer
        for j in range(ncol):
            inv[j] = max(inv[j], abs(pr[j]))
    lo = np.float32(2.0 ** (fb - 126))
    small = False
    for j in range(ncol):
        small |= (inv[j] < lo) & (inv[j] != 0)
    if small:                         # rare: the float64 instruction itself, on copies
        t64 = tc[:ncol].astype(np.float64)
        _mma_rows(t64, prod[:kk, :ncol].astype(np.float64), kk, ncol, np.empty((3, ncol)), fb, False,
                  _OUT_TRUNC, om, -126, ofmax)
        for j in range(ncol):
            tc[j] = t64[j]
        return
    hi = np.int32(127 + fb)
    for j in range(ncol):
        e = max((np.float32(inv[j]).view(np.int32) >> 23) - 127, fb - 126)     # inv >= 0: no sign bit
        inv[j] = np.int32((hi - e) << 23).view(np.float32)
    for j in range(ncol):
        acc[j] = np.int32(tc[j] * inv[j])
    for i in range(kk):
        pr = prod[i]
        for j in range(ncol):
            acc[j] += np.int32(pr[j] * inv[j])
    mask = np.int32(~((1 << (23 - om)) - 1))
    fmax = np.float32(ofmax)
    for j in range(ncol):
        r = np.int32(np.float32(np.float32(acc[j]) / inv[j]).view(np.int32) & mask).view(np.float32)
        tc[j] = r if abs(r) <= fmax else (fmax if r > 0 else -fmax)


@njit(cache=True)
def _mma_nb(c, prods, fb, nearest, okind, om, oemin, ofmax):   # pragma: no cover - compiled
    k, cols = prods.shape
    tc = c.copy()
    scr = np.empty((3, cols))
    _mma_rows(tc, prods, k, cols, scr, fb, nearest, okind, om, oemin, ofmax)
    return tc


@njit(parallel=True, cache=True)
def _dot_nb(a, b, c, kk, fb, nearest, okind, om, oemin, ofmax, promote, nth):   # pragma: no cover - compiled
    n, cols = a.shape
    out = np.empty(cols)
    nchunk = max(1, min(cols // 8, nth)) if cols >= 8 else 1
    for ch in prange(nchunk):
        j0 = ch * cols // nchunk
        j1 = (ch + 1) * cols // nchunk
        w = j1 - j0
        prod = np.empty((kk, w))
        scr = np.empty((3, w))
        tc = np.empty(w)
        reg = np.empty(w)
        for j in range(w):
            if promote > 0:
                reg[j] = _round_nb(c[j0 + j], 0.0, _FP32_MAN, _FP32_EMIN, _FP32_MAX, math.inf)
                tc[j] = 0.0
            else:
                reg[j] = 0.0
                tc[j] = c[j0 + j]
        since = 0
        for i0 in range(0, n, kk):
            i1 = min(i0 + kk, n)
            for i in range(i0, i1):
                for j in range(w):
                    prod[i - i0, j] = a[i, j0 + j] * b[i, j0 + j]
            _mma_rows(tc, prod, i1 - i0, w, scr, fb, nearest, okind, om, oemin, ofmax)
            since += i1 - i0
            if promote > 0 and (since >= promote or i1 == n):
                for j in range(w):
                    reg[j] = _add_nb(reg[j], tc[j], _FP32_MAN, _FP32_EMIN, _FP32_MAX, math.inf)
                    tc[j] = 0.0
                since = 0
        for j in range(w):
            out[j0 + j] = reg[j] if promote > 0 else tc[j]
    return out


# ------------------------------------------------------------------ argument checks
def _check_pos_int(name: str, value: Any, lo: int = 1, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or \
            (hi is not None and value > hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"parameter {name!r} must be an integer {rng}, got {value!r}")
    return int(value)


def register_format(out: str) -> FloatFormat | None:
    """The accumulator format ``out`` names (None for ``exact``); ValueError naming 'out'."""
    if out == "exact":
        return None
    if out == "fp32":
        return parse_format("fp32")
    if isinstance(out, str) and out.startswith("e8m"):
        try:
            f = parse_format(out)
        except ValueError:
            f = None
        if f is not None and f.exp_bits == 8 and 1 <= f.man_bits <= 23:
            return f
    raise ValueError(f"parameter 'out' must be 'exact', 'fp32' or 'e8mN' with 1 <= N <= 23 (e.g. 'e8m13'), "
                     f"got {out!r}")


def out_args(out: str, frac_bits: int = FRAC_BITS,
             rounding: str = "toward_zero") -> tuple[int, bool, int, int, int, float]:
    """Checked (frac_bits, nearest, okind, om, oemin, ofmax) for the compiled kernels."""
    fb = _check_pos_int("frac_bits", frac_bits, 1, 40)
    if rounding not in ROUNDINGS:
        raise ValueError(f"parameter 'rounding' must be one of {list(ROUNDINGS)}, got {rounding!r}")
    f = register_format(out)
    if f is None:
        return fb, rounding == "nearest", _OUT_EXACT, 0, 0, 0.0
    if out == "fp32":
        return fb, rounding == "nearest", _OUT_FP32, 23, -126, f.max
    return fb, rounding == "nearest", _OUT_TRUNC, f.man_bits, f.emin, f.max


def _as_real(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"parameter {name!r} must be real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64)


# ------------------------------------------------------------------ public API
def mma(c: Any, products: Any, *, frac_bits: int = FRAC_BITS, rounding: str = "toward_zero",
        out: str = "e8m13") -> np.ndarray:
    """One FP8 tensor-core instruction: ``c`` (cols,) plus the exact ``products`` (k, cols).

    Per column, emax = floor(log2 max(|c|, |products|)); each term is cut to a multiple of
    2^(emax - frac_bits) (``rounding``: ``"toward_zero"`` in sign-magnitude, or
    ``"nearest"``), the terms are summed exactly, and the sum goes to the register ``out``
    (``"e8m13"`` truncated toward zero, ``"fp32"`` nearest, ``"exact"``). Returns (cols,).
    """
    args = out_args(out, frac_bits, rounding)
    cc = _as_real(c, "c")
    pp = _as_real(products, "products")
    if cc.ndim != 1 or pp.ndim != 2 or pp.shape[1] != cc.shape[0]:
        raise ValueError(f"parameters 'c' and 'products' must be shaped (cols,) and (k, cols), got {cc.shape} "
                         f"and {pp.shape}")
    return _mma_nb(np.ascontiguousarray(cc), np.ascontiguousarray(pp), *args)


def _dot_inputs(a: Any, b: Any, c: Any, k: int, promote_every: int | None) -> tuple[np.ndarray, ...]:
    k = _check_pos_int("k", k)
    if promote_every is not None:
        promote_every = _check_pos_int("promote_every", promote_every)
        if promote_every % k:
            raise ValueError(f"parameter 'promote_every' must be a multiple of k={k}, got {promote_every}")
    aa, bb = _as_real(a, "a"), _as_real(b, "b")
    if aa.ndim not in (1, 2) or aa.shape != bb.shape:
        raise ValueError(f"parameters 'a' and 'b' must have the same shape (n,) or (n, cols), got {aa.shape} "
                         f"and {bb.shape}")
    scalar = aa.ndim == 1
    if scalar:
        aa, bb = aa[:, None], bb[:, None]
    cols = aa.shape[1]
    cc = np.zeros(cols) if c is None else np.broadcast_to(_as_real(c, "c"), (cols,)).astype(np.float64)
    return np.ascontiguousarray(aa), np.ascontiguousarray(bb), np.ascontiguousarray(cc), k, promote_every or 0, scalar


def dot(a: Any, b: Any, *, c: Any = None, k: int = K_FP8, frac_bits: int = FRAC_BITS,
        rounding: str = "toward_zero", out: str = "e8m13", promote_every: int | None = None) -> Any:
    """sum_i a[i] * b[i] as a chain of :func:`mma` over consecutive groups of ``k`` terms along
    axis 0, starting from ``c`` (zero by default). ``a``, ``b``: (n,) (one column; returns a
    float) or (n, cols). ``promote_every=N`` (a multiple of ``k``): every N terms the tensor-core
    partial is added into a true fp32 register (round to nearest, the register starting at
    fp32(c)) and restarts from zero; the result is that register.
    """
    args = out_args(out, frac_bits, rounding)
    aa, bb, cc, k, prom, scalar = _dot_inputs(a, b, c, k, promote_every)
    res = _dot_nb(aa, bb, cc, k, *args, prom, numba.get_num_threads())
    return float(res[0]) if scalar else res


def _finish_np(s: np.ndarray, out: str) -> np.ndarray:
    f = register_format(out)
    if f is None:
        return s
    return round_to(s, f, mode="nearest" if out == "fp32" else "toward_zero")


def dot_reference(a: Any, b: Any, *, c: Any = None, k: int = K_FP8, frac_bits: int = FRAC_BITS,
                  rounding: str = "toward_zero", out: str = "e8m13", promote_every: int | None = None) -> Any:
    """:func:`dot` in plain numpy (vectorized over columns, a Python loop over instructions;
    rounding by :func:`kvcost.floats.round_to`). Finite inputs only. Slow: for tests and the bench."""
    out_args(out, frac_bits, rounding)
    aa, bb, cc, k, prom, scalar = _dot_inputs(a, b, c, k, promote_every)
    n = aa.shape[0]
    reg = round_to(cc, "fp32") if prom else np.zeros_like(cc)
    tc = np.zeros_like(cc) if prom else cc.copy()
    since = 0
    cut = np.trunc if rounding == "toward_zero" else np.rint
    for i0 in range(0, n, k):
        p = aa[i0:i0 + k] * bb[i0:i0 + k]
        mx = np.maximum(np.abs(tc), np.abs(p).max(axis=0))
        _, e2 = np.frexp(mx)
        qe = np.where(mx > 0, e2 - 1 - frac_bits, 0)
        s = cut(np.ldexp(tc, -qe)) + cut(np.ldexp(p, -qe[None, :])).sum(axis=0)
        tc = _finish_np(np.ldexp(s, qe), out)
        since += p.shape[0]
        if prom and (since >= prom or i0 + k >= n):
            reg = _fp32_add(reg, tc)
            tc = np.zeros_like(tc)
            since = 0
    res = reg if prom else tc
    return float(res[0]) if scalar else res


def _fp32_add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """fp32(x + y) rounded once from the exact sum (TwoSum pair, then floats.round_pair)."""
    s = x + y
    bb = s - x
    lo = (x - (s - bb)) + (y - bb)
    return round_pair(s, lo, "fp32")
