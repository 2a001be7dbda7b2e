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

import csv
import math
from typing import Any

import ml_dtypes
import numba
import numpy as np

from kvcost.floats import round_to
from kvcost.numerics._jit import OUT_FP32, OUT_TRUNC_INF
from kvcost.numerics.fa3kernel import all_e4m3, all_in_format, attend_nb, lanes32, row, store_e4m3_nb, weights_nb
from kvcost.numerics.instructions import OPERAND_TYPES, Unit, get
from kvcost.numerics.kernel_facts import head_dim as head_dim_of
from kvcost.numerics.kernel_facts import rows as kernel_facts_rows
from kvcost.paths import data_path

__all__ = [
    "ACCUMULATORS",
    "LOG2E",
    "L_ACCUMULATORS",
    "P_FORMATS",
    "QK_MODES",
    "STORE_FORMATS",
    "UNIT_ARCHS",
    "attend",
    "attend_row",
    "exact_attention",
    "kernel_facts",
    "store",
    "tile_sizes",
    "unit_for",
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
_P_EMIN = {0: -6, 1: -126, 2: -126, 3: -1074, 4: -7}     # the smallest normal exponent P aligns by
_SCHEME = {"T": 0, "GTR": 3}
_OUT = {"RZ-E8M13": OUT_TRUNC_INF, "RZ-FP32": OUT_TRUNC_INF, "RNE-FP32": OUT_FP32}


def _attention_units() -> dict[str, dict[str, str]]:
    with open(data_path("tensorcore", "attention_units.csv"), newline="", encoding="utf-8") as fh:
        return {r["arch"]: r for r in csv.DictReader(fh)}


_UNITS = _attention_units()
#: The GPUs whose FP8 attention unit kvcost models (``data/tensorcore/attention_units.csv``).
UNIT_ARCHS = tuple(_UNITS)


def unit_for(arch: str) -> Unit:
    """The FP8 instruction ``arch``'s attention kernels run P·V (and QKᵀ) on, from
    ``data/tensorcore/attention_units.csv``: Hopper wgmma e4m3, Blackwell tcgen05 ``kind::f8f6f4`` e4m3,
    Ada / RTX Blackwell mma.sync e4m3, CDNA3 MFMA fp8 (e4m3fnuz)."""
    if arch not in _UNITS:
        raise ValueError(f"parameter 'arch' must be one of {list(UNIT_ARCHS)}, got {arch!r}")
    return get(arch, _UNITS[arch]["instr"])


def _unit(arch: str, instr: str | None = None) -> Unit:
    """arch's attention unit, or the instruction ``instr`` of arch (a kernel whose P·V is not FP8)."""
    return unit_for(arch) if instr is None else get(arch, instr)


def _unit_args(arch: str, frac_bits: Any, rounding: str, name: str = "frac_bits", instr: str | None = None) -> tuple:
    """(scheme, group, fb, fb2, nearest, okind, om, oemin, ofmax, cmin, zw) of arch's attention unit;
    ``frac_bits`` (when not None) narrows or widens the kept fraction bits, and the register with them
    (e8m{frac_bits}, truncated; CDNA3 keeps F2 - F more bits where the dot meets the accumulator)."""
    u = _unit(arch, instr)
    if rounding not in ("toward_zero", "nearest"):
        raise ValueError(f"parameter 'rounding' must be one of ['toward_zero', 'nearest'], got {rounding!r}")
    fb = u.frac_bits if frac_bits is None else _pos_int(name, frac_bits)
    if fb > 40:
        raise ValueError(f"parameter {name!r} must be an integer between 1 and 40, got {frac_bits!r}")
    om = 13 if u.rounding == "RZ-E8M13" else 23
    if frac_bits is not None:
        om = min(fb, 23)
    fb2 = u.frac_bits2 + fb - u.frac_bits if u.scheme == "GTR" else 0
    zw = 2.0 ** u.e_zero if u.scheme == "T" else 0.0
    return (_SCHEME[u.scheme], u.group, fb, fb2, rounding == "nearest", _OUT[u.rounding], om, -126,
            float(np.finfo(np.float32).max), 2.0 ** -126, zw)


def _operand_emin(x: np.ndarray, arch: str, which: str, instr: str | None = None) -> int:
    """The exponent a stored operand aligns by on arch's unit: its FP8 type's smallest normal when every
    value is of that type, else a bf16/fp32 operand's (-126)."""
    t = _unit(arch, instr).b_type if which == "b" else _unit(arch, instr).a_type
    if t == "e4m3":
        return OPERAND_TYPES[t][1] if all_e4m3(x) else -126
    name = OPERAND_TYPES[t][0]
    dt = getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else np.dtype(name)     # f16, f32: numpy's own
    fi = ml_dtypes.finfo(dt)
    ok = all_in_format(x, fi.nmant, fi.minexp, float(fi.max))    # compiled: no float64 copies of K and V
    if ok is None:                                                # inf or NaN: as ml_dtypes casts them
        with np.errstate(over="ignore", invalid="ignore"):
            ok = np.array_equal(np.asarray(x, np.float64).astype(dt).astype(np.float64), np.asarray(x, np.float64))
    return OPERAND_TYPES[t][1] if ok else -126


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
            frac_bits: Any, l_accumulator: str, rounding: str, arch: str, instr: str | None = None) -> tuple:
    _choice("p_format", p_format, P_FORMATS)
    _choice("accumulator", accumulator, ACCUMULATORS)
    _choice("l_accumulator", l_accumulator, L_ACCUMULATORS)
    flush = _pos_int("flush_every", flush_every, none_ok=True)
    bn = _pos_int("block_n", block_n)
    mo = _pos_int("max_offset", max_offset, lo=0)
    if mo > 16:
        raise ValueError(f"parameter 'max_offset' must be an integer between 0 and 16, got {max_offset!r}")
    sp = _pos_int("splits", splits)
    targs = _unit_args(arch, frac_bits, rounding, instr=instr)
    pk = _PK[p_format]
    if pk == 0 and _unit(arch, instr).a_type == "fp8":
        pk = 4                              # the GPU's e4m3 is e4m3fnuz (CDNA3)
    return (pk, _AK[accumulator], 0 if l_accumulator == "fp32" else 1, flush, bn, float(mo), sp, targs)


