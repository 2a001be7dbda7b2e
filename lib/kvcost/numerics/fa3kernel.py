"""The compiled FlashAttention-3 FP8 row kernel that :mod:`kvcost.fa3` drives (numba).

``_row`` runs one query row's blocks (running max, fp32 rescales, P in e4m3, P·V on the emulated
tensor core into acc_o, the two-level flush, split-KV); ``_scores`` computes S = q·Kᵀ;
``_attend_nb`` runs every (head, row) pair in parallel. The algorithm and its sources are in
:mod:`kvcost.fa3`'s docstring; this module holds only the compiled pieces and their fast paths:
fp32 roundings by the hardware conversion, the e4m3 cast and store branch-free, and the
tensor core in float32 lanes where its exactness conditions hold (``_mma_rows32``), each bit for
bit the plain emulation (``tests/test_fa3.py``, ``tests/test_tensorcore.py``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kvcost.floats import round_to
from kvcost.numerics._jit import OUT_TRUNC, OUT_TRUNC_INF, add_nb, fused_rows, fused_rows32, gtr_rows, lead2, round_nb

_F32MAX = float(np.finfo(np.float32).max)
_BF16MAX = float(round_to(3.3895313892515355e38, "bf16"))
_KCHUNK = 512        # keys per chunk of the compiled QKᵀ
FB32 = 16            # the float32-lane tensor core is exact up to this many fraction bits


@njit(inline="always")
def _f32(x: float) -> float:
    """x rounded to nearest fp32 (the hardware conversion: nearest-even, subnormals, overflow to inf;
    bit for bit accum._round_nb for fp32, which the tests check)."""
    return np.float64(np.float32(x))


@njit(inline="always")
def _f32add(a: float, b: float) -> float:
    """RN_fp32(a + b) for any float64 a, b (TwoSum, then one rounding)."""
    return add_nb(a, b, 23, -126, _F32MAX, math.inf)


@njit(inline="always")
def _f32sum(a: float, b: float) -> float:
    """RN_fp32(a + b) when a and b are fp32 values: their float64 sum rounded to fp32 is correctly
    rounded (double rounding is innocuous for addition when 53 >= 2 * 24 + 2)."""
    return np.float64(np.float32(a + b))


@njit(inline="always")
def _e4m3_nonneg(x: float) -> float:
    """x >= 0 (or NaN) rounded to nearest-even e4m3, saturating at 448: bit for bit
    min(round_nb(x, 0, 3, -6, 448, 448), 448), branch-free so the loop over a block vectorizes."""
    one = np.int64(1)
    b = np.float64(x).view(np.int64)
    normal = np.int64((b + (one << 48) - one + ((b >> 49) & one)) & ~((one << 49) - one)).view(np.float64)
    sub = np.rint(x * 512.0) * 0.001953125            # below 2^-6: multiples of 2^-9
    r = sub if x < 0.015625 else normal
    r = r if r < 448.0 else 448.0
    return x if x != x else r


@njit(cache=True)   # a call, not inlined (as _jit.round_nb, which it calls): compile time, same bits
def _cast_p(x: float, pk: int) -> float:
    if pk == 0:
        return _e4m3_nonneg(x)
    if pk == 1:
        return round_nb(x, 0.0, 7, -126, _BF16MAX, math.inf)
    if pk == 4:                       # e4m3fnuz (CDNA3): nearest-even, saturating at 240
        return min(round_nb(x, 0.0, 3, -7, 240.0, 240.0), 240.0)
    return x


@njit(inline="always")
def _exp2_f32(x: float) -> float:
    return _f32(math.exp2(x))


@njit(cache=True)
def row(s, v, vw, vrow0, n, scale_log2, pk, ak, lk, flush, bn, max_off, splits,
         scheme, grp, fb, fb2, nearest, okind, om, oemin, ofmax, cmin, zw, pemin, out, scr, prod, wts, acc, reg,
         pbuf, praw, pv32, prod32, mx32, acc32, scr32, thr=0.0, pscale=0.0):   # pragma: no cover - compiled
    """One query row: scores s[:n] (raw; times scale_log2 in the exponent), values
    v[vrow0 + i, :] with their alignment weights vw (2^max(floor(log2 |v|), emin), 0 for 0). P·V runs
    on the unit (``scheme`` 0: a fused truncated sum of ``grp`` terms at ``fb`` bits, register written
    by ``okind``; 3: CDNA3's even/odd MFMA at fb / fb2), P's weight clamped at 2^pemin. Writes the
    output into out[:]; scr/prod/wts/acc/reg/pbuf/praw are scratch. ``pv32``: P·V in float32 lanes
    (``fused_rows32``, same bits; FP8 P and V, truncating register), with the float32 scratch
    prod32 (grp, >= d), mx32 and acc32 (>= d), scr32 (2, >= d). ``thr`` > 0: the running max is kept
    (stale) while a block raises it by at most ``thr`` log2 units (FA4's ``rescale_threshold``).
    ``pscale`` > 0: P is multiplied by it in fp32 before the cast and the row sum counts the unscaled P
    (composable_kernel's ``scale_p``; then max_off is 0), the output divided by l·pscale."""
    d = v.shape[1]
    nblk = (n + bn - 1) // bn
    per = (nblk + splits - 1) // splits
    nsp = (nblk + per - 1) // per if nblk > 0 else 0
    # split results: lse and output, combined in fp32 at the end
    lse_max = -math.inf
    for j in range(d):
        out[j] = 0.0
    lses = np.empty(nsp)
    outs = np.empty((nsp, d))
    for sp in range(nsp):
        b_lo = sp * per
        b_hi = min(nblk, (sp + 1) * per)
        m = -math.inf
        l_val = 0.0
        dscale = 1.0
        since = 0
        for j in range(d):
            acc[j] = 0.0
            reg[j] = 0.0
        for b in range(b_hi - 1, b_lo - 1, -1):
            i0 = b * bn
            i1 = min(i0 + bn, n)
            mb = -math.inf
            for i in range(i0, i1):
                mb = max(mb, s[i])
            first = b == b_hi - 1
            if first:
                m = mb
            elif mb > m and not (thr > 0.0 and _f32((m - mb) * scale_log2) >= -thr):
                sc = _exp2_f32(_f32((m - mb) * scale_log2))
                m = mb
                l_val = _f32(l_val * sc) if lk == 0 else l_val * sc
                for j in range(d):
                    acc[j] = _f32(acc[j] * sc) if ak != 2 else acc[j] * sc
                dscale = _f32(dscale * sc)
            max_scaled = _f32(m * scale_log2 - max_off)
            w = i1 - i0
            for i in range(i0, i1):
                praw[i - i0] = _exp2_f32(_f32(s[i] * scale_log2 - max_scaled))
            if lk == 0:
                for i in range(w):
                    l_val = _f32sum(l_val, praw[i])
            else:
                for i in range(w):
                    l_val += praw[i]
            if pscale > 0.0:
                for i in range(w):
                    pbuf[i] = _cast_p(_f32(praw[i] * pscale), pk)
            else:
                for i in range(w):
                    pbuf[i] = _cast_p(praw[i], pk)
            if ak == 0 and pv32:
                for j in range(d):
                    acc32[j] = acc[j]
                for g0 in range(i0, i1, grp):
                    g1 = min(g0 + grp, i1)
                    for j in range(d):
                        mx32[j] = 0.0
                    for i in range(g0, g1):
                        pi = np.float32(pbuf[i - i0])
                        pw = np.float32(lead2(pbuf[i - i0], pemin))
                        prow = prod32[i - g0]     # row views: 2-D indexing defeats the vectorizer
                        vrow = v[vrow0 + i]
                        wrow = vw[vrow0 + i]
                        for j in range(d):
                            prow[j] = pi * np.float32(vrow[j])
                            mx32[j] = max(mx32[j], pw * np.float32(wrow[j]))
                    fused_rows32(acc32, prod32, mx32, g1 - g0, d, scr32, fb, om, ofmax)
                for j in range(d):
                    acc[j] = acc32[j]
            elif ak == 0:
                for g0 in range(i0, i1, grp):
                    g1 = min(g0 + grp, i1)
                    for i in range(g0, g1):
                        pi = pbuf[i - i0]
                        pw = lead2(pi, pemin)
                        prow = prod[i - g0]
                        wrow = wts[i - g0]
                        vrow = v[vrow0 + i]
                        vwrow = vw[vrow0 + i]
                        for j in range(d):
                            prow[j] = pi * vrow[j]
                            ww = pw * vwrow[j]
                            wrow[j] = ww if ww != 0.0 or scheme == 3 else zw
                    if scheme == 3:
                        gtr_rows(acc, prod, wts, g1 - g0, d, fb, fb2)
                    else:
                        fused_rows(acc, prod, wts, g1 - g0, d, scr, fb, nearest, okind, om, oemin, ofmax, cmin, zw, 2,
                                   False)
            elif ak == 1:
                for i in range(i0, i1):
                    pi = pbuf[i - i0]
                    vrow = v[vrow0 + i]
                    for j in range(d):
                        acc[j] = _f32add(acc[j], pi * vrow[j])
            else:
                for i in range(i0, i1):
                    pi = pbuf[i - i0]
                    vrow = v[vrow0 + i]
                    for j in range(d):
                        acc[j] += pi * vrow[j]
            if flush > 0:
                since += 1
                if since == flush:
                    for j in range(d):
                        reg[j] = _f32(dscale * reg[j] + acc[j]) if ak != 2 else dscale * reg[j] + acc[j]
                        acc[j] = 0.0
                    dscale = 1.0
                    since = 0
        if flush > 0:
            for j in range(d):
                acc[j] = _f32(dscale * reg[j] + acc[j]) if ak != 2 else dscale * reg[j] + acc[j]
        l_out = l_val if pscale <= 0.0 else (_f32(l_val * pscale) if lk == 0 else l_val * pscale)
        inv = _f32(1.0 / l_out) if lk == 0 else 1.0 / l_out
        for j in range(d):
            outs[sp, j] = _f32(acc[j] * inv) if ak != 2 else acc[j] * inv
        # the split's log-sum-exp in natural-log units: m*scale_log2*ln2 + log(l / 2^max_off)
        lses[sp] = m * scale_log2 * math.log(2.0) + math.log(l_val / 2.0 ** max_off)
        lse_max = max(lse_max, lses[sp])
    if nsp == 1:
        for j in range(d):
            out[j] = outs[0, j]
        return
    tot = 0.0
    for sp in range(nsp):
        tot = _f32sum(tot, _f32(math.exp(lses[sp] - lse_max)))
    lse = _f32(math.log(tot) + lse_max)
    for sp in range(nsp):
        w = _f32(math.exp(lses[sp] - lse))
        for j in range(d):
            out[j] = _f32add(out[j], _f32(w * outs[sp, j]))


@njit(cache=True)   # a call, not inlined: compile time, same bits
def _scores(qrow, kT, kwT, n, qk, qemin, grp, sfb, sok, som, soemin, sofmax, zw, srow, prod, wts, scr, qk32, srow32,
            prod32, mx32, scr32):
    """S[:n] = q · K[:n]ᵀ: kT is (d, n_keys), kwT its alignment weights; on the tensor core (``sfb``
    fraction bits, groups of ``grp``, register ``sok``), in fp32, or exactly. ``qk32``: the tensor core
    in float32 lanes (``fused_rows32``, same bits; FP8 Q and K, truncating cut)."""
    d = kT.shape[0]
    for j in range(n):
        srow[j] = 0.0
    if qk == 0 and qk32:
        for j0 in range(0, n, _KCHUNK):
            j1 = min(j0 + _KCHUNK, n)
            w = j1 - j0
            for j in range(w):
                srow32[j] = 0.0
            for g0 in range(0, d, grp):
                g1 = min(g0 + grp, d)
                for j in range(w):
                    mx32[j] = 0.0
                for i in range(g0, g1):
                    qi = np.float32(qrow[i])
                    qw = np.float32(lead2(qrow[i], qemin))
                    prow = prod32[i - g0]         # row views: 2-D indexing defeats the vectorizer
                    krow = kT[i, j0:j1]
                    kwrow = kwT[i, j0:j1]
                    for j in range(w):
                        prow[j] = qi * np.float32(krow[j])
                        mx32[j] = max(mx32[j], qw * np.float32(kwrow[j]))
                fused_rows32(srow32, prod32, mx32, g1 - g0, w, scr32, sfb, som, sofmax)
            for j in range(w):
                srow[j0 + j] = srow32[j]
    elif qk == 0:
        for j0 in range(0, n, _KCHUNK):          # key chunks keep the product buffer in cache
            j1 = min(j0 + _KCHUNK, n)
            w = j1 - j0
            sub = srow[j0:j1]
            for g0 in range(0, d, grp):
                g1 = min(g0 + grp, d)
                for i in range(g0, g1):
                    qi = qrow[i]
                    qw = lead2(qi, qemin)
                    prow = prod[i - g0]
                    wrow = wts[i - g0]
                    krow = kT[i, j0:j1]
                    kwrow = kwT[i, j0:j1]
                    for j in range(w):
                        prow[j] = qi * krow[j]
                        ww = qw * kwrow[j]
                        wrow[j] = ww if ww != 0.0 else zw
                fused_rows(sub, prod, wts, g1 - g0, w, scr, sfb, False, sok, som, soemin, sofmax, 2.0 ** -126, zw,
                           2, False)
    elif qk == 1:
        for i in range(d):
            qi = qrow[i]
            krow = kT[i]
            for j in range(n):
                srow[j] = _f32add(srow[j], qi * krow[j])
    else:
        for i in range(d):
            qi = qrow[i]
            krow = kT[i]
            for j in range(n):
                srow[j] += qi * krow[j]


@njit(parallel=True, cache=True)
def attend_nb(q, kT, kwT, v, vw, group, causal, scale_log2, pk, ak, lk, qk, flush, bn, max_off, splits,
               scheme, grp, fb, fb2, nearest, okind, om, oemin, ofmax, cmin, zw, pemin,
               qemin, sfb, sok, som, soemin, sofmax, qk32, pv32, nth, thr=0.0, pscale=0.0):   # pragma: no cover
    hq, nq, _ = q.shape
    nk = kT.shape[2]
    dv = v.shape[2]
    out = np.zeros((hq, nq, dv))
    total = hq * nq
    nchunk = max(1, min(total, nth * 4))
    for ch in prange(nchunk):
        t0 = ch * total // nchunk
        t1 = (ch + 1) * total // nchunk
        srow = np.empty(nk)
        width = max(min(nk, _KCHUNK), dv)
        prod = np.empty((32, width))
        wts = np.empty((32, width))
        scr = np.empty((3, width))
        acc = np.empty(dv)
        reg = np.empty(dv)
        pbuf = np.empty(bn)
        praw = np.empty(bn)
        orow = np.empty(dv)
        srow32 = np.empty(width, np.float32)
        prod32 = np.empty((32, width), np.float32)
        mx32 = np.empty(width, np.float32)
        scr32 = np.empty((2, width), np.float32)
        acc32 = np.empty(dv, np.float32)
        for t in range(t0, t1):
            h = t // nq
            r = t % nq
            hk = h // group
            n = nk - nq + r + 1 if causal else nk
            _scores(q[h, r], kT[hk], kwT[hk], n, qk, qemin, grp, sfb, sok, som, soemin, sofmax, zw, srow, prod,
                    wts, scr, qk32, srow32, prod32, mx32, scr32)
            # vrow0 as int64, not the literal 0: the row kernel attend_row compiled is reused, not a second one
            row(srow, v[hk], vw[hk], np.int64(0), n, scale_log2, pk, ak, lk, flush, bn, max_off, splits,
                 scheme, grp, fb, fb2, nearest, okind, om, oemin, ofmax, cmin, zw, pemin, orow, scr, prod, wts, acc,
                 reg, pbuf, praw, pv32, prod32, mx32, acc32, scr32, thr, pscale)
            for j in range(dv):
                out[h, r, j] = orow[j]
    return out


@njit(cache=True)
def weights_nb(a, emin):   # pragma: no cover - compiled
    """lead2 of every value of ``a`` (any shape), in a's dtype: the operands' alignment weights."""
    out = np.empty_like(a)
    fo = out.reshape(-1)
    fa = a.reshape(-1)
    for i in range(fa.size):
        fo[i] = lead2(np.float64(fa[i]), emin)
    return out


@njit(cache=True)
def _all_e4m3_nb(a):   # pragma: no cover - compiled
    for x in a:
        ax = abs(x)
        if _e4m3_nonneg(ax) != ax:
            return False
    return True


@njit(cache=True)
def store_e4m3_nb(a):   # pragma: no cover - compiled
    out = np.empty(a.size, np.float32)
    for i in range(a.size):
        x = np.float64(a[i])
        out[i] = np.float32(math.copysign(_e4m3_nonneg(abs(x)), x))
    return out


def all_e4m3(a: np.ndarray) -> bool:
    """Every value of ``a`` is an e4m3 value (finite, at most ±448)."""
    return bool(_all_e4m3_nb(np.ascontiguousarray(a).reshape(-1)))


@njit(cache=True)
def _all_in_format_nb(a, mant, emin, fmax):   # pragma: no cover - compiled
    for x0 in a:
        x = abs(np.float64(x0))
        if x != x or x == math.inf:
            return -1
        if x == 0.0:
            continue
        if x > fmax:
            return 0
        e = ((np.float64(x).view(np.int64) >> 52) & 0x7FF) - 1023
        if e == -1023:                          # float64 subnormal: below every operand format's quantum
            return 0
        scaled = x * np.int64((1023 - (max(e, emin) - mant)) << 52).view(np.float64)   # x / quantum, exact
        if scaled != math.floor(scaled):
            return 0
    return 1


def all_in_format(a: np.ndarray, mant: int, emin: int, fmax: float) -> bool | None:
    """Every value of ``a`` is a value of the binary format with ``mant`` fraction bits, smallest normal
    exponent ``emin`` and largest finite value ``fmax`` (a multiple of its quantum 2^(max(e, emin) - mant), at
    most ``fmax`` in magnitude); None when ``a`` holds an inf or NaN (whether the format has them is the
    caller's to decide)."""
    r = _all_in_format_nb(np.ascontiguousarray(a).reshape(-1), int(mant), int(emin), float(fmax))
    return None if r < 0 else bool(r)


def lanes32(pk: int, ak: int, scheme: int, fb: int, nearest: bool, okind: int) -> bool:
    """P·V may run in float32 lanes: e4m3 P on a fused (T) unit, a truncating cut of at most FB32 bits
    into a truncating e8mN register (the V check is the caller's)."""
    return pk == 0 and ak == 0 and scheme == 0 and fb <= FB32 and not nearest and okind in (OUT_TRUNC, OUT_TRUNC_INF)
