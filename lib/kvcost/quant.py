"""Storage quantizers for a KV cache, each a round trip: quantize, then dequantize.

Every function returns what attention would read back from the cache, with the input's
shape. Arrays are shaped ``(..., tokens, channels)``; leading axes (layers, heads) are
independent.

- :func:`intk_roundtrip` — integer k-bit, symmetric (absmax, the post's ``quant``) or
  asymmetric (scale and zero point, as KIVI), per token, per channel, or per group.
- :func:`axis_table` — the post's first table (Block 2): per-token vs per-channel error.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from .attention import rel_l2  # the post's metric, shared with the needle experiment

__all__ = [
    "AXES", "intk_roundtrip", "rel_l2", "axis_table",
]

AXES = ("token", "channel")
Axis = Literal["token", "channel"]

# Symmetric int-k needs qmax = 2**(bits-1)-1 >= 1, so bits >= 2; 16 is the widest
# integer cache format anyone ships (and float64 still rounds x/scale exactly there).
SYM_BITS = (2, 16)
ASYM_BITS = (1, 16)


def _as_float(x: np.ndarray | float, name: str = "x") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"parameter {name!r} must be a real numeric array, got dtype {arr.dtype}")
    if arr.dtype.kind != "f":
        arr = arr.astype(np.float64)
    return arr


def _check_bits(bits: int, lo: int, hi: int, what: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not lo <= bits <= hi:
        raise ValueError(f"parameter 'bits' must be an integer between {lo} and {hi} for {what}, got {bits!r}")
    return int(bits)


def _reduce_axis(axis: str) -> int:
    """The array axis a scale is taken over: per-token scales span channels, and vice versa."""
    if axis == "token":
        return -1
    if axis == "channel":
        return -2
    raise ValueError(f"parameter 'axis' must be one of {list(AXES)}, got {axis!r}")


def intk_roundtrip(x: np.ndarray, bits: int, axis: Axis, *, symmetric: bool = True,
                   group_size: int | None = None, residual: int = 0, sinks: int = 0) -> np.ndarray:
    """Integer k-bit round trip of ``x`` shaped ``(..., tokens, channels)``.

    ``axis="token"``: one scale per token (taken over its channels); ``axis="channel"``:
    one scale per channel (taken over tokens). ``group_size=g`` splits the span a scale
    covers into contiguous groups of ``g`` (``g`` must divide it): per-token groups of ``g``
    channels, or per-channel groups of ``g`` tokens (KIVI's K layout).

    ``symmetric=True`` is the post's absmax quantizer, bit for bit::

        qmax = 2**(bits-1) - 1
        scale = abs(x).max(span) / qmax;  scale = 1.0 where it is 0
        clip(round(x / scale), -qmax, qmax) * scale

    (per-token is the post's ``axis=1`` on an ``(N, D)`` array, per-channel its ``axis=0``);
    ``bits`` in 2..16. ``symmetric=False`` is KIVI's min/max quantizer: ``scale =
    (max - min) / (2**bits - 1)``, ``q = clip(round((x - min) / scale), 0, 2**bits - 1)``,
    read back as ``q * scale + min`` (a constant group is kept exactly); ``bits`` in 1..16.
    Rounding is to nearest, ties to even (``np.round``, as torch's ``round``).

    ``sinks=s`` keeps the first ``s`` tokens (attention sinks) and ``residual=r`` the ``r``
    most recent tokens in full precision; scales are computed over the tokens in between
    only (when ``s + r >= tokens`` nothing is quantized). The result has ``x``'s floating
    dtype (float64 for integer input).
    """
    x = _as_float(x)
    if x.ndim < 2:
        raise ValueError(f"parameter 'x' must have shape (..., tokens, channels), got shape {x.shape}")
    red = _reduce_axis(axis)
    if symmetric:
        bits = _check_bits(bits, *SYM_BITS, "symmetric int-k")
    else:
        bits = _check_bits(bits, *ASYM_BITS, "asymmetric int-k")
    residual = _check_count("residual", residual)
    sinks = _check_count("sinks", sinks)
    if residual or sinks:
        n_tok = x.shape[-2]
        lo, hi = min(sinks, n_tok), max(min(sinks, n_tok), n_tok - residual)
        out = x.copy()
        if hi > lo:
            out[..., lo:hi, :] = _intk_grouped(x[..., lo:hi, :], bits, red, symmetric, group_size)
        return out
    return _intk_grouped(x, bits, red, symmetric, group_size)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"parameter {name!r} must be an integer >= 0, got {value!r}")
    return int(value)


def _intk_grouped(x: np.ndarray, bits: int, red: int, symmetric: bool, group_size: int | None) -> np.ndarray:
    span = x.shape[red]
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"parameter 'group_size' must be a positive integer, got {group_size!r}")
        if span % group_size:
            raise ValueError(f"parameter 'group_size' must divide the {'channel' if red == -1 else 'token'} "
                             f"axis ({span}), got {group_size}")
    if group_size is not None and group_size != span:
        # Split the span into (n_groups, g) and reduce over the g axis only.
        g = int(group_size)
        if red == -1:
            xg = x.reshape(*x.shape[:-1], span // g, g)
            gred = -1
        else:
            xg = x.reshape(*x.shape[:-2], span // g, g, x.shape[-1])
            gred = -2
        return _intk_core(xg, bits, gred, symmetric).reshape(x.shape)
    return _intk_core(x, bits, red, symmetric)


def _intk_core(x: np.ndarray, bits: int, red: int, symmetric: bool) -> np.ndarray:
    if symmetric:
        # The post's exact operation order (bit-identical results).
        qmax = 2 ** (bits - 1) - 1
        scale = np.abs(x).max(axis=red, keepdims=True) / qmax
        scale = np.where(scale == 0, 1.0, scale).astype(x.dtype, copy=False)
        return np.clip(np.round(x / scale), -qmax, qmax) * scale
    # KIVI (quant/new_pack.py, triton_quantize_and_pack_along_last_dim): min/max per group,
    # scale = (mx - mn) / (2**bits - 1), q = round((x - mn) / scale) clamped, x' = q*scale + mn.
    levels = 2 ** bits - 1
    mn = x.min(axis=red, keepdims=True)
    mx = x.max(axis=red, keepdims=True)
    scale = (mx - mn) / levels
    # A constant group has scale 0: store it exactly (q = 0, read back as mn).
    safe = np.where(scale == 0, 1.0, scale).astype(x.dtype, copy=False)
    q = np.clip(np.round((x - mn) / safe), 0, levels)
    return q * scale + mn


def axis_table(k: np.ndarray, v: np.ndarray, bits_list: list[int] | tuple[int, ...]) -> pd.DataFrame:
    """The post's first table: reconstruction error of K and V, per-token vs per-channel.

    Columns ``cache, bits, per_token, per_channel, winner``: relative L2 error of the symmetric
    absmax round trip (the post's ``quant``) along each axis, and ``"per-token"`` when
    ``per_token < per_channel``, else ``"per-channel"`` (the post's tie rule). Rows: K at each
    width, then V. ``bits`` must each be in 2..16.
    """
    bits_list = list(bits_list)
    if not bits_list:
        raise ValueError("parameter 'bits' must be a non-empty list of integers between 2 and 16")
    for b in bits_list:
        _check_bits(b, *SYM_BITS, "the axis table")
    rows = []
    for name, cache in (("K", np.asarray(k)), ("V", np.asarray(v))):
        for b in bits_list:
            pt = rel_l2(intk_roundtrip(cache, b, "token"), cache)
            pc = rel_l2(intk_roundtrip(cache, b, "channel"), cache)
            rows.append({"cache": name, "bits": int(b), "per_token": pt, "per_channel": pc,
                         "winner": "per-token" if pt < pc else "per-channel"})
    return pd.DataFrame(rows, columns=["cache", "bits", "per_token", "per_channel", "winner"])


def kivi_roundtrip(k: np.ndarray, v: np.ndarray, k_bits: int, v_bits: int | None = None, *,
                   group_size: int = 32, residual: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """KIVI's cache as attention reads it at the end of prefill: ``(k_hat, v_hat)``.

    K is quantized per channel in groups of ``group_size`` tokens, V per token in groups of
    ``group_size`` channels, both asymmetric (min/max). The full-precision residual follows
    KIVI's prefill rule (``models/llama_kivi.py``): K keeps its last ``tokens % residual``
    tokens in full precision (all of them when ``tokens < residual``), so the quantized K
    is whole groups of ``residual`` tokens; V keeps its last ``min(tokens, residual)`` tokens.
    ``residual`` must be a multiple of ``group_size`` (KIVI's configurations are); 0 means
    no residual window. Shapes ``(..., tokens, head_dim)``.
    """
    v_bits = k_bits if v_bits is None else v_bits
    k = _as_float(k, "k")
    v = _as_float(v, "v")
    _check_bits(k_bits, *ASYM_BITS, "KIVI (asymmetric int-k)")
    _check_bits(v_bits, *ASYM_BITS, "KIVI (asymmetric int-k)")
    residual = _check_count("residual", residual)
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"parameter 'group_size' must be a positive integer, got {group_size!r}")
    if residual % group_size:
        raise ValueError(f"parameter 'residual' must be a multiple of group_size ({group_size}), got {residual}")
    if k.ndim < 2 or v.ndim < 2 or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"parameters 'k' and 'v' must be shaped (..., tokens, head_dim) with equal tokens, "
                         f"got {k.shape} and {v.shape}")
    n_tok = k.shape[-2]
    k_full = n_tok if (residual and n_tok < residual) else (n_tok % residual if residual else 0)
    v_full = min(n_tok, residual)
    k_hat = intk_roundtrip(k, k_bits, "channel", symmetric=False, group_size=group_size, residual=k_full)
    v_hat = intk_roundtrip(v, v_bits, "token", symmetric=False, group_size=group_size, residual=v_full)
    return k_hat, v_hat


# ----------------------------------------------------------------------------------------
# llama.cpp block formats (ggml-quants.c reference row quantizers), bit-faithful.
# Each block is 32 consecutive values of a row; all arithmetic is float32 exactly as the C
# reference does it (one rounding per C operation, no fused multiply-add), and scales are
# stored as fp16 (round to nearest even, as GGML_FP32_TO_FP16). Sources: data/ggml_formats.md.
# ----------------------------------------------------------------------------------------

QK = 32  # values per block, every format here
GGML_KINDS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
# ggml-common.h: the 16 non-linear levels of iq4_nl
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_F32 = np.float32


@dataclass(frozen=True)
class GGMLBlocks:
    """A row-quantized array as ggml stores it: per block an fp16 scale ``d`` (and fp16 min
    ``m`` for the ``_1`` formats) and 32 codes ``q`` as stored (q8_0: signed levels -127..127;
    q4_0/q4_1: nibbles 0..15; q5_0/q5_1: 5-bit codes 0..31; iq4_nl: indices into
    :data:`IQ4NL_VALUES`). ``d``/``m`` have shape ``(..., n_blocks)``, ``q`` ``(..., n_blocks, 32)``."""

    kind: str
    shape: tuple[int, ...]
    d: np.ndarray
    m: np.ndarray | None
    q: np.ndarray


def _ggml_blocks_of(x: np.ndarray, kind: str) -> np.ndarray:
    if kind not in GGML_KINDS:
        raise ValueError(f"parameter 'kind' must be one of {list(GGML_KINDS)}, got {kind!r}")
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"parameter 'x' must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 1 or arr.shape[-1] == 0 or arr.shape[-1] % QK:
        raise ValueError(f"parameter 'x' must have a last axis that is a positive multiple of {QK} "
                         f"for ggml formats, got shape {arr.shape}")
    # The reference quantizers read float32 rows: a float64 input is first rounded to float32.
    xf = arr.astype(_F32)
    if not np.isfinite(xf).all():
        raise ValueError("parameter 'x' must be finite (and within float32 range) for ggml formats")
    return xf.reshape(*arr.shape[:-1], arr.shape[-1] // QK, QK)


def _recip(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f`` in float32."""
    nz = d != 0
    return np.where(nz, _F32(1) / np.where(nz, d, _F32(1)), _F32(0)).astype(_F32)


def _first_absmax(xb: np.ndarray) -> np.ndarray:
    """The signed value of the first element of largest magnitude in each block.

    The reference scans left to right and replaces only on a strictly larger ``fabsf``, starting
    from ``max = 0.0f``: ties keep the first, and an all-zero block keeps +0.0.
    """
    idx = np.argmax(np.abs(xb), axis=-1)[..., None]
    mx = np.take_along_axis(xb, idx, axis=-1)[..., 0]
    return np.where(np.abs(mx) > 0, mx, _F32(0)).astype(_F32)


def _trunc_code(v: np.ndarray) -> np.ndarray:
    """C's float -> integer conversion (truncation toward zero), as int16."""
    return np.trunc(v).astype(np.int16)


def _quant_sym(xb: np.ndarray, nmax: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    """q4_0 / q5_0: the largest-magnitude value maps to code 0 (level -nmax)."""
    mx = _first_absmax(xb)
    d = (mx / _F32(-nmax)).astype(_F32)
    inv = _recip(d)
    x0 = (xb * inv[..., None]).astype(_F32)
    v = (x0 + _F32(nmax + 0.5)).astype(_F32)          # rounded to float32 before truncation
    q = np.minimum(top, _trunc_code(v))
    return d, q.astype(np.uint8)


def _quant_affine(xb: np.ndarray, levels: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q4_1 / q5_1: min/max, ``d = (max - min) / levels``; q5_1 has no clamp (keeps 5 bits)."""
    mn = xb.min(axis=-1)
    mx = xb.max(axis=-1)
    d = ((mx - mn).astype(_F32) / _F32(levels)).astype(_F32)
    inv = _recip(d)
    x0 = ((xb - mn[..., None]).astype(_F32) * inv[..., None]).astype(_F32)
    v = (x0 + _F32(0.5)).astype(_F32)
    q = _trunc_code(v)
    q = np.minimum(levels, q) if clamp else (q & 0x1F)
    return d, mn, q.astype(np.uint8)


def _quant_q8_0(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(xb).max(axis=-1)
    d = (amax / _F32(127)).astype(_F32)
    inv = _recip(d)
    x0 = (xb * inv[..., None]).astype(_F32)
    # roundf: half away from zero. In float64 the +-0.5 is exact, so no extra rounding.
    x64 = x0.astype(np.float64)
    q = np.trunc(x64 + np.copysign(0.5, x64))
    return d, q.astype(np.int8)


def _quant_iq4_nl(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_iq4_nl_ref: no importance weights (w = x*x), ntry = -1 (no scale search)."""
    values = IQ4NL_VALUES.astype(_F32)
    # best_index_int8: code l is the count of midpoints val[k-1] + val[k] <= 2*x (exact in float32).
    mid2 = (values[:-1] + values[1:]).astype(_F32)
    mx = _first_absmax(xb)
    tiny = np.abs(mx) < _F32(1e-15)                   # GROUP_MAX_EPS: scale 0, codes 0
    d0 = (np.where(tiny, _F32(1), mx) / _F32(IQ4NL_VALUES[0])).astype(_F32)
    inv = (_F32(1) / d0).astype(_F32)
    al = (inv[..., None] * xb).astype(_F32)
    codes = np.searchsorted(mid2, (al + al).astype(_F32), side="right")
    qv = values[codes]
    w = (xb * xb).astype(_F32)
    wq = (w * qv).astype(_F32)
    tqx = (wq * xb).astype(_F32)
    tq2 = (wq * qv).astype(_F32)
    # The reference sums the 32 terms left to right in float32: one rounding per addition.
    sumqx = np.zeros(xb.shape[:-1], dtype=_F32)
    sumq2 = np.zeros(xb.shape[:-1], dtype=_F32)
    for j in range(QK):
        sumqx = (sumqx + tqx[..., j]).astype(_F32)
        sumq2 = (sumq2 + tq2[..., j]).astype(_F32)
    pos = sumq2 > 0
    d = np.where(pos, sumqx / np.where(pos, sumq2, _F32(1)), _F32(0)).astype(_F32)
    d = np.where(tiny, _F32(0), d).astype(_F32)
    codes = np.where(tiny[..., None], 0, codes)
    return d, codes.astype(np.uint8)


def ggml_quantize(x: np.ndarray, kind: str) -> GGMLBlocks:
    """Quantize ``x`` row by row along its last axis with ggml's reference quantizer for ``kind``.

    ``kind`` in ``q8_0, q4_0, q4_1, q5_0, q5_1`` (``quantize_row_<kind>_ref``) or ``iq4_nl``
    (``quantize_row_iq4_nl_ref``). The last axis must be a positive multiple of 32; input is
    rounded to float32 first (the quantizers read float32 rows) and must be finite there.
    """
    xb = _ggml_blocks_of(x, kind)
    shape = tuple(np.shape(x))
    # A block whose float32 scale is subnormal has 1/d = inf (undefined behaviour in C's
    # float -> int cast); its fp16 scale is 0 either way, so it reads back as zeros.
    with np.errstate(all="ignore"):
        return _ggml_quantize_blocks(xb, kind, shape)


def _ggml_quantize_blocks(xb: np.ndarray, kind: str, shape: tuple[int, ...]) -> GGMLBlocks:
    m16 = None
    if kind == "q8_0":
        d, q = _quant_q8_0(xb)
    elif kind == "q4_0":
        d, q = _quant_sym(xb, 8, 15)
    elif kind == "q5_0":
        d, q = _quant_sym(xb, 16, 31)
    elif kind == "q4_1":
        d, mn, q = _quant_affine(xb, 15, clamp=True)
        m16 = mn.astype(np.float16)
    elif kind == "q5_1":
        d, mn, q = _quant_affine(xb, 31, clamp=False)
        m16 = mn.astype(np.float16)
    else:
        d, q = _quant_iq4_nl(xb)
    # GGML_FP32_TO_FP16 rounds to nearest even (overflow to inf); numpy's float32 -> float16 does too.
    return GGMLBlocks(kind, shape, d.astype(np.float16), m16, q)


def ggml_dequantize(blocks: GGMLBlocks) -> np.ndarray:
    """Dequantize as ``dequantize_row_<kind>`` does, in float32; returns the original shape.

    Every product code x fp16-scale is exact in float32 (at most 8 + 11 significant bits), so
    whether a compiler fuses the ``q*d + m`` of the ``_1`` formats into an FMA cannot change
    the result: the addition is the only rounding.
    """
    d = blocks.d.astype(_F32)[..., None]
    kind = blocks.kind
    if kind == "q8_0":
        out = blocks.q.astype(_F32) * d
    elif kind in ("q4_0", "q5_0"):
        nmax = 8 if kind == "q4_0" else 16
        out = (blocks.q.astype(np.int16) - nmax).astype(_F32) * d
    elif kind in ("q4_1", "q5_1"):
        out = (blocks.q.astype(_F32) * d).astype(_F32) + blocks.m.astype(_F32)[..., None]
    elif kind == "iq4_nl":
        out = d * IQ4NL_VALUES.astype(_F32)[blocks.q]
    else:
        raise ValueError(f"parameter 'kind' must be one of {list(GGML_KINDS)}, got {kind!r}")
    return out.astype(_F32).reshape(blocks.shape)


def ggml_roundtrip(x: np.ndarray, kind: str) -> np.ndarray:
    """Quantize ``x`` row by row along its last axis with llama.cpp's reference quantizer for
    ``kind`` and dequantize it again, as the cache hands it to attention (CONTRACT.md).

    ``kind``: ``q8_0, q4_0, q4_1, q5_0, q5_1`` (and ``iq4_nl``). Float32 arithmetic, scales
    stored as fp16; returns float32 of ``x``'s shape. A last axis that is not a multiple of 32,
    or an unknown kind, raises ``ValueError``.
    """
    return ggml_dequantize(ggml_quantize(x, kind))


# ----------------------------------------------------------------------------------------
# Hadamard rotation (QuaRot; llama.cpp PR #21038 for quantized caches)
# ----------------------------------------------------------------------------------------

def hadamard_matrix(n: int, *, normalized: bool = True) -> np.ndarray:
    """Sylvester's Hadamard matrix of order ``n`` (a power of two), scaled by ``1/sqrt(n)``
    when ``normalized`` (then orthonormal, symmetric, and its own inverse); entries +-1 else."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1):
        raise ValueError(f"parameter 'n' must be a power of two >= 1, got {n!r}")
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n) if normalized else h


def hadamard_rotate(x: np.ndarray, *, block: int | None = None, normalized: bool = True) -> np.ndarray:
    """Rotate the last axis (channels) of ``x`` by a Hadamard matrix, blockwise.

    ``block`` (a power of two dividing the channel count; default all channels) applies the
    ``block x block`` Hadamard to each run of ``block`` channels. Normalized, the rotation is
    orthonormal and its own inverse: ``hadamard_rotate(hadamard_rotate(x)) == x`` up to
    rounding, and scores are preserved, ``(H q) . (H k) == q . k``. Integer input with
    ``normalized=False`` stays integer (exact, for tests). Uses the fast Walsh-Hadamard
    butterfly (n log n).
    """
    arr = np.asarray(x)
    if arr.ndim < 1:
        raise ValueError("parameter 'x' must have at least one axis")
    n = arr.shape[-1]
    b = n if block is None else block
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 or b & (b - 1) or n % b:
        raise ValueError(f"parameter 'block' must be a power of two dividing the last axis ({n}), got {block!r}")
    if normalized or arr.dtype.kind == "f":
        y = arr.astype(np.float64 if arr.dtype.kind != "f" else arr.dtype, copy=True)
    else:
        y = arr.astype(np.int64, copy=True)
    y = y.reshape(*arr.shape[:-1], n // b, b)
    h = 1
    while h < b:
        y = y.reshape(*y.shape[:-1], b // (2 * h), 2, h)
        a, c = y[..., 0, :], y[..., 1, :]
        y = np.stack([a + c, a - c], axis=-2).reshape(*arr.shape[:-1], n // b, b)
        h *= 2
    y = y.reshape(arr.shape)
    if normalized:
        y = y / np.sqrt(b)
    return y


def rotated_roundtrip(x: np.ndarray, roundtrip: Callable[[np.ndarray], np.ndarray], *,
                      block: int | None = None, rotate_back: bool = True) -> np.ndarray:
    """Rotate ``x``'s channels, apply a storage ``roundtrip`` (any of this module's), and rotate
    back (``rotate_back=False`` keeps the rotated basis, for attention with a rotated query).

    Comparing with ``x`` in the original basis is fair because the rotation is orthonormal:
    the L2 error is the same in either basis."""
    y = roundtrip(hadamard_rotate(x, block=block))
    return hadamard_rotate(y, block=block) if rotate_back else y


# ----------------------------------------------------------------------------------------
# fp8 cache (vLLM): x / scale rounded once to fp8, read back as fp8 * scale
# ----------------------------------------------------------------------------------------

FP8_FORMATS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
FP8_SCALINGS = ("tensor", "head", "token")


def fp8_scale(x: np.ndarray, fmt: str = "e4m3", scaling: str = "tensor") -> np.ndarray:
    """The calibrated fp8 scale(s) of ``x`` shaped ``(..., heads, tokens, head_dim)``.

    ``scale = amax / fmt_max`` (448 for e4m3, 57344 for e5m2) over the span a scale covers:
    ``"tensor"`` the whole array (vLLM's per-tensor ``k_scale``), ``"head"`` each
    ``(tokens, head_dim)`` slice (vLLM's per-attention-head scales, ``[num_kv_heads]``),
    ``"token"`` each row of ``head_dim`` values. A zero amax gives scale 1.0. Returned with
    keepdims so it broadcasts against ``x``.
    """
    from . import floats  # lazily: quant's int-k and ggml parts do not need it

    name = _fp8_name(fmt)
    if scaling not in FP8_SCALINGS:
        raise ValueError(f"parameter 'scaling' must be one of {list(FP8_SCALINGS)}, got {scaling!r}")
    x = _as_float(x)
    if scaling == "head" and x.ndim < 2:
        raise ValueError(f"parameter 'x' must have shape (..., tokens, head_dim) for per-head scales, got {x.shape}")
    axes = {"tensor": None, "head": (-2, -1), "token": -1}[scaling]
    amax = np.abs(x).max(axis=axes, keepdims=True)
    scale = amax / x.dtype.type(floats.parse_format(name).max)
    return np.where(scale == 0, x.dtype.type(1.0), scale).astype(x.dtype, copy=False)


def _fp8_name(fmt: str) -> str:
    if fmt not in FP8_FORMATS:
        raise ValueError(f"parameter 'fmt' must be one of {list(FP8_FORMATS)}, got {fmt!r}")
    return FP8_FORMATS[fmt]


def fp8_roundtrip(x: np.ndarray, fmt: str = "e4m3", scaling: str = "tensor", *,
                  scale: float | np.ndarray | None = None) -> np.ndarray:
    """fp8 cache round trip as vLLM stores it: ``fp8(x / scale) * scale``.

    ``fmt``: ``"e4m3"`` (OCP E4M3FN, max 448, no inf) or ``"e5m2"``. ``scaling``: see
    :func:`fp8_scale`; an explicit ``scale`` (a scalar or an array broadcasting against
    ``x``) overrides it — vLLM's uncalibrated default is ``scale=1.0``. The quotient is
    computed in ``x``'s precision (float32 input: float32, as the engines' kernels do) and
    rounded to fp8 once, to nearest even, saturating at ±max as the CUDA ``SATFINITE``
    conversion does (``kvcost.floats.round_to``, never float64 -> float32 -> fp8 double
    rounding). Returns ``x``'s floating dtype.
    """
    from . import floats

    name = _fp8_name(fmt)
    x = _as_float(x)
    if scale is None:
        s = fp8_scale(x, fmt, scaling)
    else:
        if scaling not in FP8_SCALINGS:
            raise ValueError(f"parameter 'scaling' must be one of {list(FP8_SCALINGS)}, got {scaling!r}")
        s = np.asarray(scale, dtype=x.dtype)
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise ValueError(f"parameter 'scale' must be finite and > 0, got {scale!r}")
    q = floats.round_to(x / s, name, saturate=True)     # one rounding, from the quotient's precision
    return (np.asarray(q).astype(x.dtype) * s).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------
# Experiments for notebook 02: the post's readings, maps of error, outlier sweep, schemes
# ----------------------------------------------------------------------------------------

def axis_readings(table: pd.DataFrame) -> list:
    """The post's three readings of its axis table, checked against ``table`` (from
    :func:`axis_table`): a list of :class:`kvcost.report.Check`."""
    from .claims.report import Check

    def winners(cache: str, bits: list[int]) -> list[str]:
        rows = table[(table["cache"] == cache) & (table["bits"].isin(bits))].sort_values("bits", ascending=False)
        return [f"{cache} {b}-bit: {w}" for b, w in zip(rows["bits"], rows["winner"])]

    def won(cache: str, bits: list[int], who: str) -> bool:
        rows = table[(table["cache"] == cache) & (table["bits"].isin(bits))]
        return len(rows) == len(set(bits)) and bool((rows["winner"] == who).all())

    all_bits = sorted(set(int(b) for b in table["bits"]))
    return [
        Check("per-channel wins for K at 8 and 4 bits", "per-channel", "; ".join(winners("K", [8, 4])) or "(not computed)",
              won("K", [8, 4], "per-channel")),
        Check("per-token for V at every width", "per-token", "; ".join(winners("V", all_bits)),
              won("V", all_bits, "per-token")),
        Check("at 2 bits the K advantage flips", "per-token", "; ".join(winners("K", [2])) or "(not computed)",
              won("K", [2], "per-token")),
    ]


def group_map(k: np.ndarray, v: np.ndarray, bits_list: list[int], group_sizes: list[int | None],
              symmetric: bool = True) -> pd.DataFrame:
    """Reconstruction error over bits x axis x group size for K and V.

    Columns ``cache, bits, axis, group, rel_l2``; ``group`` 0 means one scale over the whole
    axis (the post's setting). A group size that does not divide the axis is skipped."""
    rows = []
    for name, x in (("K", k), ("V", v)):
        for axis in AXES:
            span = x.shape[-1] if axis == "token" else x.shape[-2]
            for g in group_sizes:
                if g is not None and span % g:
                    continue
                for b in bits_list:
                    y = intk_roundtrip(x, b, axis, symmetric=symmetric, group_size=g)
                    rows.append({"cache": name, "bits": int(b), "axis": axis, "group": int(g or 0),
                                 "rel_l2": rel_l2(y, x)})
    return pd.DataFrame(rows, columns=["cache", "bits", "axis", "group", "rel_l2"])


def outlier_sweep(rng: np.random.Generator, n_tokens: int, head_dim: int, strengths: list[float],
                  bits_list: list[int], stride: int = 16) -> pd.DataFrame:
    """Per-token vs per-channel error of K as its outlier channels grow.

    One Gaussian draw ``(n_tokens, head_dim)``; every ``stride``-th channel is scaled by each
    strength in turn (the post uses 4.0). Columns ``strength, bits, per_token, per_channel,
    winner, zeroed_token, zeroed_channel`` — ``zeroed_*`` is the fraction of values that round
    to 0 (what drives the 2-bit result: with qmax = 1 everything below half the scale vanishes,
    and a per-channel scale is the max of n_tokens values, a per-token one of head_dim)."""
    base = rng.normal(0, 1, (n_tokens, head_dim))
    rows = []
    for s in strengths:
        k = base.copy()
        k[:, ::stride] *= s
        for b in bits_list:
            yt, yc = intk_roundtrip(k, b, "token"), intk_roundtrip(k, b, "channel")
            pt, pc = rel_l2(yt, k), rel_l2(yc, k)
            rows.append({"strength": float(s), "bits": int(b), "per_token": pt, "per_channel": pc,
                         "winner": "per-token" if pt < pc else "per-channel",
                         "zeroed_token": float(np.mean(yt == 0)), "zeroed_channel": float(np.mean(yc == 0))})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Scheme:
    """A storage scheme for a cache: round trips for K and V (shapes ``(..., tokens, head_dim)``),
    its family, and its ``kvcost.formats`` name (for the true bits per value; None if it has none;
    ``v_fmt`` when V is stored in another format than K)."""

    name: str
    family: str
    fmt: str | None
    k: Callable[[np.ndarray], np.ndarray]
    v: Callable[[np.ndarray], np.ndarray]
    v_fmt: str | None = None


def _ggml_rt(kind: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: ggml_roundtrip(x, kind).astype(np.float64)


def _rot(rt: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: rotated_roundtrip(x, rt)


def standard_schemes(bits_list: list[int] = (8, 4, 2), group: int = 32, residual: int = 128) -> list[Scheme]:
    """The schemes notebook 02 compares: the post's symmetric int-k (K per channel, V per token),
    KIVI-style asymmetric groups (with and without the residual window), fp8 at three scale
    granularities, llama.cpp's block formats with and without the Hadamard rotation, and bf16."""
    from . import floats

    out: list[Scheme] = [Scheme("bf16", "float", "bf16", lambda x: floats.round_to(x, "bf16"),
                                lambda x: floats.round_to(x, "bf16"))]
    for b in bits_list:
        out.append(Scheme(f"int{b} post (K/ch, V/tok)", "int-k symmetric", f"int{b}_channel",
                          lambda x, b=b: intk_roundtrip(x, b, "channel"), lambda x, b=b: intk_roundtrip(x, b, "token"),
                          v_fmt=f"int{b}_token"))
        out.append(Scheme(f"int{b} g{group} asym", "int-k groups", f"int{b}_g{group}",
                          lambda x, b=b: intk_roundtrip(x, b, "channel", symmetric=False, group_size=group),
                          lambda x, b=b: intk_roundtrip(x, b, "token", symmetric=False, group_size=group)))
        out.append(Scheme(f"kivi{b} g{group} r{residual}", "KIVI", f"kivi{b}_g{group}_r{residual}",
                          lambda x, b=b: kivi_roundtrip(x, x, b, group_size=group, residual=residual)[0],
                          lambda x, b=b: kivi_roundtrip(x, x, b, group_size=group, residual=residual)[1]))
    for f in ("e4m3", "e5m2"):
        for sc, suffix in (("tensor", ""), ("head", "_head"), ("token", "_token")):
            out.append(Scheme(f"fp8 {f} /{sc}", "fp8", f"fp8_{f}{suffix}",
                              lambda x, f=f, sc=sc: fp8_roundtrip(x, f, sc), lambda x, f=f, sc=sc: fp8_roundtrip(x, f, sc)))
    for kind in GGML_KINDS:
        out.append(Scheme(kind, "llama.cpp", kind, _ggml_rt(kind), _ggml_rt(kind)))
        out.append(Scheme(f"{kind} +Hadamard", "llama.cpp +Hadamard", kind,
                          _rot(_ggml_rt(kind)), _rot(_ggml_rt(kind))))
    return out


def scheme_bits(scheme: Scheme, head_dim: int, cache: str = "kv") -> float:
    """True bits per value of a scheme (kvcost.formats, metadata amortized); NaN without a format.

    ``cache``: ``"k"`` or ``"v"`` for one cache, ``"kv"`` for their mean (K and V hold the same
    number of values). The post's int-k keeps K per channel (``int{k}_channel``: its scales are
    a constant) and V per token (``int{k}_token``: one fp32 scale per token per head).
    """
    from . import formats

    if cache not in ("k", "v", "kv"):
        raise ValueError(f"parameter 'cache' must be 'k', 'v' or 'kv', got {cache!r}")
    if scheme.fmt is None:
        return float("nan")
    k_bits = formats.bits_per_value(scheme.fmt, head_dim)
    v_bits = formats.bits_per_value(scheme.v_fmt or scheme.fmt, head_dim)
    return {"k": k_bits, "v": v_bits, "kv": (k_bits + v_bits) / 2}[cache]


def scheme_cache_errors(k: np.ndarray, v: np.ndarray, schemes: list[Scheme]) -> pd.DataFrame:
    """Reconstruction error of K and V under each scheme. Columns ``scheme, family, format,
    bits_per_value, k_bits_per_value, v_bits_per_value, k_rel_l2, v_rel_l2`` (``bits_per_value``
    is the mean of K's and V's)."""
    rows = []
    for s in schemes:
        rows.append({"scheme": s.name, "family": s.family, "format": s.fmt or "",
                     "bits_per_value": scheme_bits(s, k.shape[-1]),
                     "k_bits_per_value": scheme_bits(s, k.shape[-1], "k"),
                     "v_bits_per_value": scheme_bits(s, k.shape[-1], "v"),
                     "k_rel_l2": rel_l2(s.k(k), k), "v_rel_l2": rel_l2(s.v(v), v)})
    return pd.DataFrame(rows)


def scheme_attention_errors(seed: int, n_tokens: int, head_dim: int, trials: int, margin: float,
                            schemes: list[Scheme]) -> pd.DataFrame:
    """Attention-level error of each scheme on the post's needle trials (the post's stream: the
    axis cache is drawn first, then the trials; every scheme sees the same trials).

    Columns ``scheme, family, bits_per_value, flips, trials, max_w_err, out_rel_l2`` (means over
    trials of the largest softmax-weight error and of the output's relative L2 error)."""
    from . import needle, synthetic

    rng, _, _ = synthetic.post_stream(seed, n_tokens, head_dim)
    draws = [synthetic.post_needle_trial(rng, n_tokens, head_dim, margin) for _ in range(trials)]
    rows = []
    for s in schemes:
        errs = [needle.trial_errors(t, s.k, s.v) for t in draws]
        rows.append({"scheme": s.name, "family": s.family, "bits_per_value": scheme_bits(s, head_dim),
                     "flips": sum(e.flipped for e in errs), "trials": trials,
                     "max_w_err": float(np.mean([e.max_w_err for e in errs])),
                     "out_rel_l2": float(np.mean([e.out_rel_l2 for e in errs]))})
    return pd.DataFrame(rows)


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The rows not dominated in (lower ``x``, lower ``y``), sorted by ``x``."""
    d = df.dropna(subset=[x, y]).sort_values([x, y])
    keep, best = [], np.inf
    for i, row in d.iterrows():
        if row[y] < best:
            keep.append(i)
            best = row[y]
    return d.loc[keep]
