"""Running-sum accumulation in low precision, simulated exactly and fast.

Softmax(QK^T) @ V contracts over the context: every output is a sum of n products
accumulated in a register of some format. This module computes what such a register
holds, one correctly rounded addition at a time:

- ``flat``: ``acc = RN_fmt(acc + x[i])`` after every term (the post's model);
- ``two_level`` (``block=b``): each run of b terms summed flat in ``fmt`` from zero, the
  block partials added into a float32 accumulator (vLLM's flash-attention fix; the
  block is the flush interval);
- ``pairwise``: a balanced binary tree, each addition rounded to ``fmt``;
- ``kahan``: Kahan's compensated summation with every operation rounded to ``fmt``;
- ``hopper``: a parameterized model of Hopper's FP8 tensor-core accumulation after the
  DeepSeek-V3 technical report (§3.3.2, §3.5.2): in each group of ``group`` = 32 terms
  the terms and the running accumulator are aligned to the largest exponent among them
  and truncated to ``keep_bits`` ≈ 14 significant bits, then summed; optionally the
  accumulator is promoted (added into a real float32 register, then reset) every
  ``promote`` = N_C = 128 terms.

Every addition is exact-then-rounded-once: TwoSum gives the exact ``acc + x`` as a float64
pair, and :func:`kvcost.floats.round_pair` (or its compiled twin here) rounds the pair in
one step, so there is no float64-then-fmt double rounding. Terms are float64 and are not
rounded to ``fmt`` before they are added (round them with ``floats.round_to`` first to
model a stored operand).

Speed: never ``np.sum``/``np.dot``/``np.matmul`` (pairwise, or float32 inside). Formats that
numpy or ml_dtypes has (fp32, fp16, bf16, fp8) take ``np.add.accumulate`` on that dtype when
the terms are exactly representable in it: those ufuncs add in float32 and round once more,
which is exact rounding because float32 carries 24 >= 2p + 2 bits (double rounding is
innocuous, Figueroa 1995). Everything else runs in a numba loop, parallel over columns.

NaN and inf terms propagate as IEEE arithmetic does (inf + -inf is NaN); a sum that
overflows ``fmt`` becomes inf (NaN in ``fp8_e4m3``, which has no inf).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba import njit, prange

from .floats import FloatFormat, parse_format

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "STRATEGIES", "running_sum", "accumulate", "hopper_sum", "flat_sum_limit",
    "post_flat_sum", "post_flat_sum_literal", "equal_terms_sum", "exact_sum",
    "error_bound", "weight_profile", "PROFILES",
]

STRATEGIES = ("flat", "two_level", "pairwise", "kahan", "hopper")
# The float32 register that two-level and promoted sums flush into (numba freezes these globals).
_FP32_MAN, _FP32_EMIN, _FP32_MAX = 23, -126, float(np.finfo(np.float32).max)
_CHUNK = 1 << 16          # rows per np.add.accumulate call (bounds the temporary)


# ------------------------------------------------------------------ compiled kernels
@njit(inline="always")
def _round_nb(hi: float, lo: float, m: int, emin: int, fmax: float, ovf: float) -> float:
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
                    else:
                        up = ((b >> shift) & one) == one
                if up:
                    base += one << shift
                r = np.int64(base).view(np.float64)
        if r > fmax:
            r = ovf
    return r if hi > 0.0 else -r


@njit(inline="always")
def _add_nb(a: float, b: float, m: int, emin: int, fmax: float, ovf: float) -> float:
    """RN_fmt(a + b) for float64 a, b, rounded once (TwoSum, then one rounding)."""
    s = a + b
    bb = s - a
    lo = (a - (s - bb)) + (b - bb)
    if s == 0.0:
        return s
    return _round_nb(s, lo, m, emin, fmax, ovf)




@njit(parallel=True, cache=True)
def _flat_nb(x, acc, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        for i in range(n):
            for j in range(j0, j1):
                acc[j] = _add_nb(acc[j], x[i, j], m, emin, fmax, ovf)
    return acc


@njit(parallel=True, cache=True)
def _two_level_nb(x, block, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    out = np.zeros(k)
    part = np.zeros(k)
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        for i in range(n):
            for j in range(j0, j1):
                part[j] = _add_nb(part[j], x[i, j], m, emin, fmax, ovf)
            if (i + 1) % block == 0 or i == n - 1:
                for j in range(j0, j1):
                    out[j] = _add_nb(out[j], part[j], _FP32_MAN, _FP32_EMIN, _FP32_MAX, math.inf)
                    part[j] = 0.0
    return out


@njit(parallel=True, cache=True)
def _kahan_nb(x, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    out = np.zeros(k)
    comp = np.zeros(k)
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        for i in range(n):
            for j in range(j0, j1):
                s = out[j]
                y = _add_nb(x[i, j], -comp[j], m, emin, fmax, ovf)
                t = _add_nb(s, y, m, emin, fmax, ovf)
                comp[j] = _add_nb(_add_nb(t, -s, m, emin, fmax, ovf), -y, m, emin, fmax, ovf)
                out[j] = t
    return out


@njit(parallel=True, cache=True)
def _hopper_nb(x, group, keep_bits, promote, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    out = np.zeros(k)
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        for j in range(j0, j1):
            tc = 0.0          # the tensor-core accumulator
            fp = 0.0          # the promoted float32 register
            since = 0
            for g0 in range(0, n, group):
                g1 = min(g0 + group, n)
                mx = abs(tc)
                bad = False
                for i in range(g0, g1):
                    v = x[i, j]
                    if v != v or abs(v) == math.inf:
                        bad = True
                    mx = max(mx, abs(v))
                if bad or tc != tc or abs(tc) == math.inf:
                    s = tc
                    for i in range(g0, g1):
                        s += x[i, j]
                    tc = s
                elif mx > 0.0:
                    _, e2 = math.frexp(mx)
                    q = math.ldexp(1.0, e2 - keep_bits)   # largest item keeps keep_bits bits
                    s = math.trunc(tc / q) * q
                    for i in range(g0, g1):
                        s += math.trunc(x[i, j] / q) * q  # exact: integers times q
                    tc = _round_nb(s, 0.0, m, emin, fmax, ovf)
                since += g1 - g0
                if promote > 0 and (since >= promote or g1 == n):
                    fp = _add_nb(fp, tc, _FP32_MAN, _FP32_EMIN, _FP32_MAX, math.inf)
                    tc = 0.0
                    since = 0
            if promote > 0:
                out[j] = fp
            else:
                out[j] = tc
    return out


@njit(parallel=True, cache=True)
def _pairwise_nb(x, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    out = np.zeros(k)
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        buf = np.empty(n)
        for j in range(j0, j1):
            for i in range(n):
                buf[i] = x[i, j]
            if n == 1:
                out[j] = _round_nb(buf[0], 0.0, m, emin, fmax, ovf)
                continue
            cnt = n
            while cnt > 1:
                half = cnt // 2
                for i in range(half):
                    buf[i] = _add_nb(buf[2 * i], buf[2 * i + 1], m, emin, fmax, ovf)
                if cnt % 2:
                    buf[half] = buf[cnt - 1]
                    cnt = half + 1
                else:
                    cnt = half
            out[j] = buf[0]
    return out


@njit(cache=True)
def _exact_nb(x):   # pragma: no cover - compiled
    """Sum of columns in double-double (TwoSum cascade): error ~2^-100 relative."""
    n, k = x.shape
    hi = np.zeros(k)
    lo = np.zeros(k)
    for i in range(n):
        for j in range(k):
            a = hi[j]
            b = x[i, j]
            s = a + b
            bb = s - a
            e = (a - (s - bb)) + (b - bb)
            t = lo[j] + e
            h = s + t
            lo[j] = t - (h - s)
            hi[j] = h
    return hi + lo


@njit(cache=True)
def _post_loop_nb(n, kind):   # pragma: no cover - compiled
    """The post's Block 3 loop, operation for operation (see post_flat_sum)."""
    term = 1.0 / n
    t32 = np.float32(term)
    if kind == 0 or kind == 3:           # fp32 flat, or the "two-level" column
        acc = np.float32(0.0)
        for _ in range(n):
            acc = np.float32(acc + t32)
        return float(acc)
    if kind == 1:                        # bf16: float32 add, then RNE to bf16
        acc = np.float32(0.0)
        for _ in range(n):
            s = np.float32(acc + t32)
            acc = np.float32(_round_nb(float(s), 0.0, 7, -126, 3.3895313892515355e38, math.inf))
        return float(acc)
    # fp16: first step float16(float32(term)); then float16 acc + float16(term), one rounding
    t16 = _round_nb(term, 0.0, 10, -14, 65504.0, math.inf)
    acc = _round_nb(float(t32), 0.0, 10, -14, 65504.0, math.inf)
    for _ in range(n - 1):
        acc = _add_nb(acc, t16, 10, -14, 65504.0, math.inf)
    return acc


