"""The registry of tensor-core and matrix-core instructions: one :class:`Unit` per (arch, instr).

Names are MMA-Sim's (PyPI ``mmasim`` 2.1.1, microsoft/MMA-Sim, arXiv 2511.10909): ``arch`` is
``"Volta"`` ... ``"RTX Blackwell"`` or ``"CDNA3"``; ``instr`` is the PTX shape-and-type string
(``m64n8k32.f32.e4m3.e4m3`` for Hopper's wgmma, ``m16n8k32.f32.e4m3.e4m3.f32`` for mma.sync,
``m64n8k32.kind::f8f6f4.f32.e4m3.e4m3`` for Blackwell's tcgen05.mma, with ``.blockN`` and a scale
type for the block-scaled kinds) or the MFMA suffix on AMD (``f32_16x16x32_fp8_fp8``). Which
instructions exist follows the PTX ISA as MMA-Sim lists it; the arithmetic of each -- kept fraction
bits F, terms fused per step, the zero term's exponent, the output rounding -- is a row of
``data/tensorcore/units.csv``, cited there. A new GPU is a new row, not a new code path: every unit
runs through the one fused kernel of :mod:`kvcost.numerics.tensorcore`.

Schemes (MMA-Sim's arithmetic models): ``T`` a fused truncated dot product of ``group`` products
and the accumulator; ``ST`` the same with one block scale per step (``kind::mxf8f6f4``); ``GST``
groups of ``g`` products summed exactly, scaled, then fused at F bits (``kind::mxf4*``); ``GTR``
CDNA3's FP8 MFMA (even and odd halves fused at F, combined with the accumulator at F2).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache

from kvcost.paths import data_path

__all__ = ["ARCHS", "OPERAND_TYPES", "SCALE_TYPES", "Unit", "examples", "get", "instructions"]

#: Operand types: (ml_dtypes name, smallest normal exponent MMA-Sim aligns a subnormal to, bytes).
#: ``tf32`` operands are float32 values truncated to 10 fraction bits, as the hardware reads them.
OPERAND_TYPES = {
    "f32": ("float32", -126, 4), "tf32": ("float32", -126, 4), "f16": ("float16", -14, 2),
    "bf16": ("bfloat16", -126, 2), "e4m3": ("float8_e4m3fn", -6, 1), "e5m2": ("float8_e5m2", -14, 1),
    "e3m2": ("float6_e3m2fn", -2, 1), "e2m3": ("float6_e2m3fn", 0, 1), "e2m1": ("float4_e2m1fn", 0, 1),
    "fp8": ("float8_e4m3fnuz", -7, 1), "bf8": ("float8_e5m2fnuz", -15, 1),
}
#: Block-scale types: (ml_dtypes name, smallest normal exponent). ``ue4m3`` is e4m3 without its sign.
SCALE_TYPES = {"ue8m0": ("float8_e8m0fnu", -127), "ue4m3": ("float8_e4m3fn", -6)}
_F8 = ("e5m2", "e4m3")
_F8F6F4 = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
_N = range(8, 257, 8)


def _nv_mma() -> dict[str, list[str]]:
    sm70 = ["m8n8k4.f32.f16.f16.f32", "m8n8k4.f32.f16.f16.f16", "m8n8k4.f16.f16.f16.f16"]
    sm75 = ["m16n8k8.f32.f16.f16.f32", "m16n8k8.f16.f16.f16.f16"]
    sm80 = ["m16n8k8.f32.tf32.tf32.f32", "m16n8k4.f32.tf32.tf32.f32", "m16n8k16.f32.f16.f16.f32",
            "m16n8k16.f16.f16.f16.f16", "m16n8k16.f32.bf16.bf16.f32", "m16n8k8.f32.bf16.bf16.f32"]
    sm89 = [f"m16n8k{k}.{d}.{a}.{b}.{d}" for k in (32, 16) for d in ("f32", "f16") for a in _F8 for b in _F8]
    sm120 = [f"m16n8k32.kind::f8f6f4.{d}.{a}.{b}.{d}" for d in ("f32", "f16") for a in _F8F6F4 for b in _F8F6F4]
    return {"Volta": sm70, "Turing": sm75 + sm70, "Ampere": sm80 + sm75, "Ada Lovelace": sm89 + sm80 + sm75,
            "Hopper": sm80 + sm75, "Blackwell": sm80 + sm75, "RTX Blackwell": sm120 + sm89 + sm80 + sm75}


def _nv_mma_block() -> dict[str, list[str]]:
    rtx = ([f"m16n8k32.kind::mxf8f6f4.block32.f32.{a}.{b}.f32.ue8m0" for a in _F8F6F4 for b in _F8F6F4]
           + ["m16n8k64.kind::mxf4.block32.f32.e2m1.e2m1.f32.ue8m0",
              "m16n8k64.kind::mxf4nvf4.block32.f32.e2m1.e2m1.f32.ue8m0",
              "m16n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.f32.ue8m0",
              "m16n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.f32.ue4m3"])
    return {"RTX Blackwell": rtx}


def _nv_wgmma() -> dict[str, list[str]]:
    h = ([f"m64n{n}k8.f32.tf32.tf32" for n in _N] + [f"m64n{n}k16.f32.f16.f16" for n in _N]
         + [f"m64n{n}k16.f16.f16.f16" for n in _N] + [f"m64n{n}k16.f32.bf16.bf16" for n in _N]
         + [f"m64n{n}k32.{d}.{a}.{b}" for n in _N for d in ("f32", "f16") for a in _F8 for b in _F8])
    return {"Hopper": h}


def _nv_tcgen05() -> dict[str, list[str]]:
    mn = [(m, n) for m in (64, 128) for n in _N]
    b = ([f"m{m}n{n}k8.kind::tf32.f32.tf32.tf32" for m, n in mn]
         + [f"m{m}n{n}k16.kind::f16.f32.{t}.{t}" for m, n in mn for t in ("f16", "bf16")]
         + [f"m{m}n{n}k16.kind::f16.f16.f16.f16" for m, n in mn]
         + [f"m{m}n{n}k32.kind::f8f6f4.{d}.{a}.{bt}" for m, n in mn for d in ("f32", "f16")
            for a in _F8F6F4 for bt in _F8F6F4])
    return {"Blackwell": b}


def _nv_tcgen05_block() -> dict[str, list[str]]:
    b = ([f"m128n{n}k32.kind::mxf8f6f4.block32.f32.{a}.{bt}.ue8m0" for n in _N for a in _F8F6F4 for bt in _F8F6F4]
         + [f"m128n{n}k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0" for n in _N]
         + [f"m128n{n}k64.kind::mxf4nvf4.block32.f32.e2m1.e2m1.ue8m0" for n in _N]
         + [f"m128n{n}k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.{s}" for n in _N for s in ("ue8m0", "ue4m3")])
    return {"Blackwell": b}


def _amd_mfma() -> dict[str, list[str]]:
    fp8 = [f"f32_{s}_{a}_{b}" for s in ("16x16x32", "32x32x16") for a in ("bf8", "fp8") for b in ("bf8", "fp8")]
    return {"CDNA3": fp8}


_FAMILIES = {"mma": _nv_mma, "mma_block": _nv_mma_block, "wgmma": _nv_wgmma, "tcgen05": _nv_tcgen05,
             "tcgen05_block": _nv_tcgen05_block, "mfma": _amd_mfma}


@cache
def instructions() -> dict[str, dict[str, str]]:
    """{arch: {instr: family}} for every instruction the registry models."""
    out: dict[str, dict[str, str]] = {}
    for fam, gen in _FAMILIES.items():
        for arch, names in gen().items():
            for name in names:
                out.setdefault(arch, {})[name] = fam
    return out


ARCHS = tuple(sorted(instructions()))


@dataclass(frozen=True)
class Unit:
    """One instruction's arithmetic (see the module docstring and ``data/tensorcore/units.csv``)."""

    arch: str
    instr: str
    family: str
    m: int
    n: int
    k: int
    a_type: str
    b_type: str
    d_type: str
    scheme: str           # T, ST, GST, GTR
    frac_bits: int        # F: fraction bits kept below the largest term's exponent
    frac_bits2: int       # F2 (GTR only): bits kept when the dot meets the accumulator
    group: int            # terms fused per step (MMA-Sim's L_max), <= k
    g: int                # GST: products summed exactly before scaling
    rounding: str         # RZ-E8M13, RZ-FP32, RNE-FP16, RNE-FP32: how D is written
    e_zero: int           # the exponent a zero term aligns with (T, ST, GST)
    block: int            # block-scaled kinds: values per scale (0 otherwise)
    scale_type: str       # ue8m0 / ue4m3 (block-scaled kinds), "" otherwise

    @property
    def c_type(self) -> str:
        return self.d_type

    def describe(self) -> str:
        return (f"{self.arch} {self.instr}: {self.scheme}, F={self.frac_bits}"
                + (f", F2={self.frac_bits2}" if self.scheme == "GTR" else "")
                + f", {self.group} terms per step, output {self.rounding}")


