"""Tensor-core arithmetic: every GPU's MMA units bit for bit MMA-Sim, and the products-only FP8 model.

**The units** -- :func:`matmul` (``arch``, ``instr``: MMA-Sim's names, :mod:`kvcost.numerics.instructions`)
computes D = A·B + C as the chain of that instruction along K, bit for bit MMA-Sim (PyPI ``mmasim`` 2.1.1,
microsoft/MMA-Sim, arXiv 2511.10909), which its authors validated on the GPUs; ``tests/test_units.py`` and
the committed ``data/tensorcore/validation.json`` hold every unit to it. Per instruction step, every product
is aligned by the **sum of its operands' exponents** (its significand product lies in [1, 4)), a zero term
by the unit's e_zero; each term is cut toward zero to a multiple of 2^(e_max - F), the cut terms are summed
exactly and the sum written to the register (Hopper FP8: F = 13, truncated to e8m13; Blackwell tcgen05:
F = 25, fp32 truncated; block-scaled MX / NVFP4: 16-term exact groups, F = 35; CDNA3 FP8: even and odd
halves at F = 24, combined at F2 = 31, rounded to nearest fp32). One compiled kernel serves every unit.

**The products-only model** -- :func:`mma` and :func:`dot` take exact products, not operands, so they
align to floor(log2 |a·b|): one bit coarser than the hardware whenever a significand product is >= 2.
They are what the public probes measure (SageAttention2, arXiv 2411.10958; huweim/emulation_sys
``tc_acc_bitwidth_fp8.cu``; DeepSeek-V3 §3.3.2) and agree with the units wherever C dominates the
instruction, not where the products decide (C = 0). Kept for the accumulation studies of notebook 04b,
where ``frac_bits`` / ``out`` / ``promote_every`` make any register; sources: ``data/fa3_kernel_facts.md``.

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
"""
from __future__ import annotations

import math
from functools import cache
from typing import Any

import ml_dtypes
import numba
import numpy as np
from numba import njit, prange

from kvcost.floats import FloatFormat, parse_format, round_pair, round_to
from kvcost.numerics._jit import (
    FP32_EMIN,
    FP32_MAN,
    FP32_MAX,
    OUT_EXACT,
    OUT_FP16,
    OUT_FP32,
    OUT_TRUNC,
    OUT_TRUNC_INF,
    add_nb,
    finish,
    fused_rows,
    gtr_rows,
    lead2,
    round_nb,
)
from kvcost.numerics.instructions import OPERAND_TYPES, SCALE_TYPES, Unit, get

__all__ = ["FRAC_BITS", "K_FP8", "OUTS", "ROUNDINGS", "dot", "dot_reference", "matmul", "matmul_unit", "mma",
           "operand_values", "out_args", "register_format"]

ROUNDINGS = ("toward_zero", "nearest")
#: ``exact``, ``fp32`` (round to nearest), or any ``e8mN`` format (truncated toward zero).
OUTS = ("e8m13", "fp32", "exact", "e8mN")
K_FP8 = 32           # products per FP8 WGMMA instruction along the contraction
FRAC_BITS = 13       # fraction bits the probes measure on Hopper


# ------------------------------------------------------------------ compiled kernels
@njit(cache=True)
def _mma_nb(c, prods, fb, nearest, okind, om, oemin, ofmax):   # pragma: no cover - compiled
    k, cols = prods.shape
    tc = c.copy()
    scr = np.empty((3, cols))
    fused_rows(tc, prods, prods, k, cols, scr, fb, nearest, okind, om, oemin, ofmax, 0.0, 0.0, 1, True)
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
                reg[j] = round_nb(c[j0 + j], 0.0, FP32_MAN, FP32_EMIN, FP32_MAX, math.inf)
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
            fused_rows(tc, prod, prod, i1 - i0, w, scr, fb, nearest, okind, om, oemin, ofmax, 0.0, 0.0, 1, True)
            since += i1 - i0
            if promote > 0 and (since >= promote or i1 == n):
                for j in range(w):
                    reg[j] = add_nb(reg[j], tc[j], FP32_MAN, FP32_EMIN, FP32_MAX, math.inf)
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
        return fb, rounding == "nearest", OUT_EXACT, 0, 0, 0.0
    if out == "fp32":
        return fb, rounding == "nearest", OUT_FP32, 23, -126, f.max
    return fb, rounding == "nearest", OUT_TRUNC, f.man_bits, f.emin, f.max


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


