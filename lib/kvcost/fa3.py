"""FlashAttention-3's FP8 forward pass on Hopper, emulated operation by operation on the CPU.

What the kernel does, per query row (sources and line references: ``data/fa3_kernel_facts.md``):

1. S = Q Kᵀ on the tensor core, contracting head_dim from zero (``kvcost.tensorcore``: 32
   products per instruction, e8m13 register).
2. KV blocks of ``block_n`` keys are visited **last to first**. Per block: the running max m
   grows; the old row sum and acc_o are rescaled by exp2((m_old - m_new)·scale_log2) in fp32;
   P = exp2(S·scale_log2 - (m·scale_log2 - max_offset)) in fp32, so P ∈ [0, 2^max_offset]
   (``Max_offset = 8`` for FP8); the row sum l adds the fp32 P on the CUDA cores.
3. P is cast to e4m3 (round to nearest, saturating) and P·V goes through the tensor core
   **into acc_o itself** (c = acc_o, no zeroing between blocks): the accumulation that loses
   mass at long range. ``flush_every=N`` is vLLM's fix (flash-attention PR #104 for N = 1, PR
   #122 for N > 1): acc_o restarts from zero and is merged into a true fp32 register, with the
   rescales deferred into one factor, every N blocks.
4. Split-KV: S contiguous splits, each as above, combined in fp32 by log-sum-exp.
5. Output acc_o · (1/l), in fp32.

fp32 operations are emulated exactly rounded (float64 products are exact; sums go through
TwoSum). Two departures from the GPU, both below fp32's own error: exp2 is correctly rounded
(the GPU's ``ex2.approx`` is within 2 ulp), and the row sum l is one sequential fp32 chain
(the kernel keeps four per-thread chains and adds them at the end).

:func:`attend_row` takes one row's scores; :func:`attend` runs many heads and rows (causal
or not, grouped-query heads) from Q, K, V stored in the project's formats, in parallel.

Speed without changing a bit: when Q, K (for S) and V (for P·V) hold e4m3 values -- the kernel's
own case -- the tensor-core steps run in float32 lanes (``tensorcore._mma_rows32``), and fp32
roundings use the hardware conversion; the tests hold both to the float64 emulation bit for bit.
The compiled kernel is :mod:`kvcost.fa3kernel`; this module checks arguments and drives it.
"""
from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numba
import numpy as np

from .fa3kernel import FB32, _all_e4m3, _attend_nb, _pv32, _row, _store_e4m3_nb
from .floats import round_to
from .tensorcore import FRAC_BITS, out_args

__all__ = [
    "ACCUMULATORS",
    "LOG2E",
    "L_ACCUMULATORS",
    "P_FORMATS",
    "QK_MODES",
    "STORE_FORMATS",
    "attend",
    "attend_row",
    "exact_attention",
    "store",
    "tile_sizes",
]

#: P cast before P·V: ``e4m3`` (OCP E4M3FN, nearest, saturating at 448), ``bf16``, ``fp32``,
#: ``exact`` (float64, no cast).
P_FORMATS = ("e4m3", "bf16", "fp32", "exact")
#: ``tensorcore`` (the FP8 unit, c = acc_o), ``fp32`` (an fp32 FMA chain), ``exact`` (float64).
ACCUMULATORS = ("tensorcore", "fp32", "exact")
#: The row sum l: ``fp32`` (the kernel's) or ``exact`` (float64).
L_ACCUMULATORS = ("fp32", "exact")
#: S = QKᵀ: ``tensorcore`` (the kernel's), ``fp32`` (an fp32 FMA chain), ``exact``.
QK_MODES = ("tensorcore", "fp32", "exact")
#: Storage of Q, K, V at scale 1.0 (as vLLM ships FP8 KV without calibration).
STORE_FORMATS = ("e4m3", "bf16", "fp32", "exact")
LOG2E = float(np.float32(math.log2(math.e)))     # the fp32 constant the kernel multiplies by
_PK = {"e4m3": 0, "bf16": 1, "fp32": 2, "exact": 3}
_AK = {"tensorcore": 0, "fp32": 1, "exact": 2}


# ------------------------------------------------------------------ checks
def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"parameter {name!r} must be one of {list(allowed)}, got {value!r}")
    return value


def _pos_int(name: str, value: Any, lo: int = 1, none_ok: bool = False) -> int:
    if value is None and none_ok:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        extra = " (or None)" if none_ok else ""
        raise ValueError(f"parameter {name!r} must be an integer >= {lo}{extra}, got {value!r}")
    return int(value)


