"""Block-scaled float caches of 2026 engines, store then load: OCP MX (MXFP4, MXFP8), SGLang's MX-style
recipes (``fp4_mx_block16``: E2M1 blocks of 16; ``mxfp8``: E4M3 blocks of 32; ``recipe="sglang"``, a ceiling
scale rule), NVIDIA's NVFP4 (and vLLM's ``nvfp4_4over6``), and fp8 e4m3fnuz (MI300).

Blocks run along the last axis (a head's channels). Arithmetic is float32, as the engines' kernels
and the reference code do: the input is rounded to float32 first, the quotient x / scale is formed
in float32 and rounded once into the element type by ml_dtypes' own cast (``float4_e2m1fn``,
``float8_e4m3fn``, ``float8_e4m3fnuz``: float32 -> element, nearest even), after saturating to the
element's largest finite value (SGLang's ``fp4_mx_block16`` rounds ties away from zero and never saturates:
:func:`mx_quantize`'s ``recipe="sglang"``). (ml_dtypes casts float64 through float32, a double rounding: never
fed float64 here.) Sources and the reference implementations the tests hold these to:
``data/storage_formats.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "ELEMENTS", "E8M0_BIAS", "MX_RECIPES", "MXBlocks", "NVFP4Blocks", "NVFP4_RECIPES", "cast_element", "mx_dequantize",
    "mx_quantize", "mx_roundtrip", "nvfp4_dequantize", "nvfp4_quantize", "nvfp4_roundtrip",
    "scaled_fp8_roundtrip",
]

_F32 = np.float32
#: element type -> (ml_dtypes type, largest finite value, emax_elem = floor(log2(largest))) (OCP MX v1.0 table 1)
ELEMENTS: dict[str, tuple[type, float, int]] = {
    "float4_e2m1fn": (ml_dtypes.float4_e2m1fn, 6.0, 2),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15),
    "float8_e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 240.0, 7),
}
E8M0_BIAS = 127
_E4M3_MAX = _F32(448.0)
_E2M1_MAX = _F32(6.0)
_E4M3_TINY = _F32(2.0 ** -6)          # torch.finfo(float8_e4m3fn).tiny: torchao's floor for NVFP4 block scales
#: How an MX block's scale and elements are computed (see :func:`mx_quantize`): OCP MX v1.0, or SGLang's
#: (``fp4_mx_block16`` and ``mxfp8``; data/storage_formats.md).
MX_RECIPES = ("ocp", "sglang")


@dataclass(frozen=True)
class _SGLangRule:
    """SGLang's ceiling rule for one element type: ``e = ceil(log2(r))`` with ``r = max(amax / top, floor)``
    (``floor_first=False``) or ``max(amax, floor) / top`` (``floor_first=True``), in float32; elements ``x / 2^e``
    rounded ties away from zero with no clip (``ties_away``) or saturated to ``top`` and rounded to nearest even."""

    floor: np.float32
    floor_first: bool
    ties_away: bool


#: SGLang's rule per element type. E2M1 (``fp4_mx_block16``): ``FP4MXBlock16KVQuantizeUtil.batched_quantize``,
#: python/sglang/srt/layers/quantization/kvfp4_tensor.py at sgl-project/sglang 0dae407b (max|x| / 6 floored at
#: 1e-10, the E2M1 code counts the midpoints reached). E4M3 (``mxfp8``): ``_mxfp8_quant_store_qkv_kernel``
#: (sglang/kernels/ops/kvcache/mxfp8_quant_store_kv.py), ``_mxfp8_quant_kernel``
#: (sglang/kernels/ops/quantization/mxfp8_quant.py) and ``mxfp8_scale_byte`` / ``store_mxfp8_vec``
#: (sglang/kernels/jit/csrc/inkling/inkling_attn_prologue_fused.cuh), SGLang 0.5.23: max|x| floored at 1e-30,
#: then / 448; the biased exponent clamped to [0, 254]; ``x / 2^e`` clamped to +-448 and cast to e4m3 (nearest even).
_SGLANG_RULES: dict[str, _SGLangRule] = {
    "float4_e2m1fn": _SGLangRule(_F32(1e-10), floor_first=False, ties_away=True),
    "float8_e4m3fn": _SGLangRule(_F32(1e-30), floor_first=True, ties_away=False),
}
#: How the NVFP4 scales are computed (see :func:`nvfp4_quantize`).
NVFP4_RECIPES = ("torchao", "compressed-tensors")


def _element(element: str) -> tuple[type, float, int]:
    if element not in ELEMENTS:
        raise ValueError(f"parameter 'element' must be one of {list(ELEMENTS)}, got {element!r}")
    return ELEMENTS[element]


def cast_element(q: np.ndarray, element: str) -> np.ndarray:
    """float32 ``q`` saturated to ``element``'s largest finite value and rounded into it (nearest even);
    float32 values of the element type out."""
    dtype, top, _ = _element(element)
    q = np.clip(np.asarray(q, dtype=_F32), -_F32(top), _F32(top))
    return q.astype(dtype).astype(_F32)


def _blocks(x: np.ndarray, block: int, what: str) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"parameter 'x' must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 1 or arr.shape[-1] == 0 or arr.shape[-1] % block:
        raise ValueError(f"parameter 'x' must have a last axis that is a positive multiple of {block} for {what}, "
                         f"got shape {arr.shape}")
    x32 = arr.astype(_F32)
    if not np.isfinite(x32).all():
        raise ValueError(f"parameter 'x' must be finite (and within float32 range) for {what}")
    return x32.reshape(*arr.shape[:-1], arr.shape[-1] // block, block), arr.shape


def _check_block(block: int) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"parameter 'block' must be a positive integer, got {block!r}")
    return int(block)


# ------------------------------------------------------------------ OCP MX v1.0

@dataclass(frozen=True)
class MXBlocks:
    """An MX-quantized array: per block a biased E8M0 exponent ``scale`` (uint8, value 2^(scale-127)) and
    the elements ``q`` (float32 values of ``element``), ``(..., n_blocks)`` and ``(..., n_blocks, block)``."""

    element: str
    shape: tuple[int, ...]
    scale: np.ndarray
    q: np.ndarray

    @property
    def scale_e8m0(self) -> np.ndarray:
        """The scales as ml_dtypes ``float8_e8m0fnu``."""
        return self.scale.view(ml_dtypes.float8_e8m0fnu)


def mx_quantize(x: np.ndarray, element: str = "float4_e2m1fn", block: int = 32, *,
                recipe: str = "ocp") -> MXBlocks:
    """MX blocks along the last axis: per ``block`` values one power-of-two scale, stored as a biased
    E8M0 exponent, and the elements ``x / scale`` in ``element``.

    ``recipe="ocp"`` is OCP MX v1.0 (section 6.3): the shared scale is ``X = 2^(floor(log2(max|x|)) -
    emax_elem)`` (emax_elem 2 for E2M1, 8 for E4M3), clamped to E8M0's range 2^-127 .. 2^127; each element
    ``x / X`` is rounded to nearest even in ``element`` and saturated to its largest finite value. An
    all-zero block stays zero (its scale is 2^-127). ``mxfp4`` is this rule.

    ``recipe="sglang"`` is SGLang's ceiling rule (E2M1 and E4M3 only; sources in ``_SGLANG_RULES`` and
    data/storage_formats.md): the exponent is ``e = ceil(log2(r))`` in float32 (``/``, ``log2`` and ``ceil`` on
    float32 values), with r the block maximum over the element's largest value, floored, so that ``max|x| / 2^e
    <= top`` and nothing needs clipping beyond a rounding; stored as ``e + 127``, clamped to [0, 254].

    - E2M1 (``fp4_mx_block16``, blocks of 16): ``r = max(max|x| / 6, 1e-10)``; each element ``x / 2^e`` takes the
      E2M1 code that counts the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 it reaches (``>=``): nearest, **ties
      away from zero**, not clipped; the sign bit is ``x < 0`` (an input -0 reads +0). An all-zero block gets
      exponent ceil(log2(1e-10)) = -33 (byte 94). (SGLang runs this arithmetic in the cache's dtype; for a bf16
      cache ``max|x| / 6`` is rounded to bf16 first, which moves the exponent only where that rounding crosses a
      power of two.)
    - E4M3 (``mxfp8``, blocks of 32): ``r = max(max|x|, 1e-30) / 448``; each element ``x / 2^e`` is clamped to
      +-448 and rounded to nearest even (the sign kept, -0 included). An all-zero block gets exponent
      ceil(log2(1e-30 / 448)) = -108 (byte 19), as does any block whose maximum is below 1e-30. Where OCP takes
      ``floor(log2 max|x|) - 8``, this is one binade larger for blocks whose maximum lies in (448, 512) x 2^k
      (OCP saturates their maximum to 448 x 2^k) and the same elsewhere, the all-zero and sub-1e-30 blocks apart.
    """
    if recipe not in MX_RECIPES:
        raise ValueError(f"parameter 'recipe' must be one of {list(MX_RECIPES)}, got {recipe!r}")
    _, top, emax = _element(element)
    if recipe == "sglang" and element not in _SGLANG_RULES:
        raise ValueError(f"parameter 'element': SGLang's MX-style recipes store E2M1 ('float4_e2m1fn', "
                         f"fp4_mx_block16) or E4M3 ('float8_e4m3fn', mxfp8) only, got {element!r}")
    xb, shape = _blocks(x, _check_block(block), f"MX blocks of {block}")
    amax = np.abs(xb).max(axis=-1)
    if recipe == "sglang":
        rule = _SGLANG_RULES[element]
        if rule.floor_first:
            ratio = (np.maximum(amax, rule.floor) / _F32(top)).astype(_F32)
        else:
            ratio = np.maximum((amax / _F32(top)).astype(_F32), rule.floor)
        shared = np.clip(np.ceil(np.log2(ratio)), -E8M0_BIAS, E8M0_BIAS).astype(np.int32)
        with np.errstate(under="ignore"):
            scaled = np.ldexp(xb, -shared[..., None]).astype(_F32)
        q = _e2m1_ties_away(scaled) if rule.ties_away else cast_element(scaled, element)
        return MXBlocks(element, tuple(shape), (shared + E8M0_BIAS).astype(np.uint8), q)
    _, e2 = np.frexp(amax)                                   # amax = m * 2^e2, m in [0.5, 1): floor(log2) = e2 - 1
    shared = np.where(amax > 0, e2.astype(np.int32) - 1 - emax, -E8M0_BIAS)
    shared = np.clip(shared, -E8M0_BIAS, E8M0_BIAS)
    with np.errstate(under="ignore"):
        q = cast_element(np.ldexp(xb, -shared[..., None]).astype(_F32), element)
    return MXBlocks(element, tuple(shape), (shared + E8M0_BIAS).astype(np.uint8), q)


#: E2M1's non-negative values in code order (ml_dtypes ``float4_e2m1fn`` codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6)
#: and the midpoints between neighbours (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5), both exact in float32.
_E2M1_VALUES = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(_F32)
_E2M1_MIDPOINTS = ((_E2M1_VALUES[:-1] + _E2M1_VALUES[1:]) / _F32(2)).astype(_F32)


def _e2m1_ties_away(s: np.ndarray) -> np.ndarray:
    """float32 ``s`` to E2M1 values: the code is the number of midpoints ``|s|`` reaches (so a tie goes to the
    larger magnitude, away from zero), magnitudes past 5 are 6 (no clipping needed); the sign bit is
    ``s < 0``, as SGLang sets it (a negative value that rounds to zero reads -0, an input -0 reads +0)."""
    mag = _E2M1_VALUES[np.searchsorted(_E2M1_MIDPOINTS, np.abs(s), side="right")]    # count of midpoints <= |s|
    return np.where(s < 0, -mag, mag).astype(_F32)


def mx_dequantize(blocks: MXBlocks) -> np.ndarray:
    """``q * 2^(scale - 127)`` in float32, in the original shape."""
    e = blocks.scale.astype(np.int32) - E8M0_BIAS
    with np.errstate(under="ignore"):
        return np.ldexp(blocks.q, e[..., None]).astype(_F32).reshape(blocks.shape)


def mx_roundtrip(x: np.ndarray, element: str = "float4_e2m1fn", block: int = 32, *,
                 recipe: str = "ocp") -> np.ndarray:
    """Store ``x`` in an MX format and load it back (float32, ``x``'s shape): ``mxfp4`` is
    ``("float4_e2m1fn", 32)`` (``recipe="ocp"``), SGLang's ``mxfp8`` ``("float8_e4m3fn", 32, recipe="sglang")``
    and ``fp4_mx_block16`` ``("float4_e2m1fn", 16, recipe="sglang")``; OCP MXFP8 is ``("float8_e4m3fn", 32)``.
    The read-back is ``q * 2^(byte - 127)`` for both recipes (SGLang's ``batched_dequantize`` for E2M1, then cast
    to bf16: exact for these values; FA4's block-scaled MXFP8 operands for E4M3)."""
    return mx_dequantize(mx_quantize(x, element, block, recipe=recipe))


# ------------------------------------------------------------------ NVFP4

@dataclass(frozen=True)
class NVFP4Blocks:
    """An NVFP4-quantized array: E2M1 elements ``q`` (float32 values) per 16, their UE4M3 block scales
    ``scale`` (float32 values of e4m3fn) and the fp32 tensor scale ``tensor_scale`` (the decode-side
    multiplier: a value is ``q * tensor_scale * scale``; ``recipe`` says how the product is formed)."""

    recipe: str
    shape: tuple[int, ...]
    tensor_scale: np.float32
    scale: np.ndarray
    q: np.ndarray


def _nvfp4_scales(bmax: np.ndarray, amax: np.float32, recipe: str, fp4_max: np.float32) -> np.ndarray:
    """The e4m3 block scales (float32 values) for block maxima ``bmax``, mapping them to ``fp4_max``."""
    if recipe == "torchao":
        # torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize with per_tensor_scale =
        # per_tensor_amax_to_scale(amax): block_scale / per_tensor_scale, clamped to [tiny, 448], to e4m3
        pts = (amax / _F32(448.0 * 6.0)).astype(_F32)
        s = ((bmax / fp4_max).astype(_F32) / pts).astype(_F32)
        return cast_element(np.clip(s, _E4M3_TINY, _E4M3_MAX), "float8_e4m3fn")
    # compressed-tensors: generate_gparam (global = 448 * 6 / amax), calculate_qparams (global * max / 6,
    # rounded to e4m3; a zero scale becomes 0.125)
    gs = _nvfp4_global(amax)
    s = cast_element((gs * (bmax / fp4_max).astype(_F32)).astype(_F32), "float8_e4m3fn")
    return np.where(s == 0, _F32(0.125), s).astype(_F32)


def _nvfp4_global(amax: np.float32) -> np.float32:
    tiny = np.finfo(_F32).tiny
    with np.errstate(over="ignore", divide="ignore"):
        gs = _F32(448.0 * 6.0) / max(amax, tiny)
    return _F32(gs) if np.isfinite(gs) else _F32(1.0)


def _nvfp4_codes(xb: np.ndarray, s: np.ndarray, amax: np.float32, recipe: str) -> tuple[np.ndarray, np.ndarray]:
    """``(q, read_back)`` of blocks ``xb`` with e4m3 scales ``s``."""
    with np.errstate(all="ignore"):
        if recipe == "torchao":
            pts = (amax / _F32(448.0 * 6.0)).astype(_F32)
            recip = ((_F32(1.0) / pts).astype(_F32) / s).astype(_F32)
            q = cast_element((xb * recip[..., None]).astype(_F32), "float4_e2m1fn")
            back = (q * (pts * s).astype(_F32)[..., None]).astype(_F32)
        else:
            eff = (s / _nvfp4_global(amax)).astype(_F32)
            q = cast_element((xb / eff[..., None]).astype(_F32), "float4_e2m1fn")
            back = (q * eff[..., None]).astype(_F32)
    return q, back


def nvfp4_quantize(x: np.ndarray, *, tensor_amax: float | None = None, recipe: str = "torchao",
                   four_over_six: bool = False) -> NVFP4Blocks:
    """NVFP4 along the last axis (a multiple of 16): E2M1 elements, a UE4M3 scale per 16 values and an
    fp32 tensor scale from the tensor's absolute maximum ``tensor_amax`` (default: ``x``'s own, an
    oracle calibration over the array given; engines read it from the checkpoint's ``k_scale`` /
    ``v_scale``). The tensor scale is ``amax / (448 * 6)``, so the largest block maps its maximum to 6
    with a block scale near 448.

    ``recipe="torchao"``: torchao 0.18 ``nvfp4_quantize`` arithmetic (``x * ((1/ts) / s)``, read back
    ``q * (ts * s)``, block scales clamped to at least 2^-6); ``"compressed-tensors"``: compressed-tensors
    0.20 (global scale ``448 * 6 / amax``, ``x / (s / global)``, read back ``q * (s / global)``). They differ
    in last-place roundings of the scales (data/storage_formats.md).

    ``four_over_six=True`` is vLLM's ``nvfp4_4over6``: each block also tries the scale that maps its
    maximum to 4 instead of 6 and keeps the one whose read-back has the smaller squared error (ties: 6).
    """
    if recipe not in NVFP4_RECIPES:
        raise ValueError(f"parameter 'recipe' must be one of {list(NVFP4_RECIPES)}, got {recipe!r}")
    xb, shape = _blocks(x, 16, "NVFP4 (blocks of 16)")
    bmax = np.abs(xb).max(axis=-1)
    if tensor_amax is None:
        amax = _F32(bmax.max()) if bmax.size else _F32(0)
    else:
        amax = _F32(tensor_amax)
        if not (np.isfinite(amax) and amax > 0):
            raise ValueError(f"parameter 'tensor_amax' must be a finite number > 0, got {tensor_amax!r}")
    if amax == 0:
        amax = _F32(1.0)          # an all-zero tensor: any scale stores zeros; keep the arithmetic finite
    s = _nvfp4_scales(bmax, amax, recipe, _E2M1_MAX)
    q, back = _nvfp4_codes(xb, s, amax, recipe)
    if four_over_six:
        s4 = _nvfp4_scales(bmax, amax, recipe, _F32(4.0))
        q4, back4 = _nvfp4_codes(xb, s4, amax, recipe)
        err6 = ((back.astype(np.float64) - xb) ** 2).sum(axis=-1)
        err4 = ((back4.astype(np.float64) - xb) ** 2).sum(axis=-1)
        use4 = err4 < err6
        s = np.where(use4, s4, s)
        q = np.where(use4[..., None], q4, q)
    ts = (amax / _F32(448.0 * 6.0)).astype(_F32) if recipe == "torchao" else _F32(1.0) / _nvfp4_global(amax)
    return NVFP4Blocks(recipe, tuple(shape), _F32(ts), s.astype(_F32), q.astype(_F32))


def nvfp4_dequantize(blocks: NVFP4Blocks) -> np.ndarray:
    """Read an NVFP4 array back in float32 (the recipe's own product), original shape."""
    with np.errstate(all="ignore"):
        if blocks.recipe == "torchao":
            out = blocks.q * (blocks.tensor_scale * blocks.scale).astype(_F32)[..., None]
        else:
            gs = _F32(1.0) / blocks.tensor_scale if blocks.tensor_scale != 0 else _F32(1.0)
            out = blocks.q * (blocks.scale / _F32(gs)).astype(_F32)[..., None]
    return out.astype(_F32).reshape(blocks.shape)


#: Rows (every axis but the last, flattened: tokens) per piece of :func:`nvfp4_roundtrip`. The round trip's
#: temporaries grow with the rows it is given: in one piece it held 6.2 times a float32 array's bytes (tracemalloc,
#: a 256k x 256 cache; about 6 GB for Gemma 3 270M's 1M x 256), in pieces of 2^16 rows 2.5 times at 256k.
NVFP4_ROWS_PER_PIECE = 1 << 16


def nvfp4_roundtrip(x: np.ndarray, *, tensor_amax: float | None = None, recipe: str = "torchao",
                    four_over_six: bool = False, rows_per_piece: int = NVFP4_ROWS_PER_PIECE) -> np.ndarray:
    """Store ``x`` as NVFP4 and load it back (float32, ``x``'s shape); see :func:`nvfp4_quantize`.

    The rows are stored ``rows_per_piece`` at a time with one tensor scale (``tensor_amax``, default the whole
    array's amax), so memory follows the piece and the values are one round trip's over the whole array, bit for
    bit (blocks never cross a row)."""
    if isinstance(rows_per_piece, bool) or not isinstance(rows_per_piece, (int, np.integer)) or rows_per_piece < 1:
        raise ValueError(f"parameter 'rows_per_piece' must be an int >= 1, got {rows_per_piece!r}")
    arr = np.asarray(x)
    rows = arr.size // arr.shape[-1] if arr.ndim and arr.shape[-1] else 0
    if rows <= rows_per_piece:
        return nvfp4_dequantize(nvfp4_quantize(arr, tensor_amax=tensor_amax, recipe=recipe,
                                               four_over_six=four_over_six))
    flat = arr.reshape(rows, arr.shape[-1])
    amax = tensor_amax
    if amax is None:
        amax = max(float(np.abs(flat[i:i + rows_per_piece].astype(_F32)).max())
                   for i in range(0, rows, rows_per_piece))
        if not (np.isfinite(amax) and amax > 0):     # zeros, or a value past float32: one piece says which
            return nvfp4_roundtrip(arr, recipe=recipe, four_over_six=four_over_six, rows_per_piece=rows)
    out = np.empty(flat.shape, dtype=_F32)
    for i in range(0, rows, rows_per_piece):
        out[i:i + rows_per_piece] = nvfp4_dequantize(nvfp4_quantize(
            flat[i:i + rows_per_piece], tensor_amax=amax, recipe=recipe, four_over_six=four_over_six))
    return out.reshape(arr.shape)


# ------------------------------------------------------------------ fp8 in any ml_dtypes element

def scaled_fp8_roundtrip(x: np.ndarray, element: str, scaling: str = "tensor", *,
                         scale: float | None = None) -> np.ndarray:
    """``fp8(x / scale) * scale`` in float32 for an fp8 ``element`` ml_dtypes has and kvcost.floats does
    not (``float8_e4m3fnuz``). ``scaling``: ``"tensor"`` (one amax over the array), ``"head"`` (each
    ``(tokens, head_dim)`` slice), ``"token"`` (each row); ``scale`` overrides it (vLLM's uncalibrated
    ``1.0``). ``scale = amax / max`` (240 for e4m3fnuz), a zero amax gives 1.0."""
    _, top, _ = _element(element)
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"parameter 'x' must be a real numeric array, got dtype {arr.dtype}")
    x32 = arr.astype(_F32)
    if scale is not None:
        s = np.asarray(scale, dtype=_F32)
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise ValueError(f"parameter 'scale' must be finite and > 0, got {scale!r}")
    else:
        axes = {"tensor": None, "head": (-2, -1), "token": -1}.get(scaling, "bad")
        if axes == "bad":
            raise ValueError(f"parameter 'scaling' must be one of ['tensor', 'head', 'token'], got {scaling!r}")
        if scaling == "head" and x32.ndim < 2:
            raise ValueError(f"parameter 'x' must have shape (..., tokens, head_dim) for per-head scales, "
                             f"got {x32.shape}")
        amax = np.abs(x32).max(axis=axes, keepdims=True)
        s = (amax / _F32(top)).astype(_F32)
        s = np.where(s == 0, _F32(1.0), s).astype(_F32)
    return (cast_element((x32 / s).astype(_F32), element) * s).astype(_F32)
