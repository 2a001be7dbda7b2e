"""llama.cpp's block formats (ggml-quants.c reference row quantizers), bit for bit.

Each block is 32 consecutive values of a row; all arithmetic is float32 exactly as the C
reference does it (one rounding per C operation, no fused multiply-add), and scales are
stored as fp16 (round to nearest even, as GGML_FP32_TO_FP16). Sources: data/ggml_formats.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GGML_KINDS", "IQ4NL_VALUES", "QK", "GGMLBlocks", "ggml_dequantize", "ggml_quantize", "ggml_roundtrip"]

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
    ``kind`` and dequantize it again, as the cache hands it to attention (docs/api.md).

    ``kind``: ``q8_0, q4_0, q4_1, q5_0, q5_1`` (and ``iq4_nl``). Float32 arithmetic, scales
    stored as fp16; returns float32 of ``x``'s shape. A last axis that is not a multiple of 32,
    or an unknown kind, raises ``ValueError``.
    """
    return ggml_dequantize(ggml_quantize(x, kind))
