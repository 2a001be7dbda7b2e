"""kvcost.tensorcore.matmul held to MMA-Sim (the GPU-validated oracle), unit by unit, on the hard cases.

Every unit of docs/api.md's stable list (and a few more) runs every case of ``oracle.CASES`` on a seeded sample
and must match MMA-Sim's ``sim(A, B, C[, scale_a, scale_b])``, chained the same way, bit for bit
(NaN as NaN). The longer validation (>= 100,000 instructions per unit) is the sweep
``tensorcore_validation``; its committed result is checked in ``test_validation_data_says_zero``.
"""
import csv
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvcost import instructions, tensorcore
from kvcost.numerics import oracle
from kvcost.paths import repo_root
from kvcost.provenance import checked

#: The units docs/api.md lists as stable: the long validation covers each.
CONTRACT_UNITS = [
    ("Hopper", "m64n8k32.f32.e4m3.e4m3"), ("Hopper", "m64n8k32.f32.e5m2.e4m3"), ("Hopper", "m64n8k16.f32.bf16.bf16"),
    ("Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32"), ("RTX Blackwell", "m16n8k32.f32.e4m3.e4m3.f32"),
    ("Blackwell", "m64n8k32.kind::f8f6f4.f32.e4m3.e4m3"),
    ("Blackwell", "m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0"),
    ("Blackwell", "m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0"),
    ("Blackwell", "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"), ("CDNA3", "f32_16x16x32_fp8_fp8"),
]
UNITS = [
    ("Hopper", "m64n8k32.f32.e4m3.e4m3"), ("Hopper", "m64n8k32.f32.e5m2.e4m3"),
    ("Hopper", "m64n8k32.f32.e4m3.e5m2"), ("Hopper", "m64n8k32.f16.e4m3.e4m3"),
    ("Hopper", "m64n8k16.f32.bf16.bf16"), ("Hopper", "m64n8k16.f32.f16.f16"), ("Hopper", "m64n8k8.f32.tf32.tf32"),
    ("Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32"), ("Ada Lovelace", "m16n8k16.f32.bf16.bf16.f32"),
    ("RTX Blackwell", "m16n8k32.f32.e4m3.e4m3.f32"), ("RTX Blackwell", "m16n8k32.kind::f8f6f4.f32.e2m1.e4m3.f32"),
    ("Blackwell", "m64n8k32.kind::f8f6f4.f32.e4m3.e4m3"), ("Blackwell", "m64n8k32.kind::f8f6f4.f32.e2m1.e2m1"),
    ("Blackwell", "m64n8k32.kind::f8f6f4.f32.e3m2.e2m3"),
    ("Blackwell", "m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0"),
    ("Blackwell", "m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0"),
    ("Blackwell", "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"),
    ("RTX Blackwell", "m16n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.f32.ue4m3"),
    ("CDNA3", "f32_16x16x32_fp8_fp8"), ("CDNA3", "f32_32x32x16_bf8_fp8"),
    ("Ampere", "m16n8k16.f32.bf16.bf16.f32"), ("Volta", "m8n8k4.f32.f16.f16.f32"),
]


def _run(arch, instr, kw, unit=None):
    if unit is None:
        return tensorcore.matmul(kw["a"], kw["b"], kw["c"], arch=arch, instr=instr, scale_a=kw.get("scale_a"),
                                 scale_b=kw.get("scale_b"))
    return tensorcore.matmul_unit(unit, kw["a"], kw["b"], kw["c"], kw.get("scale_a"), kw.get("scale_b"))


@pytest.mark.parametrize(("arch", "instr"), UNITS, ids=[f"{a}:{i}" for a, i in UNITS])
def test_matmul_is_mmasim_bit_for_bit(arch, instr):
    unit = instructions.get(arch, instr)
    for case, kw in oracle.cases(unit, seed=2026, m=16, n=8):
        ours = _run(arch, instr, kw)
        theirs = oracle.sim_matmul(arch, instr, kw["a"], kw["b"], kw["c"], kw.get("scale_a"), kw.get("scale_b"))
        diff = oracle.compare(ours, theirs)
        assert ours.dtype == np.float32 and ours.shape == theirs.shape
        assert not diff.any(), f"{case}: {diff.sum()} of {diff.size} differ, e.g. ours {ours[diff][:3]} " \
                               f"MMA-Sim {theirs[diff][:3]}"


def test_the_cases_reach_what_they_name():
    """The hard cases are hard: NaN and inf appear, C = 0 somewhere, subnormal operands, products >= 2."""
    unit = instructions.get("Hopper", "m64n8k32.f32.e5m2.e4m3")
    got = dict(oracle.cases(unit, seed=2026))
    assert np.isnan(got["nan_inf"]["c"]).any() and np.isinf(got["nan_inf"]["a"]).any()
    assert (got["c_zero"]["c"] == 0).mean() > 0.5
    a = got["subnormal"]["a"]
    assert (np.abs(a[a != 0]) < 2.0 ** -14).all()
    a, b = got["significand_near_2"]["a"][:, :1], got["significand_near_2"]["b"][:1]
    lg = lambda x: np.floor(np.log2(np.abs(x)))
    assert (lg(a * b) > lg(a) + lg(b)).mean() > 0.5      # significand products >= 2: one binade up
    d = _run("Hopper", "m64n8k32.f32.e5m2.e4m3", got["nan_inf"])
    assert np.isnan(d).any() and np.isinf(d).any()


