"""vLLM's TurboQuant KV cache, store then load: the four ``--kv-cache-dtype turboquant_*`` presets.

A key is stored either as fp8 e4m3 at scale 1 (``turboquant_k8v4``) or, for the MSE presets, as its norm
(fp16) and the 3- or 4-bit Lloyd-Max codes of its unit vector rotated by the orthonormal Sylvester Hadamard
matrix; ``_nc`` presets re-normalize the codes' vector to unit length when reading. A value is stored as
asymmetric uniform 3- or 4-bit codes of its head vector, with an fp16 scale and an fp16 zero (the
vector's minimum). The arithmetic follows vLLM's store and dequant kernels (``triton_turboquant_store.py``,
``triton_turboquant_decode.py``) in float32; the codebook is vLLM's own Lloyd-Max solution for N(0, 1/d)
(``turboquant/centroids.py``), recomputed here with the same float64 arithmetic. Sources, and what is not
claimed bit-exact (Triton's float32 division, cuBLAS's rotation GEMM): ``data/storage_formats.md``.
"""
from __future__ import annotations

import math
from functools import lru_cache

import ml_dtypes
import numpy as np

from kvcost.storage import formats

__all__ = ["PRESETS", "hadamard", "key_roundtrip", "lloyd_max", "roundtrip", "value_roundtrip"]

_F32 = np.float32
#: The presets, from :data:`kvcost.storage.formats.TURBOQUANT`: name -> (key bits, value bits, norm correction).
PRESETS = formats.TURBOQUANT
_MSE_BITS = (3, 4)
_E4M3_MAX = _F32(448.0)


def _check_head_dim(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2 or d & (d - 1):
        raise ValueError(f"parameter 'x' must have a power-of-two last axis (head_dim >= 2) for TurboQuant's Hadamard "
                         f"rotation, got {d!r}")
    return int(d)


@lru_cache(maxsize=32)
def _lloyd_max(d: int, bits: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    # vLLM's solve_lloyd_max, operation for operation in Python floats (float64): a Gaussian N(0, 1/d),
    # 2^bits centroids started evenly on [-3.5 sigma, 3.5 sigma], cells integrated by the trapezoid rule
    # with 200 steps between edges (the outer edges at +-10.5 sigma), up to 200 iterations, stopping
    # (without taking the last update) once no centroid moves by 1e-10.
    n_levels = 2 ** bits
    sigma2 = 1.0 / d
    sigma = math.sqrt(sigma2)

    def pdf(x: float) -> float:
        return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))

    def trapz(f, a: float, b: float, n: int = 200) -> float:
        h = (b - a) / n
        result = 0.5 * (f(a) + f(b))
        for i in range(1, n):
            result += f(a + i * h)
        return result * h

    lo, hi = -3.5 * sigma, 3.5 * sigma
    centroids = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(200):
        bounds = [(centroids[i] + centroids[i + 1]) / 2.0 for i in range(n_levels - 1)]
        edges = [lo * 3, *bounds, hi * 3]
        new = []
        for i in range(n_levels):
            a, b = edges[i], edges[i + 1]
            num = trapz(lambda x: x * pdf(x), a, b)
            den = trapz(pdf, a, b)
            new.append(num / den if den > 1e-15 else centroids[i])
        if max(abs(new[i] - centroids[i]) for i in range(n_levels)) < 1e-10:
            break
        centroids = new
    bounds = [(centroids[i] + centroids[i + 1]) / 2.0 for i in range(n_levels - 1)]
    return tuple(centroids), tuple(bounds)


