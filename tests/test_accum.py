"""accum: every strategy against a plain exact-rounding reference, the post's Block 3 loop,
the fast paths against the compiled loop, and bad input."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcost import accum
from kvcost.floats import parse_format, round_to
from kvcost.numerics import _jit
from references import chain_exact, round_rational

FORMATS = ["fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "e8m13", "e5m4"]


# ------------------------------------------------------------ plain exact reference
def rn(v: Fraction, fmt: str) -> Fraction | float:
    """Round an exact rational to nearest-even in fmt (inf/NaN on overflow)."""
    return round_rational(v, fmt)


def ref_flat(xs, fmt, acc=Fraction(0)):
    for x in xs:
        acc = rn(acc + Fraction(float(x)), fmt)
    return acc


def ref_two_level(xs, fmt, b):
    out = Fraction(0)
    for s in range(0, len(xs), b):
        out = rn(out + ref_flat(xs[s:s + b], fmt), "fp32")
    return out


def ref_pairwise(xs, fmt):
    level = [Fraction(float(x)) for x in xs]
    if len(level) == 1:
        return rn(level[0], fmt)
    while len(level) > 1:
        nxt = [rn(level[i] + level[i + 1], fmt) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def ref_kahan(xs, fmt):
    s, c = Fraction(0), Fraction(0)
    for x in xs:
        y = rn(Fraction(float(x)) - c, fmt)
        t = rn(s + y, fmt)
        c = rn(rn(t - s, fmt) - y, fmt)
        s = t
    return s


def ref_hopper(xs, group, keep_bits, promote):
    """The model as specified in accum.hopper_sum, in rationals: the tensor-core instruction chain with
    keep_bits significant bits below the group's largest term (frac_bits = keep_bits - 1), each
    instruction's sum rounded to fp32."""
    return chain_exact(xs, group, promote, frac_bits=keep_bits - 1, rounding="toward_zero", out="fp32")


def terms(draw, fmt, n):
    """Terms of mixed scale and sign, some exactly representable in fmt, some not."""
    f = parse_format(fmt)
    vals = draw(st.lists(st.floats(-4, 4, allow_subnormal=False), min_size=n, max_size=n))
    scale = draw(st.sampled_from([1.0, f.eps, 2.0 ** -3, 1e-3]))
    xs = np.array(vals) * scale
    if draw(st.booleans()):
        xs = round_to(xs, fmt)
    return xs


SET = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fmt", FORMATS)
@SET
@given(data=st.data())
def test_flat_and_two_level_match_reference(fmt, data):
    n = data.draw(st.integers(1, 60))
    xs = terms(data.draw, fmt, n)
    got = float(accum.running_sum(xs, fmt))
    want = ref_flat(xs, fmt)
    assert got == float(want) or (math.isnan(got) and math.isnan(float(want)))
    b = data.draw(st.integers(1, 9))
    got2 = float(accum.running_sum(xs, fmt, block=b))
    assert got2 == float(ref_two_level(xs, fmt, b))


@pytest.mark.parametrize("fmt", FORMATS)
@SET
@given(data=st.data())
def test_pairwise_and_kahan_match_reference(fmt, data):
    n = data.draw(st.integers(1, 40))
    xs = terms(data.draw, fmt, n)
    assert float(accum.accumulate(xs, fmt, "pairwise")) == float(ref_pairwise(xs, fmt))
    got = float(accum.accumulate(xs, fmt, "kahan"))
    want = ref_kahan(xs, fmt)
    assert got == float(want) or (math.isnan(got) and math.isnan(float(want)))


@SET
@given(data=st.data())
def test_hopper_model_matches_reference(data):
    n = data.draw(st.integers(1, 200))
    xs = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n)))
    keep = data.draw(st.sampled_from([4, 8, 14]))
    promote = data.draw(st.sampled_from([None, 8, 32]))
    got = float(accum.hopper_sum(xs, group=8, keep_bits=keep, promote=promote))
    assert got == float(ref_hopper(xs, 8, keep, promote))


def test_exact_then_round_once():
    # 1 + 2^-8 + 2^-30 added to 1.0: double rounding via float64 would tie to 1.0
    x = np.array([1.0, 2.0 ** -8 + 2.0 ** -30])
    assert float(accum.running_sum(x, "bf16")) == 1.0078125
    # and a tail below float64's ulp at 1: 1 + (2^-8 + 2^-60) (float64 sum is a tie)
    x = np.array([1.0, 2.0 ** -8, 2.0 ** -60])
    assert float(accum.running_sum(x, "bf16")) == 1.0
    assert float(accum.running_sum(np.array([1.0, 2.0 ** -8 + 2.0 ** -60]), "bf16")) == 1.0078125


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_dtype_fast_path_equals_compiled_loop(fmt):
    rng = np.random.default_rng(1)
    x = round_to(rng.standard_normal((3000, 5)) * 0.05, fmt)
    f = parse_format(fmt)
    assert accum._dtype_path(x, f) is not None       # the fast path is taken
    fast = accum.running_sum(x, fmt)
    slow = accum._flat_nb(np.ascontiguousarray(x), np.zeros(5), *accum._fmt_args(f), 2)
    np.testing.assert_array_equal(fast, slow)
    fast2 = accum.running_sum(x, fmt, block=37)
    slow2 = accum._two_level_nb(np.ascontiguousarray(x), 37, *accum._fmt_args(f), 2)
    np.testing.assert_array_equal(fast2, slow2)


