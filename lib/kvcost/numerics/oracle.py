"""MMA-Sim as the oracle of :func:`kvcost.tensorcore.matmul`, and the cases it is held to.

MMA-Sim (PyPI ``mmasim`` 2.1.1, microsoft/MMA-Sim, arXiv 2511.10909) models each MMA instruction bit
for bit and is validated by its authors on the GPUs; it runs in torch, slowly. This module needs the
test extras (``torch``, ``mmasim``; ``make setup`` installs them): the tests, the validation sweep
(``sweeps/tensorcore_validation.yaml``) and ``make bench`` import it, the library never does.

- :func:`sim_matmul`: MMA-Sim's ``sim(A, B, C[, scale_a, scale_b])`` chained along K, one instruction
  per step, each fed the previous D, from operand *values* (fp4 / fp6 encoded as MMA-Sim's uint8
  codes, packed two per byte for the ``mxf4`` kinds);
- :func:`cases`: seeded operands for one unit, named by what they probe (C = 0 so the products decide,
  significands near 2, large C over small products, subnormals, cancellation, long K chains, zero
  blocks and scales, NaN and inf, overflow).
"""
from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import torch
from mmasim.amd import MFMA
from mmasim.nv_ptx import MMA, WGMMA, MMABlockScale, TCGen05MMA, TCGen05MMABlockScale

from kvcost.numerics.instructions import OPERAND_TYPES, Unit, get
from kvcost.numerics.tensorcore import matmul_unit, operand_values

__all__ = ["CASES", "cases", "compare", "sim_matmul", "type_values", "validate"]

_CLASSES = {"mma": MMA, "mma_block": MMABlockScale, "wgmma": WGMMA, "tcgen05": TCGen05MMA,
            "tcgen05_block": TCGen05MMABlockScale, "mfma": MFMA}
_TORCH = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "fp8": torch.float8_e4m3fnuz,
          "bf8": torch.float8_e5m2fnuz}
_SUBBYTE = {"e2m1": 2, "e3m2": 0, "e2m3": 0}     # uint8 code shift: fp4 sits in bits 5:2, fp6 in 5:0
CASES = ("random", "c_zero", "significand_near_2", "large_c", "subnormal", "tiny_products", "cancellation",
         "long_k", "zero_blocks", "nan_inf", "overflow")


def _codes(x: np.ndarray, t: str) -> torch.Tensor:
    dt = getattr(ml_dtypes, OPERAND_TYPES[t][0])
    return torch.from_numpy((x.astype(dt).view(np.uint8) & 0x3F) << _SUBBYTE[t])


def _packed_fp4(x: np.ndarray) -> torch.Tensor:
    code = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return torch.from_numpy((code[..., 0::2] << 4) | code[..., 1::2])


def _tensor(x: np.ndarray, t: str, unit: Unit) -> torch.Tensor:
    if t in _SUBBYTE:
        if unit.scheme == "GST":
            return _packed_fp4(x)
        return _codes(x, t)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(_TORCH[t])


def _scale_tensor(x: np.ndarray, st: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.float8_e8m0fnu if st == "ue8m0" else torch.float8_e4m3fn)


def sim_matmul(arch: str, instr: str, a: np.ndarray, b: np.ndarray, c: np.ndarray,
               scale_a: np.ndarray | None = None, scale_b: np.ndarray | None = None) -> np.ndarray:
    """MMA-Sim's D for ``a`` (m, K) · ``b`` (K, n) + ``c``, one instruction per k along K. float32 (m, n)."""
    u = get(arch, instr)
    sim = _CLASSES[u.family](arch, instr)
    ctype = torch.float16 if u.c_type == "f16" else torch.float32
    d = torch.from_numpy(np.ascontiguousarray(c, dtype=np.float32)).to(ctype)
    kk = a.shape[1]
    with torch.no_grad():
        for k0 in range(0, kk, u.k):
            ta = _tensor(a[:, k0:k0 + u.k], u.a_type, u)
            tb = _tensor(np.ascontiguousarray(b[k0:k0 + u.k].T), u.b_type, u).T
            if u.block:
                b0, b1 = k0 // u.block, (k0 + u.k) // u.block
                d = sim(ta, tb, d, _scale_tensor(scale_a[:, b0:b1], u.scale_type),
                        _scale_tensor(scale_b[b0:b1], u.scale_type))
            else:
                d = sim(ta, tb, d)
    return d.float().numpy()