def _extra(rescale_threshold: Any, p_scale: Any) -> tuple[float, float]:
    """The compiled kernel's (thr, pscale): FA4's stale-max threshold and CK's scale_p (0: none)."""
    return (_nonneg_float("rescale_threshold", rescale_threshold),
            0.0 if p_scale is None else _pos_float("p_scale", p_scale))


def _nonneg_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not (math.isfinite(value) and 0 <= value <= 16):
        raise ValueError(f"parameter {name!r} must be a number between 0 and 16, got {value!r}")
    return float(value)


def _pos_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not (math.isfinite(value) and 0 < value <= 65536):
        raise ValueError(f"parameter {name!r} must be a number in (0, 65536] (or None), got {value!r}")
    return float(np.float32(value))


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
               frac_bits: int | None = None, l_accumulator: str = "fp32", rounding: str = "toward_zero",
               arch: str = "Hopper", rescale_threshold: float = 0.0, p_scale: float | None = None,
               instr: str | None = None) -> np.ndarray:
    """FlashAttention-3's FP8 forward pass for one query row (see the module docstring).

    ``scores`` (n,): already scaled, natural-log units (rounded to fp32 here); ``v`` (n, d):
    the stored values. ``p_format``: :data:`P_FORMATS` (``e4m3`` is the GPU's own: e4m3fnuz on CDNA3);
    ``accumulator``: :data:`ACCUMULATORS`; ``flush_every=N``: two-level accumulation every N blocks
    (None: never, the kernel before vLLM's fix); ``block_n``: keys per block (96 for FP8 decode at
    head_dim 128, see :func:`tile_sizes`); ``max_offset``: 8 for FP8; ``splits``: split-KV. ``arch``:
    the GPU whose FP8 unit runs P·V (:func:`unit_for`, bit for bit MMA-Sim); ``frac_bits``, when given,
    overrides the unit's kept fraction bits (the register narrowed on purpose, e8m{frac_bits}). Extra,
    to take the kernel apart: ``l_accumulator="exact"`` and ``accumulator="exact"`` sum in float64,
    ``rounding="nearest"`` cuts the tensor-core terms to nearest. Kernels other than FA3 (defaults: FA3's):
    ``rescale_threshold`` > 0 keeps the running max stale while a block raises it by at most that many log2
    units (FA4 on Blackwell), ``p_scale`` multiplies P by that number before the cast, the row sum counting
    the unscaled P (composable_kernel's ``scale_p``; use with ``max_offset=0``), and ``instr`` runs P·V on
    that instruction of ``arch`` (e.g. ``"m64n8k16.f32.bf16.bf16"``: a kernel that stores FP8 and
    multiplies in bf16) instead of :func:`unit_for`'s. Returns (d,) float64.
    """
    pk, ak, lk, flush, bn, mo, sp, targs = _common(p_format, accumulator, flush_every, block_n, max_offset,
                                                   splits, frac_bits, l_accumulator, rounding, arch, instr)
    extra = _extra(rescale_threshold, p_scale)
    s = _values(scores, "scores", 1)
    vv = _values(v, "v", 2)
    if vv.shape[0] != s.shape[0] or s.shape[0] < 1:
        raise ValueError(f"parameters 'scores' and 'v' must be shaped (n,) and (n, d) with n >= 1, got {s.shape} "
                         f"and {vv.shape}")
    s32 = round_to(np.asarray(s, dtype=np.float64), "fp32")
    d = vv.shape[1]
    width = max(d, 1)
    out = np.empty(d)
    pv32 = lanes32(pk, ak, targs[0], targs[2], targs[4], targs[5]) and all_e4m3(vv)
    if pv32:
        vv = np.ascontiguousarray(vv, dtype=np.float32)
    vw = weights_nb(vv, _operand_emin(vv, arch, "b", instr))
    row(s32, vv, vw, 0, s32.shape[0], LOG2E, pk, ak, lk, flush, bn, mo, sp, *targs, _P_EMIN[pk], out,
        np.empty((3, width)), np.empty((32, width)), np.empty((32, width)), np.empty(d), np.empty(d),
        np.empty(bn), np.empty(bn), pv32, np.empty((32, width), np.float32), np.empty(width, np.float32),
        np.empty(d, np.float32), np.empty((2, width), np.float32), *extra)
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
            return store_e4m3_nb(np.ascontiguousarray(a32).reshape(-1)).reshape(a32.shape)
        return a32.astype(ml_dtypes.bfloat16).astype(np.float32)
    r = round_to(a.astype(np.float64), {"e4m3": "fp8_e4m3", "bf16": "bf16", "fp32": "fp32"}[fmt], saturate=True)
    return r.astype(np.float32)


