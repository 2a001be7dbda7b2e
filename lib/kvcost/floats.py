"""Floating-point formats as specifications, and correctly rounded conversion into them.

A :class:`FloatFormat` describes a binary floating-point format by its exponent bits,
stored fraction bits and bias, with subnormals, the way IEEE 754 does. Named formats:

=============  =====  =====  ====  ===========================================
name           exp    frac   bias  notes
=============  =====  =====  ====  ===========================================
``fp32``        8     23     127   IEEE binary32 (``numpy.float32``)
``tf32``        8     10     127   NVIDIA TensorFloat-32 (no storage dtype)
``bf16``        8      7     127   bfloat16 (``ml_dtypes.bfloat16``)
``fp16``        5     10      15   IEEE binary16 (``numpy.float16``)
``fp8_e4m3``    4      3       7   OCP E4M3 "fn": no inf, NaN only at S.1111.111,
                                    max 448 (``ml_dtypes.float8_e4m3fn``)
``fp8_e5m2``    5      2      15   OCP E5M2, IEEE-like with inf (``ml_dtypes.float8_e5m2``)
``eXmY``        X      Y   2^(X-1)-1  any IEEE-like format: the all-ones exponent holds
                                    inf and NaN (so ``e4m3`` is *not* ``fp8_e4m3``: max 240)
=============  =====  =====  ====  ===========================================

:func:`round_to` rounds float64 values into a format in one step, from the exact float64
value (no detour through float32, which is what ``ml_dtypes``' ``astype`` from float64
does: ``1 + 2**-8 + 2**-30`` becomes 1.0 there and 1.0078125 here, the correct bf16
rounding). Modes: round to nearest, ties to even (default); toward zero; stochastic
(seeded). Overflow gives inf (NaN for ``fp8_e4m3``, which has no inf) or, with
``saturate=True``, the largest finite value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["FloatFormat", "parse_format", "round_to", "round_pair", "FORMAT_NAMES", "MODES"]

#: Rounding modes accepted by :func:`round_to`.
MODES = ("nearest", "toward_zero", "stochastic")

_EXY = re.compile(r"^e(\d+)m(\d+)$")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format with subnormals.

    ``exp_bits`` exponent bits, ``man_bits`` stored fraction bits (the precision is
    ``man_bits + 1`` with the implicit bit), ``bias`` the exponent bias. ``finite_only``
    marks the OCP "fn" encoding: no infinities, the all-ones exponent holds normal numbers
    except S.1111.111 (NaN), so the largest value is ``(2 - 2^(1-man_bits)) * 2^emax``.
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    finite_only: bool = False

    @property
    def precision(self) -> int:
        """Significand bits including the implicit leading bit (p)."""
        return self.man_bits + 1

    @property
    def emax(self) -> int:
        """Largest unbiased exponent of a finite number."""
        top = 2 ** self.exp_bits - 1
        return (top if self.finite_only else top - 1) - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number (``1 - bias``)."""
        return 1 - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        frac = 2.0 - 2.0 ** (1 - self.man_bits) if self.finite_only else 2.0 - 2.0 ** -self.man_bits
        return float(np.ldexp(frac, self.emax))

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value ``2^emin``."""
        return float(np.ldexp(1.0, self.emin))

    @property
    def min_subnormal(self) -> float:
        """Smallest positive subnormal value ``2^(emin - man_bits)``."""
        return float(np.ldexp(1.0, self.emin - self.man_bits))

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1.0 and the next larger value, ``2^-man_bits``."""
        return float(np.ldexp(1.0, -self.man_bits))

    @property
    def unit_roundoff(self) -> float:
        """Unit roundoff u = eps / 2 (the relative error bound of round to nearest)."""
        return float(np.ldexp(1.0, -self.man_bits - 1))

    @property
    def has_inf(self) -> bool:
        """Whether the format encodes infinities (overflow then gives inf, else NaN)."""
        return not self.finite_only

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy / ml_dtypes dtype with exactly this format, or None (e.g. tf32, e8m13)."""
        return _dtype_for(self.exp_bits, self.man_bits, self.bias, self.finite_only)

    def ulp(self, x: Any) -> np.ndarray | float:
        """Unit in the last place at ``|x|``: the spacing of this format's values there.

        Uses the binade of ``x`` (``2^(max(floor(log2|x|), emin) - man_bits)``); at 0 and in
        the subnormal range it is the subnormal spacing.
        """
        a = np.abs(np.asarray(x, dtype=np.float64))
        _, e = np.frexp(a)
        e = np.where(a == 0, self.emin, e - 1)   # frexp(0) gives exponent 0; 0 is subnormal
        out = np.ldexp(1.0, np.maximum(e, self.emin) - self.man_bits)
        return float(out) if out.ndim == 0 else out

    def is_representable(self, x: Any) -> np.ndarray | bool:
        """Whether each float64 value is exactly a value of this format (NaN and inf:
        representable when the format has them)."""
        a = np.asarray(x, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            r = round_to(a, self, saturate=False)
            out = (r == a) | (np.isnan(a) & np.isnan(r))
        return bool(out) if np.ndim(out) == 0 else out

    def __str__(self) -> str:
        return self.name


_NAMED: dict[str, tuple[int, int, bool]] = {
    "fp32": (8, 23, False),
    "tf32": (8, 10, False),
    "bf16": (8, 7, False),
    "fp16": (5, 10, False),
    "fp8_e4m3": (4, 3, True),
    "fp8_e5m2": (5, 2, False),
}
_ALIASES = {
    "float32": "fp32", "f32": "fp32", "binary32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "f16": "fp16", "half": "fp16", "binary16": "fp16",
    "fp8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}
#: Names :func:`parse_format` accepts besides ``eXmY``.
FORMAT_NAMES = tuple(_NAMED) + tuple(_ALIASES)

_ALLOWED_TEXT = (f"one of {list(_NAMED)} (aliases {sorted(_ALIASES)}), or 'eXmY' with "
                 "2 <= X <= 11 exponent bits and 1 <= Y <= 50 stored fraction bits (e.g. 'e8m13')")


def _dtype_for(exp_bits: int, man_bits: int, bias: int, finite_only: bool) -> np.dtype | None:
    if bias != 2 ** (exp_bits - 1) - 1:
        return None
    key = (exp_bits, man_bits, finite_only)
    if key == (8, 23, False):
        return np.dtype(np.float32)
    if key == (5, 10, False):
        return np.dtype(np.float16)
    if key == (11, 52, False):  # pragma: no cover - not parseable (Y <= 50), kept for completeness
        return np.dtype(np.float64)
    import ml_dtypes
    table = {(8, 7, False): ml_dtypes.bfloat16,
             (4, 3, True): ml_dtypes.float8_e4m3fn,
             (5, 2, False): ml_dtypes.float8_e5m2}
    dt = table.get(key)
    return None if dt is None else np.dtype(dt)


@lru_cache(maxsize=256)
def _parse_name(name: str) -> FloatFormat:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _NAMED:
        e, m, fn = _NAMED[key]
        return FloatFormat(key, e, m, 2 ** (e - 1) - 1, fn)
    match = _EXY.match(key)
    if match:
        e, m = int(match.group(1)), int(match.group(2))
        if 2 <= e <= 11 and 1 <= m <= 50:
            # An eXmY spelling of a named IEEE-like format is that format (e8m7 is bf16).
            for nm, (ne, nmb, nfn) in _NAMED.items():
                if (ne, nmb, nfn) == (e, m, False):
                    return FloatFormat(nm, e, m, 2 ** (e - 1) - 1, False)
            return FloatFormat(key, e, m, 2 ** (e - 1) - 1, False)
    raise ValueError(f"parameter 'fmt': unknown float format {name!r}; allowed: {_ALLOWED_TEXT}")


def parse_format(fmt: str | FloatFormat) -> FloatFormat:
    """The :class:`FloatFormat` for a name (``fp32``, ``tf32``, ``bf16``, ``fp16``,
    ``fp8_e4m3``, ``fp8_e5m2``, aliases such as ``bfloat16``) or an ``eXmY`` string.

    ``eXmY`` is IEEE-like (bias ``2^(X-1)-1``, subnormals, inf/NaN in the top exponent);
    2 <= X <= 11 and 1 <= Y <= 50 so that every value, midpoint and the two guard bits
    exact rounding needs are float64 numbers. Anything else raises ``ValueError``.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if not isinstance(fmt, str):
        raise ValueError(f"parameter 'fmt' must be a format name string, got {fmt!r}; allowed: {_ALLOWED_TEXT}")
    return _parse_name(fmt)


