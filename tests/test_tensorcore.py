"""kvcost.tensorcore: the FP8 tensor-core instruction, with exact expected values and the exact
rational reference (references.mma_exact, chain_exact)."""
import math
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcost import floats, tensorcore
from kvcost.numerics import _jit
from references import chain_exact, e4m3, mma_exact

SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ exact expected values
def test_probe_sageattention2_zero_inputs_zero_low_10_bits():
    rng = np.random.default_rng(0)
    c = rng.standard_normal(64).astype(np.float32).astype(np.float64)
    got = tensorcore.mma(c, np.zeros((32, 64)))
    expect = (c.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFFC00)).view(np.float32).astype(np.float64)
    assert np.array_equal(got, expect)
    assert not np.array_equal(got, c)          # some low bits were set and are now gone


def test_product_2_pow_minus_13_kept_2_pow_minus_14_lost():
    assert tensorcore.mma([1.0], [[2.0 ** -13]])[0] == 1.0 + 2.0 ** -13
    assert tensorcore.mma([1.0], [[2.0 ** -14]])[0] == 1.0
    # nearest cuts 2^-14 (half a quantum) to even: lost too; 3 * 2^-15 goes up
    assert tensorcore.mma([1.0], [[2.0 ** -14]], rounding="nearest")[0] == 1.0
    assert tensorcore.mma([1.0], [[3 * 2.0 ** -15]], rounding="nearest")[0] == 1.0 + 2.0 ** -13


def test_negative_term_below_grid_dropped_toward_zero():
    assert tensorcore.mma([1.0], [[-2.0 ** -14]])[0] == 1.0          # not 1 - 2^-13 (floor would)
    assert tensorcore.mma([1.0], [[-2.0 ** -13]])[0] == 1.0 - 2.0 ** -13
    # the cut happens on each term, not on the sum: 32 terms of 2^-14 vanish one by one
    assert tensorcore.mma([1.0], np.full((32, 1), 2.0 ** -14))[0] == 1.0
    assert tensorcore.mma([1.0], np.full((32, 1), 2.0 ** -14), out="exact")[0] == 1.0


def test_sum_truncated_to_e8m13():
    # 2^14 - 1 + 2^13 products... a sum that needs 15 bits: the last is truncated
    c = 2.0 ** 13 + 1.0                         # 14 significant bits: exact on the grid at emax = 13
    got = tensorcore.mma([c], [[2.0 ** 13]])[0]
    assert got == 2.0 ** 14                     # exact 2^14 + 1 truncated to 13 fraction bits
    assert tensorcore.mma([c], [[2.0 ** 13]], out="exact")[0] == 2.0 ** 14 + 1.0
    assert tensorcore.mma([c], [[2.0 ** 13]], out="fp32")[0] == 2.0 ** 14 + 1.0


def test_adding_ones_stalls_at_2_pow_14_promotion_does_not():
    n = 20_000
    ones = np.ones(n)
    assert tensorcore.dot(ones, ones) == 2.0 ** 14
    assert tensorcore.dot(ones, ones, promote_every=128) == float(n)
    assert tensorcore.dot(ones[:16_384], ones[:16_384]) == 16_384.0    # exact up to the stall
    # the stall is at 2^(frac_bits + 1): a 10-bit unit stops at 2^11
    assert tensorcore.dot(ones, ones, frac_bits=10, out="e8m10") == 2.0 ** 11


def test_dot_starts_from_c_and_chains():
    a = np.ones(64)
    assert tensorcore.dot(a, a, c=1.0) == 65.0
    assert tensorcore.dot(a, a, c=2.0 ** 20) == 2.0 ** 20     # ones below 2^(20-13): dropped
    # with promotion c sits in the fp32 register and the ones add from zero
    assert tensorcore.dot(a, a, c=2.0 ** 20, promote_every=32) == 2.0 ** 20 + 64


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="'out'"):
        tensorcore.mma([1.0], [[1.0]], out="bf16")
    with pytest.raises(ValueError, match="'rounding'"):
        tensorcore.mma([1.0], [[1.0]], rounding="up")
    with pytest.raises(ValueError, match="'frac_bits'"):
        tensorcore.mma([1.0], [[1.0]], frac_bits=0)
    with pytest.raises(ValueError, match="'promote_every'"):
        tensorcore.dot(np.ones(4), np.ones(4), promote_every=48)
    with pytest.raises(ValueError, match="'products'"):
        tensorcore.mma([1.0, 2.0], [[1.0]])
    with pytest.raises(ValueError, match="'a' and 'b'"):
        tensorcore.dot(np.ones(4), np.ones(5))


def test_nan_and_inf_propagate():
    assert math.isnan(tensorcore.mma([1.0], [[math.nan]])[0])
    assert tensorcore.mma([1.0], [[math.inf]])[0] == math.inf


# ------------------------------------------------------------------ against exact rationals
fp8 = st.sampled_from(sorted({float(v) for v in floats.round_to(np.linspace(-448, 448, 4001), "fp8_e4m3")}
                             | {float(v) for v in floats.round_to(np.geomspace(2 ** -9, 448, 300), "fp8_e4m3")}))