# ------------------------------------------------------------------ the units of each GPU
_SCHEMES = {"T": 0, "ST": 1, "GST": 2, "GTR": 3}
_ROUNDING_OUT = {"RZ-E8M13": (OUT_TRUNC_INF, 13), "RZ-FP32": (OUT_TRUNC_INF, 23), "RNE-FP32": (OUT_FP32, 23),
                 "RNE-FP16": (OUT_FP16, 10)}
_TILE = 256          # outputs per tile of the compiled matmul (the vector loops run along a tile)


@njit(cache=True)
def _weights_nb(x, emin):   # pragma: no cover - compiled
    out = np.empty(x.size)
    flat = x.reshape(-1)
    for i in range(x.size):
        out[i] = lead2(flat[i], emin)
    return out.reshape(x.shape)


@njit(parallel=True, cache=True)
def _matmul_nb(a, b, c, aw, bw, sa, sb, sw_a, sw_b, scheme, group, g, block, fb, fb2, okind, om, cmin, zw,
               nth):   # pragma: no cover - compiled
    """The chain of instructions for every output: tiles of whole rows (R rows x n outputs, flattened),
    each step's terms formed along the flattened tile so the fused kernel's loops vectorize."""
    m, kk = a.shape
    n = b.shape[1]
    rows = max(1, min(m, _TILE // n if n < _TILE else 1))
    ntile = (m + rows - 1) // rows
    out = np.empty((m, n))
    oemin = FP32_EMIN if okind != OUT_FP16 else -14
    nterm = group // g if scheme == 2 else group
    for tl in prange(ntile):
        r0 = tl * rows
        r1 = min(m, r0 + rows)
        w = (r1 - r0) * n
        tc = np.empty(w)
        prod = np.empty((nterm, w))
        wts = np.empty((nterm, w))
        scr = np.empty((3, w))
        for r in range(r0, r1):
            for j in range(n):
                tc[(r - r0) * n + j] = c[r, j]
        for t0 in range(0, kk, group):
            blk = t0 // block
            if scheme == 2:                       # GST: exact group sums, scaled, then fused
                for gi in range(nterm):
                    s0 = t0 + gi * g
                    blk = s0 // block
                    pr = prod[gi]
                    wr = wts[gi]
                    for r in range(r0, r1):
                        q0 = (r - r0) * n
                        for j in range(n):
                            v = 0.0
                            allz = True
                            for t in range(s0, s0 + g):
                                p = a[r, t] * b[t, j]
                                v += p
                                allz &= p == 0.0
                            scale = sa[r, blk] * sb[blk, j]
                            pr[q0 + j] = v * scale
                            wr[q0 + j] = zw if (allz or scale == 0.0) else sw_a[r, blk] * sw_b[blk, j]
                fused_rows(tc, prod, wts, nterm, w, scr, fb, False, okind, om, oemin, math.inf, cmin, zw, 12, False)
                continue
            for t in range(t0, t0 + group):
                pr = prod[t - t0]
                wr = wts[t - t0]
                brow = b[t]
                bwrow = bw[t]
                for r in range(r0, r1):
                    q0 = (r - r0) * n
                    ar = a[r, t]
                    awr = aw[r, t]
                    if scheme == 1:               # ST: one block scale per step
                        ar = ar * sa[r, blk]
                        awr = awr * sw_a[r, blk]
                        for j in range(n):
                            pr[q0 + j] = ar * brow[j] * sb[blk, j]
                            ww = awr * bwrow[j] * sw_b[blk, j]
                            wr[q0 + j] = ww if ww != 0.0 else zw
                    elif scheme == 3:
                        for j in range(n):
                            pr[q0 + j] = ar * brow[j]
                            wr[q0 + j] = awr * bwrow[j]
                    else:
                        for j in range(n):
                            pr[q0 + j] = ar * brow[j]
                            ww = awr * bwrow[j]
                            wr[q0 + j] = ww if ww != 0.0 else zw
            if scheme == 3:
                gtr_rows(tc, prod, wts, group, w, fb, fb2)
            else:
                fused_rows(tc, prod, wts, group, w, scr, fb, False, okind, om, oemin, math.inf, cmin, zw, 2, False)
        for r in range(r0, r1):
            for j in range(n):
                out[r, j] = tc[(r - r0) * n + j] + 0.0
    return out


# ------------------------------------------------------------------ the fast path of the units (finite inputs)
_RB, _CB = 8, 64     # output tile of the fast kernels: rows x columns (a step's slice of B stays in L1)
_PARALLEL_MACS = 1 << 24    # smaller calls run on one thread (a parallel launch costs more than it saves)


@njit(cache=True)
def _scan_nb(x, mbits, emin, fmax, zero_ok):   # pragma: no cover - compiled
    """(finite values not representable in the format, non-finite values) of x, from the float64 bits: a
    finite nonzero value is representable when |x| <= fmax and its significand has no bit set below
    2^(max(e, emin) - mbits)."""
    bad = 0
    nonfin = 0
    flat = x.reshape(-1)
    one = np.int64(1)
    for i in range(flat.size):
        v = flat[i]
        bits = np.float64(v).view(np.int64) & 0x7FFFFFFFFFFFFFFF
        ef = bits >> 52
        e = ef - 1023
        shift = min(52 - mbits + max(emin - e, 0), 63)
        low = (bits | (one << 52)) & ((one << shift) - one)
        nonfin += ef == 0x7FF
        isbad = (low != 0) | (abs(v) > fmax) | ((ef == 0) & (bits != 0))
        bad += (ef != 0x7FF) & (isbad if bits != 0 else not zero_ok)
    return bad, nonfin


@njit(cache=True)
def _lead2_nb(x, emin, out):   # pragma: no cover - compiled
    """out[...] = :func:`lead2` of finite x, branch-free: 2^max(floor(log2 |x|), emin), 0 for 0."""
    fx = x.reshape(-1)
    fo = out.reshape(-1)
    lt = out.dtype.type
    for i in range(fx.size):
        bits = np.float64(fx[i]).view(np.int64) & 0x7FFFFFFFFFFFFFFF
        e = max((bits >> 52) - 1023, emin)
        w = np.int64((1023 + e) << 52).view(np.float64)
        fo[i] = lt(w if bits != 0 else 0.0)
    return out


@njit(inline="always")
def _chain_rows(a, b, wa, wb, c, out, r0, r1,
                group, fb, okind, om, oemin, cmin, zw, lane_lo, lane_hi):   # pragma: no cover
    """Rows r0 ... r1 of :func:`_chain_nb`, column tile by column tile."""
    kk = a.shape[1]
    n = b.shape[1]
    lt = a.dtype.type
    one = np.int64(1)
    cw = min(n, _CB)
    mx = np.empty(cw, a.dtype)
    acc = np.empty(cw, a.dtype)
    invl = np.empty(cw, a.dtype)
    inv = np.empty(cw)
    tc = np.empty((r1 - r0, cw))
    for j0 in range(0, n, _CB):
        j1 = min(n, j0 + _CB)
        w = j1 - j0
        for r in range(r0, r1):
            for j in range(w):
                tc[r - r0, j] = c[r, j0 + j]
        for t0 in range(0, kk, group):
            for r in range(r0, r1):
                ar = a[r]
                war = wa[r]
                tr = tc[r - r0]
                for j in range(w):
                    mx[j] = 0.0
                    acc[j] = 0.0
                for t in range(t0, t0 + group):
                    x = war[t]
                    wrow = wb[t]
                    for j in range(w):
                        v = x * wrow[j0 + j]
                        mx[j] = v if v > mx[j] else mx[j]
                for j in range(w):
                    v = abs(tr[j])
                    wm = max(max(v, cmin) if v != 0.0 else zw, np.float64(mx[j]))
                    e = max(((np.float64(wm).view(np.int64) >> 52) & 0x7FF) - 1023, -1000)
                    inv[j] = np.int64((1023 + fb - e) << 52).view(np.float64)
                    invl[j] = lt(np.int64((1023 + fb - min(max(e, lane_lo), lane_hi)) << 52).view(np.float64))
                for t in range(t0, t0 + group):
                    x = ar[t]
                    brow = b[t]
                    for j in range(w):
                        acc[j] += np.trunc(x * brow[j0 + j] * invl[j])
                if okind == OUT_TRUNC_INF:        # truncate to e8m{om}, past 2^128 inf: on the bits, branch-free
                    for j in range(w):
                        v = tr[j]
                        s = (np.float64(acc[j]) + np.trunc(v * inv[j])) / inv[j]
                        bits = np.float64(s).view(np.int64)
                        mag = bits & 0x7FFFFFFFFFFFFFFF
                        e = (mag >> 52) - 1023
                        shift = min(52 - om + max(oemin - e, 0), 63)
                        mag = mag & ~((one << shift) - one) if shift <= 52 else 0
                        mag = mag if mag < 0x47F0000000000000 else 0x7FF0000000000000       # 2^128 -> inf
                        r = np.int64(mag | (bits & np.int64(-0x8000000000000000))).view(np.float64)
                        tr[j] = r if v - v == 0.0 else v
                else:
                    for j in range(w):
                        v = tr[j]
                        if v - v == 0.0:          # finite
                            tr[j] = finish((np.float64(acc[j]) + np.trunc(v * inv[j])) / inv[j], okind, om, oemin,
                                           math.inf)
        for r in range(r0, r1):
            for j in range(w):
                out[r, j0 + j] = tc[r - r0, j] + 0.0


@njit(cache=True)
def _chain_serial_nb(a, b, wa, wb, c, group, fb, okind, om, oemin, cmin, zw, lane_lo, lane_hi):   # pragma: no cover
    """:func:`_chain_nb` on the calling thread alone (small calls: no thread pool to wake)."""
    m = a.shape[0]
    out = np.empty((m, b.shape[1]))
    for q0 in range(0, m, _RB):
        _chain_rows(a, b, wa, wb, c, out, q0, min(m, q0 + _RB), group, fb, okind, om, oemin, cmin, zw, lane_lo,
                    lane_hi)
    return out


@njit(parallel=True, cache=True)
def _chain_nb(a, b, wa, wb, c, group, fb, okind, om, oemin, cmin, zw, lane_lo, lane_hi, nth):   # pragma: no cover
    """The T / ST chain for finite operands, nothing materialised per instruction; ``nth`` row blocks in
    parallel (1: serial, for small calls on a shared machine).

    ``a``, ``wa`` (m, K) and ``b``, ``wb`` (K, n) in the lane dtype (float32 where every product, every cut
    term and their sums are exact in float32: FP8-or-narrower operands at small F; float64 otherwise);
    ``wa``, ``wb`` are the operands' alignment weights 2^e (block scales folded in for ST), 0 for zero.
    Per step and output row: pass 1 takes each output's largest product weight (multiply and max along
    n: they vectorize), e_max joins the accumulator's weight (max(|c|, cmin), or zw for c = 0; a zero
    product's weight zw never decides, since the accumulator's is >= zw); pass 2 sums trunc(p · 2^(F - e_max))
    in the lanes (exact integers). ``lane_lo``: the smallest exponent a nonzero product's weight can have;
    the lanes' grid is clamped there (below it every product is zero), so 2^(F - e) stays finite in them;
    ``lane_hi``: F + 2 above the largest a product's weight can have, where the grid is clamped too (above
    it every product cuts to zero anyway), so no cut runs through subnormals (slow) past an overflowed or
    huge accumulator.
    A non-finite accumulator (an overflowed step) stays as it is, as the IEEE sum with finite products."""
    m = a.shape[0]
    out = np.empty((m, b.shape[1]))
    nblk = max(1, min(nth, (m + _RB - 1) // _RB)) if nth > 1 else 1
    for blk in prange(nblk):
        r0 = blk * m // nblk
        r1 = (blk + 1) * m // nblk
        for q0 in range(r0, r1, _RB):
            _chain_rows(a, b, wa, wb, c, out, q0, min(r1, q0 + _RB), group, fb, okind, om, oemin, cmin, zw,
                        lane_lo, lane_hi)
    return out


@njit(inline="always")
def _gtr_rows_chain(a, b, wa, wb, c, out, r0, r1, group, fb, fb2):   # pragma: no cover - compiled
    """Rows r0 ... r1 of the GTR chain (CDNA3), one row's step at a time through :func:`gtr_rows`."""
    kk = a.shape[1]
    n = b.shape[1]
    prod = np.empty((group, n))
    wts = np.empty((group, n))
    tc = np.empty(n)
    for r in range(r0, r1):
        for j in range(n):
            tc[j] = c[r, j]
        for t0 in range(0, kk, group):
            for t in range(t0, t0 + group):
                x = a[r, t]
                w = wa[r, t]
                pr = prod[t - t0]
                wr = wts[t - t0]
                brow = b[t]
                bwr = wb[t]
                for j in range(n):
                    pr[j] = x * brow[j]
                    wr[j] = w * bwr[j]
            gtr_rows(tc, prod, wts, group, n, fb, fb2)
        for j in range(n):
            out[r, j] = tc[j] + 0.0


@njit(cache=True)
def _gtr_serial_nb(a, b, wa, wb, c, group, fb, fb2):   # pragma: no cover - compiled
    """The GTR chain on finite inputs, on the calling thread."""
    out = np.empty((a.shape[0], b.shape[1]))
    _gtr_rows_chain(a, b, wa, wb, c, out, 0, a.shape[0], group, fb, fb2)
    return out


@njit(parallel=True, cache=True)
def _gtr_nb(a, b, wa, wb, c, group, fb, fb2, nth):   # pragma: no cover - compiled
    """The GTR chain on finite inputs, ``nth`` row blocks in parallel."""
    m = a.shape[0]
    out = np.empty((m, b.shape[1]))
    for blk in prange(nth):
        _gtr_rows_chain(a, b, wa, wb, c, out, blk * m // nth, (blk + 1) * m // nth, group, fb, fb2)
    return out


@njit(parallel=True, cache=True)
def _gst_chain_nb(c, v, nz, sa, sb, swa, swb, g0, g, block, nterm, fb, okind, om, cmin, zw):   # pragma: no cover
    """The GST chain from the exact group sums ``v`` (G, m, n) of groups g0 ... g0 + G - 1 and their
    nonzero-product counts ``nz``: each term is v · scale_a · scale_b, its weight the scales' weights
    (zw for an all-zero group or a zero scale); ``nterm`` terms fused per step, rows in parallel."""
    ng, m, n = v.shape
    out = np.empty((m, n))
    for r in prange(m):
        tc = np.empty(n)
        for j in range(n):
            tc[j] = c[r, j]
        p = np.empty((nterm, n))
        w = np.empty((nterm, n))
        scr = np.empty((3, n))
        for s0 in range(0, ng, nterm):
            for i in range(nterm):
                blk = (g0 + s0 + i) * g // block
                s_a = sa[r, blk]
                w_a = swa[r, blk]
                for j in range(n):
                    scale = s_a * sb[blk, j]
                    p[i, j] = np.float64(v[s0 + i, r, j]) * scale
                    w[i, j] = zw if (nz[s0 + i, r, j] == 0.0 or scale == 0.0) else w_a * swb[blk, j]
            fused_rows(tc, p, w, nterm, n, scr, fb, False, okind, om, FP32_EMIN, math.inf, cmin, zw, 12, False)
        for j in range(n):
            out[r, j] = tc[j] + 0.0
    return out


def operand_values(t: str) -> np.ndarray:
    """Every finite value of a 16-bit-or-narrower operand type (``bf16``, ``e4m3``, ``e2m1``, ``fp8`` ...), sorted."""
    if t not in OPERAND_TYPES or OPERAND_TYPES[t][2] > 2:
        raise ValueError(f"parameter 't' must be a 16-bit or narrower operand type "
                         f"({[k for k, v in OPERAND_TYPES.items() if v[2] <= 2]}), got {t!r}")
    name, _, size = OPERAND_TYPES[t]
    dt = getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else np.dtype(name)
    bits = 4 if t == "e2m1" else 6 if t in ("e3m2", "e2m3") else 8 * size
    codes = np.arange(1 << bits, dtype=np.uint8 if size == 1 else np.uint16)
    with np.errstate(invalid="ignore"):
        vals = codes.view(dt).astype(np.float64)
    return np.unique(vals[np.isfinite(vals)])


def _rounding_out(rounding: str) -> tuple[int, int]:
    if rounding in _ROUNDING_OUT:
        return _ROUNDING_OUT[rounding]
    if rounding.startswith("RZ-E8M") and rounding[6:].isdigit() and 1 <= int(rounding[6:]) <= 23:
        return OUT_TRUNC_INF, int(rounding[6:])
    raise ValueError(f"unit rounding must be one of {list(_ROUNDING_OUT)} or 'RZ-E8MN' (1 <= N <= 23), "
                     f"got {rounding!r}")


def _promoted(u: Unit, a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, every: int) -> np.ndarray:
    every = _check_pos_int("promote_every", every)
    if every % u.k:
        raise ValueError(f"parameter 'promote_every' must be a multiple of the instruction's k = {u.k}, got {every}")
    aa, bb = np.asarray(a), np.asarray(b)
    reg = np.asarray(c, dtype=np.float32).copy()
    zero = np.zeros_like(reg)
    for k0 in range(0, aa.shape[1] if aa.ndim == 2 else 0, every):
        k1 = min(k0 + every, aa.shape[1])
        sc = {}
        if u.block:
            sc = {"scale_a": np.asarray(scale_a)[:, k0 // u.block:k1 // u.block],
                  "scale_b": np.asarray(scale_b)[k0 // u.block:k1 // u.block]}
        part = matmul_unit(u, aa[:, k0:k1], bb[k0:k1], zero, sc.get("scale_a"), sc.get("scale_b"))
        reg = (reg + part).astype(np.float32)          # float32 + float32: one correct rounding
    return reg


def _operand(x: Any, name: str, dtype_name: str, shape_ok: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf" or arr.ndim != 2:
        raise ValueError(f"parameter {name!r} must be a real 2-D array {shape_ok}, got {arr.dtype} {arr.shape}")
    return arr.astype(np.float64)


@cache
def _format_of(dtype_name: str) -> tuple[int, int, float, bool]:
    """(fraction bits, smallest normal exponent, largest finite, whether 0 is a value) of a type."""
    dt = getattr(ml_dtypes, dtype_name, None) or np.dtype(dtype_name)
    fi = ml_dtypes.finfo(dt)
    zero = np.zeros(1).astype(dt).astype(np.float64)[0] == 0.0
    return int(fi.nmant), int(fi.minexp), float(fi.max), bool(zero)


def _emax(dtype_name: str) -> int:
    """floor(log2) of a type's largest finite value."""
    return math.frexp(_format_of(dtype_name)[2])[1] - 1


def _representable(x: np.ndarray, name: str, tname: str, dtype_name: str) -> bool:
    """Raise unless every value of x is one of the type's (compiled scan; ml_dtypes' round trip decides
    the non-finite values and words the error). Returns whether every value is finite."""
    bad, nonfinite = _scan_nb(x, *_format_of(dtype_name))
    if bad or nonfinite:
        _round_trip(x, name, tname, dtype_name)
    return not nonfinite


def _round_trip(x: np.ndarray, name: str, tname: str, dtype_name: str) -> None:
    dt = getattr(ml_dtypes, dtype_name, None) or np.dtype(dtype_name)
    with np.errstate(over="ignore", invalid="ignore"):
        back = x.astype(dt).astype(np.float64)
    bad = ~((back == x) | (np.isnan(back) & np.isnan(x)))
    if bad.any():
        v = x[bad][0]
        raise ValueError(f"parameter {name!r} must hold values exactly representable in {tname} "
                         f"({dtype_name}); {np.count_nonzero(bad)} are not, e.g. {v!r}")


def matmul(a: Any, b: Any, c: Any, *, arch: str, instr: str, scale_a: Any = None, scale_b: Any = None,
           promote_every: int | None = None) -> np.ndarray:
    """D = A·B + C through ``arch``'s instruction ``instr``, chained along K (each step fed the previous D
    as its C), bit for bit as MMA-Sim computes it. Names and arithmetic: :mod:`kvcost.numerics.instructions`.

    ``a`` (m, K), ``b`` (K, n): operand values, each exactly representable in the instruction's A / B
    type (e2m1 as values; tf32 operands are float32 values truncated to tf32 as the hardware reads them);
    ``c`` (m, n): float32 (float16 for ``.f16`` accumulators) values. K is a multiple of the
    instruction's k; m and n are free. Block-scaled kinds take ``scale_a`` (m, K // block) and ``scale_b``
    (K // block, n): ue8m0 powers of two, or non-negative e4m3 values for ue4m3. ``promote_every=N`` (a
    multiple of k; not part of the instruction): every N terms along K the unit's partial, started from
    zero, is added into a true fp32 register (round to nearest), as CUTLASS' ``GmmaFP8Accumulation`` and
    DeepSeek-V3's N_C = 128 do; the register starts at c. Returns float32 (m, n).
    """
    return matmul_unit(get(arch, instr), a, b, c, scale_a, scale_b, promote_every)


def matmul_unit(u: Unit, a: Any, b: Any, c: Any, scale_a: Any = None, scale_b: Any = None,
                promote_every: int | None = None) -> np.ndarray:
    """:func:`matmul` on a :class:`~kvcost.numerics.instructions.Unit` given directly (a registered one, or
    one with its arithmetic changed on purpose: ``dataclasses.replace(unit, frac_bits=N, rounding="RZ-E8MN")``
    narrows the register)."""
    if promote_every is not None:
        return _promoted(u, a, b, c, scale_a, scale_b, promote_every)
    arch, instr = u.arch, u.instr
    aa = _operand(a, "a", "", "(m, K)")
    bb = _operand(b, "b", "", "(K, n)")
    m, kk = aa.shape
    if bb.shape[0] != kk:
        raise ValueError(f"parameters 'a' and 'b' must be shaped (m, K) and (K, n), got {aa.shape} and {bb.shape}")
    n = bb.shape[1]
    if kk < 1 or kk % u.k:
        raise ValueError(f"K = {kk} must be a positive multiple of the instruction's k = {u.k} ({instr})")
    cc = _operand(c, "c", "", "(m, n)")
    if cc.shape != (m, n):
        raise ValueError(f"parameter 'c' must be shaped (m, n) = {(m, n)}, got {cc.shape}")
    finite = True
    for x, nm, t in ((aa, "a", u.a_type), (bb, "b", u.b_type)):
        if t == "tf32":
            x[...] = (x.astype(np.float32).view(np.int32) >> 13 << 13).view(np.float32)
        finite &= _representable(x, nm, t, OPERAND_TYPES[t][0])
    finite &= _representable(cc, "c", u.c_type, "float16" if u.c_type == "f16" else "float32")
    ones = np.ones((1, 1))
    sa = sb = swa = swb = ones
    if u.block:
        if scale_a is None or scale_b is None:
            raise ValueError(f"{arch} {instr} is block-scaled: parameters 'scale_a' (m, K // {u.block}) and "
                             f"'scale_b' (K // {u.block}, n) are required")
        sa = _operand(scale_a, "scale_a", "", f"(m, K // {u.block})")
        sb = _operand(scale_b, "scale_b", "", f"(K // {u.block}, n)")
        if sa.shape != (m, kk // u.block) or sb.shape != (kk // u.block, n):
            raise ValueError(f"parameters 'scale_a' and 'scale_b' must be shaped {(m, kk // u.block)} and "
                             f"{(kk // u.block, n)}, got {sa.shape} and {sb.shape}")
        sname, semin = SCALE_TYPES[u.scale_type]
        for x, nm in ((sa, "scale_a"), (sb, "scale_b")):
            if (x < 0).any():
                raise ValueError(f"parameter {nm!r} must be non-negative ({u.scale_type} scales)")
            finite &= _representable(x, nm, u.scale_type, sname)
        swa, swb = _weights_nb(sa, semin), _weights_nb(sb, semin)
    elif scale_a is not None or scale_b is not None:
        raise ValueError(f"parameters 'scale_a' / 'scale_b' apply only to block-scaled instructions, not {instr}")
    okind, om = _rounding_out(u.rounding)
    cmin = 2.0 ** (-14 if u.c_type == "f16" else FP32_EMIN)
    zw = 2.0 ** u.e_zero if u.scheme != "GTR" else 0.0
    if finite and zw <= cmin and u.scheme in ("T", "ST"):
        d = _fast_chain(u, aa, bb, cc, sa, sb, swa, swb, okind, om, cmin, zw)
    elif finite and u.scheme == "GTR":
        aw = _lead2_nb(aa, OPERAND_TYPES[u.a_type][1], np.empty(aa.shape))
        bw = _lead2_nb(bb, OPERAND_TYPES[u.b_type][1], np.empty(bb.shape))
        nth = numba.get_num_threads()
        args = (aa, bb, aw, bw, np.ascontiguousarray(cc), u.group, u.frac_bits, u.frac_bits2)
        d = _gtr_serial_nb(*args) if nth == 1 or m * kk * n < _PARALLEL_MACS else _gtr_nb(*args, min(nth, m))
    elif finite and zw <= cmin and u.scheme == "GST" and u.a_type == u.b_type == "e2m1":
        d = _fast_gst(u, aa, bb, cc, sa, sb, swa, swb, okind, om, cmin, zw)
    else:
        aw = _weights_nb(aa, OPERAND_TYPES[u.a_type][1])
        bw = _weights_nb(bb, OPERAND_TYPES[u.b_type][1])
        d = _matmul_nb(np.ascontiguousarray(aa), np.ascontiguousarray(bb), np.ascontiguousarray(cc), aw, bw, sa,
                       sb, swa, swb, _SCHEMES[u.scheme], u.group, max(u.g, 1), max(u.block, 1), u.frac_bits,
                       u.frac_bits2, okind, om, cmin, zw, numba.get_num_threads())
    return d.astype(np.float32)


def _fast_chain(u: Unit, aa: np.ndarray, bb: np.ndarray, cc: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                swa: np.ndarray, swb: np.ndarray, okind: int, om: int, cmin: float, zw: float) -> np.ndarray:
    """T and ST units on finite inputs (:func:`_chain_nb`): block scales folded into the operands and their
    weights (exact: powers of two), float32 lanes where every product, cut term and step sum is exact."""
    narrow = u.scheme == "T" and OPERAND_TYPES[u.a_type][2] == 1 and OPERAND_TYPES[u.b_type][2] == 1
    lanes32 = narrow and u.group * 2 ** (u.frac_bits + 2) <= 2 ** 24
    lt = np.float32 if lanes32 else np.float64
    aw = _lead2_nb(aa, OPERAND_TYPES[u.a_type][1], np.empty(aa.shape, lt))
    bw = _lead2_nb(bb, OPERAND_TYPES[u.b_type][1], np.empty(bb.shape, lt))
    if u.scheme == "ST":
        ra, rb = np.repeat(sa, u.block, axis=1), np.repeat(sb, u.block, axis=0)
        aa, bb = aa * ra, bb * rb
        aw, bw = aw * np.repeat(swa, u.block, axis=1), bw * np.repeat(swb, u.block, axis=0)
    lane_lo = OPERAND_TYPES[u.a_type][1] + OPERAND_TYPES[u.b_type][1] if lanes32 else -1000
    lane_hi = _emax(OPERAND_TYPES[u.a_type][0]) + _emax(OPERAND_TYPES[u.b_type][0]) + u.frac_bits + 2
    if u.scheme == "ST":
        lane_hi += 2 * _emax(SCALE_TYPES[u.scale_type][0])
    oemin = -14 if okind == OUT_FP16 else FP32_EMIN
    m, kk = aa.shape
    args = (np.ascontiguousarray(aa, lt), np.ascontiguousarray(bb, lt), np.ascontiguousarray(aw, lt),
            np.ascontiguousarray(bw, lt), np.ascontiguousarray(cc), u.group, u.frac_bits, okind, om, oemin, cmin, zw,
            lane_lo, lane_hi)
    nth = numba.get_num_threads()
    if nth == 1 or m * kk * bb.shape[1] < _PARALLEL_MACS:
        return _chain_serial_nb(*args)
    return _chain_nb(*args, nth)


_GST_CHUNK = 1 << 22     # group sums held at once (G x m x n float32): the chain runs chunk by chunk along K


def _fast_gst(u: Unit, aa: np.ndarray, bb: np.ndarray, cc: np.ndarray, sa: np.ndarray, sb: np.ndarray,
              swa: np.ndarray, swb: np.ndarray, okind: int, om: int, cmin: float, zw: float) -> np.ndarray:
    """GST units on finite e2m1 operands: the exact 16-product group sums are float32 matrix products
    (e2m1 products are multiples of 2^-2 below 36, so any order of summing is exact), then
    :func:`_gst_chain_nb` scales and fuses them, a chunk of K at a time."""
    m, kk = aa.shape
    n = bb.shape[1]
    g = u.g
    nterm = u.group // g
    a3 = aa.astype(np.float32).reshape(m, kk // g, g).transpose(1, 0, 2)
    b3 = bb.astype(np.float32).reshape(kk // g, g, n)
    step = max(nterm, (_GST_CHUNK // max(m * n, 1)) // nterm * nterm)
    d = np.ascontiguousarray(cc)
    for g0 in range(0, kk // g, step):
        g1 = min(kk // g, g0 + step)
        v = np.matmul(a3[g0:g1], b3[g0:g1])
        nz = np.matmul((a3[g0:g1] != 0).astype(np.float32), (b3[g0:g1] != 0).astype(np.float32))
        d = _gst_chain_nb(d, v, nz, sa, sb, swa, swb, g0, g, u.block, nterm, u.frac_bits, okind, om, cmin, zw)
    return d
