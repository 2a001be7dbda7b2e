"""Notebook 06's tables and readings: real-head profiles, haystacks with an exact needle weight,
the FA3 emulation's error growing with context and removed by the fixes, the scaling-law fit."""
import numpy as np
import pandas as pd
import pytest

from kvcost import realkv
from kvcost.claims import beyond_flat
from kvcost.claims import longrange as claims
from kvcost.experiments import longrange as lr


@pytest.fixture(scope="module")
def profiles():
    return lr.head_profiles(realkv.load_real_kv())


def test_profiles_carry_the_real_channel_mean_ratio(profiles):
    t = lr.profile_table(profiles)
    assert len(t) == 72
    assert 0.30 < t["rho"].median() < 0.36            # the measurement: median 0.33
    assert 0.8 < t["rho"].max() < 0.9
    picked = lr.pick_profiles(profiles, 3)
    assert [p.rho for p in picked] == sorted(p.rho for p in picked)
    assert picked[-1].rho == t["rho"].max()


def test_decoder_profiles_carry_real_sinks():
    ps = lr.load_profiles("smollm2")
    t = lr.profile_table(ps)
    assert len(t) == 15                                  # 5 layers x 3 KV heads in the extract
    assert t["sink_share"].between(0, 1).all() and (t["sink_share"] > 0.1).sum() >= 3
    assert 0.2 < t["rho"].median() < 0.6
    with pytest.raises(ValueError, match="'source'"):
        lr.load_profiles("bert")


def test_haystack_is_deterministic_and_its_metrics_are_exact_on_the_reference(profiles):
    p = lr.pick_profiles(profiles, 1)[0]
    h = lr.make_haystack(p, 4096, 64, 0.05, seed=3)
    h2 = lr.make_haystack(p, 4096, 64, 0.05, seed=3)
    assert np.array_equal(h.k, h2.k) and np.array_equal(h.v, h2.v)
    assert 0.025 < h.weight < 0.1                      # the stored keys move the weight a little
    m = lr.metrics(h, h.ref)
    assert m["rel_l2"] == 0.0 and abs(m["gain"] - 1) < 1e-12 and abs(m["share"] - 1) < 1e-9 and m["retrieved"]
    # V has the head's channel means: rho of the drawn values is the profile's (within sampling)
    v = h.v.astype(np.float64)
    rho = np.sqrt(np.mean(v.mean(0) ** 2)) / np.sqrt(np.mean(v.std(0) ** 2))
    assert abs(rho - p.rho) < 0.05


def test_error_grows_with_context_and_the_fixes_remove_it(profiles):
    p = lr.pick_profiles(profiles, 1)
    g = lr.context_grid(p, [2048, 32768], d=64, trials=1, needle_weight=0.05, seed=0,
                        fixes=["no fix", "PR #104 every tile"], block_n=128)
    e = g.set_index(["n_tokens", "fix"])["rel_l2"]
    assert e[(32768, "no fix")] > 3 * e[(2048, "no fix")]
    assert e[(32768, "PR #104 every tile")] < e[(32768, "no fix")] / 10
    assert e[(32768, "bf16 P, fp32 acc")] < 0.01


def test_the_loss_is_in_acc_o(profiles):
    p = lr.pick_profiles(profiles, 1)
    w = lr.where_grid(p, 32768, d=64, trials=1, needle_weight=0.05, seed=0, block_n=128)
    e = w.set_index("variant")["rel_l2"]
    assert e["exact acc_o"] < e["kernel"] / 5
    assert e["exact QKᵀ"] > e["kernel"] / 2 and e["exact l"] > e["kernel"] / 2


def test_scaling_fit_collapse_and_level():
    x = np.geomspace(0.1, 100, 12)
    rows = [{"head": "h", "sink_share": 0.0, "frac_bits": b, "x": xi, "acc_error": 0.05 * xi ** 0.8,
             "n_tokens": xi * 2 ** b}
            for b in (9, 11, 13) for xi in x]
    fit = claims.scaling_fit(pd.DataFrame(rows))
    assert fit["spread_dex"] < 1e-9 and fit["range_dex"] > 2
    assert abs(fit["x_at_level"] - 2 ** (1 / 0.8)) < 0.05     # 0.05 x^0.8 = 0.1


def test_published_niah_read_from_data():
    niah = lr.published_niah(beyond_flat.load_published()).drop_duplicates("fix").set_index("fix")["accuracy"]
    assert niah["BF16 (blog)"] == 0.91 and niah["no fix"] == 0.13 and niah["PR #104 every tile"] == 0.89
    assert niah["PR #122 every 4"] == 0.88 and niah["PR #122 every 64"] == 0.856


def test_checks_are_computed_text(profiles):
    p = lr.pick_profiles(profiles, 1)
    kw = dict(d=64, trials=1, needle_weight=0.05, seed=0, block_n=128)
    ctx = lr.context_grid(p, [2048, 16384], **kw)
    where = lr.where_grid(p, 16384, **kw)
    knobs = lr.knob_grid(p, 16384, splits=[1, 4], block_sizes=[192], **kw)
    sc = lr.scaling_grid(p[0], [1024, 4096], [9, 11], **kw)
    out = claims.checks(ctx, where, knobs, sc, beyond_flat.load_published(), frac_bits=11)
    assert len(out) == 7
    assert all(isinstance(c.agrees, bool) and c.computed for c in out)
    assert "16,384" in out[0].computed
    assert claims.pct(0.2345) == "23%" and claims.pct(1e-9) == "< 0.0001%"
