"""kvcost.longrange: the needle's exact weight, exact arithmetic equals float64 attention, the
accumulators' behaviour, storage fast paths equal the quant/floats reference, bad parameters."""
import math

import numpy as np
import pytest

from kvcost import accum, attention, floats, longrange as lr, quant


@pytest.mark.parametrize("position", lr.POSITIONS)
@pytest.mark.parametrize("weight", [0.5, 0.1, 0.01])
@pytest.mark.parametrize("structure", lr.STRUCTURES)
def test_needle_gets_exactly_the_requested_weight(position, weight, structure):
    h = lr.make_haystack(2048, 64, needle_weight=weight, position=position, structure=structure, seed=3)
    w = attention.softmax(h.k @ h.q / math.sqrt(64))
    assert h.needle == lr.needle_index(2048, position)
    assert abs(w[h.needle] - weight) < 1e-12 * max(1.0, 1 / weight)
    assert h.needle_logit == pytest.approx(float(h.k[h.needle] @ h.q) / 8.0, rel=1e-13)


def test_haystack_is_deterministic_and_float32_valued():
    a = lr.make_haystack(512, 32, seed=5)
    b = lr.make_haystack(512, 32, seed=5)
    assert np.array_equal(a.k, b.k) and np.array_equal(a.v, b.v) and np.array_equal(a.q, b.q)
    assert np.array_equal(a.v.astype(np.float32).astype(np.float64), a.v)
    assert not np.array_equal(a.k, lr.make_haystack(512, 32, seed=6).k)


def test_exact_storage_and_arithmetic_is_float64_attention():
    h = lr.make_haystack(4096, 64, needle_weight=0.1, seed=1)
    r = lr.decode_step(h.q, h.k, h.v, score_format="exact", p_format="exact", accumulator="exact")
    ref = lr.exact_attention(h)
    assert np.allclose(r.out, ref, rtol=1e-12, atol=1e-14)
    assert lr.needle_metrics(h, r.out, ref)["retrieved"]


def test_fp32_accumulator_matches_float64_within_fp32_error():
    h = lr.make_haystack(1024, 32, needle_weight=0.3, seed=2)
    r = lr.decode_step(h.q, h.k, h.v, p_format="fp32", accumulator="fp32")
    ref = lr.exact_attention(h)
    u = 2.0 ** -24
    assert attention.rel_l2(r.out, ref) < 1024 * u
    assert abs(r.denominator / r.denominator_exact - 1) < 1024 * u
    assert attention.rel_l2(r.numerator, r.numerator_exact) < 1024 * u


def test_bf16_flat_loses_mass_and_promoted_hopper_does_not():
    h = lr.make_haystack(16384, 32, needle_weight=0.1, position="start", seed=4)
    bf = lr.decode_step(h.q, h.k, h.v, p_format="bf16", accumulator="bf16", denominator="matched")
    hp = lr.decode_step(h.q, h.k, h.v, p_format="bf16", accumulator="hopper_promoted", denominator="matched")
    assert bf.denominator / bf.denominator_exact < 0.5          # the register stalls
    assert abs(hp.denominator / hp.denominator_exact - 1) < 1e-2      # only the needle's own 128-term tile truncates
    assert attention.rel_l2(hp.numerator, hp.numerator_exact) < 1e-2
    ref = lr.exact_attention(h)
    assert lr.needle_metrics(h, bf.out, ref)["needle_proj"] > 1.5   # needle weight inflated
    assert abs(lr.needle_metrics(h, hp.out, ref)["needle_proj"] - 1) < 0.05


def test_accumulators_route_to_kvcost_accum():
    x = np.random.default_rng(0).random((3000, 3))
    assert np.array_equal(lr.accumulate_terms(x, "bf16"), accum.accumulate(x, "bf16", "flat"))
    assert np.array_equal(lr.accumulate_terms(x, "hopper"), accum.hopper_sum(x))
    assert np.array_equal(lr.accumulate_terms(x, "hopper_promoted"), accum.hopper_sum(x, promote=128))
    assert np.array_equal(lr.accumulate_terms(x, "two_level_512"), accum.hopper_sum(x, promote=512))
    assert lr.parse_accumulator("two_level_128") == lr.parse_accumulator("hopper_promoted")