@SET
@given(c=st.floats(-1e4, 1e4, allow_nan=False, width=32), a=st.lists(fp8, min_size=1, max_size=32),
       b=st.lists(fp8, min_size=32, max_size=32), fb=st.integers(4, 16),
       rounding=st.sampled_from(["toward_zero", "nearest"]), out=st.sampled_from(["e8m13", "fp32", "exact", "e8m8"]))
def test_mma_matches_exact_rationals(c, a, b, fb, rounding, out):
    prods = [x * y for x, y in zip(a, b)]
    got = tensorcore.mma([c], np.array(prods)[:, None], frac_bits=fb, rounding=rounding, out=out)[0]
    assert Fraction(got) == mma_exact(c, prods, fb, rounding, out)


@SET
@given(a=st.lists(fp8, min_size=1, max_size=200), seed=st.integers(0, 10),
       promote=st.sampled_from([None, 32, 64]), k=st.sampled_from([32, 16]))
def test_dot_matches_chained_exact_rationals_and_numpy_reference(a, seed, promote, k):
    rng = np.random.default_rng(seed)
    aa = np.array(a)
    bb = floats.round_to(rng.standard_normal(len(a)) * 4, "fp8_e4m3")
    if promote is not None and promote % k:
        return
    got = tensorcore.dot(aa, bb, k=k, promote_every=promote)
    assert got == tensorcore.dot_reference(aa, bb, k=k, promote_every=promote)
    # the chain, term by term, in exact rationals
    assert Fraction(got) == chain_exact(aa * bb, k, promote)


def test_dot_columns_equal_reference_and_are_independent():
    rng = np.random.default_rng(1)
    a = floats.round_to(rng.standard_normal((333, 7)), "fp8_e4m3")
    b = floats.round_to(rng.random((333, 7)) * 3, "fp8_e4m3")
    got = tensorcore.dot(a, b, promote_every=64)
    assert np.array_equal(got, tensorcore.dot_reference(a, b, promote_every=64))
    assert all(got[j] == tensorcore.dot(a[:, j], b[:, j], promote_every=64) for j in range(7))


# ------------------------------------------------------------ the float32-lane kernel fa3 uses
@numba.njit
def _instr64(tc, prod, wts, fb, om, oemin, ofmax):
    t = tc.astype(np.float64)
    _jit.fused_rows(t, prod.astype(np.float64), wts.astype(np.float64), prod.shape[0], t.size, np.empty((3, t.size)),
                    fb, False, 1, om, oemin, ofmax, 2.0 ** -126, 0.0, 2, False)
    return t


@numba.njit
def _instr32(tc, prod, wts, fb, om, ofmax):
    t = tc.copy()
    mx = np.zeros(t.size, np.float32)
    for i in range(wts.shape[0]):
        for j in range(t.size):
            mx[j] = max(mx[j], wts[i, j])
    _jit.fused_rows32(t, prod, mx, prod.shape[0], t.size, np.empty((2, t.size), np.float32), fb, om, ofmax)
    return t


def test_float32_lane_instruction_equals_the_float64_one_bit_for_bit():
    rng = np.random.default_rng(11)

    def w(x):       # operand alignment weights: 2^max(floor(log2 |x|), -6), 0 for 0
        return np.where(x == 0, 0, np.exp2(np.maximum(np.floor(np.log2(np.where(x == 0, 1, np.abs(x)))), -6)))

    took_float64 = 0
    for trial in range(400):
        fb = int(rng.choice([2, 5, 8, 13, 16]))
        _, _, _, om, oemin, ofmax = tensorcore.out_args(f"e8m{fb}", fb)
        kk, ncol = int(rng.integers(1, 33)), int(rng.integers(1, 70))
        a = e4m3(rng.standard_normal((kk, ncol)) * np.exp(rng.standard_normal((kk, ncol)) * 3))
        a[:, rng.random(ncol) < 0.2] = 0                    # columns with no products: tc alone
        b = e4m3(rng.standard_normal((kk, ncol)) * 4)
        prod = a * b
        wts = (w(a) * w(b)).astype(np.float32)
        tc = (rng.standard_normal(ncol) * np.exp(rng.standard_normal(ncol) * 6)).astype(np.float32)
        if trial % 4 == 1:
            tc *= np.float32(2.0 ** -120)                   # a rescaled accumulator below the float32 grid
        z = np.zeros((1, ncol), np.float32)
        tc = _instr64(tc, z, z, 23, om, oemin, ofmax).astype(np.float32)  # an e8mN value
        small = np.any((np.abs(tc) < 2.0 ** (fb - 126)) & (tc != 0) & np.all(prod == 0, axis=0))
        took_float64 += bool(small)
        np.testing.assert_array_equal(_instr32(tc, prod, wts, fb, om, ofmax).astype(np.float64),
                                      _instr64(tc, prod, wts, fb, om, oemin, ofmax))
    assert took_float64 > 10                                # the fallback columns were exercised