# ------------------------------------------------------------------ helpers
def _threads() -> int:
    return int(numba.get_num_threads())


def _fmt_args(f: FloatFormat) -> tuple[int, int, float, float]:
    return f.man_bits, f.emin, f.max, (math.inf if f.has_inf else math.nan)


def _as_terms(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind in "cSUO":
        raise ValueError(f"parameter 'x' must be an array of real numbers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError("parameter 'x' must have at least one axis (the terms run along axis 0)")
    if arr.dtype == np.float32:   # exact in float64; the compiled loops read it as is
        return arr
    with np.errstate(invalid="ignore"):
        return arr.astype(np.float64, copy=False)


def _check_block(block: Any, name: str = "block") -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"parameter {name!r} must be an integer >= 1 (or None for flat), got {block!r}")
    return int(block)


def _dtype_path(x2: np.ndarray, f: FloatFormat) -> np.ndarray | None:
    """``x2`` cast to ``f``'s numpy/ml_dtypes dtype when every term is exactly representable
    there (and the dtype's add is exactly rounded), else None."""
    dt = f.dtype
    if dt is None:
        return None

    def exact(a: np.ndarray) -> bool:
        with np.errstate(over="ignore", invalid="ignore"):
            a32 = a.astype(np.float32)            # every dtype here is a subset of float32
            if not np.array_equal(a32, a, equal_nan=True):
                return False
            if f.name == "fp32":
                return True
            if f.name == "bf16":                  # bf16 = float32 with the low 16 bits zero
                fin = np.isfinite(a32)
                return bool(np.all((a32.view(np.uint32)[fin] & np.uint32(0xFFFF)) == 0))
            back = a32.astype(dt).astype(np.float32)
            return bool(np.array_equal(back, a32, equal_nan=True))

    if not exact(x2[:256]) or not exact(x2):      # a cheap look first: most misses show early
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return x2.astype(np.float32).astype(dt) if dt != np.float32 else x2.astype(np.float32)


def _sequential_accumulate(y: np.ndarray, init: np.ndarray | None = None) -> np.ndarray:
    """Last row of ``np.add.accumulate(y, axis=0)`` (a compiled sequential loop in y's dtype),
    chunked so the temporary stays small; ``init`` is the starting accumulator."""
    n = y.shape[0]
    acc = np.zeros(y.shape[1:], dtype=y.dtype) if init is None else init.astype(y.dtype)
    for s in range(0, n, _CHUNK):
        blk = np.concatenate([acc[None], y[s:s + _CHUNK]], axis=0)
        acc = np.add.accumulate(blk, axis=0)[-1]
    return acc


# ------------------------------------------------------------------ public API
def running_sum(x: Any, fmt: str | FloatFormat, block: int | None = None) -> np.ndarray:
    """Sum ``x`` along axis 0 as a running accumulator in ``fmt`` computes it (CONTRACT).

    Each addition ``acc + x[i]`` is rounded once, to nearest, ties to even, into ``fmt``.
    ``block=b``: two-level accumulation: each run of b consecutive terms is summed in
    ``fmt`` from zero and the block partials are added (each addition rounded to nearest)
    into a float32 accumulator. Other axes are independent sums. Returns a float64 array
    of shape ``x.shape[1:]`` whose values are exactly the register's contents.
    Raises ``ValueError`` for an unknown ``fmt`` or ``block < 1``.
    """
    return accumulate(x, fmt, "flat" if block is None else "two_level", block=block)


def accumulate(x: Any, fmt: str | FloatFormat, strategy: str = "flat", *, block: int | None = None,
               group: int = 32, keep_bits: int = 14, promote: int | None = None) -> np.ndarray:
    """Sum ``x`` along axis 0 with an accumulation ``strategy`` in ``fmt``.

    ``strategy``: ``flat``, ``two_level`` (needs ``block``), ``pairwise``, ``kahan``, or
    ``hopper`` (see :func:`hopper_sum`; ``group``, ``keep_bits``, ``promote`` apply there,
    ``fmt`` is the tensor-core register format, fp32 on Hopper). Returns float64 values of
    shape ``x.shape[1:]``.
    """
    f = parse_format(fmt)
    if strategy not in STRATEGIES:
        raise ValueError(f"parameter 'strategy' must be one of {list(STRATEGIES)}, got {strategy!r}")
    if block is not None:
        block = _check_block(block)
    if strategy == "two_level" and block is None:
        raise ValueError("parameter 'block' is required for strategy 'two_level' (an integer >= 1)")
    arr = _as_terms(x)
    shape = arr.shape[1:]
    x2 = np.ascontiguousarray(arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:]))))
    n = x2.shape[0]
    if strategy == "hopper":
        return hopper_sum(arr, group=group, keep_bits=keep_bits, promote=promote, fmt=f)
    if n == 0:
        return np.zeros(shape)
    margs = _fmt_args(f)
    if strategy == "flat":
        y = _dtype_path(x2, f)
        if y is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                out = _sequential_accumulate(y).astype(np.float64)
        else:
            out = _flat_nb(x2, np.zeros(x2.shape[1]), *margs, _threads())
    elif strategy == "two_level":
        y = _dtype_path(x2, f)
        if y is not None and f.exp_bits <= 8 and f.man_bits <= 23:
            nb = -(-n // block)
            pad = nb * block - n
            if pad:   # zeros added to a partial leave it unchanged (x + 0 = x exactly)
                y = np.concatenate([y, np.zeros((pad,) + y.shape[1:], dtype=y.dtype)])
            yb = y.reshape(nb, block, -1)
            with np.errstate(over="ignore", invalid="ignore"):
                parts = np.add.accumulate(yb, axis=1)[:, -1, :]
                out = _sequential_accumulate(parts.astype(np.float32)).astype(np.float64)
        else:
            out = _two_level_nb(x2, block, *margs, _threads())
    elif strategy == "pairwise":
        out = _pairwise_nb(x2, *margs, _threads())
    else:
        out = _kahan_nb(x2, *margs, _threads())
    return out.reshape(shape)


def hopper_sum(x: Any, group: int = 32, keep_bits: int = 14, promote: int | None = None,
               fmt: str | FloatFormat = "fp32") -> np.ndarray:
    """A model of Hopper FP8 tensor-core accumulation (DeepSeek-V3 report §3.3.2, §3.5.2).

    In each group of ``group`` consecutive terms (products; 32 = one WGMMA's K for FP8),
    the terms and the current accumulator are aligned to the largest exponent among them
    and truncated toward zero to multiples of ``2^(E + 1 - keep_bits)`` (the largest item
    keeps ``keep_bits`` significant bits, "around 14 bits" in the report), then summed
    exactly and stored in the accumulator (format ``fmt``, fp32). ``promote=N_C``: every
    N_C terms (a multiple of ``group``; 128 in the report) the accumulator is added into a
    true float32 register (rounded to nearest) and reset, which is the report's fix and, at
    one flash-attention step per promotion, vLLM's two-level accumulation. ``promote=None``:
    no promotion. This is a model calibrated on published descriptions, not silicon.
    """
    f = parse_format(fmt)
    group = _check_block(group, "group")
    keep_bits = _check_block(keep_bits, "keep_bits")
    if keep_bits > 40:
        raise ValueError(f"parameter 'keep_bits' must be between 1 and 40, got {keep_bits}")
    if promote is not None:
        promote = _check_block(promote, "promote")
        if promote % group:
            raise ValueError(f"parameter 'promote' must be a multiple of group={group}, got {promote}")
    arr = _as_terms(x)
    shape = arr.shape[1:]
    x2 = np.ascontiguousarray(arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:]))))
    if x2.shape[0] == 0:
        return np.zeros(shape)
    out = _hopper_nb(x2, group, keep_bits, promote or 0, *_fmt_args(f), _threads())
    return out.reshape(shape)