def _common(p_format: str, accumulator: str, flush_every: Any, block_n: Any, max_offset: Any, splits: Any,
            frac_bits: Any, l_accumulator: str, rounding: str) -> tuple:
    _choice("p_format", p_format, P_FORMATS)
    _choice("accumulator", accumulator, ACCUMULATORS)
    _choice("l_accumulator", l_accumulator, L_ACCUMULATORS)
    flush = _pos_int("flush_every", flush_every, none_ok=True)
    bn = _pos_int("block_n", block_n)
    mo = _pos_int("max_offset", max_offset, lo=0)
    if mo > 16:
        raise ValueError(f"parameter 'max_offset' must be an integer between 0 and 16, got {max_offset!r}")
    sp = _pos_int("splits", splits)
    fb = _pos_int("frac_bits", frac_bits)
    targs = out_args(f"e8m{fb}" if fb <= 23 else "fp32", fb, rounding)
    return (_PK[p_format], _AK[accumulator], 0 if l_accumulator == "fp32" else 1, flush, bn, float(mo), sp, targs)


def _values(x: Any, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf" or arr.ndim != ndim:
        raise ValueError(f"parameter {name!r} must be a real array with {ndim} axes, got {arr.dtype} {arr.shape}")
    if arr.dtype == np.float32:
        return np.ascontiguousarray(arr)
    return np.ascontiguousarray(arr, dtype=np.float64)


# ------------------------------------------------------------------ public API
def attend_row(scores: Any, v: Any, *, p_format: str = "e4m3", accumulator: str = "tensorcore",
               flush_every: int | None = None, block_n: int = 96, max_offset: int = 8, splits: int = 1,
               frac_bits: int = FRAC_BITS, l_accumulator: str = "fp32", rounding: str = "toward_zero") -> np.ndarray:
    """FlashAttention-3's FP8 forward pass for one query row (see the module docstring).

    ``scores`` (n,): already scaled, natural-log units (rounded to fp32 here); ``v`` (n, d):
    the stored values. ``p_format``: :data:`P_FORMATS`; ``accumulator``: :data:`ACCUMULATORS`;
    ``flush_every=N``: two-level accumulation every N blocks (None: never, the kernel before
    vLLM's fix); ``block_n``: keys per block (96 for FP8 decode at head_dim 128, see
    :func:`tile_sizes`); ``max_offset``: 8 for FP8; ``splits``: split-KV; ``frac_bits``: the
    tensor core's kept fraction bits (the register is e8m{frac_bits}). Extra, to take the
    kernel apart: ``l_accumulator="exact"`` and ``accumulator="exact"`` sum in float64,
    ``rounding="nearest"`` cuts the tensor-core terms to nearest. Returns (d,) float64.
    """
    pk, ak, lk, flush, bn, mo, sp, targs = _common(p_format, accumulator, flush_every, block_n, max_offset,
                                                   splits, frac_bits, l_accumulator, rounding)
    s = _values(scores, "scores", 1)
    vv = _values(v, "v", 2)
    if vv.shape[0] != s.shape[0] or s.shape[0] < 1:
        raise ValueError(f"parameters 'scores' and 'v' must be shaped (n,) and (n, d) with n >= 1, got {s.shape} "
                         f"and {vv.shape}")
    s32 = round_to(np.asarray(s, dtype=np.float64), "fp32")
    d = vv.shape[1]
    width = max(d, 1)
    out = np.empty(d)
    pv32 = _pv32(pk, ak, targs) and _all_e4m3(vv)
    _row(s32, vv, 0, s32.shape[0], LOG2E, pk, ak, lk, flush, bn, mo, sp, *targs, out,
         np.empty((3, width)), np.empty((32, width)), np.empty(d), np.empty(d), np.empty(bn), np.empty(bn),
         pv32, np.empty((32, width), np.float32), np.empty(d, np.float32), np.empty((2, width), np.float32))
    return out


def store(x: Any, fmt: str, name: str = "fmt") -> np.ndarray:
    """``x`` as the kernel reads it from memory in ``fmt`` at scale 1.0 (:data:`STORE_FORMATS`:
    ``e4m3`` nearest and saturating at ±448, as vLLM's uncalibrated FP8 cache), float32 when
    exact there (``exact``: float64 unchanged)."""
    _choice(name, fmt, STORE_FORMATS)
    if fmt == "exact":
        return np.asarray(x, dtype=np.float64)
    a = np.asarray(x)
    a32 = a.astype(np.float32, copy=False)
    if a.dtype == np.float32 or np.array_equal(a32, a, equal_nan=True):
        # float32 input: ml_dtypes' cast rounds once, to nearest even (clipping first is SATFINITE)
        if fmt == "fp32":
            return a32
        if fmt == "e4m3":             # compiled: bit for bit ml_dtypes' SATFINITE cast (tested), 10x faster
            return _store_e4m3_nb(np.ascontiguousarray(a32).reshape(-1)).reshape(a32.shape)
        return a32.astype(ml_dtypes.bfloat16).astype(np.float32)
    r = round_to(a.astype(np.float64), {"e4m3": "fp8_e4m3", "bf16": "bf16", "fp32": "fp32"}[fmt], saturate=True)
    return r.astype(np.float32)


def attend(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
           q_format: str = "e4m3", kv_format: str = "e4m3", qk: str = "tensorcore", p_format: str = "e4m3",
           accumulator: str = "tensorcore", flush_every: int | None = None, block_n: int = 96,
           max_offset: int = 8, splits: int = 1, frac_bits: int = FRAC_BITS, l_accumulator: str = "fp32",
           rounding: str = "toward_zero") -> np.ndarray:
    """FlashAttention-3's FP8 forward pass for many heads and rows, in parallel.

    ``q`` (heads, n_q, d), ``k`` and ``v`` (kv_heads, n_k, d) with heads a multiple of
    kv_heads (grouped-query attention: head h reads kv head h // (heads / kv_heads)). Q is
    stored in ``q_format`` and K, V in ``kv_format`` (:data:`STORE_FORMATS`, scale 1.0).
    ``causal``: query r sits at position n_k - n_q + r and sees keys up to it. S = QKᵀ
    (``qk``: :data:`QK_MODES`), scaled by ``softmax_scale`` (default 1/sqrt(d)) inside the
    exponent as the kernel does; the rest as :func:`attend_row`. Returns (heads, n_q, d) float64.
    """
    pk, ak, lk, flush, bn, mo, sp, targs = _common(p_format, accumulator, flush_every, block_n, max_offset,
                                                   splits, frac_bits, l_accumulator, rounding)
    _choice("qk", qk, QK_MODES)
    qq, kk, vv = (store(_values(x, nm, 3), f, fn) for x, nm, f, fn in
                  ((q, "q", q_format, "q_format"), (k, "k", kv_format, "kv_format"), (v, "v", kv_format, "kv_format")))
    hq, nq, d = qq.shape
    hk, nk, dk = kk.shape
    if dk != d or vv.shape[:2] != (hk, nk) or hk < 1 or hq % hk or nk < 1 or nq < 1:
        raise ValueError(f"parameters 'q', 'k', 'v' must be shaped (heads, n_q, d), (kv_heads, n_k, d), "
                         f"(kv_heads, n_k, d_v) with heads a multiple of kv_heads; got {qq.shape}, {kk.shape}, "
                         f"{vv.shape}")
    if causal and nq > nk:
        raise ValueError(f"parameter 'causal': n_q = {nq} queries cannot sit among n_k = {nk} keys")
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"parameter 'softmax_scale' must be a positive number, got {softmax_scale!r}")
    scale_log2 = float(np.float32(np.float32(scale) * np.float32(math.log2(math.e))))
    s_args = out_args("e8m13", 13, "toward_zero")[2:] if qk == "tensorcore" else (0, 0, 0, 0.0)
    # the float32-lane tensor core where its exactness conditions hold (e4m3 operands, truncation)
    qk32 = qk == "tensorcore" and targs[0] <= FB32 and not targs[1] and \
        (q_format == "e4m3" or _all_e4m3(qq)) and (kv_format == "e4m3" or _all_e4m3(kk))
    pv32 = _pv32(pk, _AK[accumulator], targs) and (kv_format == "e4m3" or _all_e4m3(vv))
    if (qk32 or pv32) and all(x.dtype == np.float32 or np.array_equal(x.astype(np.float32), x) for x in (qq, kk, vv)):
        qq, kk, vv = (np.ascontiguousarray(x, dtype=np.float32) for x in (qq, kk, vv))
    kT = np.ascontiguousarray(np.swapaxes(kk, 1, 2))
    return _attend_nb(qq, kT, vv, hq // hk, bool(causal), scale_log2, pk, ak, lk, _AK[qk], flush, bn, mo, sp,
                      *targs, *s_args, qk32, pv32, numba.get_num_threads())