@pytest.mark.parametrize("field", ["frac_bits", "e_zero", "group"])
def test_the_oracle_sees_a_one_step_change(field):
    """A unit one fraction bit wider, with another zero exponent, or fusing fewer terms, no longer matches
    MMA-Sim on the same cases: the differential test can fail."""
    arch, instr = "Hopper", "m64n8k16.f32.bf16.bf16"     # bf16 products reach below 2^e_zero
    unit = instructions.get(arch, instr)
    changed = replace(unit, **{field: {"frac_bits": 26, "e_zero": -120, "group": 8}[field]})
    differ = 0
    for _, kw in oracle.cases(unit, seed=5):
        theirs = oracle.sim_matmul(arch, instr, kw["a"], kw["b"], kw["c"])
        differ += oracle.compare(_run(arch, instr, kw, changed), theirs).sum()
    assert differ > 0


def test_products_only_model_misaligns_significands_near_two():
    """The old model (tensorcore.mma, products only) aligns to floor(log2 |a·b|), one bit short of MMA-Sim's
    ea + eb when the significand product is >= 2: with C = 0 it differs, the unit does not."""
    rng = np.random.default_rng(1)
    vals = oracle.type_values("e4m3")
    a = rng.choice(vals[np.abs(vals) > 0.1], (64, 32))
    b = rng.choice(vals[np.abs(vals) > 0.1], (32, 8))
    c = np.zeros((64, 8), np.float32)
    theirs = oracle.sim_matmul("Hopper", "m64n8k32.f32.e4m3.e4m3", a, b, c)
    old = np.stack([tensorcore.mma(np.zeros(8), a[i][:, None] * b) for i in range(64)]).astype(np.float32)
    new = tensorcore.matmul(a, b, c, arch="Hopper", instr="m64n8k32.f32.e4m3.e4m3")
    assert oracle.compare(new, theirs).sum() == 0
    assert 0.02 < oracle.compare(old, theirs).mean() < 0.6


def test_chain_along_k_feeds_d_as_c():
    a = np.full((1, 64), 1.0)
    b = np.full((64, 1), 1.0)
    d = tensorcore.matmul(a, b, np.array([[2.0 ** 20]], np.float32), arch="Hopper", instr="m64n8k32.f32.e4m3.e4m3")
    # 2^20 + 32 ones: the 13-bit grid of 2^20 is 2^7, so each instruction's 32 is cut to zero
    assert d[0, 0] == 2.0 ** 20
    d = tensorcore.matmul(a, b, np.array([[2.0 ** 10]], np.float32), arch="Hopper", instr="m64n8k32.f32.e4m3.e4m3")
    assert d[0, 0] == 2.0 ** 10 + 64


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"arch": "Pascal", "instr": "m64n8k32.f32.e4m3.e4m3"}, "parameter 'arch'"),
    ({"arch": "Hopper", "instr": "m64n8k32.f32.e4m3"}, "parameter 'instr'"),
    ({"arch": "Ada Lovelace", "instr": "m64n8k32.f32.e4m3.e4m3"}, "parameter 'instr'"),
])
def test_unknown_names_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tensorcore.matmul(np.ones((1, 32)), np.ones((32, 1)), np.zeros((1, 1)), **kwargs)


def test_bad_operands_are_refused():
    mm = lambda a, b, c, **kw: tensorcore.matmul(a, b, c, arch="Hopper", instr="m64n8k32.f32.e4m3.e4m3", **kw)
    with pytest.raises(ValueError, match="exactly representable in e4m3"):
        mm(np.full((1, 32), 0.3), np.ones((32, 1)), np.zeros((1, 1)))
    with pytest.raises(ValueError, match="multiple of the instruction's k = 32"):
        mm(np.ones((1, 16)), np.ones((16, 1)), np.zeros((1, 1)))
    with pytest.raises(ValueError, match="parameter 'c' must be shaped"):
        mm(np.ones((2, 32)), np.ones((32, 1)), np.zeros((1, 1)))
    with pytest.raises(ValueError, match="apply only to block-scaled"):
        mm(np.ones((1, 32)), np.ones((32, 1)), np.zeros((1, 1)), scale_a=np.ones((1, 1)))
    blk = "m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0"
    with pytest.raises(ValueError, match="scale_a"):
        tensorcore.matmul(np.ones((1, 32)), np.ones((32, 1)), np.zeros((1, 1)), arch="Blackwell", instr=blk)
    with pytest.raises(ValueError, match="exactly representable in ue8m0"):
        tensorcore.matmul(np.ones((1, 32)), np.ones((32, 1)), np.zeros((1, 1)), arch="Blackwell", instr=blk,
                          scale_a=np.full((1, 1), 3.0), scale_b=np.ones((1, 1)))


def test_every_registry_row_is_cited():
    with open(repo_root() / "data" / "tensorcore" / "units.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and all(r["source"].startswith("mmasim 2.1.1 mmasim/") for r in rows)
    assert {r["arch"] for r in rows} == set(instructions.ARCHS)


def test_validation_data_says_zero():
    """The committed long validation (scripts/tensorcore_validation.py, resumable, one unit at a time): every unit
    it has recorded ran >= 100,000 instructions with 0 mismatches, its CSV rows add up to the JSON's totals, and
    every recorded unit is one the contract names."""
    path = repo_root() / "data" / "tensorcore" / "validation.json"
    meta = json.loads(path.read_text())
    rows = {(r["arch"], r["instr"]): r for r in meta["units"]}
    assert rows and set(rows) <= set(CONTRACT_UNITS)
    per_case = pd.read_csv(checked(path.with_suffix(".csv")))
    for key, r in rows.items():
        assert r["instructions"] >= 100_000 and r["mismatches"] == 0
        mine = per_case[(per_case["arch"] == key[0]) & (per_case["instr"] == key[1])]
        assert set(mine["case"]) == set(oracle.CASES)
        assert int(mine["instructions"].sum()) == r["instructions"] and int(mine["mismatches"].sum()) == 0