def attend(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
           q_format: str = "e4m3", kv_format: str = "e4m3", qk: str = "tensorcore", p_format: str = "e4m3",
           accumulator: str = "tensorcore", flush_every: int | None = None, block_n: int = 96,
           max_offset: int = 8, splits: int = 1, frac_bits: int | None = None, l_accumulator: str = "fp32",
           rounding: str = "toward_zero", arch: str = "Hopper", qk_frac_bits: int | None = None,
           rescale_threshold: float = 0.0, p_scale: float | None = None, instr: str | None = None,
           prepared: dict | None = None) -> np.ndarray:
    """FlashAttention-3's FP8 forward pass for many heads and rows, in parallel.

    ``q`` (heads, n_q, d), ``k`` and ``v`` (kv_heads, n_k, d) with heads a multiple of
    kv_heads (grouped-query attention: head h reads kv head h // (heads / kv_heads)). Q is
    stored in ``q_format`` and K, V in ``kv_format`` (:data:`STORE_FORMATS`, scale 1.0).
    ``causal``: query r sits at position n_k - n_q + r and sees keys up to it. S = QKᵀ
    (``qk``: :data:`QK_MODES`), scaled by ``softmax_scale`` (default 1/sqrt(d)) inside the
    exponent as the kernel does; the rest as :func:`attend_row`. QKᵀ runs on the same unit with its own
    fraction bits: ``frac_bits`` narrows P·V alone, ``qk_frac_bits`` (None: the unit's) QKᵀ alone.
    ``rescale_threshold``, ``p_scale``, ``instr`` as :func:`attend_row` (``instr`` for QKᵀ too).
    ``prepared``: a dict the caller owns and passes to several calls on the same ``q``, ``k``, ``v`` objects
    (unchanged between the calls: several kernels, or V swapped with K kept): each operand is stored,
    transposed and weighted once (:func:`_prepared`; results are the same with or without it).
    Returns (heads, n_q, d) float64.
    """
    pk, ak, lk, flush, bn, mo, sp, targs = _common(p_format, accumulator, flush_every, block_n, max_offset,
                                                   splits, frac_bits, l_accumulator, rounding, arch, instr)
    extra = _extra(rescale_threshold, p_scale)
    _choice("qk", qk, QK_MODES)
    memo = _prepared(prepared)
    qq, kk, vv = (memo(("store", f), x, lambda x=x, nm=nm, f=f, fn=fn: _stored_operand(x, nm, f, fn))
                  for x, nm, f, fn in ((q, "q", q_format, "q_format"), (k, "k", kv_format, "kv_format"),
                                       (v, "v", kv_format, "kv_format")))
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
    sargs = _unit_args(arch, qk_frac_bits, "toward_zero", "qk_frac_bits", instr)
    sfb, sok, som, soemin, sofmax = sargs[2], sargs[5], sargs[6], sargs[7], sargs[8]
    if sargs[0] != 0 and qk == "tensorcore":
        raise ValueError(f"parameter 'qk': QKᵀ on {arch}'s MFMA is not modelled; use qk='fp32' or 'exact'")
    # the float32-lane tensor core where its exactness conditions hold (e4m3 operands, truncation)
    e4 = (lambda x: memo(("e4m3",), x, lambda: all_e4m3(x)))
    qk32 = qk == "tensorcore" and lanes32(0, 0, sargs[0], sfb, False, sok) and \
        (q_format == "e4m3" or e4(qq)) and (kv_format == "e4m3" or e4(kk))
    pv32 = lanes32(pk, _AK[accumulator], targs[0], targs[2], targs[4], targs[5]) and \
        (kv_format == "e4m3" or e4(vv))
    if (qk32 or pv32) and all(x.dtype == np.float32 or np.array_equal(x.astype(np.float32), x) for x in (qq, kk, vv)):
        qq, kk, vv = (memo(("f32",), x, lambda x=x: np.ascontiguousarray(x, dtype=np.float32)) for x in (qq, kk, vv))
    kT = memo(("T",), kk, lambda: np.ascontiguousarray(np.swapaxes(kk, 1, 2)))
    emins = [memo(("emin", arch, instr, w), x, lambda x=x, w=w: _operand_emin(x, arch, w, instr))
             for x, w in ((kT, "b"), (vv, "b"), (qq, "a"))]
    kwT = memo(("weights", emins[0]), kT, lambda: weights_nb(kT, emins[0]))
    vw = memo(("weights", emins[1]), vv, lambda: weights_nb(vv, emins[1]))
    qemin = emins[2]
    return attend_nb(qq, kT, kwT, vv, vw, hq // hk, bool(causal), scale_log2, pk, ak, lk, _AK[qk], flush, bn, mo, sp,
                     *targs, _P_EMIN[pk], qemin, sfb, sok, som, soemin, sofmax, qk32, pv32, numba.get_num_threads(),
                     *extra)


