"""Tests for kvcost.storage.quant: bit-exactness to the post, error bounds, bad input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvcost.experiments import axis_choice
from kvcost.inputs import synthetic
from kvcost.numerics import attention, axis
from kvcost.paths import repo_root
from kvcost.storage import ggml, quant
from references import post_block2_quant

# ---------------------------------------------------------------- the post, bit for bit

@pytest.mark.parametrize("bits", [2, 3, 4, 8, 16])
def test_intk_symmetric_is_bit_identical_to_post(bits):
    rng = np.random.default_rng(bits)
    x = rng.normal(0, 1, (257, 64))
    x[:, ::16] *= 4.0
    np.testing.assert_array_equal(quant.intk_roundtrip(x, bits, "token"), post_block2_quant(x, bits, 1))
    np.testing.assert_array_equal(quant.intk_roundtrip(x, bits, "channel"), post_block2_quant(x, bits, 0))


def test_axis_table_reproduces_post_printed_digits():
    k, v = synthetic.post_axis_cache(np.random.default_rng(7), 4096, 128)
    df = axis.axis_table(k, v, [8, 4, 2])
    assert list(df.columns) == ["cache", "bits", "per_token", "per_channel", "winner"]
    printed = [("K", 8, "1.212e-02", "8.506e-03", "per-channel"),
               ("K", 4, "2.199e-01", "1.542e-01", "per-channel"),
               ("K", 2, "7.749e-01", "9.020e-01", "per-token"),
               ("V", 8, "6.458e-03", "2.876e-02", "per-token"),
               ("V", 4, "1.175e-01", "5.104e-01", "per-token"),
               ("V", 2, "7.642e-01", "9.078e-01", "per-token")]
    for row, (c, b, pt, pc, w) in zip(df.itertuples(), printed):
        assert (row.cache, row.bits, row.winner) == (c, b, w)
        assert f"{row.per_token:.3e}" == pt
        assert f"{row.per_channel:.3e}" == pc


@pytest.mark.parametrize("bits", [1, 17])
def test_axis_table_bad_bits(bits):
    k = np.ones((4, 4))
    with pytest.raises(ValueError, match="'bits'"):
        axis.axis_table(k, k, [bits])


# ---------------------------------------------------------------- int-k: bounds, groups, KIVI


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 9), st.sampled_from([4, 8, 12])), elements=finite),
       st.integers(2, 8), st.sampled_from(["token", "channel"]))
def test_intk_symmetric_half_step_bound(x, bits, axis_choice):
    # absmax never clamps: every value is inside [-qmax, qmax] steps, so rounding to nearest
    # leaves at most half a step (plus the few ulps of x / scale and q * scale).
    y = quant.intk_roundtrip(x, bits, axis_choice)
    red = -1 if axis_choice == "token" else -2
    scale = np.abs(x).max(axis=red, keepdims=True) / (2 ** (bits - 1) - 1)
    assert np.all(np.abs(y - x) <= 0.5 * scale * (1 + 1e-12) + 4 * np.spacing(np.abs(x) + scale))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.sampled_from([4, 8])), elements=finite),
       st.integers(1, 8), st.sampled_from(["token", "channel"]), st.sampled_from([None, 2, 4]))
def test_intk_asymmetric_half_step_bound(x, bits, axis_choice, group):
    if axis_choice == "channel" and group is not None and x.shape[0] % group:
        group = None
    y = quant.intk_roundtrip(x, bits, axis_choice, symmetric=False, group_size=group)
    red = -1 if axis_choice == "token" else -2
    g = x.shape[red] if group is None else group
    xs = x.reshape(x.shape[0], -1, g) if red == -1 else x.reshape(-1, g, x.shape[1])
    ys = y.reshape(xs.shape)
    r = -1 if red == -1 else -2
    step = (xs.max(r, keepdims=True) - xs.min(r, keepdims=True)) / (2 ** bits - 1)
    slack = 8 * np.spacing(np.abs(xs).max(r, keepdims=True) + 1e-300)
    assert np.all(np.abs(ys - xs) <= 0.5 * step + slack)


def test_intk_known_values_and_ties_to_even():
    x = np.array([[-3.0, -1.0, 0.5, 1.5, 3.0]])           # 3 bits: qmax 3, scale 1
    np.testing.assert_array_equal(quant.intk_roundtrip(x, 3, "token"), [[-3.0, -1.0, 0.0, 2.0, 3.0]])
    # asymmetric 2 bits over [0, 3]: levels 0, 1, 2, 3; 0.5 -> 0 and 1.5 -> 2 (ties to even)
    x = np.array([[0.0, 0.5, 1.5, 3.0]])
    np.testing.assert_array_equal(quant.intk_roundtrip(x, 2, "token", symmetric=False), [[0.0, 0.0, 2.0, 3.0]])


def test_intk_groups_are_independent_blocks():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (2, 64, 16))
    y = quant.intk_roundtrip(x, 4, "channel", group_size=16)
    for i in range(4):
        blk = x[:, 16 * i:16 * (i + 1), :]
        np.testing.assert_array_equal(y[:, 16 * i:16 * (i + 1), :], quant.intk_roundtrip(blk, 4, "channel"))
    y = quant.intk_roundtrip(x, 4, "token", group_size=8)
    np.testing.assert_array_equal(y[..., 8:], quant.intk_roundtrip(x[..., 8:], 4, "token"))


def test_intk_zeros_constants_outliers():
    z = np.zeros((4, 8))
    for sym in (True, False):
        np.testing.assert_array_equal(quant.intk_roundtrip(z, 4, "token", symmetric=sym), z)
    c = np.full((3, 8), -2.5)
    np.testing.assert_array_equal(quant.intk_roundtrip(c, 4, "token", symmetric=False), c)  # exact
    np.testing.assert_allclose(quant.intk_roundtrip(c, 4, "token"), c, rtol=1e-15)
    # one outlier token wipes out the small channels of its channel scale at 4 bits
    x = np.ones((4, 2))
    x[0, 0] = 1000.0
    y = quant.intk_roundtrip(x, 4, "channel")
    np.testing.assert_array_equal(y[:, 0], [1000.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(y[:, 1], [1.0, 1.0, 1.0, 1.0])


def test_intk_idempotent_to_rounding():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (32, 16))
    for sym, bits in ((True, 4), (False, 3)):
        y = quant.intk_roundtrip(x, bits, "channel", symmetric=sym)
        np.testing.assert_allclose(quant.intk_roundtrip(y, bits, "channel", symmetric=sym), y, rtol=0, atol=1e-14)


def test_residual_window_and_sinks_kept_exact():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (40, 8))
    y = quant.intk_roundtrip(x, 2, "channel", residual=10, sinks=4)
    np.testing.assert_array_equal(y[:4], x[:4])
    np.testing.assert_array_equal(y[-10:], x[-10:])
    np.testing.assert_array_equal(y[4:30], quant.intk_roundtrip(x[4:30], 2, "channel"))
    np.testing.assert_array_equal(quant.intk_roundtrip(x, 2, "token", residual=30, sinks=10), x)


def test_kivi_prefill_residual_rule():
    rng = np.random.default_rng(4)
    k, v = rng.normal(0, 1, (2, 300, 64)), rng.normal(0, 1, (2, 300, 64))
    kh, vh = quant.kivi_roundtrip(k, v, 2, group_size=32, residual=128)
    # K: last 300 % 128 = 44 tokens full precision, 256 tokens in groups of 32 tokens per channel
    np.testing.assert_array_equal(kh[:, -44:], k[:, -44:])
    np.testing.assert_array_equal(kh[:, :32], quant.intk_roundtrip(k[:, :32], 2, "channel", symmetric=False))
    # V: last 128 tokens full precision, the rest per token in groups of 32 channels
    np.testing.assert_array_equal(vh[:, -128:], v[:, -128:])
    np.testing.assert_array_equal(vh[:, :172, :32], quant.intk_roundtrip(v[:, :172, :32], 2, "token", symmetric=False))
    assert not np.array_equal(kh[:, :256], k[:, :256])
    kh, vh = quant.kivi_roundtrip(k[:, :100], v[:, :100], 2, residual=128)   # shorter than R: all exact
    np.testing.assert_array_equal(kh, k[:, :100])
    np.testing.assert_array_equal(vh, v[:, :100])


# ---------------------------------------------------------------- ggml block formats

def test_ggml_q4_0_known_block_and_clamp():
    x = np.arange(32, dtype=np.float32) - 16           # -16 .. 15: max |x| is -16 -> level -8, d = 2
    y = quant.ggml_roundtrip(x, "q4_0")
    # round half up (trunc(x/d + 8.5)); +15 would need level +7.5 -> clamps to +7, i.e. 14
    expected = 2.0 * (np.minimum(15, np.floor((x / 2) + 8.5)) - 8)
    np.testing.assert_array_equal(y, expected)
    assert y[0] == -16 and y[1] == -14 and y[2] == -14 and y[31] == 14
    # the opposite sign at full magnitude loses a whole step
    b = np.ones(32, dtype=np.float32)
    b[0] = -1
    np.testing.assert_array_equal(quant.ggml_roundtrip(b, "q4_0")[1:], np.float32(0.875))
    b5 = quant.ggml_roundtrip(b, "q5_0")
    np.testing.assert_array_equal(b5[1:], np.float32(15 / 16))


def test_ggml_q8_0_rounds_half_away_from_zero():
    x = np.zeros(32, dtype=np.float32)
    x[0] = 127.0                                        # d = 1 exactly
    x[1:5] = [0.5, -0.5, 2.5, -1.5]
    y = quant.ggml_roundtrip(x, "q8_0")
    np.testing.assert_array_equal(y[:5], [127.0, 1.0, -1.0, 3.0, -2.0])


def test_ggml_affine_known_block():
    x = np.linspace(-1, 2, 32, dtype=np.float32)
    b = quant.ggml_quantize(x, "q4_1")
    assert b.m[0] == np.float16(-1.0) and b.d[0] == np.float16(np.float32(3) / np.float32(15))
    np.testing.assert_array_equal(b.q[0, [0, 31]], [0, 15])
    b = quant.ggml_quantize(x, "q5_1")
    np.testing.assert_array_equal(b.q[0, [0, 31]], [0, 31])


def _ggml_bound(x32, kind):
    """The true per-element error bound of one ggml format, from an independent recomputation
    of the float32 scale d32 (the one used to pick codes) and the stored fp16 scale."""
    xb = x32.reshape(-1, 32).astype(np.float64)
    blocks = quant.ggml_quantize(x32, kind)
    d16 = blocks.d.reshape(-1, 1).astype(np.float64)
    amax = np.abs(xb).max(1, keepdims=True)
    eps = 2.0 ** -22 * amax                              # float32 rounding of x*id, x-min, the add
    if kind == "q8_0":
        d32 = np.float32(amax.astype(np.float32) / np.float32(127)).astype(np.float64)
        # half a step of d32, plus |q| <= 127 times the fp16 storage error of the scale
        return 0.5 * d32 + 127 * np.abs(d16 - d32) + eps
    if kind in ("q4_0", "q5_0"):
        nmax = 8 if kind == "q4_0" else 16
        d32 = amax / nmax
        # the largest magnitude maps to -nmax; the opposite sign tops out at nmax - 1, so values
        # above nmax - 1/2 steps lose up to a whole step instead of half
        t = np.abs(xb) / np.where(d32 == 0, 1, d32)
        half = np.where(t > nmax - 0.5, t - (nmax - 1), 0.5)
        return half * d32 + nmax * np.abs(d16 - d32) + eps
    levels = 15 if kind == "q4_1" else 31
    mn, mx = xb.min(1, keepdims=True), xb.max(1, keepdims=True)
    d32 = (mx - mn) / levels
    m16 = blocks.m.reshape(-1, 1).astype(np.float64)
    return 0.5 * d32 + levels * np.abs(d16 - d32) + np.abs(m16 - mn) + 2 * eps


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_ggml_error_bounds(kind, scale):
    rng = np.random.default_rng(11)
    x = (rng.normal(0, scale, (64, 128)) * np.where(rng.random((64, 128)) < 0.03, 20, 1)).astype(np.float32)
    x[0, :32] = scale                                   # constant block
    x[1, :32] = 0                                       # zero block
    x[2, :32] = np.where(np.arange(32) % 2, scale, -scale)   # both signs at full magnitude
    y = quant.ggml_roundtrip(x, kind).astype(np.float64)
    err = np.abs(y - x.astype(np.float64)).reshape(-1, 32)
    assert np.all(err <= _ggml_bound(x, kind))
    np.testing.assert_array_equal(y[1, :32], 0)


def test_ggml_iq4_nl_bound_and_levels():
    rng = np.random.default_rng(12)
    x = rng.normal(0, 1, (32, 64)).astype(np.float32)
    b = quant.ggml_quantize(x, "iq4_nl")
    y = quant.ggml_roundtrip(x, "iq4_nl")
    # each value is a stored fp16 scale times one of the 16 levels
    np.testing.assert_array_equal(y.reshape(-1, 32), b.d.reshape(-1, 1).astype(np.float32)
                                  * ggml.IQ4NL_VALUES[b.q.reshape(-1, 32)].astype(np.float32))
    # codes are nearest levels under s0 = max/-127; the widest gap is 24 and the top level 113 of
    # a possible 127 (opposite sign), so |x - s0*v| <= 14|s0|; the final (least-squares) scale d
    # moves each value by |v| |d - s0| <= 127 |d - s0|
    xb = x.reshape(-1, 32).astype(np.float64)
    s0 = np.abs(xb).max(1, keepdims=True) / 127
    d16 = b.d.reshape(-1, 1).astype(np.float64)
    assert np.all(np.abs(y.reshape(-1, 32) - xb) <= 14 * s0 + 127 * np.abs(np.abs(d16) - s0) + 1e-6 * s0)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q5_0"])
def test_ggml_idempotent_where_scale_is_reproduced(kind):
    # re-quantizing a dequantized block finds the same fp16 scale exactly (amax = nmax * d16),
    # so codes and values repeat bit for bit; the _1 formats re-derive (max - min)/levels with a
    # rounding, and iq4_nl refits its scale, so they are only close
    x = np.random.default_rng(8).normal(0, 1, (16, 64)).astype(np.float32)
    y = quant.ggml_roundtrip(x, kind)
    np.testing.assert_array_equal(quant.ggml_roundtrip(y, kind), y)


@pytest.mark.parametrize("kind", ["q4_1", "q5_1", "iq4_nl"])
def test_ggml_nearly_idempotent(kind):
    x = np.random.default_rng(8).normal(0, 1, (16, 64)).astype(np.float32)
    y = quant.ggml_roundtrip(x, kind)
    y2 = quant.ggml_roundtrip(y, kind)
    assert np.abs(y2 - y).max() < 0.05 * np.abs(y).max()


def _scalar_q4_0(block):
    """A direct scalar transcription of quantize_row_q4_0_ref + dequantize_row_q4_0 (float32 scalars)."""
    f = np.float32
    amax, mx = f(0), f(0)
    for v in block:
        if amax < abs(v):
            amax, mx = abs(v), v
    d = f(mx / f(-8))
    inv = f(f(1) / d) if d else f(0)
    out = []
    dh = np.float32(np.float16(d))
    for v in block:
        q = min(15, int(f(f(v * inv) + f(8.5))))
        out.append(f(f(q - 8) * dh))
    return np.array(out, dtype=np.float32)


def test_ggml_q4_0_matches_scalar_transcription_on_ties():
    rng = np.random.default_rng(9)
    # values on exact half steps of the scale, where float32 order of operations decides
    x = (rng.integers(-16, 17, (200, 32)) * 0.5).astype(np.float32)
    x[:, 0] = -8
    x[:100] *= np.float32(1.1)
    y = quant.ggml_roundtrip(x, "q4_0")
    for r in range(x.shape[0]):
        np.testing.assert_array_equal(y[r], _scalar_q4_0(x[r]))


def test_ggml_contract_shapes_and_bad_input():
    x = np.random.default_rng(0).normal(0, 1, (2, 3, 64))
    for kind in quant.GGML_KINDS:
        assert quant.ggml_roundtrip(x, kind).shape == x.shape
    with pytest.raises(ValueError, match="'x'"):
        quant.ggml_roundtrip(np.zeros((2, 48)), "q4_0")
    with pytest.raises(ValueError, match="'kind'"):
        quant.ggml_roundtrip(np.zeros((2, 64)), "q3_0")
    with pytest.raises(ValueError, match="'x'"):
        quant.ggml_roundtrip(np.full((1, 32), np.inf), "q8_0")


# ---------------------------------------------------------------- Hadamard

def test_hadamard_scores_invariant_exactly_in_integers():
    # exact arithmetic: with the unnormalized +-1 matrix, H^T H = n I, so (Hq).(Hk) = n (q.k)
    rng = np.random.default_rng(6)
    q = rng.integers(-50, 50, (128,))
    k = rng.integers(-50, 50, (300, 128))
    hq = quant.hadamard_rotate(q, normalized=False)
    hk = quant.hadamard_rotate(k, normalized=False)
    assert hq.dtype == np.int64
    np.testing.assert_array_equal(hk @ hq, 128 * (k @ q))
    h8 = quant.hadamard_matrix(8, normalized=False)
    np.testing.assert_array_equal(h8 @ h8, 8 * np.eye(8, dtype=np.int64))


def test_hadamard_scores_invariant_in_float_and_involution():
    rng = np.random.default_rng(7)
    q, k = rng.normal(0, 1, 128), rng.normal(0, 1, (500, 128))
    k[:, ::16] *= 4
    for block in (None, 64, 32):
        hq, hk = quant.hadamard_rotate(q, block=block), quant.hadamard_rotate(k, block=block)
        np.testing.assert_allclose(hk @ hq, k @ q, rtol=0, atol=1e-12 * np.abs(k).max() * np.abs(q).max() * 128)
        np.testing.assert_allclose(quant.hadamard_rotate(hk, block=block), k, atol=1e-13)
    np.testing.assert_allclose(quant.hadamard_rotate(np.eye(16)), quant.hadamard_matrix(16), atol=1e-15)


def test_hadamard_spreads_channel_outliers():
    # the point of rotating: per-token 4-bit error of K with outlier channels drops
    rng = np.random.default_rng(1)
    k = rng.normal(0, 1, (512, 128))
    k[:, ::16] *= 8
    plain = attention.rel_l2(quant.intk_roundtrip(k, 4, "token"), k)
    rot = attention.rel_l2(quant.rotated_roundtrip(k, lambda y: quant.intk_roundtrip(y, 4, "token")), k)
    assert rot < 0.6 * plain


def test_hadamard_bad_input():
    with pytest.raises(ValueError, match="'n'"):
        quant.hadamard_matrix(12)
    with pytest.raises(ValueError, match="'block'"):
        quant.hadamard_rotate(np.zeros((2, 96)))
    with pytest.raises(ValueError, match="'block'"):
        quant.hadamard_rotate(np.zeros((2, 64)), block=48)


# ---------------------------------------------------------------- fp8

def test_fp8_single_rounding_not_double():
    # 1 + 2^-4 + 2^-30 lies just above the e4m3 midpoint between 1 and 1.125: correctly rounded it
    # is 1.125; through float32 first it becomes exactly the midpoint 1.0625 and ties to even 1.0
    x = np.array([[1 + 2.0 ** -4 + 2.0 ** -30]])
    np.testing.assert_array_equal(quant.fp8_roundtrip(x, "e4m3", scale=1.0), [[1.125]])
    x = np.array([[1 + 2.0 ** -3 + 2.0 ** -30]])   # e5m2: between 1 and 1.25
    np.testing.assert_array_equal(quant.fp8_roundtrip(x, "e5m2", scale=1.0), [[1.25]])


@pytest.mark.parametrize("fmt,man,fmax", [("e4m3", 3, 448.0), ("e5m2", 2, 57344.0)])
@pytest.mark.parametrize("scaling", ["tensor", "head", "token"])
def test_fp8_half_ulp_bound_and_saturation(fmt, man, fmax, scaling):
    rng = np.random.default_rng(10)
    x = rng.normal(0, 1, (4, 64, 32)) * np.exp(rng.normal(0, 1, (4, 64, 1)))
    y = quant.fp8_roundtrip(x, fmt, scaling)
    s = quant.fp8_scale(x, fmt, scaling)
    assert np.abs(x / s).max() <= fmax * (1 + 1e-15)
    t = np.abs(x / s)
    emin = -6 if fmt == "e4m3" else -14
    ulp = np.ldexp(1.0, np.maximum(np.floor(np.log2(np.where(t > 0, t, 1))), emin).astype(int) - man)
    assert np.all(np.abs(y - x) <= 0.5 * ulp * s * (1 + 1e-12))
    # explicit scale 1.0 saturates at +-max (vLLM's SATFINITE conversion), never NaN
    big = np.array([[1e6, -1e6, 0.0]])
    np.testing.assert_array_equal(quant.fp8_roundtrip(big, fmt, scale=1.0), [[fmax, -fmax, 0.0]])


def test_fp8_zeros_and_bad_input():
    np.testing.assert_array_equal(quant.fp8_roundtrip(np.zeros((2, 3, 4)), "e4m3", "head"), 0)
    with pytest.raises(ValueError, match="'fmt'"):
        quant.fp8_roundtrip(np.ones((2, 2)), "e3m4")
    with pytest.raises(ValueError, match="'scaling'"):
        quant.fp8_roundtrip(np.ones((2, 2)), "e4m3", "channel")
    with pytest.raises(ValueError, match="'scale'"):
        quant.fp8_roundtrip(np.ones((2, 2)), "e4m3", scale=0.0)


# ---------------------------------------------------------------- bad input (int-k)

def test_intk_bad_input():
    x = np.ones((8, 8))
    with pytest.raises(ValueError, match="'bits'"):
        quant.intk_roundtrip(x, 1, "token")
    with pytest.raises(ValueError, match="'bits'"):
        quant.intk_roundtrip(x, 17, "token", symmetric=False)
    with pytest.raises(ValueError, match="'group_size'"):
        quant.intk_roundtrip(x, 4, "token", group_size=3)
    with pytest.raises(ValueError, match="'group_size'"):
        quant.intk_roundtrip(x, 4, "channel", group_size=0)
    with pytest.raises(ValueError, match="'axis'"):
        quant.intk_roundtrip(x, 4, "head")
    with pytest.raises(ValueError, match="'residual'"):
        quant.intk_roundtrip(x, 4, "token", residual=-1)
    with pytest.raises(ValueError, match="'x'"):
        quant.intk_roundtrip(np.ones(8), 4, "token")
    with pytest.raises(ValueError, match="'residual'"):
        quant.kivi_roundtrip(x, x, 2, group_size=32, residual=48)


def test_scheme_bits_of_the_post_int_k_split_k_and_v():
    (post4,) = [s for s in axis_choice.standard_schemes([4]) if s.name.startswith("int4 post")]
    assert axis_choice.scheme_bits(post4, 128, "k") == 4.0        # per-channel scales: constant
    assert axis_choice.scheme_bits(post4, 128, "v") == 4.25       # + 32-bit scale per 128 values
    assert axis_choice.scheme_bits(post4, 128) == 4.125
    with pytest.raises(ValueError, match="'cache'"):
        axis_choice.scheme_bits(post4, 128, "q")


def test_the_2026_schemes_of_notebook_02() -> None:
    schemes = {s.name: s for s in axis_choice.standard_schemes([4], head_dim=128)}
    tq = schemes["turboquant_4bit_nc"]
    bits = axis_choice.scheme_bits(tq, 128, "k"), axis_choice.scheme_bits(tq, 128, "v")
    assert bits == (4.125, 4.25)     # 66 and 68 bytes
    assert axis_choice.scheme_bits(schemes["nvfp4"], 128) == 4.5 and schemes["mxfp8"].family == "FP4 / MX blocks"
    x = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)
    assert np.array_equal(tq.k(x), quant.roundtrip(x, "turboquant_4bit_nc", role="k"))
    assert np.array_equal(tq.v(x), quant.roundtrip(x, "turboquant_4bit_nc", role="v"))
    # llama.cpp's rotation as shipped at head_dim 128: K rotated as a whole, V in blocks of 64
    rot = schemes["q4_0 +Hadamard"]
    np.testing.assert_array_equal(rot.v(x), quant.rotated_roundtrip(x, lambda y: quant.ggml_roundtrip(y, "q4_0"),
                                                                     block=64).astype(np.float64))
    np.testing.assert_array_equal(rot.k(x), quant.roundtrip(x, "q4_0+hadamard").astype(np.float64))
    # a head llama.cpp does not rotate (96 % 64) has no rotated twin, and no TurboQuant (Hadamard of 96)
    names96 = {s.name for s in axis_choice.standard_schemes([4], head_dim=96)}
    assert "q4_0" in names96 and "q4_0 +Hadamard" not in names96 and "turboquant_4bit_nc" not in names96
    assert "nvfp4" in names96 and "mxfp4" in names96
    assert axis_choice.outlier_formats(96)["about 4 bits"][:2] == ["q4_0", "iq4_nl"]


def test_format_outlier_sweep_and_the_fp4_placement() -> None:
    from kvcost.claims import axis_choice as claims

    sw = axis_choice.format_outlier_sweep(np.random.default_rng(7), 256, 64, [1.0, 8.0], ["q4_0", "nvfp4", "fp8_e4m3"])
    assert list(sw.columns) == ["format", "k_bits_per_value", "strength", "rel_l2"] and len(sw) == 6
    base = np.random.default_rng(7).normal(0, 1, (256, 64))
    k = base.copy()
    k[:, ::16] *= 8.0
    row = sw[(sw["format"] == "nvfp4") & (sw["strength"] == 8.0)].iloc[0]
    assert row["rel_l2"] == pytest.approx(np.linalg.norm(quant.roundtrip(k, "nvfp4") - k) / np.linalg.norm(k))
    table = pd.DataFrame({"scheme": ["q4_0", "nvfp4", "fp8 e4m3 /tensor"], "k_rel_l2": [0.13, 0.09, 0.03],
                          "v_rel_l2": [0.08, 0.09, 0.03], "k_bits_per_value": [4.5, 4.5, 8.0],
                          "v_bits_per_value": [4.5, 4.5, 8.0]})
    text = claims.fp4_placement(table)
    assert "- K: q4_0 0.13 (4.5 bits), nvfp4 0.09 (4.5 bits), fp8 e4m3 /tensor 0.03 (8 bits) — all 1 between them; " \
           "they close 40%–40% of q4_0's gap to fp8." in text
    assert "- V: " in text and "none between them, nvfp4 at or above q4_0." in text
    assert claims.fp4_placement(table[table["scheme"] != "nvfp4"]) == ""


def _llamacpp_ggml(name: str = "libggml-base.so"):
    """A ggml library llama-cpp-python ships (make llamacpp-reference), or None."""
    import ctypes
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib" / name
    return ctypes.CDLL(str(lib)) if lib.is_file() else None


@pytest.mark.skipif(_llamacpp_ggml() is None, reason="llama-cpp-python is not installed (make llamacpp-reference)")
@pytest.mark.parametrize("kind, block_bytes", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24),
                                               ("iq4_nl", 18)])
def test_ggml_roundtrip_is_llamacpps_own_bit_for_bit(kind, block_bytes):
    """Our quantizers against the reference ones in the ggml library llama.cpp ships
    (quantize_row_<kind>_ref, then dequantize_row_<kind>), on Gaussian rows and on SmolLM2's real K
    and V; and the CPU backend's quantize_row_<kind> (libggml-cpu: the from_float a KV-cache write
    calls) against _ref."""
    import ctypes

    from kvcost.inputs import extracts

    lib = _llamacpp_ggml()
    quantize, dequantize = getattr(lib, f"quantize_row_{kind}_ref"), getattr(lib, f"dequantize_row_{kind}")
    cpu = _llamacpp_ggml("libggml-cpu.so")
    cpu_quantize = getattr(cpu, f"quantize_row_{kind}") if cpu is not None else None
    for fn in (quantize, dequantize, cpu_quantize):
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    kv = extracts.load_real_kv(repo_root() / "data" / "real_model" / "smollm2_kv.npz")
    rng = np.random.default_rng(21)
    for x in (rng.normal(0, 3, (64, 64)).astype(np.float32), kv.k.reshape(-1, 64)[:4096].astype(np.float32),
              kv.v.reshape(-1, 64)[:4096].astype(np.float32)):
        flat = np.ascontiguousarray(x).ravel()
        blocks = np.zeros(flat.size // 32 * block_bytes, dtype=np.uint8)
        theirs = np.zeros_like(flat)
        quantize(flat.ctypes.data, blocks.ctypes.data, flat.size)
        dequantize(blocks.ctypes.data, theirs.ctypes.data, flat.size)
        np.testing.assert_array_equal(quant.ggml_roundtrip(x, kind).ravel(), theirs)
        if cpu is None:
            continue
        # the CPU backend's from_float, what a KV-cache write calls: _ref itself for five formats; for
        # q8_0 a SIMD version (x * (127/amax), rounded to even) that moves a near-tie by one step
        cpu_blocks = np.zeros_like(blocks)
        cpu_quantize(flat.ctypes.data, cpu_blocks.ctypes.data, flat.size)
        if kind != "q8_0":
            np.testing.assert_array_equal(cpu_blocks, blocks)
            continue
        ours, simd = (b.reshape(-1, 34) for b in (blocks, cpu_blocks))
        np.testing.assert_array_equal(simd[:, :2], ours[:, :2])          # the same fp16 scales
        step = simd[:, 2:].view(np.int8).astype(int) - ours[:, 2:].view(np.int8).astype(int)
        assert np.abs(step).max() <= 1 and np.count_nonzero(step) <= 1e-3 * step.size
