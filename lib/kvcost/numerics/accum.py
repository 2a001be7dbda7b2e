"""Running-sum accumulation in low precision, simulated exactly and fast.

Strategies: ``flat`` (``acc = RN_fmt(acc + x[i])`` after every term), ``two_level``
(``block`` terms flat in ``fmt``, partials into float32), ``pairwise``, ``kahan`` and
``hopper`` (a model of Hopper's FP8 tensor-core accumulation, DeepSeek-V3 report §3.3.2).

Every addition is exact-then-rounded-once (TwoSum, then one rounding), so there is no
float64-then-fmt double rounding. Formats numpy or ml_dtypes has take ``np.add.accumulate``
when the terms are exact in them (float32 carries >= 2p + 2 bits: the double rounding is
innocuous, Figueroa 1995); everything else runs in numba loops, parallel over columns.
NaN and inf propagate as in IEEE arithmetic; a sum that overflows ``fmt`` becomes inf (NaN
in ``fp8_e4m3``, which has no inf).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from kvcost.floats import FloatFormat, parse_format
from kvcost.numerics._jit import FP32_EMIN, FP32_MAN, FP32_MAX, add_nb, round_nb

__all__ = [
    "PROFILES",
    "STRATEGIES",
    "accumulate",
    "equal_terms_sum",
    "error_bound",
    "exact_sum",
    "flat_sum_limit",
    "hopper_sum",
    "post_block3_loop",
    "running_sum",
    "weight_profile",
]

STRATEGIES = ("flat", "two_level", "pairwise", "kahan", "hopper")
_CHUNK = 1 << 16          # rows per np.add.accumulate call (bounds the temporary)


# ------------------------------------------------------------------ compiled kernels
@njit(cache=True)
def post_block3_loop(n, kind):   # pragma: no cover - compiled
    """The post's Block 3 loop, operation for operation (``kind`` 0 fp32, 1 bf16, 2 fp16, 3 its "two-level"
    column): what ``kvcost.experiments.accumulator_floor.post_flat_sum`` returns, compiled."""
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
            acc = np.float32(round_nb(float(s), 0.0, 7, -126, 3.3895313892515355e38, math.inf))
        return float(acc)
    # fp16: first step float16(float32(term)); then float16 acc + float16(term), one rounding
    t16 = round_nb(term, 0.0, 10, -14, 65504.0, math.inf)
    acc = round_nb(float(t32), 0.0, 10, -14, 65504.0, math.inf)
    for _ in range(n - 1):
        acc = add_nb(acc, t16, 10, -14, 65504.0, math.inf)
    return acc



@njit(parallel=True, cache=True)
def _flat_nb(x, acc, m, emin, fmax, ovf, nth):   # pragma: no cover - compiled
    n, k = x.shape
    nchunk = max(1, min(k, nth))
    for c in prange(nchunk):
        j0 = c * k // nchunk
        j1 = (c + 1) * k // nchunk
        for i in range(n):
            for j in range(j0, j1):
                acc[j] = add_nb(acc[j], x[i, j], m, emin, fmax, ovf)
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
                part[j] = add_nb(part[j], x[i, j], m, emin, fmax, ovf)
            if (i + 1) % block == 0 or i == n - 1:
                for j in range(j0, j1):
                    out[j] = add_nb(out[j], part[j], FP32_MAN, FP32_EMIN, FP32_MAX, math.inf)
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
                y = add_nb(x[i, j], -comp[j], m, emin, fmax, ovf)
                t = add_nb(s, y, m, emin, fmax, ovf)
                comp[j] = add_nb(add_nb(t, -s, m, emin, fmax, ovf), -y, m, emin, fmax, ovf)
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
                    tc = round_nb(s, 0.0, m, emin, fmax, ovf)
                since += g1 - g0
                if promote > 0 and (since >= promote or g1 == n):
                    fp = add_nb(fp, tc, FP32_MAN, FP32_EMIN, FP32_MAX, math.inf)
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
                out[j] = round_nb(buf[0], 0.0, m, emin, fmax, ovf)
                continue
            cnt = n
            while cnt > 1:
                half = cnt // 2
                for i in range(half):
                    buf[i] = add_nb(buf[2 * i], buf[2 * i + 1], m, emin, fmax, ovf)
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
    """Sum ``x`` along axis 0 as a running accumulator in ``fmt`` computes it (docs/api.md).

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
                y = np.concatenate([y, np.zeros((pad, *y.shape[1:]), dtype=y.dtype)])
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