def exact_sum(x: Any) -> np.ndarray:
    """Reference sum along axis 0 in double-double (error about 2^-100 relative): the
    "truth" errors are measured against."""
    arr = _as_terms(x)
    x2 = np.ascontiguousarray(arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:]))))
    return _exact_nb(x2).reshape(arr.shape[1:])


def equal_terms_sum(n: int, fmt: str | FloatFormat, strategy: str = "flat", block: int | None = None,
                    **kw: Any) -> float:
    """The sum of ``n`` equal terms ``1/n`` (a flat softmax) accumulated with ``strategy``."""
    n = _check_block(n, "n")
    f = parse_format(fmt)
    return _equal_terms_cached(n, f, strategy, block, tuple(sorted(kw.items())))


@lru_cache(maxsize=512)
def _equal_terms_cached(n: int, f: FloatFormat, strategy: str, block: int | None,
                        kw: tuple[tuple[str, Any], ...]) -> float:
    t = 1.0 / n
    dt = f.dtype
    if strategy == "flat" and dt is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            td = np.asarray(t).astype(dt)
        if float(td) == t:   # the term is exact in the dtype: accumulate in it, chunk by chunk
            acc = np.zeros(1, dtype=dt)
            full = np.full(min(n, _CHUNK), td, dtype=dt)
            for s in range(0, n, _CHUNK):
                m = min(_CHUNK, n - s)
                acc = np.add.accumulate(np.concatenate([acc, full[:m]]))[-1:]
            return float(acc[0])
    return float(accumulate(np.full(n, t), f, strategy, block=block, **dict(kw)))


