"""Storage quantizers for a KV cache, each a round trip: quantize, then dequantize.

Every function returns what attention would read back from the cache, with the input's
shape. Arrays are shaped ``(..., tokens, channels)``; leading axes (layers, heads) are
independent.

- :func:`intk_roundtrip` — integer k-bit, symmetric (absmax, the post's ``quant``) or
  asymmetric (scale and zero point, as KIVI), per token, per channel, or per group.
- :func:`axis_table` — the post's first table (Block 2): per-token vs per-channel error.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

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
                   group_size: int | None = None) -> np.ndarray:
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
    read back as ``q * scale + min``; ``bits`` in 1..16. Rounding is to nearest, ties to
    even (``np.round``, as torch's ``round``). The result has ``x``'s floating dtype
    (float64 for integer input).
    """
    x = _as_float(x)
    if x.ndim < 2:
        raise ValueError(f"parameter 'x' must have shape (..., tokens, channels), got shape {x.shape}")
    red = _reduce_axis(axis)
    if symmetric:
        bits = _check_bits(bits, *SYM_BITS, "symmetric int-k")
    else:
        bits = _check_bits(bits, *ASYM_BITS, "asymmetric int-k")

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


def rel_l2(approx: np.ndarray, exact: np.ndarray) -> float:
    """Relative L2 error ``||approx - exact|| / ||exact||`` (the post's metric, np.linalg.norm)."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


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