def _stored_operand(x: Any, name: str, fmt: str, fmt_name: str) -> np.ndarray:
    """Operand ``x`` stored in ``fmt`` (:func:`store`); float32 e4m3 values already are, and are read in place
    (the compiled pass never writes its operands): no copy of a long cache."""
    a = _values(x, name, 3)
    if fmt == "e4m3" and a.dtype == np.float32 and all_e4m3(a):
        return a
    return store(a, fmt, fmt_name)


def _prepared(cache: dict | None):
    """``memo(step, x, make)``: ``make()``, kept in ``cache`` under (step, id(x)) with ``x`` itself, so that a
    later call on the same object (``is``, not an equal copy, and never a new object at a reused address) takes
    it; without a cache, ``make()``."""
    if cache is not None and not isinstance(cache, dict):
        raise ValueError(f"parameter 'prepared' must be a dict (or None), got {type(cache).__name__}")

    def memo(step: tuple, x: Any, make: Any) -> Any:
        if cache is None:
            return make()
        hit = cache.get((step, id(x)))
        if hit is not None and hit[0] is x:
            return hit[1]
        out = make()
        cache[(step, id(x))] = (x, out)
        return out
    return memo


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


def kernel_facts() -> list[dict[str, str]]:
    """The FP8 attention kernels' facts as data (``data/attention_kernels.csv``, each row cited first-hand:
    see ``data/attention_kernels.md``), one dict per kernel x phase x head_dim x fix, as strings
    (:func:`kvcost.numerics.kernel_facts.rows`)."""
    return kernel_facts_rows()


def tile_sizes(head_dim: int) -> dict[str, int]:
    """FA3's FP8 kBlockN for ``head_dim`` in vLLM's fork, read from ``data/attention_kernels.csv``
    (hopper/tile_size.h): decode (one MMA warpgroup), chunked prefill before the two-level fix and with it
    (PR #104 with PR #125's tiles, the fork's state now). The kernels' other facts, as they run:
    :func:`kvcost.numerics.kernels.kernel`."""
    rows = {(r["phase"], r["fix"]): int(float(r["block_n"])) for r in kernel_facts()
            if r["kernel"] == "fa3_fp8_vllm" and head_dim_of(r["head_dim"]) == head_dim}
    if not rows:
        have = sorted({head_dim_of(r["head_dim"]) for r in kernel_facts() if r["kernel"] == "fa3_fp8_vllm"})
        raise ValueError(f"parameter 'head_dim' must be one of {have}, got {head_dim!r}")
    return {"decode": rows[("decode", "none")], "prefill_before_fix": rows[("chunked prefill", "none")],
            "prefill_two_level": rows[("chunked prefill", "pr104+pr125")]}
