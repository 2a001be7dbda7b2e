"""floats.round_to against an exact rational reference, and bit-exact against ml_dtypes."""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcost import floats
from kvcost.floats import parse_format, round_pair, round_to
from references import round_rational

FORMATS = ["fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "e8m13", "e4m3", "e2m1",
           "e3m2", "e6m5", "e11m50", "e11m4"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- exact reference
def ref_round(v: Fraction | float, fmt: str, mode: str, saturate: bool = False) -> float:
    """Textbook rounding of an exact rational (or a non-finite float) into ``fmt``, as a float with
    the sign of zero kept: references.round_rational on |v|, the sign put back."""
    f = parse_format(fmt)
    if isinstance(v, float) and math.isnan(v):
        return math.nan
    if isinstance(v, float) and math.isinf(v):
        if saturate:
            return math.copysign(f.max, v)
        return v if f.has_inf else math.nan
    sign = -1 if (math.copysign(1.0, v) < 0 if isinstance(v, float) else v < 0) else 1
    return sign * float(round_rational(abs(Fraction(v)), fmt, mode, saturate))


def same(a: float, b: float) -> bool:
    """Equal including the sign of zero, NaN equal to NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


# ------------------------------------------------- values near rounding breakpoints
@st.composite
def near_breakpoints(draw, fmt: str) -> float:
    """A format value or a midpoint between two, nudged by 0, ±1 float64 ulp; in every range
    (subnormal, normal, near overflow)."""
    f = parse_format(fmt)
    e = draw(st.integers(f.emin - f.man_bits - 2, f.emax + 2))
    sig = draw(st.integers(0, 2 ** (f.man_bits + 1) - 1))
    half = draw(st.booleans())
    # value = (sig + half/2) * 2^(max(e, emin) - m), on the grid of binade e
    q = max(e, f.emin) - f.man_bits
    try:
        x = math.ldexp(sig * 2 + int(half), q - 1)
    except OverflowError:
        x = math.inf
    nudge = draw(st.sampled_from([0, 1, -1]))
    if nudge and math.isfinite(x):
        x = math.nextafter(x, math.copysign(math.inf, nudge))
    if draw(st.booleans()):
        x = -x
    return x


def any_value(fmt: str):
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), near_breakpoints(fmt),
                     st.floats(width=32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["nearest", "toward_zero"])
@SETTINGS
@given(data=st.data())
def test_round_to_matches_exact_reference(fmt, mode, data):
    x = data.draw(any_value(fmt))
    sat = data.draw(st.booleans())
    want = ref_round(x, fmt, mode, sat)
    got = round_to(x, fmt, mode=mode, saturate=sat)
    assert same(got, want), (x, got, want)
    # arrays give the same as scalars
    arr = round_to(np.array([x, x]), fmt, mode=mode, saturate=sat)
    assert same(float(arr[1]), want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["nearest", "toward_zero"])
@SETTINGS
@given(data=st.data())
def test_round_pair_is_one_rounding_of_the_exact_sum(fmt, mode, data):
    """round_pair(TwoSum(a, b)) == exact rounding of the rational a + b: the double-rounding
    trap (1 + 2^-8 + 2^-60 is a bf16 midpoint plus a tail) included."""
    a = data.draw(near_breakpoints(fmt))
    b = data.draw(st.one_of(st.floats(-1e-300, 1e-300), near_breakpoints(fmt),
                            st.sampled_from([0.0, 2.0 ** -60, -2.0 ** -60, 2.0 ** -80]),
                            st.floats(allow_nan=False, allow_infinity=False, width=32)))
    s = a + b
    if not math.isfinite(s):
        return
    bb = s - a
    lo = (a - (s - bb)) + (b - bb)
    want = ref_round(Fraction(a) + Fraction(b), fmt, mode)
    got = float(round_pair(np.float64(s), np.float64(lo), fmt, mode))
    if Fraction(a) + Fraction(b) == 0:   # sign of an exact zero sum follows IEEE (+0), skip sign
        assert got == 0
    else:
        assert same(got, want), (a, b, got, want)


def test_issue_example_single_rounding_from_float64():
    x = 1 + 2.0 ** -8 + 2.0 ** -30
    assert round_to(x, "bf16") == 1.0078125
    # ml_dtypes goes through float32 and double-rounds to 1.0: the reason round_to exists
    assert float(np.float64(x).astype(ml_dtypes.bfloat16)) == 1.0
    assert round_to(1 + 2.0 ** -8, "bf16") == 1.0            # exact tie -> even
    assert round_to(1 + 3 * 2.0 ** -8, "bf16") == 1 + 2.0 ** -6  # tie -> even (up)
    assert round_to(1 + 2.0 ** -8, "bf16", mode="toward_zero") == 1.0


def test_specials_and_overflow():
    e4 = "fp8_e4m3"
    assert round_to(448.0, e4) == 448.0
    assert round_to(464.0, e4) == 448.0              # tie between 448 and 480 -> even 448
    assert math.isnan(round_to(464.5, e4))          # past the tie: NaN, e4m3fn has no inf
    assert math.isnan(round_to(math.inf, e4))
    assert round_to(1e9, e4, saturate=True) == 448.0
    assert round_to(-math.inf, e4, saturate=True) == -448.0
    assert round_to(1e9, e4, mode="toward_zero") == 448.0
    assert round_to(61440.0, "fp8_e5m2") == math.inf  # tie with 2^16 -> even -> overflow
    assert round_to(61439.0, "fp8_e5m2") == 57344.0
    assert round_to(-1e6, "fp16") == -math.inf
    assert round_to(-1e6, "fp16", saturate=True) == -65504.0
    assert math.isnan(round_to(math.nan, "bf16"))
    assert round_to(math.inf, "bf16") == math.inf
    assert round_to(240.0, "e4m3") == 240.0 and round_to(248.0, "e4m3") == math.inf
    # subnormals and signed zero
    assert round_to(2.0 ** -24, "fp16") == 2.0 ** -24
    assert round_to(2.0 ** -25, "fp16") == 0.0       # tie -> even (zero)
    assert round_to(3 * 2.0 ** -26, "fp16") == 2.0 ** -24
    z = round_to(-1e-30, "fp16")
    assert z == 0 and math.copysign(1, z) == -1


def test_format_spec_values():
    f = parse_format("fp8_e4m3")
    assert (f.max, f.min_normal, f.min_subnormal, f.emax, f.emin) == (448.0, 2 ** -6, 2 ** -9, 8, -6)
    assert parse_format("e4m3").max == 240.0 and not parse_format("e4m3").finite_only
    assert parse_format("fp8_e5m2").max == 57344.0
    assert parse_format("tf32").man_bits == 10 and parse_format("tf32").dtype is None
    assert parse_format("e8m7") == parse_format("bf16")
    assert parse_format("bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)
    assert parse_format("fp32").ulp(1.0) == 2.0 ** -23
    assert parse_format("bf16").ulp(1.0) == 2.0 ** -7       # the post's ULP line says 2^-8
    assert parse_format("fp16").ulp(0.0) == 2.0 ** -24
    assert parse_format("bf16").unit_roundoff == 2.0 ** -8
    for name in ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]:
        f = parse_format(name)
        fi = ml_dtypes.finfo(f.dtype)
        assert (float(fi.max), float(fi.smallest_normal), float(fi.smallest_subnormal)) == \
            (f.max, f.min_normal, f.min_subnormal)
    assert list(parse_format("bf16").is_representable([1.0, 1.0078125, 1.001])) == [True, True, False]


@pytest.mark.parametrize("bad", ["fp12", "e1m3", "e12m3", "e5m0", "e8m51", "", "E8M13x", None, 16])
def test_unknown_format_is_a_value_error(bad):
    with pytest.raises(ValueError, match="fmt"):
        round_to(1.0, bad)


def test_bad_mode_and_missing_seed():
    with pytest.raises(ValueError, match="mode"):
        round_to(1.0, "bf16", mode="up")
    with pytest.raises(ValueError, match="seed"):
        round_to(1.0, "bf16", mode="stochastic")
    with pytest.raises(ValueError, match="x"):
        round_to("1.0", "bf16")


# ---------------------------------------------------------------- ml_dtypes, bit-exact
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_bit_exact_with_ml_dtypes_on_float32(fmt):
    """Random float32 bit patterns (all exponents, NaN and inf included) and every float32
    value whose bits sit on and next to the target's rounding breakpoints."""
    f = parse_format(fmt)
    rng = np.random.default_rng(123)
    bits = rng.integers(0, 2 ** 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    shift = 23 - f.man_bits
    base = bits & np.uint32(~((1 << shift) - 1) & 0xFFFFFFFF)
    half = np.uint32(1 << (shift - 1))
    near = np.concatenate([base, base + half, base + half - np.uint32(1), base + half + np.uint32(1)])
    x = np.concatenate([bits, near]).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(f.dtype).astype(np.float64)
    got = round_to(x, fmt)
    ok = (want == got) & (np.signbit(want) == np.signbit(got)) | (np.isnan(want) & np.isnan(got))
    assert ok.all(), x[~ok][:5]


@SETTINGS
@given(x=st.floats(width=32), fmt=st.sampled_from(["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]),
       sat=st.booleans())
def test_ml_dtypes_agreement_property(x, fmt, sat):
    f = parse_format(fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        want = float(np.float32(x).astype(f.dtype))
    got = round_to(np.float32(x), fmt)
    assert same(got, want)


# ---------------------------------------------------------------- stochastic rounding
@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "e8m13", "fp16"])
def test_stochastic_rounding_is_unbiased_and_seeded(fmt):
    f = parse_format(fmt)
    x = np.full(200_000, 1.0 + 0.3 * f.eps)
    r = round_to(x, fmt, mode="stochastic", seed=5)
    assert set(np.unique(r)) == {1.0, 1.0 + f.eps}
    p_up = np.mean(r > 1.0)
    assert abs(p_up - 0.3) < 0.005
    assert np.array_equal(r, round_to(x, fmt, mode="stochastic", seed=5))
    assert not np.array_equal(r, round_to(x, fmt, mode="stochastic", seed=6))
    rep = parse_format(fmt).min_normal * 3
    assert np.all(round_to(np.full(10, rep), fmt, mode="stochastic", seed=0) == rep)


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(data=st.data())
def test_stochastic_rounds_to_a_neighbour(fmt, data):
    x = data.draw(near_breakpoints(fmt))
    r = round_to(x, fmt, mode="stochastic", seed=data.draw(st.integers(0, 2 ** 32)))
    if math.isinf(x):
        assert same(r, x if parse_format(fmt).has_inf else math.nan)
        return
    down = ref_round(Fraction(x), fmt, "toward_zero")
    if down == x:
        assert same(r, down) or (x == 0 and r == 0)
        return
    f = parse_format(fmt)
    # the neighbour away from zero (past max: overflow -> inf, or NaN without inf)
    if abs(down) >= f.max:
        away = math.copysign(math.inf, x) if f.has_inf else math.nan
    else:
        away = ref_round(Fraction(down) + Fraction(math.copysign(f.ulp(down), x)), fmt, "nearest")
    assert same(r, down) or same(r, away), (x, r, down, away)


def test_format_names_listed():
    assert {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"} <= set(floats.FORMAT_NAMES)