def exact_attention(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None) -> np.ndarray:
    """float64 softmax(q kᵀ · scale) v on the same (already stored) arrays: the reference."""
    qq, kk, vv = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq, nq, d = qq.shape
    hk, nk, _ = kk.shape
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    out = np.empty((hq, nq, vv.shape[2]))
    for h in range(hq):
        s = qq[h] @ kk[h // (hq // hk)].T * scale
        if causal:
            s = np.where(np.arange(nk)[None, :] <= (nk - nq + np.arange(nq))[:, None], s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        w = np.exp(s)
        out[h] = (w / w.sum(axis=1, keepdims=True)) @ vv[h // (hq // hk)]
    return out


def tile_sizes(head_dim: int) -> dict[str, int]:
    """FA3's FP8 kBlockN for ``head_dim`` (hopper/tile_size.h of vllm-project/flash-attention, read
    for data/fa3_kernel_facts.md): decode (one MMA warpgroup), prefill before and with two-level
    accumulation. Only the head dims the facts file records."""
    table = {64: {"decode": 128, "prefill_before_fix": 160, "prefill_two_level": 128},
             128: {"decode": 96, "prefill_before_fix": 224, "prefill_two_level": 192}}
    if head_dim not in table:
        raise ValueError(f"parameter 'head_dim' must be one of {sorted(table)}, got {head_dim!r}")
    return dict(table[head_dim])