def _as_float64(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a float64 array, or ValueError naming ``name`` (complex, strings, objects)."""
    arr = np.asarray(x)
    if arr.dtype.kind in "cSUO":
        raise ValueError(f"parameter {name!r} must be real numbers, got dtype {arr.dtype}")
    try:
        with np.errstate(invalid="ignore"):   # signalling-NaN payloads warn on the cast
            return arr.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        raise ValueError(f"parameter {name!r} must be real numbers, got dtype {arr.dtype}") from None


def round_pair(hi: np.ndarray, lo: np.ndarray, fmt: str | FloatFormat, mode: str = "nearest",
               saturate: bool = False, u: np.ndarray | None = None) -> np.ndarray:
    """Round the exact values ``hi + lo`` into ``fmt`` (one rounding).

    ``(hi, lo)`` must be a float64 pair with ``hi = fl(hi + lo)`` (as TwoSum produces it),
    so ``|lo| <= ulp64(hi) / 2``. Only when ``hi`` is itself a rounding breakpoint of ``fmt``
    (a value, or a midpoint between two) can ``lo`` change the result, and then only its
    sign matters; ``fmt`` has at most 51-bit significands, so breakpoints lie on the float64
    grid at least 2 float64 ulps apart. ``u``: uniforms in [0, 1) for ``mode="stochastic"``.
    """
    f = parse_format(fmt)
    if mode not in MODES:
        raise ValueError(f"parameter 'mode' must be one of {list(MODES)}, got {mode!r}")
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), hi.shape)
    m = f.man_bits
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(hi)
        finite = np.isfinite(a)
        a_f = np.where(finite, a, 0.0)
        _, e2 = np.frexp(a_f)                   # a = frac * 2^e2, frac in [0.5, 1)
        ee = e2.astype(np.int64) - 1            # floor(log2 a) (a > 0)
        qexp = np.maximum(ee, f.emin) - m       # exponent of the quantum at a
        y = np.ldexp(a_f, -qexp)                # a in quanta: exact, < 2^(m+1)
        # direction of the exact value relative to hi, in magnitude: +1 larger, -1 smaller
        dl = np.sign(lo) * np.where(hi < 0, -1.0, 1.0)
        if mode == "nearest":
            r = np.rint(y)                      # ties to even
            tie = np.abs(y - r) == 0.5
            fl = np.floor(y)
            r = np.where(tie & (dl > 0), fl + 1.0, np.where(tie & (dl < 0), fl, r))
        elif mode == "toward_zero":
            r = np.floor(y)
            on_grid = (r == y) & (dl < 0) & (y > 0)
            # one step down in magnitude; at the bottom of a normal binade the step halves
            binade_bottom = (y == 2.0 ** m) & (ee > f.emin)
            r = np.where(on_grid, np.where(binade_bottom, y - 0.5, y - 1.0), r)
        else:  # stochastic: round up in magnitude with probability (exact - down) / quantum
            if u is None:
                raise ValueError("parameter 'u' (uniforms) is required for mode='stochastic'")
            fl = np.floor(y)
            frac = (y - fl) + np.ldexp(np.abs(lo), -qexp) * dl
            r = np.where(np.asarray(u) < frac, fl + 1.0, fl)
        res = np.ldexp(r, qexp)
        big = res > f.max
        if mode == "toward_zero" or saturate:
            res = np.where(big, f.max, res)
        else:
            res = np.where(big, np.inf if f.has_inf else np.nan, res)
        # non-finite inputs: NaN stays NaN; inf stays inf (NaN in an fn format; max if saturating)
        inf_val = f.max if saturate else (np.inf if f.has_inf else np.nan)
        res = np.where(finite, res, np.where(np.isnan(hi), np.nan, inf_val))
        return np.copysign(res, hi)


def round_to(x: Any, fmt: str | FloatFormat, mode: str = "nearest", saturate: bool = False,
             rng: np.random.Generator | None = None, seed: int | None = None) -> Any:
    """Round ``x`` (converted to float64) into ``fmt``, correctly, in a single step.

    Returns float64 values (an array of ``x``'s shape; a float for a scalar) that are
    exactly values of ``fmt``.

    - ``mode="nearest"``: round to nearest, ties to even (IEEE default).
    - ``mode="toward_zero"``: truncate; overflow gives the largest finite value (IEEE).
    - ``mode="stochastic"``: round up in magnitude with probability equal to the distance
      from the value below, in quanta (unbiased); needs ``rng`` (a numpy Generator) or
      ``seed`` so results are reproducible.

    Overflow (the rounded value, with unbounded exponent, exceeds ``fmt.max``) gives ±inf,
    or NaN for formats without inf (``fp8_e4m3``); with ``saturate=True`` it gives ±max,
    and ±inf inputs give ±max too. NaN stays NaN. Signs of zeros are kept.
    """
    f = parse_format(fmt)
    if mode not in MODES:
        raise ValueError(f"parameter 'mode' must be one of {list(MODES)}, got {mode!r}")
    if not isinstance(saturate, (bool, np.bool_)):
        raise ValueError(f"parameter 'saturate' must be True or False, got {saturate!r}")
    arr = _as_float64(x)
    u = None
    if mode == "stochastic":
        if rng is None:
            if seed is None:
                raise ValueError("parameter 'rng' or 'seed' is required for mode='stochastic' "
                                 "(stochastic rounding must be reproducible)")
            rng = np.random.default_rng(seed)
        u = rng.random(arr.shape)
    out = round_pair(arr, np.zeros_like(arr), f, mode, bool(saturate), u)
    if np.ndim(x) == 0 and not isinstance(x, np.ndarray):
        return float(out)
    return out