@cache
def _rows() -> tuple[dict[str, str], ...]:
    with open(data_path("tensorcore", "units.csv"), newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


def _parse(arch: str, instr: str, family: str) -> tuple[int, int, int, str, str, str, int, str]:
    """(m, n, k, a, b, d, block, scale type) of an instruction string."""
    if family == "mfma":
        d, shape, a, b = instr.split("_")
        m, n, k = (int(x) for x in shape.split("x"))
        return m, n, k, a, b, d, 0, ""
    parts = instr.split(".")
    shape = parts[0]
    m, rest = shape[1:].split("n")
    n, k = rest.split("k")
    body = [p for p in parts[1:] if not p.startswith("kind::")]
    block = 0
    scale = ""
    if body and body[0].startswith("block"):
        block = int(body[0][5:])
        scale = body[-1]
        body = body[1:-1]
    d, a, b = body[0], body[1], body[2]
    return int(m), int(n), int(k), a, b, d, block, scale


def _row_for(arch: str, family: str, instr: str, a: str, k: int) -> dict[str, str]:
    rows = [r for r in _rows() if r["arch"] == arch and r["family"] in (family, "mma_sm70_shape")]
    if family == "mma" and arch == "Turing" and instr in _nv_mma()["Volta"]:
        return next(r for r in rows if r["family"] == "mma_sm70_shape")
    rows = [r for r in rows if r["family"] == family]
    want = "fp8" if a in (*_F8, "fp8", "bf8") else "any"
    if family.endswith("_block"):
        want = f"k{k}"
    for op in (want, "any"):
        for r in rows:
            if r["operands"] == op:
                return r
    raise ValueError(f"no arithmetic is recorded for {arch} {instr} in data/tensorcore/units.csv")


@cache
def get(arch: str, instr: str) -> Unit:
    """The :class:`Unit` for ``arch`` and ``instr`` (MMA-Sim's names); ValueError naming the parameter."""
    table = instructions()
    if arch not in table:
        raise ValueError(f"parameter 'arch' must be one of {list(ARCHS)}, got {arch!r}")
    family = table[arch].get(instr)
    if family is None:
        shown = examples().get(arch, [])
        raise ValueError(f"parameter 'instr': {instr!r} is not an instruction of {arch} that kvcost models "
                         f"(PTX shape-and-type strings as MMA-Sim spells them, e.g. {shown[:3]})")
    m, n, k, a, b, d, block, scale = _parse(arch, instr, family)
    r = _row_for(arch, family, instr, a, k)
    itemsize = OPERAND_TYPES[a][2]
    group = int(r["group"]) // itemsize if r["group_unit"] == "bytes" else int(r["group"])
    group = min(group, k)
    f16 = d == "f16"
    rounding = r["rho_f16"] if f16 else r["rho_f32"]
    e_zero = r["e_zero_f16"] if f16 else r["e_zero_f32"]
    return Unit(arch=arch, instr=instr, family=family, m=m, n=n, k=k, a_type=a, b_type=b, d_type=d,
                scheme=r["scheme"], frac_bits=int(r["frac_bits"]), frac_bits2=int(r["frac_bits2"] or 0),
                group=group, g=int(r["g"] or 0), rounding=rounding, e_zero=int(e_zero or 0), block=block,
                scale_type=scale)


def examples() -> dict[str, list[str]]:
    """A few instructions per architecture (the narrowest n): for error messages, tests and tables."""
    out: dict[str, list[str]] = {}
    for arch, names in instructions().items():
        picked = [s for s in names if "n8k" in s or "mfma" in names[s] or "_16x16x" in s]
        out[arch] = sorted(picked, key=lambda s: ("e4m3" not in s and "fp8_fp8" not in s, s))
    return out