@lru_cache(maxsize=128)
def _flat_sum_limit(f: FloatFormat) -> int:
    k = min(f.man_bits + 1, f.man_bits - f.emin)
    n = 1 << k
    if 2 * n <= (1 << 26):
        ok = equal_terms_sum(n, f) == 1.0
        ok_next = equal_terms_sum(2 * n, f) == 1.0
        if not ok or ok_next:  # pragma: no cover - would contradict the proof
            raise AssertionError(f"flat_sum_limit proof does not hold for {f.name}")
    return n


def flat_sum_limit(fmt: str | FloatFormat) -> int:
    """Largest power of two n for which n terms 1/n summed flat in ``fmt`` give exactly 1.0.

    With ``m`` stored fraction bits the partial sums j/n stay exact while n <= 2^(m+1); for
    n = 2^(m+2) the running sum stalls at 1/2 (adding 1/n there is a tie, and ties go to
    the even 1/2). The term 1/n must itself be representable: n <= 2^(m - emin). So the
    limit is ``2^min(m + 1, m - emin)``. This is checked by running the sums (n at the
    limit gives 1.0, 2n does not) whenever 2n <= 2^26; beyond that the proof above stands.
    """
    return _flat_sum_limit(parse_format(fmt))


# ------------------------------------------------------------------ the post's Block 3
_POST_KINDS = {"fp32": 0, "bf16": 1, "fp16": 2}


