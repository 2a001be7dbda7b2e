"""The compiled arithmetic every numerics module shares (numba), in one private module.

Public names here are for :mod:`kvcost.numerics` alone (``accum``, ``tensorcore``, ``fa3kernel``);
users call those modules. What lives here:

- :func:`round_nb`, :func:`add_nb`: an exact value rounded once to nearest-even in any float format;
  a sum rounded once (TwoSum first). ``accum``'s running sums and every fp32 step of the FA3 kernel.
- :func:`trunc_nb`, :func:`finish`: truncation toward zero and the write of an instruction's exact sum
  to its register (``OUT_*``).
- :func:`fused_rows`, :func:`fused_rows32`: one *fused truncated dot product* (MMA-Sim's
  ``truncated_fused_sum``, arXiv 2511.10909) for a row of outputs at once: every term, the accumulator
  included, cut to a multiple of 2^(e_max - F) where e_max is the largest **alignment exponent** among
  the terms, then summed exactly. The alignment exponent of a product is the sum of its operands'
  exponents (its significand product lies in [1, 4)); products-only models pass |product| instead.
  ``fused_rows32`` is the float32-lane twin for FP8 operands (same bits, twice the vector width).
- :func:`gtr_rows`: CDNA3's FP8 MFMA (even and odd halves fused apart, then combined at F2 bits).

The large helpers (:func:`round_nb`, :func:`trunc_nb`, :func:`finish`, :func:`fused_rows`,
:func:`fused_rows32`, :func:`gtr_rows`) are plain ``@njit(cache=True)`` calls, compiled once per
signature (and cached, so another process compiling a new caller loads them), not ``inline="always"``:
numba's IR inlining copied each into every call site (``round_nb`` some ten times into the FA3 row
kernel), and that copying was most of a fresh clone's compile time (3-4x). LLVM still inlines where it
pays; the arithmetic, and so every bit, is the same. The small ones stay inlined.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

#: How an instruction's exact sum is written to its register: kept (``exact``), truncated toward
#: zero with overflow to the largest finite (``trunc``, the e8mN registers of :func:`kvcost.tensorcore.mma`),
#: rounded to nearest fp32 (``fp32``), truncated with overflow past 2^128 to inf (``trunc_inf``, MMA-Sim's
#: RZ-FP32 / RZ-E8M13), rounded to nearest fp16 (``fp16``, MMA-Sim's RNE-FP16).
OUT_EXACT, OUT_TRUNC, OUT_FP32, OUT_TRUNC_INF, OUT_FP16 = 0, 1, 2, 3, 4
FP32_MAN, FP32_EMIN, FP32_MAX = 23, -126, float(np.finfo(np.float32).max)
_TWO128 = 2.0 ** 128


@njit(cache=True)
def round_nb(hi: float, lo: float, m: int, emin: int, fmax: float, ovf: float) -> float:
    """Round the exact value hi + lo to nearest-even in a format (m fraction bits, emin,
    largest finite fmax, overflow value ovf = inf or NaN). Same rule as floats.round_pair
    for mode 'nearest', on the float64 bits: drop the low `shift` significand bits, rounding
    up past half, and at exactly half by the sign of lo (then by parity)."""
    if hi != hi:
        return hi
    a = abs(hi)
    if a == math.inf:
        r = ovf
    elif a == 0.0:
        return hi
    else:
        b = np.float64(a).view(np.int64)
        e = (b >> 52) - 1023
        if e < -1022:                       # float64 subnormal input: exponent via frexp
            _, e2 = math.frexp(a)
            qexp = max(e2 - 1, emin) - m
            y = math.ldexp(a, -qexp)
            r = (y + 4503599627370496.0) - 4503599627370496.0
            d = y - r
            if (d == 0.5 or d == -0.5) and lo != 0.0:
                r = math.floor(y) + 1.0 if (lo > 0.0) == (hi > 0.0) else math.floor(y)
            r = math.ldexp(r, qexp)
        else:
            shift = 52 - m + max(emin - e, 0)
            if shift > 53:                  # below half the smallest subnormal
                r = 0.0
            elif shift == 53:               # between half and one smallest subnormal
                q = math.ldexp(1.0, emin - m)
                if a > 0.5 * q or (a == 0.5 * q and lo != 0.0 and (lo > 0.0) == (hi > 0.0)):
                    r = q
                else:
                    r = 0.0
            else:
                one = np.int64(1)
                mask = (one << shift) - one
                rem = b & mask
                half = one << (shift - 1)
                base = b - rem
                up = rem > half
                if rem == half:
                    if lo != 0.0:
                        up = (lo > 0.0) == (hi > 0.0)
                    else:                   # parity of the kept significand (implicit bit included:
                        up = (((b | (one << 52)) >> shift) & one) == one   # at shift 52 it is all that is kept)
                if up:
                    base += one << shift
                r = np.int64(base).view(np.float64)
        if r > fmax:
            r = ovf
    return r if hi > 0.0 else -r


@njit(inline="always")
def add_nb(a: float, b: float, m: int, emin: int, fmax: float, ovf: float) -> float:
    """RN_fmt(a + b) for float64 a, b, rounded once (TwoSum, then one rounding)."""
    s = a + b
    bb = s - a
    lo = (a - (s - bb)) + (b - bb)
    if s == 0.0:
        return s
    return round_nb(s, lo, m, emin, fmax, ovf)




@njit(cache=True)
def trunc_nb(x: float, m: int, emin: int, fmax: float) -> float:
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


@njit(cache=True)
def finish(s: float, okind: int, om: int, oemin: int, ofmax: float) -> float:
    """The exact instruction sum s written to the accumulator (``OUT_*``)."""
    if okind == OUT_TRUNC:
        return trunc_nb(s, om, oemin, ofmax)
    if okind == OUT_TRUNC_INF:
        r = trunc_nb(s, om, oemin, math.inf)
        return r if abs(r) < _TWO128 else math.copysign(math.inf, r)
    if okind == OUT_FP32:
        return round_nb(s, 0.0, FP32_MAN, FP32_EMIN, FP32_MAX, math.inf)
    if okind == OUT_FP16:
        return round_nb(s, 0.0, 10, -14, 65504.0, math.inf)
    return s


@njit(inline="always")
def quanta(mx: float, fb: int) -> tuple[float, float]:
    """(1/q, q) with q = 2^(floor(log2 mx) - fb), from mx's float64 exponent bits (mx >= 0;
    mx = 0 or below 2^-1000 gives q for 2^-1000: every term is then cut to zero or kept)."""
    e = ((np.float64(mx).view(np.int64) >> 52) & 0x7FF) - 1023
    e = max(e, -1000)
    inv = np.int64((1023 + fb - e) << 52).view(np.float64)
    q = np.int64((1023 + e - fb) << 52).view(np.float64)
    return inv, q


@njit(inline="always")
def lead2(x: float, emin: int) -> float:
    """2^max(floor(log2 |x|), emin): the power of two MMA-Sim aligns an operand by
    (``frexp_and_normalize``: a subnormal keeps its format's smallest normal exponent); 0 for x = 0,
    2^-1 for inf and NaN (frexp's exponent 0; such a sum is their IEEE sum anyway)."""
    if x == 0.0:
        return 0.0
    if x != x or abs(x) == math.inf:
        return 0.5
    e = ((np.float64(x).view(np.int64) >> 52) & 0x7FF) - 1023
    if e == -1023:                              # float64 subnormal: far below every operand format
        e = -1074
    e = max(e, emin)
    return np.int64((1023 + e) << 52).view(np.float64)


@njit(cache=True)
def fused_rows(tc, prod, wts, kk, ncol, scr, fb, nearest, okind, om, oemin, ofmax, cmin, zw, hb, absw):
    """One fused instruction for ncol outputs at once: tc[j] += the kk terms prod[:kk, j].

    Per column, e_max = floor(log2) of the largest alignment weight among ``wts[:kk, j]`` (the terms'),
    max(|tc[j]|, cmin) for the accumulator (``zw`` when tc[j] = 0: the weight of a zero term, 2^e_zero,
    or 0). Every term is cut to a multiple of 2^(e_max - fb) -- toward zero, or to nearest -- the cut
    terms are summed exactly and the sum is written by :func:`finish`. NaN or inf among the terms
    gives their IEEE sum. ``hb``: how far above its weight a term may reach (|term| < 2^hb · weight:
    1 for |product| weights, 2 for operand-exponent weights); the int32 fast cut needs fb + hb <= 30.
    ``absw``: the weights are |wts| (products-only models pass the products themselves).
    tc is updated in place; scr is a (3, >= ncol) scratch array. The hot loops run along j, branch-free,
    so they vectorize."""
    inv = scr[0]
    chk = scr[1]
    acc = scr[2]
    for j in range(ncol):
        a = abs(tc[j])
        inv[j] = max(a, cmin) if a != 0.0 else zw
        chk[j] = tc[j]
    for i in range(kk):
        pr = prod[i]                      # 1-D row views: numba's 2-D indexing defeats the vectorizer
        wr = wts[i]
        if absw:
            for j in range(ncol):
                inv[j] = max(inv[j], abs(wr[j]))
                chk[j] += pr[j]
        else:
            for j in range(ncol):
                inv[j] = max(inv[j], wr[j])
                chk[j] += pr[j]
    for j in range(ncol):
        inv[j] = quanta(inv[j], fb)[0]
    if nearest:
        for j in range(ncol):
            acc[j] = np.rint(tc[j] * inv[j])
        for i in range(kk):
            pr = prod[i]
            for j in range(ncol):
                acc[j] += np.rint(pr[j] * inv[j])
    elif fb + hb <= 30:    # |term| / q < 2^(fb + hb) <= 2^30: int32 conversion truncates, and vectorizes
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
            tc[j] = finish(acc[j] / inv[j], okind, om, oemin, ofmax)


@njit(cache=True)
def fused_rows32(tc, prod, mx, kk, ncol, scr, fb, om, ofmax):
    """:func:`fused_rows` in float32 lanes (twice the vector width), bit for bit, for a truncating cut
    into a truncating e8m{om} register (om <= 23), fb <= 16, finite FP8 operands whose products are
    exact in float32. ``mx[:ncol]``: each column's largest term weight (the caller forms it with the
    products; 0 where every product is zero). tc (>= ncol) float32 is updated in place; scr is
    (2, >= ncol) float32.

    Exact because: an FP8 product's weight is at least 2^-30, far above 2^(fb - 126), so the grid
    q = 2^(e - fb) stays >= 2^-126 and acc * q is exact in float32, subnormals included; the cut terms
    |t|/q < 2^(fb + 2) are integers after the int32 conversion and 33 of them sum below 2^24 (so the
    sum converts to float32 exactly); truncating to om fraction bits is clearing the low 23 - om bits
    (in float32's subnormal range too, where e8m{om}'s grid is 2^(-126-om)). A column whose only
    nonzero term is an accumulator below 2^(fb - 126) is redone in float64 on its own grid."""
    inv = scr[0]
    acc = scr[1].view(np.int32)       # the cut terms are integers: summed as int32 (exact below 2^31)
    lo = np.float32(2.0 ** (fb - 126))
    small = False
    for j in range(ncol):
        inv[j] = max(mx[j], abs(tc[j]))
        small |= (inv[j] < lo) & (inv[j] != 0)
    if small:                         # rare: every product zero and a tiny accumulator
        fix = np.empty(ncol)
        for j in range(ncol):
            a = abs(np.float64(tc[j]))
            fix[j] = math.nan
            if a < lo and a != 0.0 and mx[j] == 0.0:
                iv = quanta(max(a, 2.0 ** FP32_EMIN), fb)[0]
                fix[j] = finish(np.trunc(np.float64(tc[j]) * iv) / iv, OUT_TRUNC, om, FP32_EMIN, ofmax)
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
    if small:
        for j in range(ncol):
            if fix[j] == fix[j]:
                tc[j] = fix[j]


@njit(inline="always")
def _pow2(e: int) -> float:
    """2^e as torch.exp2 gives it in float64: exact down to 2^-1074, zero below (normal range: from the bits)."""
    if -1022 <= e <= 1023:
        return np.int64((1023 + e) << 52).view(np.float64)
    return math.ldexp(1.0, e) if e >= -1074 else 0.0


@njit(inline="always")
def _norm(x: float, esub: int) -> tuple[float, int]:
    """MMA-Sim's ``frexp_and_normalize``: x = s·2^e with 1 <= |s| < 2, or e = esub and |s| < 1 below
    2^esub (zero included); inf and NaN give (x, -1) as torch.frexp does."""
    if x != x or abs(x) == math.inf:
        return x, -1
    if x == 0.0:
        return x, esub
    m, e = math.frexp(x)
    e -= 1
    s = m * 2.0
    if e < esub:
        s = s * _pow2(e - esub)
        e = esub
    return s, e


@njit(inline="always")
def _exp_of(w: float) -> int:
    """The exponent of a power of two w > 0."""
    return ((np.float64(w).view(np.int64) >> 52) & 0x7FF) - 1023


@njit(inline="always")
def _floor_at(x: float, e: int) -> float:
    """floor(x · 2^e) for |x| < 2^60, without a subnormal operand (slow on x86) where x · 2^e is far
    below 1 (or x is 0): there it is 0 for x >= 0 and -1 below."""
    if x == 0.0:
        return 0.0
    if e < -900:
        return 0.0 if x > 0.0 else -1.0
    return np.floor(x * _pow2(e))


@njit(cache=True)
def gtr_rows(tc, prod, wts, kk, ncol, fb, fb2):
    """CDNA3's FP8 MFMA step for ncol outputs (MMA-Sim's ``gtr_fdpa``): the kk (<= 16) products' even
    and odd terms are each a fused truncated sum at ``fb`` bits on their own largest alignment
    exponent (``wts``: 2^(e_a + e_b), 0 for a zero product); the two are floored onto their common
    exponent at fb bits, floored again at fb2 + 1 bits against the accumulator (itself floored at fb
    bits, dropped when more than fb + 1 binades below), the sum floored to fb2 fraction bits and
    rounded to nearest fp32. Scalar per column: this unit is not on a hot path."""
    for j in range(ncol):
        ee = -999
        eo = -999
        we = 0.0
        wo = 0.0
        for i in range(0, kk - 1, 2):
            we = max(we, wts[i, j])
            wo = max(wo, wts[i + 1, j])
        if kk % 2:
            we = max(we, wts[kk - 1, j])
        if we > 0.0:
            ee = _exp_of(we)
        if wo > 0.0:
            eo = _exp_of(wo)
        se = 0.0
        so = 0.0
        qe = _pow2(fb - ee)
        qo = _pow2(fb - eo)
        for i in range(0, kk - 1, 2):
            se += np.trunc(prod[i, j] * qe)
            so += np.trunc(prod[i + 1, j] * qo)
        if kk % 2:
            se += np.trunc(prod[kk - 1, j] * qe)
        se *= _pow2(-fb)
        so *= _pow2(-fb)
        ed = max(ee, eo)
        sd = _floor_at(se, ee - ed + fb) * _pow2(-fb) + _floor_at(so, eo - ed + fb) * _pow2(-fb)
        sc, ec = _norm(tc[j], FP32_EMIN)
        em = max(ed, ec)
        sd = _floor_at(sd, ed - em + fb2 + 1) * _pow2(-(fb2 + 1))
        sc = 0.0 if ec < em - fb - 1 else np.floor(sc * _pow2(ec - em + fb)) * _pow2(-fb)
        s, e = _norm((sd + sc) * _pow2(em), FP32_EMIN)
        s = np.floor(s * _pow2(fb2)) * _pow2(-fb2)
        tc[j] = np.float64(np.float32(s * _pow2(e))) + 0.0
