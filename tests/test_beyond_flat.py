"""experiments.accumulation_beyond_flat and claims.accumulation_beyond_flat: notebook 04b's tables and its verdict."""
from __future__ import annotations

from kvcost.claims import accumulation_beyond_flat as claims
from kvcost.experiments import accumulation_beyond_flat


def test_error_sweep_and_flush_sweep():
    df = accumulation_beyond_flat.error_sweep([256, 4096], ["bf16"], ["flat", "two_level", "hopper", "hopper_promoted"],
                                              d=2)
    flat = df[(df.strategy == "flat") & (df.profile == "flat")].set_index("n")["rel_error"]
    assert flat[256] == 0.0 and flat[4096] == 1 - 2.0 ** -4            # 1 - 0.0625
    assert (df[df.strategy == "flat"].rel_error <= df[df.strategy == "flat"].bound_recursive).all()
    fl = accumulation_beyond_flat.flush_sweep([1, 64], 131072, d=2).set_index(["interval", "profile"])["rel_error"]
    assert fl[("1", "flat")] == 0.0 and fl[("never", "flat")] > 0.5
    assert fl[("1", "needle_middle")] < fl[("64", "needle_middle")] < fl[("never", "needle_middle")]


def test_deepseek_check_normwise_and_promotion_helps():
    ds = accumulation_beyond_flat.deepseek_check(K=1024, trials=20, frac_bits=(13,))
    assert len(ds) == len(accumulation_beyond_flat.DEEPSEEK_INPUTS)
    assert (ds["normwise_rel_error_promoted"] < ds["normwise_rel_error"]).all()
    # errors add up when the products share a sign: zero-mean inputs lose least
    e = ds.set_index("inputs")["normwise_rel_error"]
    assert e["normal"] < e["normal, mean 1"] < e["uniform_positive"]


def test_verdict_from_small_tables():
    methods = ["flat", "two_level", "pairwise", "hopper"]
    sweep = accumulation_beyond_flat.error_sweep([256, 65536], ["fp32", "bf16"], methods, d=2)
    flush = accumulation_beyond_flat.flush_sweep([1, 4, 64], 65536, d=2)
    ds = accumulation_beyond_flat.deepseek_check(K=1024, trials=20, frac_bits=(13,))
    checks = claims.printed(sweep, flush, ds, claims.load_published())
    assert len(checks) >= 8 and all(isinstance(c.agrees, bool) for c in checks)
    assert checks[0].agrees        # the needle is more forgiving than the flat profile