def compare(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Where two float32 results differ: bit patterns, every NaN equal to every NaN."""
    o = np.asarray(ours, np.float32)
    t = np.asarray(theirs, np.float32)
    both_nan = np.isnan(o) & np.isnan(t)
    return ~both_nan & (o.view(np.int32) != t.view(np.int32))


def type_values(t: str, *, finite: bool = True) -> np.ndarray:
    """Every value of operand type ``t`` (ml_dtypes' codes), finite ones only unless told."""
    name = OPERAND_TYPES[t][0]
    dt = getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else np.dtype(name)
    if np.dtype(dt).itemsize == 1 and finite:
        vals = operand_values(t)                       # the one enumeration of a narrow type's values
    elif np.dtype(dt).itemsize == 1:
        bits = 4 if t == "e2m1" else 6 if t in ("e3m2", "e2m3") else 8
        vals = np.arange(1 << bits, dtype=np.uint8).view(dt).astype(np.float64)
    else:   # 16/32-bit types: a spread of exponents and significands, and the whole range, subnormals too
        rng = np.random.default_rng(0)
        fi = ml_dtypes.finfo(dt)
        lo, hi = int(np.log2(float(fi.smallest_subnormal))), int(np.log2(float(fi.max)))
        e = np.concatenate([rng.integers(-30, 31, 4096), rng.integers(lo, hi + 1, 1024)])
        vals = np.ldexp(rng.uniform(1, 2, e.size), e) * rng.choice([-1, 1], e.size)
        vals = np.concatenate([vals, [fi.max, -fi.max, np.inf, -np.inf, np.nan]])
        with np.errstate(over="ignore"):
            vals = vals.astype(dt).astype(np.float64)
    if finite:
        vals = vals[np.isfinite(vals)]
    return np.unique(vals)


def _scales(unit: Unit, rng: np.random.Generator, shape: tuple[int, int], case: str) -> np.ndarray:
    if unit.scale_type == "ue8m0":
        e = rng.integers(-12, 13, shape)
        if case == "subnormal":
            e = rng.integers(-127, -100, shape)
        elif case == "overflow":
            e = rng.integers(100, 128, shape)
        return np.ldexp(1.0, e)
    vals = type_values("e4m3")
    vals = vals[vals >= 0]
    s = rng.choice(vals[(vals > 0.01) & (vals < 16)], shape)
    if case == "subnormal":
        s = rng.choice(vals[vals < 2.0 ** -6], shape)
    if case == "zero_blocks":
        s[rng.random(shape) < 0.3] = 0.0
    return s


def _draw(t: str, rng: np.random.Generator, shape: tuple[int, ...], case: str, e_zero: int) -> np.ndarray:
    vals = type_values(t)
    emin = OPERAND_TYPES[t][1]
    if case == "subnormal":
        sub = vals[(np.abs(vals) < 2.0 ** emin)]
        x = rng.choice(sub, shape) if len(sub) else rng.choice(vals, shape)
        return x
    if case == "significand_near_2":
        mant = np.abs(vals) / np.exp2(np.floor(np.log2(np.where(vals == 0, 1, np.abs(vals)))))
        pick = vals[(mant >= 1.4) & (np.abs(vals) > 0)]
        return rng.choice(pick if len(pick) else vals, shape)
    if case == "overflow":
        big = vals[np.abs(vals) >= np.abs(vals).max() / 4]
        return rng.choice(big, shape)
    if case == "tiny_products":    # products near 2^e_zero: below it only the zero term's exponent decides
        mag = np.abs(vals)
        ex = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
        pick = vals[(mag > 0) & (np.abs(ex - (e_zero // 2 - 6)) <= 3)]
        if not len(pick):
            pick = vals[mag > 0][np.argsort(mag[mag > 0])[:8]]
        x = rng.choice(pick, shape)
        x[rng.random(shape) < 0.3] = 0.0
        return x
    x = rng.choice(vals, shape)
    if case == "zero_blocks":
        x[:, : shape[1] // 2] = 0.0 if shape[1] > 1 else x[:, :1]
    return x


def _special(t: str) -> list[float]:
    all_vals = type_values(t, finite=False)
    return [float(v) for v in all_vals[~np.isfinite(all_vals)]][:3]


def cases(unit: Unit, seed: int, *, m: int = 16, n: int = 8, steps: int = 1) -> Iterator[tuple[str, dict]]:
    """(name, kwargs for matmul / sim_matmul) for each case of :data:`CASES`, seeded; K = steps * k
    (``long_k``: 16 steps)."""
    rng = np.random.default_rng(seed)
    for case in CASES:
        kk = unit.k * (16 if case == "long_k" else steps)
        a = _draw(unit.a_type, rng, (m, kk), case, unit.e_zero or -133)
        b = _draw(unit.b_type, rng, (n, kk), case, unit.e_zero or -133).T.copy()
        c = (rng.standard_normal((m, n)) * np.exp2(rng.integers(-20, 21, (m, n)))).astype(np.float32)
        if unit.c_type == "f16":
            c = (rng.standard_normal((m, n)) * np.exp2(rng.integers(-10, 8, (m, n)))).astype(np.float16)
        if case in ("c_zero", "significand_near_2", "subnormal", "zero_blocks", "tiny_products"):
            c[rng.random((m, n)) < 0.7] = 0.0
        if case == "subnormal":
            tiny = 2.0 ** -149 if unit.c_type != "f16" else 2.0 ** -24      # the smallest subnormal
            c[: m // 2] = (rng.integers(-(1 << 12), 1 << 12, (m // 2, n)) * tiny).astype(c.dtype)
        if case == "large_c":
            top = 40 if unit.c_type != "f16" else 15
            c = (rng.choice([-1, 1], (m, n)) * np.exp2(rng.integers(10, top, (m, n)))).astype(c.dtype)
        if case == "cancellation":
            half = kk // 2
            a[:, half:] = a[:, :half]
            b[half:] = -b[:half]
        if case == "zero_blocks":
            c[:, : n // 2] = 0.0
        if case == "nan_inf":
            for x in (a, b):
                sp = _special(unit.a_type if x is a else unit.b_type)
                if sp:
                    mask = rng.random(x.shape) < 0.02
                    x[mask] = rng.choice(sp, mask.sum())
            spc = np.array([np.inf, -np.inf, np.nan], dtype=c.dtype)
            mask = rng.random(c.shape) < 0.05
            c[mask] = rng.choice(spc, mask.sum())
        if case == "overflow":
            c = (rng.choice([-1, 1], (m, n)) * np.exp2(rng.integers(100, 128, (m, n)))).astype(np.float32) \
                if unit.c_type != "f16" else (rng.choice([-1, 1], (m, n)) * 30000.0).astype(np.float16)
        kw = {"a": a, "b": b, "c": c.astype(np.float32)}
        if unit.block:
            kw["scale_a"] = _scales(unit, rng, (m, kk // unit.block), case)
            kw["scale_b"] = _scales(unit, rng, (kk // unit.block, n), case)
        yield case, kw



def validate(unit: Unit, instructions: int, seed: int = 0, *, tile: tuple[int, int] = (8, 8),
             steps: int = 4) -> list[dict]:
    """Run :func:`cases` through :func:`kvcost.tensorcore.matmul_unit` and :func:`sim_matmul` until at least
    ``instructions`` instructions (each of the unit's own m×n×k) have been compared; a batch is ``tile``
    instructions along m and n and ``steps`` along K (``long_k``: 16). One row per case: how many
    instructions and outputs it covered and how many outputs differ (bit patterns, NaN as NaN)."""
    m, n = unit.m * tile[0], unit.n * tile[1]
    per = {c: {"case": c, "instructions": 0, "outputs": 0, "mismatches": 0} for c in CASES}
    done = 0
    batch = seed
    while done < instructions:
        for case, kw in cases(unit, batch, m=m, n=n, steps=steps):
            ours = matmul_unit(unit, kw["a"], kw["b"], kw["c"], kw.get("scale_a"), kw.get("scale_b"))
            theirs = sim_matmul(unit.arch, unit.instr, kw["a"], kw["b"], kw["c"], kw.get("scale_a"),
                                kw.get("scale_b"))
            count = tile[0] * tile[1] * (kw["a"].shape[1] // unit.k)
            row = per[case]
            row["instructions"] += count
            row["outputs"] += ours.size
            row["mismatches"] += int(compare(ours, theirs).sum())
            done += count
        batch += 1
    return list(per.values())