def test_vectorized_over_other_axes():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((500, 3, 4)) * 1e-3
    for strat, kw in [("flat", {}), ("two_level", {"block": 16}), ("pairwise", {}), ("kahan", {}),
                      ("hopper", {"promote": 128})]:
        out = accum.accumulate(x, "bf16", strat, **kw)
        assert out.shape == (3, 4)
        for i in range(3):
            for j in range(4):
                assert out[i, j] == accum.accumulate(x[:, i, j], "bf16", strat, **kw)


# ------------------------------------------------------------ limits (errata)
@pytest.mark.parametrize("fmt,limit", [("fp32", 2 ** 24), ("fp16", 2048), ("bf16", 256), ("tf32", 2048),
                                       ("fp8_e4m3", 16), ("fp8_e5m2", 8), ("e8m13", 2 ** 14),
                                       ("e2m1", 2), ("e11m40", 2 ** 41)])
def test_flat_sum_limit(fmt, limit):
    assert accum.flat_sum_limit(fmt) == limit


def test_flat_limit_by_running_sum_fp16_bf16():
    for fmt, p in (("fp16", 10), ("bf16", 7)):
        n = 2 ** (p + 1)
        assert accum.equal_terms_sum(n, fmt) == 1.0
        assert accum.equal_terms_sum(2 * n, fmt) == 0.5          # stalls at 1/2
        assert accum.equal_terms_sum(4 * n, fmt) == 0.25


def test_two_level_restores_one():
    assert accum.equal_terms_sum(131072, "bf16", "two_level", block=128) == 1.0
    assert accum.equal_terms_sum(131072, "bf16") == 2.0 ** -9
    assert accum.hopper_sum(np.full(131072, 2.0 ** -17), promote=128) == 1.0
    h = float(accum.hopper_sum(np.full(131072, 2.0 ** -17)))
    assert 2.0 ** -9 < h < 1.0                                  # between flat bf16 and two-level


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize("fmt", ["fp12", "e1m2", "int8", "", None])
def test_unknown_format(fmt):
    with pytest.raises(ValueError, match="fmt"):
        accum.running_sum(np.ones(4), fmt)
    with pytest.raises(ValueError, match="fmt"):
        accum.flat_sum_limit(fmt)


@pytest.mark.parametrize("block", [0, -1, 1.5, True, "8"])
def test_bad_block(block):
    with pytest.raises(ValueError, match="block"):
        accum.running_sum(np.ones(4), "bf16", block=block)


def test_bad_other_parameters():
    with pytest.raises(ValueError, match="strategy"):
        accum.accumulate(np.ones(4), "bf16", "magic")
    with pytest.raises(ValueError, match="block"):
        accum.accumulate(np.ones(4), "bf16", "two_level")
    with pytest.raises(ValueError, match="promote"):
        accum.hopper_sum(np.ones(64), promote=100)
    with pytest.raises(ValueError, match="x"):
        accum.running_sum(np.float64(1.0), "bf16")


def test_non_finite_terms_propagate_as_ieee():
    assert math.isnan(float(accum.running_sum(np.array([1.0, np.nan, 2.0]), "bf16")))
    assert float(accum.running_sum(np.array([1.0, np.inf, 2.0]), "e8m13")) == math.inf
    assert math.isnan(float(accum.running_sum(np.array([np.inf, -np.inf]), "fp16")))
    # overflow of the register: inf, or NaN in fp8_e4m3 (no inf)
    assert float(accum.running_sum(np.array([60000.0, 60000.0]), "fp16")) == math.inf
    assert math.isnan(float(accum.running_sum(np.array([448.0, 448.0]), "fp8_e4m3")))
    assert float(accum.running_sum(np.zeros((0, 3)), "bf16").sum()) == 0.0


def test_error_bounds_hold_on_flat_sum():
    for n in (256, 4096, 65536):
        x = np.full(n, 1.0 / n)
        err = abs(float(accum.running_sum(x, "e8m13")) - 1.0)
        assert err <= float(accum.error_bound("recursive", n, "e8m13"))
    assert accum.error_bound("recursive", 10 ** 6, "bf16") == math.inf
    assert float(accum.error_bound("probabilistic", 4, "bf16")) == 2 * 2.0 ** -8


def test_weight_profiles():
    for kind in accum.PROFILES:
        w = accum.weight_profile(kind, 1000, seed=3)
        if kind == "pv":
            assert w.shape == (1000, 16)
        else:
            assert w.shape == (1000,) and abs(math.fsum(w) - 1.0) < 1e-12 and (w >= 0).all()
    assert accum.weight_profile("needle_end", 100)[-1] == 0.5
    with pytest.raises(ValueError, match="kind"):
        accum.weight_profile("spiky", 10)
    with pytest.raises(ValueError, match="needle_mass"):
        accum.weight_profile("needle_end", 10, needle_mass=1.5)


def test_exact_sum_is_exact_enough():
    x = np.array([1e16, 1.0, -1e16, 1e-8])
    assert float(accum.exact_sum(x)) == 1.00000001


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "e8m13"])
def test_compiled_rounding_ties_in_the_subnormal_range_go_to_even(fmt):
    # (k + 1/2) smallest subnormals: at k = 1 the float64 input keeps only its implicit bit after
    # the shift, whose parity the compiled rounding once read from the exponent field (1.5 -> 1)
    f = parse_format(fmt)
    tiny = math.ldexp(1.0, f.emin - f.man_bits)
    x = np.array([(k + 0.5) * tiny for k in range(40)] + [(k + 0.5) * tiny * 2 ** 20 for k in range(40)])
    got = np.array([_jit.round_nb(v, 0.0, *accum._fmt_args(f)) for v in x])
    np.testing.assert_array_equal(got, round_to(x, fmt))
    assert _jit.round_nb(1.5 * tiny, 0.0, *accum._fmt_args(f)) == 2 * tiny