def post_flat_sum(n: int, kind: str, two_level: bool = False) -> float:
    """What the post's Block 3 ``flat_sum(n, kind, two_level)`` returns, computed fast.

    Under numpy 2 (NEP 50) the post's loop does: ``acc`` float32, ``term = 1/n`` turned into
    float32 by ``acc + term``; ``fp32`` and ``two_level=True`` (any kind): a plain float32
    running sum (the "2-level" column is not two-level at all); ``bf16``: float32 addition,
    then the bit trick rounds to bf16 (two roundings); ``fp16``: the first step is
    ``float16(float32(1/n))``, after which ``acc`` is a float16 scalar and every step is
    ``float16 acc + float16(1/n)``, correctly rounded. Verified against the literal loop
    (:func:`post_flat_sum_literal`) in the tests.
    """
    n = _check_block(n, "n")
    if kind not in _POST_KINDS:
        raise ValueError(f"parameter 'kind' must be one of {list(_POST_KINDS)}, got {kind!r}")
    return float(_post_loop_nb(n, 3 if two_level else _POST_KINDS[kind]))


def post_flat_sum_literal(n: int, kind: str, two_level: bool = False) -> float:
    """The post's Block 3 code, verbatim (a Python loop: slow; for tests and the bench)."""
    def round_acc(x, kind):
        if kind == "fp32":
            return np.float32(x)
        if kind == "bf16":
            u = np.asarray(x, np.float32).view(np.uint32)
            return np.uint32((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)
        return np.float16(x)

    term, acc = 1.0 / n, np.float32(0.0)
    for _ in range(n):
        acc = np.float32(acc + term) if two_level else round_acc(acc + term, kind)
    return float(acc)


# ------------------------------------------------------------------ bounds and profiles
def error_bound(kind: str, n: Any, fmt: str | FloatFormat, abs_sum: Any = 1.0,
                block: int | None = None) -> np.ndarray:
    """Textbook bounds on |computed - exact| for summing n terms with sum of |x| = abs_sum.

    ``kind``: ``recursive`` γ_{n-1}·Σ|x| (Higham, Accuracy and Stability, (4.4)), with
    γ_k = k·u/(1 - k·u) (inf once k·u >= 1); ``pairwise`` γ_{⌈log2 n⌉}·Σ|x|;
    ``blocked`` ((b - 1)·u + (n/b)·u32)·Σ|x| to first order (inner fmt, outer float32);
    ``probabilistic`` √n·u·Σ|x| (Higham & Mary 2019: holds with high probability for
    independent rounding errors, constant λ ≈ 1); ``kahan`` (2u + n·u²)·Σ|x|.
    """
    f = parse_format(fmt)
    u = f.unit_roundoff
    nn = np.asarray(n, dtype=np.float64)
    s = np.asarray(abs_sum, dtype=np.float64)

    def gamma(k):
        ku = k * u
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(ku < 1, ku / (1 - ku), np.inf)

    if kind == "recursive":
        return gamma(np.maximum(nn - 1, 0)) * s
    if kind == "pairwise":
        return gamma(np.ceil(np.log2(np.maximum(nn, 1)))) * s
    if kind == "blocked":
        b = _check_block(block)
        return ((b - 1) * u + (nn / b) * 2.0 ** -24) * s
    if kind == "probabilistic":
        return np.sqrt(nn) * u * s
    if kind == "kahan":
        return (2 * u + nn * u * u) * s
    raise ValueError("parameter 'kind' must be one of ['recursive', 'pairwise', 'blocked', "
                     f"'probabilistic', 'kahan'], got {kind!r}")


PROFILES = ("flat", "needle_start", "needle_middle", "needle_end", "zipf", "pv")


def weight_profile(kind: str, n: int, needle_mass: float = 0.5, zipf_s: float = 1.0,
                   d: int = 16, seed: int = 0) -> np.ndarray:
    """Attention-like terms to accumulate, shape (n,) or (n, d) for ``pv``.

    ``flat``: 1/n each. ``needle_<where>``: one weight holding ``needle_mass`` of the mass at
    the start, middle or end, the rest flat. ``zipf``: p_i ∝ 1/(i+1)^zipf_s, positions shuffled
    (seeded). ``pv``: the products p_i·V[i, c] for a flat-plus-needle p (needle in the middle)
    and V ~ N(0, 1) of shape (n, d) (seeded), so the sum is P·V, not only Σp. Weights are
    normalised in float64 (sum 1 up to float64 rounding; errors are measured against
    :func:`exact_sum` of the same terms).
    """
    n = _check_block(n, "n")
    if kind not in PROFILES:
        raise ValueError(f"parameter 'kind' must be one of {list(PROFILES)}, got {kind!r}")
    if not (0.0 <= needle_mass < 1.0):
        raise ValueError(f"parameter 'needle_mass' must be in [0, 1), got {needle_mass!r}")
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return np.full(n, 1.0 / n)
    if kind.startswith("needle") or kind == "pv":
        where = {"needle_start": 0, "needle_middle": n // 2, "needle_end": n - 1, "pv": n // 2}[kind]
        p = np.full(n, (1.0 - needle_mass) / max(n - 1, 1)) if n > 1 else np.ones(1)
        if n > 1:
            p[where] = needle_mass
        if kind == "pv":
            v = rng.standard_normal((n, d))
            return p[:, None] * v
        return p
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** zipf_s
    w = w / math.fsum(w)
    return w[rng.permutation(n)]


# ------------------------------------------------------------------ notebook 04 tables
POST_ULP_MANTISSA = {"fp32": 23, "fp16": 10, "bf16": 8}   # the exponents the post's code prints


def flat_sum_table(n_tokens: list[int]) -> "pd.DataFrame":
    """The post's Block 3 table for ``n_tokens``, as the post's own code computes it under
    numpy 2 (:func:`post_flat_sum`): columns n, fp32_flat, fp16_flat, bf16_flat, bf16_two_level."""
    import pandas as pd
    rows = []
    for n in n_tokens:
        n = _check_block(n, "n_tokens")
        rows.append({"n": n, "fp32_flat": post_flat_sum(n, "fp32"), "fp16_flat": post_flat_sum(n, "fp16"),
                     "bf16_flat": post_flat_sum(n, "bf16"),
                     "bf16_two_level": post_flat_sum(n, "bf16", two_level=True)})
    return pd.DataFrame(rows, columns=["n", "fp32_flat", "fp16_flat", "bf16_flat", "bf16_two_level"])


def post_table_text(table: "pd.DataFrame") -> str:
    """``table`` printed the way the post's Block 3 prints it (same widths and digits)."""
    lines = ["Summing n equal weights that must total 1.0 (what softmax guarantees):",
             f"{'n tokens':>9s} {'fp32 flat':>11s} {'fp16 flat':>11s} {'bf16 flat':>11s} {'bf16 2-level':>13s}"]
    for r in table.itertuples(index=False):
        row = [r.fp32_flat, r.fp16_flat, r.bf16_flat, r.bf16_two_level]
        lines.append(f"{int(r.n):9d} " + " ".join(f"{v:11.6f}" if i < 3 else f"{v:13.6f}"
                                                 for i, v in enumerate(row)))
    return "\n".join(lines)


def post_ulp_lines() -> list[str]:
    """The post's three ULP lines, generated by its own formula (exponents 23, 10, 8)."""
    out = []
    for kind, mantissa in POST_ULP_MANTISSA.items():
        out.append(f"  {kind}: 1 ULP at a sum of 1.0 = 2^-{mantissa} = {2.0**-mantissa:.6f} "
                   f"-> a flat distribution longer than {int(2**mantissa):,} tokens stops accumulating")
    return out


def strategy_table(n_tokens: list[int], block: int = 128, fmt: str = "bf16") -> "pd.DataFrame":
    """Sum of n terms 1/n under each accumulation, next to the post's "2-level" column.

    Columns: n; post_bf16_flat (the post's double rounding); bf16_flat (one rounding per
    add); post_two_level (the post's column: a float32 running sum); two_level (true
    two-level: ``block`` terms in ``fmt``, partials into float32); hopper (the FP8
    tensor-core model, no promotion); hopper_promoted (promotion every 128 terms);
    post_fp16_flat (the post: 1/n rounded to fp16 first) and fp16_flat (exact 1/n added,
    one rounding); fp32_flat.
    """
    import pandas as pd
    block = _check_block(block)
    rows = []
    for n in n_tokens:
        n = _check_block(n, "n_tokens")
        x = np.full(n, 1.0 / n)
        rows.append({"n": n,
                     "post_bf16_flat": post_flat_sum(n, "bf16"),
                     f"{fmt}_flat": float(running_sum(x, fmt)),
                     "post_two_level": post_flat_sum(n, "bf16", two_level=True),
                     "two_level": float(running_sum(x, fmt, block=block)),
                     "hopper": float(hopper_sum(x)),
                     "hopper_promoted": float(hopper_sum(x, promote=128)),
                     "post_fp16_flat": post_flat_sum(n, "fp16"),
                     "fp16_flat": float(running_sum(x, "fp16")),
                     "fp32_flat": float(running_sum(x, "fp32"))})
    return pd.DataFrame(rows)


def stall_table(formats: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "e8m13"),
                ) -> "pd.DataFrame":
    """Per format: stored fraction bits p, ULP at 1.0, the measured flat-sum limit (largest
    power-of-two n with sum exactly 1.0), 2^(p+1), and the sums run at the limit and twice it."""
    import pandas as pd
    rows = []
    for name in formats:
        f = parse_format(name)
        lim = flat_sum_limit(f)
        rows.append({"format": f.name, "fraction_bits": f.man_bits, "ulp_at_1": f.ulp(1.0),
                     "limit_n": lim, "two_pow_p_plus_1": 2 ** (f.man_bits + 1),
                     "sum_at_limit": equal_terms_sum(lim, f) if lim <= 1 << 26 else float("nan"),
                     "sum_at_2x_limit": equal_terms_sum(2 * lim, f) if lim <= 1 << 25 else float("nan")})
    return pd.DataFrame(rows)


def errata_table(n_tokens: list[int] | None = None, block: int = 128) -> "pd.DataFrame":
    """The post's claims about Block 3 against measured runs: claim, post, measured, verdict.

    Every measured value comes from running sums here (fp32 at n = 2^23, 2^24, 2^25 included).
    """
    import pandas as pd
    n_tokens = list(n_tokens or [64, 256, 1024, 4096, 16384, 65536, 131072])
    rows = []

    def stall(fmt: str) -> tuple[int, str]:
        lim = flat_sum_limit(fmt)
        runs = {k: equal_terms_sum(k, fmt) for k in (lim // 2, lim, 2 * lim)}
        txt = ", ".join(f"n={k:,}: {v:.6g}" for k, v in runs.items())
        return lim, txt

    for kind, post_tokens in (("fp32", 8_388_608), ("fp16", 1_024), ("bf16", 256)):
        lim, txt = stall(kind)
        rows.append({"claim": f"{kind}: a flat distribution longer than {post_tokens:,} tokens stops accumulating",
                     "post": f"{post_tokens:,}", "measured": f"{lim:,} (last n with sum 1.0; {txt})",
                     "verdict": "correct" if lim == post_tokens else
                     f"wrong: the sum stays exactly 1.0 up to {lim:,} = 2^(p+1) tokens"})
    for kind, mant in POST_ULP_MANTISSA.items():
        ulp = parse_format(kind).ulp(1.0)
        true_exp = -int(math.log2(ulp))
        rows.append({"claim": f"{kind}: 1 ULP at a sum of 1.0 = 2^-{mant}", "post": f"2^-{mant}",
                     "measured": f"2^-{true_exp} = {ulp:.6g}",
                     "verdict": "correct" if true_exp == mant else
                     f"wrong: {kind} stores {true_exp} fraction bits, so its ULP at 1.0 is 2^-{true_exp}"})
    fb = parse_format("fp16")
    n1, n2 = 2 ** (fb.man_bits + 1), 2 ** (fb.man_bits + 2)
    v1, v2 = equal_terms_sum(n1, fb), equal_terms_sum(n2, fb)
    rows.append({"claim": "The floor is 2^-mantissa: an increment is lost once it falls below one ULP of the sum",
                 "post": "n > 2^mantissa stalls",
                 "measured": f"fp16: n={n1}: {v1:g}, n={n2}: {v2:g} (the sum stalls at 1/2, where 1/{n2} is half "
                             f"an ULP: a tie, rounded to the even 1/2)",
                 "verdict": "correct" if v2 == 1.0 or v1 != 1.0 else
                            "wrong by 2x: the stall starts at n > 2^(p+1), p = stored fraction bits; the sum stops "
                            "at 1/2, where the ULP is half the ULP at 1.0"})
    # "two-level returns 1.000000 at every context length tested"
    post_tl = [post_flat_sum(n, "bf16", two_level=True) for n in n_tokens]
    true_tl = [float(running_sum(np.full(n, 1.0 / n), "bf16", block=block)) for n in n_tokens]
    all_one = all(f"{v:.6f}" == "1.000000" for v in true_tl)
    rows.append({"claim": "two-level returns 1.000000 at every context length tested",
                 "post": "1.000000 x %d" % len(n_tokens),
                 "measured": f"post's column (float32 running sum): {sorted(set(f'{v:.6f}' for v in post_tl))}; "
                             f"true two-level (bf16 blocks of {block}, fp32 partials): "
                             f"{sorted(set(f'{v:.6f}' for v in true_tl))}",
                 "verdict": ("holds, but the post's column is a float32 running sum, not two-level; true two-level "
                             f"with block {block} also prints 1.000000") if all_one else
                            "does not hold for true two-level accumulation at these n"})
    # "the truth sits between the flat and two-level columns"
    between = []
    for n in n_tokens:
        x = np.full(n, 1.0 / n)
        h = float(hopper_sum(x))
        between.append(float(running_sum(x, "bf16")) <= h <= post_flat_sum(n, "bf16", two_level=True))
    rows.append({"claim": "real tensor cores: the truth sits between the flat and two-level columns",
                 "post": "between", "measured": f"Hopper FP8 model (14 bits, groups of 32, no promotion) between "
                                                f"bf16 flat and two-level at {sum(between)} of {len(between)} n",
                 "verdict": "consistent with the model" if all(between) else "not at every n in the model"})
    return pd.DataFrame(rows, columns=["claim", "post", "measured", "verdict"])


def reproduction_checks(table: "pd.DataFrame") -> list:
    """Checks of ``table`` (from :func:`flat_sum_table`) against the post's printed Block 3
    output, to the digits printed, for every n the post printed; and of the ULP lines."""
    from . import post, report
    printed = post.flat_sum_table()
    checks = []
    ours = {int(r.n): r for r in table.itertuples(index=False)}
    for r in printed.itertuples(index=False):
        n = int(r.n)
        if n not in ours:
            continue
        for col in ("fp32_flat", "fp16_flat", "bf16_flat", "bf16_two_level"):
            checks.append(report.check_printed(f"n={n:,} {col}", getattr(r, col), getattr(ours[n], col), ".6f"))
    for r in post.ulp_lines().itertuples(index=False):
        mant = POST_ULP_MANTISSA[r.fmt]
        checks.append(report.check_printed(f"{r.fmt} ULP line: 2^-{r.mantissa}", r.ulp, 2.0 ** -mant, ".6f"))
        checks.append(report.check_printed(f"{r.fmt} ULP line: tokens", r.tokens, int(2 ** mant), ","))
    return checks


def errata_checks(errata: "pd.DataFrame") -> list:
    """The errata rows as report.Check items (agrees when the measured verdict upholds the claim)."""
    from . import report
    return [report.Check(r.claim, r.post, r.measured,
                         r.verdict.startswith(("correct", "holds", "consistent")), r.verdict)
            for r in errata.itertuples(index=False)]