def test_storage_fast_paths_equal_the_reference_round_trips():
    h = lr.make_haystack(256, 64, needle_weight=0.2, seed=7)
    for x in (h.k, h.v):
        assert np.array_equal(lr.store(x, "bf16", "k"), floats.round_to(x, "bf16"))
        ref = quant.fp8_roundtrip(x.astype(np.float32), "e4m3").astype(np.float64)
        assert np.array_equal(lr.store(x, "fp8_e4m3", "k"), ref)
    k4, v4 = quant.kivi_roundtrip(h.k, h.v, 4)
    assert np.array_equal(lr.store(h.k, "kivi4", "k"), k4)
    assert np.array_equal(lr.store(h.v, "kivi4", "v"), v4)
    assert np.array_equal(lr.store(h.k, "q4_0", "k"), quant.ggml_roundtrip(h.k, "q4_0").astype(np.float64))
    assert np.array_equal(lr.store(h.k, "none", "k"), h.k)


def test_fp8_p_flushes_small_probabilities():
    h = lr.make_haystack(8192, 32, needle_weight=0.5, seed=8)
    r = lr.decode_step(h.q, h.k, h.v, p_format="fp8_e4m3", accumulator="exact")
    assert r.p[h.needle] == 1.0
    assert np.all((r.p == 0) | (r.p >= 2.0 ** -9))


def test_grid_separates_the_parts_and_is_deterministic():
    kw = dict(n_tokens=[1024], needle_weights=[0.1], positions=["middle", "end"],
              storage=["none", "q8_0/q4_0"], arithmetic=[["exact", "exact"], ["fp8_e4m3", "hopper"]],
              head_dim=32, denominators=["fp32", "matched"])
    g = lr.needle_grid(**kw)
    assert list(g.columns) == lr.GRID_COLUMNS
    assert set(g["part"]) == {"reference", "storage", "accumulation", "both"}
    assert len(g) == 2 * 2 * (1 + 2)
    ref = g[g["part"] == "reference"]
    assert (ref["rel_l2"] < 1e-12).all() and ref["retrieved"].all()
    assert g.equals(lr.needle_grid(**kw))
    s = lr.summary(g, ["storage", "accumulator"])
    assert {"retrieved", "rel_l2", "runs"} <= set(s.columns)


@pytest.mark.parametrize("call,name", [
    (lambda: lr.make_haystack(1), "n_tokens"),
    (lambda: lr.make_haystack(64, 0), "head_dim"),
    (lambda: lr.make_haystack(64, needle_weight=1.0), "needle_weight"),
    (lambda: lr.make_haystack(64, needle_weight=0.0), "needle_weight"),
    (lambda: lr.make_haystack(64, position="left"), "position"),
    (lambda: lr.make_haystack(64, structure="zipf"), "structure"),
    (lambda: lr.make_haystack(64, seed=-1), "seed"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 4)), np.ones((8, 4)), accumulator="fp64"), "accumulator"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 4)), np.ones((8, 4)), accumulator="two_level_100"), "accumulator"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 4)), np.ones((8, 4)), p_format="int8"), "p_format"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 4)), np.ones((8, 4)), denominator="x"), "denominator"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 5)), np.ones((8, 4))), "q"),
    (lambda: lr.decode_step(np.ones(4), np.ones((8, 4)), np.ones((7, 4))), "v"),
    (lambda: lr.store(np.ones((4, 32)), "int3", "k"), "fmt"),
    (lambda: lr.parse_storage("q8_0/q9"), "storage"),
    (lambda: lr.needle_grid([64], [0.1], ["middle"], ["none"], [["fp32"]]), "arithmetic"),
    (lambda: lr.needle_grid([64], [1.5], ["middle"], ["none"], [["fp32", "fp32"]]), "needle_weights"),
    (lambda: lr.needle_grid([64], [0.1], ["middle"], ["none"], [["fp32", "fp32"]], trials=0), "trials"),
    (lambda: lr.needle_grid([], [0.1], ["middle"], ["none"], [["fp32", "fp32"]]), "n_tokens"),
])
def test_bad_parameters_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=f"'{name}"):
        call()


def test_checks_run_on_a_small_grid():
    ar = [["exact", "exact"], ["bf16", "fp32"], ["bf16", "bf16"], ["fp8_e4m3", "exact"],
          ["fp8_e4m3", "hopper"], ["fp8_e4m3", "hopper_promoted"]]
    g = lr.needle_grid([512, 2048], [0.1], ["middle"], ["none", "fp8_e4m3"], ar, head_dim=16,
                       denominators=["fp32", "matched"])
    f = lr.needle_grid([2048], [0.1], ["middle"], ["fp8_e4m3"],
                       [["fp8_e4m3", a] for a in ("hopper", "two_level_128", "two_level_512")], head_dim=16,
                       denominators=["fp32"])
    cs = lr.checks(g, f, accum.load_published())
    assert len(cs) == 8 and all(isinstance(c.agrees, bool) for c in cs)