def lloyd_max(d: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's codebook for head_dim ``d`` and ``bits`` (3 or 4): ``(centroids, midpoints)`` in float32 —
    the 2^bits Lloyd-Max centroids for N(0, 1/d) and the decision points the store kernel searches,
    ``(c[i] + c[i + 1]) / 2`` formed in float32 from the float32 centroids (as the backend does)."""
    d = _check_head_dim(d)
    if bits not in _MSE_BITS:
        raise ValueError(f"parameter 'bits' must be one of {list(_MSE_BITS)} (TurboQuant's key codes), got {bits!r}")
    c = np.asarray(_lloyd_max(d, int(bits))[0], dtype=_F32)
    mid = ((c[:-1] + c[1:]) / _F32(2)).astype(_F32)
    return c, mid


@lru_cache(maxsize=8)
def _hadamard(d: int) -> np.ndarray:
    h = np.ones((1, 1), dtype=_F32)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]]).astype(_F32)
    out = (h / _F32(math.sqrt(d))).astype(_F32)
    out.flags.writeable = False
    return out


def hadamard(d: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard matrix of order ``d`` in float32 (±1 / sqrt(d)), symmetric and its
    own inverse: vLLM's ``_build_hadamard``, one rotation shared by every layer (read-only array)."""
    return _hadamard(_check_head_dim(d))


def _as32(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"parameter 'x' must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 1 or arr.shape[-1] == 0:
        raise ValueError(f"parameter 'x' must have a non-empty last axis (head_dim), got shape {arr.shape}")
    x32 = arr.astype(_F32)
    if not np.isfinite(x32).all():
        raise ValueError("parameter 'x' must be finite (and within float32 range) for TurboQuant")
    return x32


def key_roundtrip(k: np.ndarray, bits: int, *, norm_correction: bool = True) -> np.ndarray:
    """Keys ``(..., head_dim)`` as the TurboQuant cache reads them back, in the original basis (float32).

    ``bits=8``: fp8 e4m3 at scale 1, saturating at ±448 (``turboquant_k8v4``; the Hopper+ e4nv type).
    ``bits`` 3 or 4: ``n = ||k||``, ``y = (k / (n + 1e-8)) H``, code = the number of midpoints ``<= y``
    (the store kernel's binary search), ``n`` kept as fp16; read back as ``n16 * c[code]`` (divided by
    ``sqrt(sum c^2 + 1e-16)`` when ``norm_correction``), rotated back by ``H`` (attention in vLLM scores the
    rotated query against the rotated key; the rotation is orthonormal, so scores agree)."""
    x = _as32(k)
    if bits == 8:
        return np.clip(x, -_E4M3_MAX, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(_F32)
    d = x.shape[-1]
    h = hadamard(d)
    c, mid = lloyd_max(d, bits)
    norms = np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=_F32)).astype(_F32)
    y = ((x / (norms + _F32(1e-8))).astype(_F32) @ h).astype(_F32)
    idx = np.searchsorted(mid, y, side="right")
    cv = c[idx]
    if norm_correction:
        cv = (cv * (_F32(1.0) / np.sqrt(np.sum(cv * cv, axis=-1, keepdims=True, dtype=_F32) + _F32(1e-16)))
              ).astype(_F32)
    n16 = norms.astype(np.float16).astype(_F32)
    return ((n16 * cv).astype(_F32) @ h).astype(_F32)


def value_roundtrip(v: np.ndarray, bits: int) -> np.ndarray:
    """Values ``(..., head_dim)`` stored as TurboQuant does (float32 out): per head vector ``scale = (max -
    min) / (2^bits - 1)`` (at least 1e-8), code ``floor((v - min) / scale + 0.5)`` clipped to [0, 2^bits - 1]
    (round half up), scale and ``min`` kept as fp16; read back ``code * scale16 + min16``."""
    if bits not in _MSE_BITS:
        raise ValueError(f"parameter 'bits' must be one of {list(_MSE_BITS)} (TurboQuant's value codes), got {bits!r}")
    x = _as32(v)
    top = _F32(2 ** bits - 1)
    vmin = x.min(axis=-1, keepdims=True)
    scale = ((x.max(axis=-1, keepdims=True) - vmin) / top).astype(_F32)
    scale = np.where(scale > _F32(1e-8), scale, _F32(1e-8)).astype(_F32)
    with np.errstate(over="ignore"):
        q = np.clip(np.floor(((x - vmin) / scale).astype(_F32) + _F32(0.5)), 0, top).astype(_F32)
        s16 = scale.astype(np.float16).astype(_F32)
        z16 = vmin.astype(np.float16).astype(_F32)
    return (q * s16 + z16).astype(_F32)


def roundtrip(x: np.ndarray, name: str, role: str = "v") -> np.ndarray:
    """``x`` ``(..., head_dim)`` through preset ``name`` as K (``role="k"``) or V (``"v"``), float32 out."""
    if name not in PRESETS:
        raise ValueError(f"parameter 'name' must be a TurboQuant preset, one of {list(PRESETS)}, got {name!r}")
    kb, vb, nc = PRESETS[name]
    if role == "k":
        return key_roundtrip(x, kb, norm_correction=nc)
    if role == "v":
        return value_roundtrip(x, vb)
    raise ValueError(f"parameter 'role' must be one of ['k', 'v'], got {role!r}")
