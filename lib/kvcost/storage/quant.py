"""Storage quantizers for a KV cache, each a round trip: quantize, then dequantize.

Every function returns what attention would read back from the cache, with the input's
shape ``(..., tokens, channels)``; leading axes (layers, heads) are independent. Integer
k-bit (the post's absmax, KIVI's min/max, per token, channel or group), fp8 with vLLM's
scales, the Hadamard rotation, llama.cpp's block formats (from :mod:`kvcost.storage.ggml`) and the
block-scaled floats of 2026 engines (MX, NVFP4, fp8 e4m3fnuz: :mod:`kvcost.storage.blockfloat`) and
vLLM's TurboQuant presets (:mod:`kvcost.storage.turboquant`).

:func:`roundtrip` is the one entry point by name: every :mod:`kvcost.storage.formats` name (and every
spec :func:`kvcost.storage.parse_spec` reads, rotation included) maps to exactly one of these;
:func:`roundtrip_fn` hands out that function, :func:`store_kv` stores a K/V pair.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from kvcost import floats
from kvcost.storage import blockfloat, formats, turboquant
from kvcost.storage.ggml import GGML_KINDS, GGMLBlocks, ggml_dequantize, ggml_quantize, ggml_roundtrip
from kvcost.storage.spec import CacheSpec, parse_spec

__all__ = [
    "ASYM_BITS", "AXES", "FP8_ELEMENTS", "FP8_SCALINGS", "GGML_KINDS", "ROLES", "SYM_BITS", "GGMLBlocks",
    "fp8_roundtrip", "fp8_scale", "ggml_dequantize", "ggml_quantize", "ggml_roundtrip", "hadamard_matrix",
    "hadamard_rotate", "intk_roundtrip", "kivi_roundtrip", "mx_roundtrip", "nvfp4_roundtrip", "rotated_roundtrip",
    "roundtrip", "roundtrip_fn", "store_kv",
]

mx_roundtrip = blockfloat.mx_roundtrip
nvfp4_roundtrip = blockfloat.nvfp4_roundtrip

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

FP8_SCALINGS = ("tensor", "head", "token")


def fp8_scale(x: np.ndarray, fmt: str = "e4m3", scaling: str = "tensor") -> np.ndarray:
    """The calibrated fp8 scale(s) of ``x`` shaped ``(..., heads, tokens, head_dim)``.

    ``scale = amax / fmt_max`` (448 for e4m3, 57344 for e5m2) over the span a scale covers:
    ``"tensor"`` the whole array (vLLM's per-tensor ``k_scale``), ``"head"`` each
    ``(tokens, head_dim)`` slice (vLLM's per-attention-head scales, ``[num_kv_heads]``),
    ``"token"`` each row of ``head_dim`` values. A zero amax gives scale 1.0. Returned with
    keepdims so it broadcasts against ``x``.
    """
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


#: The fp8 element names :func:`fp8_roundtrip` takes, and the :mod:`kvcost.floats` format each rounds
#: into. Here ``e4m3`` is OCP E4M3FN (max 448), as FlashAttention-3's ``p_format`` spells it; the
#: IEEE-style eXmY ``e4m3`` of :mod:`kvcost.floats` (max 240) is not an fp8 cache element.
FP8_ELEMENTS = {"e4m3": "fp8_e4m3", "e4m3fn": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3",
                "float8_e4m3fn": "fp8_e4m3", "e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2"}


def _fp8_name(fmt: str) -> str:
    """The :mod:`kvcost.floats` format of an fp8 element name in :data:`FP8_ELEMENTS`."""
    if not isinstance(fmt, str) or fmt.strip().lower() not in FP8_ELEMENTS:
        raise ValueError(f"parameter 'fmt' must be an fp8 element, one of {sorted(FP8_ELEMENTS)} "
                         f"(e4m3 = OCP E4M3FN, max 448; for e4m3fnuz use roundtrip(x, 'fp8_e4m3fnuz')), got {fmt!r}")
    return FP8_ELEMENTS[fmt.strip().lower()]


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
    q = _round_float(x / s, name)          # one rounding, from the quotient's precision
    return (np.asarray(q).astype(x.dtype) * s).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------
# One round trip per storage format name (kvcost.storage.formats), and K/V pairs of a spec
# ----------------------------------------------------------------------------------------

#: ``role`` of a tensor in :func:`roundtrip`: formats that store K and V differently (KIVI) need it.
ROLES = ("k", "v")


def _round_float(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` rounded once to nearest even into float format ``name`` (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2),
    saturating at its largest finite value (±inf too; NaN stays NaN), ``x``'s floating dtype out: a cast
    (numpy's, ml_dtypes') where ``x`` holds float32 values — one rounding from float32, after clipping to the
    largest finite value, which saturates exactly as SATFINITE does (tests/test_storage.py holds it bit for bit
    to :func:`kvcost.floats.round_to` over every float32 exponent) — else ``round_to`` from float64, which never
    rounds twice."""
    x = _as_float(x)
    f = floats.parse_format(name)
    with np.errstate(invalid="ignore"):                 # NaN stays NaN through the casts, silently
        as32 = x.dtype == np.float32 or np.array_equal(x.astype(np.float32), x, equal_nan=True)
        if as32 and f.dtype is not None:
            x32 = np.clip(x.astype(np.float32, copy=False), -f.max, f.max)
            return x32.astype(f.dtype).astype(x.dtype)
    return np.asarray(floats.round_to(x, name, saturate=True), dtype=x.dtype)


def _kivi_one(x: np.ndarray, f: formats.Format, role: str) -> np.ndarray:
    """KIVI for one tensor: K per channel, V per token (:func:`kivi_roundtrip`'s layouts and residuals)."""
    x = _as_float(x)
    if x.ndim < 2:
        raise ValueError(f"parameter 'x' must have shape (..., tokens, head_dim) for KIVI, got shape {x.shape}")
    n_tok, r = x.shape[-2], f.residual
    if role == "k":
        full = n_tok if (r and n_tok < r) else (n_tok % r if r else 0)
        return intk_roundtrip(x, f.payload_bits, "channel", symmetric=False, group_size=f.block, residual=full)
    return intk_roundtrip(x, f.payload_bits, "token", symmetric=False, group_size=f.block, residual=min(n_tok, r))


def _format_roundtrip(x: np.ndarray, f: formats.Format, role: str) -> np.ndarray:
    fam = f.family
    if fam == "exact":
        return _as_float(x).copy()
    if fam == "float":
        return _round_float(x, f.name)
    if fam == "fp8":
        if f.element == "float8_e4m3fnuz":
            scale = 1.0 if f.scale == "tensor" else None
            return blockfloat.scaled_fp8_roundtrip(x, f.element, f.scale if scale is None else "tensor", scale=scale)
        elem = "e4m3" if f.element == "float8_e4m3fn" else "e5m2"
        if f.scale == "tensor":
            return fp8_roundtrip(x, elem, scale=1.0)
        return fp8_roundtrip(x, elem, f.scale)
    if fam == "ggml":
        return ggml_roundtrip(x, f.name)
    if fam == "intk":
        if f.scale == "group":
            return intk_roundtrip(x, f.payload_bits, "token", symmetric=False, group_size=f.block)
        return intk_roundtrip(x, f.payload_bits, f.scale)
    if fam == "kivi":
        return _kivi_one(x, f, role)
    if fam == "mx":
        return blockfloat.mx_roundtrip(x, f.element, f.block, recipe=f.recipe)
    if fam == "nvfp4":
        return blockfloat.nvfp4_roundtrip(x, four_over_six=f.name == "nvfp4_4over6")
    if fam == "turboquant":
        return turboquant.roundtrip(x, f.name, role)
    if fam == "mla_record":
        raise ValueError(f"parameter 'fmt': {f.name} is vLLM's per-token record of DeepSeek's MLA latent (its bytes "
                         f"size MLA layers in kvcost.models.footprint); its quantizer was not read first-hand, so it "
                         f"has no round trip here")
    raise ValueError(f"parameter 'fmt': format {f.name!r} has no quantizer (family {fam!r})")  # pragma: no cover


def _single_spec(fmt: str | CacheSpec, role: str) -> tuple[CacheSpec, formats.Format]:
    if role not in ROLES:
        raise ValueError(f"parameter 'role' must be one of {list(ROLES)}, got {role!r}")
    spec = parse_spec(fmt, param="fmt")
    if spec.skip_layers:
        raise ValueError(f"parameter 'fmt': {spec.label!r} names layers to skip; a round trip stores one tensor "
                         f"(size whole models with kvcost.models.footprint)")
    if spec.k_order is not None:
        raise ValueError(f"parameter 'fmt': {spec.label!r}: K's channel order is the real decoder's "
                         f"(kvcost.models.decoders.store_kv); a round trip takes the channels as given")
    return spec, formats.get(spec.k if role == "k" else spec.v)


def roundtrip(x: np.ndarray, fmt: str | CacheSpec, *, role: str = "v") -> np.ndarray:
    """Store ``x`` in storage format ``fmt`` and load it back, as attention sees the values.

    ``fmt``: any :mod:`kvcost.storage.formats` name or alias (the names :func:`kvcost.models.footprint.cache_bytes`
    accepts), optionally ``+hadamard`` (rotate the last axis, store, rotate back) or ``K/V`` (``role``
    picks K's or V's). Blocks, groups and per-token scales run along the last axis (channels); a
    per-channel or per-head scale spans the tokens (axis -2); ``role="k"`` stores KIVI's K per
    channel, ``"v"`` (default) per token, and picks a TurboQuant preset's K half (rotated Lloyd-Max
    codes or fp8) rather than its V half (uniform codes). ``exact`` (alias ``none``) returns ``x`` unchanged. Plain
    floats and fp8 keep ``x``'s floating dtype (one rounding from its precision, saturating at the
    largest finite value; fp8 at scale 1.0, vLLM's uncalibrated default); block
    formats compute and return float32. ``mxfp4`` follows OCP MX v1.0, ``mxfp8`` and ``fp4_mx_block16``
    SGLang's own recipes (exponent ceil(log2(max/448)), nearest even; ceil(log2(max/6)), ties away from zero, no
    saturation), ``nvfp4``
    torchao's NVFP4 arithmetic with the array's own amax as tensor scale, llama.cpp's blocks its reference
    quantizers bit for bit.
    """
    spec, f = _single_spec(fmt, role)
    if spec.rotation:
        return rotated_roundtrip(x, lambda y: _format_roundtrip(y, f, role))
    return _format_roundtrip(x, f, role)


def roundtrip_fn(fmt: str | CacheSpec, *, role: str = "v") -> Callable[[np.ndarray], np.ndarray]:
    """The function ``x -> roundtrip(x, fmt, role=role)``, the spec checked once (for callers that
    store many arrays in one format, e.g. FlashAttention-3's ``store``)."""
    spec, f = _single_spec(fmt, role)
    if spec.rotation:
        return lambda x: rotated_roundtrip(x, lambda y: _format_roundtrip(y, f, role))
    return lambda x: _format_roundtrip(x, f, role)


def store_kv(k: np.ndarray, v: np.ndarray, spec: str | CacheSpec) -> tuple[np.ndarray, np.ndarray]:
    """K and V ``(..., tokens, head_dim)`` as a cache in ``spec`` hands them to attention (float32).

    ``spec``: ``K``, ``K/V``, with ``+hadamard`` (both rotated by the normalized Hadamard matrix in
    float32, stored, rotated back). K in a KIVI format with V in the same is KIVI's joint
    end-of-prefill layout (:func:`kivi_roundtrip`); otherwise each is :func:`roundtrip` with its
    role. K's channel order (``@hf``) is :func:`kvcost.models.decoders.store_kv`'s business.
    """
    s = parse_spec(spec, param="spec")
    if s.skip_layers:
        raise ValueError(f"parameter 'spec': {s.label!r} names layers to skip; store_kv stores one layer")
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    if s.rotation:
        k, v = (hadamard_rotate(x).astype(np.float32) for x in (k, v))
    kf, vf = formats.get(s.k), formats.get(s.v)
    if kf.family == "kivi" and kf == vf:
        kh, vh = kivi_roundtrip(k, v, kf.payload_bits, group_size=kf.block, residual=kf.residual)
    else:
        kh, vh = _format_roundtrip(k, kf, "k"), _format_roundtrip(v, vf, "v")
    if s.rotation:
        kh, vh = (hadamard_rotate(np.asarray(x, dtype=np.float32)) for x in (kh, vh))
    return np.ascontiguousarray(kh, dtype=np.float32), np.ascontiguousarray(vh, dtype=np.float32)
