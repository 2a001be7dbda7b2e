"""kvcost.fa3: FlashAttention-3's FP8 forward pass, against exact attention and kvcost.accum."""
import math

import numpy as np
import pytest

from kvcost import accum, fa3, fa3kernel, tensorcore
from kvcost.numerics import _jit, kernel_facts, kernels, oracle
from references import attention_exact, e4m3


def _case(n: int, d: int = 64, seed: int = 0, mean: float = 0.3, spread: float = 2.0):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(n) * spread
    v = fa3.store(rng.standard_normal((n, d)) + mean, "e4m3")
    w = np.exp(s - s.max())
    return s, v, (w / w.sum()) @ v.astype(np.float64)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_bf16_p_with_fp32_accumulation_within_1e_3_of_exact():
    s, v, ref = _case(32_768)
    out = fa3.attend_row(s, v, p_format="bf16", accumulator="fp32")
    assert _rel(out, ref) < 1e-3


def test_exact_arithmetic_is_attention_to_fp32_p():
    s, v, ref = _case(5_000)
    out = fa3.attend_row(s, v, p_format="exact", accumulator="exact", l_accumulator="exact")
    assert _rel(out, ref) < 1e-6
    # split-KV combined by log-sum-exp gives the same attention
    out4 = fa3.attend_row(s, v, p_format="exact", accumulator="exact", l_accumulator="exact", splits=4)
    assert _rel(out4, ref) < 1e-6


def test_flush_every_tile_within_1_percent_at_131k_and_no_fix_is_worse():
    s, v, ref = _case(131_072, d=64, seed=1)
    fixed = _rel(fa3.attend_row(s, v, flush_every=1), ref)
    never = _rel(fa3.attend_row(s, v), ref)
    assert fixed < 0.01
    assert never > 3 * fixed


def test_single_key_returns_its_value_exactly():
    v = fa3.store(np.array([[0.8125, -3.0, 17.0, 0.0]]), "e4m3")
    assert np.array_equal(fa3.attend_row([0.3], v), v[0].astype(np.float64))


def test_accum_hopper_paths_agree_with_tensorcore():
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal((5_000, 6))) * np.exp(rng.standard_normal((5_000, 6)))
    x = x.astype(np.float32).astype(np.float64)
    ones = np.ones_like(x)
    # accum keeps keep_bits significant bits of the largest term: frac_bits = keep_bits - 1;
    # accum's register is fp32 rounded to nearest
    assert np.array_equal(accum.hopper_sum(x, keep_bits=14),
                          tensorcore.dot(x, ones, frac_bits=13, out="fp32"))
    assert np.array_equal(accum.hopper_sum(x, keep_bits=14, promote=128),
                          tensorcore.dot(x, ones, frac_bits=13, out="fp32", promote_every=128))
    assert np.array_equal(accum.hopper_sum(x, keep_bits=11, group=16),
                          tensorcore.dot(x, ones, k=16, frac_bits=10, out="fp32"))


def test_attend_matches_attend_row_and_exact_attention():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((4, 3, 64)), rng.standard_normal((2, 700, 64)), rng.standard_normal((2, 700, 64))
    out = fa3.attend(q, k, v, qk="exact", q_format="exact", kv_format="exact", p_format="exact",
                     accumulator="exact", l_accumulator="exact")
    ref = attention_exact(q, k, v)
    assert _rel(out, ref) < 1e-6
    # kvcost's own float64 reference is the definition, to float64's rounding
    assert _rel(fa3.exact_attention(q, k, v), ref) < 1e-13
    assert _rel(fa3.exact_attention(q, k, v, causal=True), attention_exact(q, k, v, causal=True)) < 1e-13
    # grouped heads: head 3 reads kv head 1
    one = fa3.attend(q[3:4], k[1:2], v[1:2])
    assert np.array_equal(one[0], fa3.attend(q, k, v)[3])
    # the default FP8 path stays within a few percent of exact attention on the stored cache
    qs, ks, vs = (fa3.store(x, "e4m3") for x in (q, k, v))
    assert _rel(fa3.attend(q, k, v), attention_exact(qs, ks, vs)) < 0.05


def test_causal_first_row_sees_only_the_first_key():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 50, 64)), rng.standard_normal((1, 50, 64)), rng.standard_normal((1, 50, 64))
    out = fa3.attend(q, k, v, causal=True)
    assert np.array_equal(out[0, 0], fa3.store(v, "e4m3")[0, 0].astype(np.float64))
    ref = attention_exact(*(fa3.store(x, "e4m3") for x in (q, k, v)), causal=True)
    assert _rel(out, ref) < 0.05


def test_tile_sizes_and_bad_parameters():
    assert fa3.tile_sizes(128) == {"decode": 96, "prefill_before_fix": 224, "prefill_two_level": 192}
    s, v, _ = _case(100)
    for kw, name in ((dict(p_format="fp8"), "p_format"), (dict(accumulator="bf16"), "accumulator"),
                     (dict(flush_every=0), "flush_every"), (dict(block_n=0), "block_n"),
                     (dict(splits=0), "splits"), (dict(max_offset=-1), "max_offset"), (dict(frac_bits=0), "frac_bits")):
        with pytest.raises(ValueError, match=f"'{name}'"):
            fa3.attend_row(s, v, **kw)
    with pytest.raises(ValueError, match="'v'"):
        fa3.attend_row(s, v[:5])
    with pytest.raises(ValueError, match="'q', 'k', 'v'"):
        fa3.attend(np.ones((3, 2, 8)), np.ones((2, 4, 8)), np.ones((2, 4, 8)))
    with pytest.raises(ValueError, match="'kv_format'"):
        fa3.attend(np.ones((2, 2, 8)), np.ones((2, 4, 8)), np.ones((2, 4, 8)), kv_format="q8_0")
    with pytest.raises(ValueError, match="'head_dim'"):
        fa3.tile_sizes(80)


def test_max_offset_keeps_p_out_of_e4m3_underflow_and_reverse_order_matters():
    # exp(s - m) in [0, 1] cast to e4m3 flushes p < 2^-10 to zero; with the offset 2^8 it does not.
    # The needle (score 0, value 0) sits in the last block, which the kernel visits first.
    n = 4096
    s = np.full(n, -9.0)
    v = np.ones((n, 8))
    w_needle = 1 / (1 + (n - 1) * math.exp(-9.0))
    for pos in (n - 1, 0):
        s2, v2 = s.copy(), v.copy()
        s2[pos], v2[pos] = 0.0, 0.0
        good = abs(fa3.attend_row(s2, v2, flush_every=1)[0] - (1 - w_needle)) < 0.02
        bad = abs(fa3.attend_row(s2, v2, flush_every=1, max_offset=0)[0] - (1 - w_needle)) < 0.02
        assert good
        # without the offset the haystack vanishes, unless the needle comes last (reverse order: first
        # block) -- then the haystack's P were cast before the max rose, and rescaled in fp32
        assert bad == (pos == 0)


# ------------------------------------------------------------ the fast paths are the same arithmetic
def test_compiled_e4m3_store_is_ml_dtypes_satfinite_cast_bit_for_bit():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(200_000) * np.exp(rng.standard_normal(200_000) * 4)).astype(np.float32)
    ties = np.concatenate([np.ldexp(np.floor(rng.random(5000) * 16) + 16.5, rng.integers(-14, 6, 5000)),
                           (np.arange(64) + 0.5) * 2.0 ** -9]).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 448, 449, 464, 465, -480, 3e38, 1e-45, -2.0 ** -10,
                        3 * 2.0 ** -11], np.float32)
    for a in (x, ties, -ties, special):
        ref = e4m3(a)
        np.testing.assert_array_equal(fa3.store(a, "e4m3").view(np.uint32), ref.view(np.uint32))
    assert np.isnan(fa3.store(np.array([np.nan], np.float32), "e4m3")[0])


def test_fp32_helpers_are_the_compiled_rounding():
    rng = np.random.default_rng(9)
    e = rng.integers(-160, 130, 20_000)
    x = np.ldexp(rng.random(20_000) + 1, e) * rng.choice([-1, 1], 20_000)
    f32max = float(np.finfo(np.float32).max)
    x = np.concatenate([x, [0.0, np.inf, np.nan, 2.0 ** -150, 1.5 * 2.0 ** -149, f32max * (1 + 2 ** -25)]])
    for v in x:
        assert fa3kernel._f32(v) == _jit.round_nb(v, 0.0, 23, -126, f32max, math.inf) or (np.isnan(v))
    with np.errstate(over="ignore"):                         # some become inf in float32: skipped below
        a = x[:5000].astype(np.float32).astype(np.float64)
        b = (x[5000:10000] * np.ldexp(1.0, rng.integers(-40, 40, 5000))).astype(np.float32).astype(np.float64)
    for u, w in zip(a, b):
        if np.isfinite(u) and np.isfinite(w):
            assert fa3kernel._f32sum(u, w) == fa3kernel._f32add(u, w)


@pytest.mark.parametrize("opts", [{}, dict(flush_every=1), dict(frac_bits=5, splits=2), dict(frac_bits=16),
                                  dict(qk_frac_bits=6)])
def test_float32_lanes_give_the_float64_paths_bits(opts):
    # the same call with the float32-lane tensor core (QK and PV) switched off in the compiled kernel
    rng = np.random.default_rng(10)
    q, k, v = (fa3.store(rng.standard_normal(s) * sc, "e4m3") for s, sc in
               (((6, 9, 64), 3.0), ((2, 700, 64), 2.0), ((2, 700, 64), 1.0)))
    v[:, 3] *= 0.0                                           # a row of P·V terms that are all zero
    out = fa3.attend(q, k, v, causal=True, **opts)
    pk, ak, lk, flush, bn, mo, sp, targs = fa3._common("e4m3", "tensorcore", opts.get("flush_every"), 96, 8,
                                                       opts.get("splits", 1), opts.get("frac_bits"), "fp32",
                                                       "toward_zero", "Hopper")
    sargs = fa3._unit_args("Hopper", opts.get("qk_frac_bits"), "toward_zero")
    kT = np.ascontiguousarray(np.swapaxes(k, 1, 2))
    kwT, vw = fa3kernel.weights_nb(kT, -6), fa3kernel.weights_nb(v, -6)
    scale_log2 = float(np.float32(np.float32(1 / 8) * np.float32(math.log2(math.e))))
    for qk32, pv32 in ((False, False), (True, False), (False, True)):
        # thr and pscale given (0.0, as fa3.attend passes them): the kernel fa3.attend compiled, not another
        ref = fa3kernel.attend_nb(q, kT, kwT, v, vw, 3, True, scale_log2, pk, ak, lk, 0, flush, bn, mo, sp, *targs, -6,
                                  -6, sargs[2], sargs[5], sargs[6], sargs[7], sargs[8], qk32, pv32, 2, 0.0, 0.0)
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("arch", fa3.UNIT_ARCHS)
def test_pv_runs_on_the_gpus_unit_bit_for_bit(arch):
    """With equal scores, P = 2^max_offset on every key (the GPU's e4m3 of it: 240 in e4m3fnuz), so acc_o
    is the chain of that GPU's instruction (tensorcore.matmul, itself MMA-Sim) over 32-key groups, blocks
    last to first, and the output acc_o / l."""
    unit = fa3.unit_for(arch)
    rng = np.random.default_rng(3)
    vals = oracle.type_values(unit.b_type)
    n, d, bn = 3 * 96, 16, 96
    v = rng.choice(vals, (n, d))
    v[:, 0] = rng.choice(vals[np.abs(vals) < 2.0 ** -5], n)         # subnormal-range values
    out = fa3.attend_row(np.zeros(n), v, arch=arch, block_n=bn)
    p = 240.0 if unit.a_type == "fp8" else 256.0
    acc = np.zeros((1, d), np.float32)
    for b in range(n // bn - 1, -1, -1):
        for g0 in range(b * bn, (b + 1) * bn, unit.k):
            acc = tensorcore.matmul(np.full((1, unit.k), p), v[g0:g0 + unit.k], acc, arch=arch, instr=unit.instr)
    inv = np.float32(1.0 / np.float32(n * 256.0))
    np.testing.assert_array_equal(out, (acc[0] * inv).astype(np.float64))


def test_frac_bits_narrows_pv_alone_and_qk_frac_bits_qk_alone():
    rng = np.random.default_rng(4)
    q, k, v = (fa3.store(rng.standard_normal(s) * sc, "e4m3") for s, sc in
               (((2, 3, 64), 3.0), ((1, 300, 64), 2.0), ((1, 300, 64), 1.0)))
    base = fa3.attend(q, k, v)
    s_only = fa3.attend(q, k, v, qk_frac_bits=4)
    pv_only = fa3.attend(q, k, v, frac_bits=4)
    assert not np.array_equal(base, s_only) and not np.array_equal(base, pv_only)
    # with exact QKᵀ the scores no longer depend on qk_frac_bits
    np.testing.assert_array_equal(fa3.attend(q, k, v, qk="exact", qk_frac_bits=4), fa3.attend(q, k, v, qk="exact"))
    with pytest.raises(ValueError, match="parameter 'arch'"):
        fa3.attend_row(np.zeros(4), np.zeros((4, 2)), arch="Volta")


@pytest.mark.parametrize("arch", ["Hopper", "Blackwell", "Ada Lovelace"])
def test_one_block_with_varied_p_is_the_units_chain(arch):
    """One block (no rescale): P_i = e4m3(fp32(exp2(fp32(s_i·log2e − (m·log2e − 8))))) as the kernel forms it,
    then acc_o is the unit's chain over the block's 32-key groups: products with significands >= 2 included."""
    unit = fa3.unit_for(arch)
    rng = np.random.default_rng(5)
    n, d = 96, 8
    s = (rng.standard_normal(n) * 2).astype(np.float32).astype(np.float64)
    v = rng.choice(oracle.type_values("e4m3"), (n, d))
    out = fa3.attend_row(s, v, arch=arch)
    ms = float(np.float32(s.max() * fa3.LOG2E - 8))
    praw = np.array([np.float32(math.exp2(float(np.float32(x * fa3.LOG2E - ms)))) for x in s], np.float64)
    p = e4m3(praw).astype(np.float64)
    lsum = np.float32(0)
    for x in praw:
        lsum = np.float32(lsum + np.float32(x))
    acc = np.zeros((1, d), np.float32)
    for g0 in range(0, n, unit.k):
        acc = tensorcore.matmul(p[None, g0:g0 + unit.k], v[g0:g0 + unit.k], acc, arch=arch, instr=unit.instr)
    np.testing.assert_array_equal(out, (acc[0] * np.float32(1.0 / lsum)).astype(np.float64))


def test_the_kernels_facts_are_read_once_as_data():
    # one reader of data/attention_kernels.csv (kvcost.numerics.kernel_facts); kernels.kernel turns a row into
    # what the emulation runs, fa3.tile_sizes reads FA3's tiles from the same rows
    assert not hasattr(fa3, "kernel_config") and fa3.kernel_facts() == kernel_facts.rows()
    k = kernels.kernel("fa3_fp8_vllm", "none", "decode", 64)
    assert (k.arch, k.block_n, k.max_offset, k.p_format, k.flush_every) == ("Hopper", 128, 8, "e4m3", None)
    assert k.assumed == ("split-KV (heuristic, not modelled): splits is the caller's",)
    k = kernels.kernel("fa3_fp8_vllm", "pr122_interval4", "chunked prefill", 128)
    assert (k.block_n, k.flush_every, k.flush_tokens) == (192, 4, 768)
    k = kernels.kernel("fa4_fp8", "pr2109", "decode", 128)
    assert (k.arch, k.max_offset, k.rescale_threshold) == ("Blackwell", 8, 4.0)
    assert kernels.kernel("fa4_fp8", "pr2717", "decode", 128).max_offset == 4
    k = kernels.kernel("ck_tile_fmha_fwd_fp8", "none", "chunked prefill", 128)
    assert (k.arch, k.max_offset, k.p_scale) == ("CDNA3", 0, 240.0) and "scale_p = 240" in k.assumed[0]
    assert fa3.tile_sizes(64) == {"decode": 128, "prefill_before_fix": 160, "prefill_two_level": 128}
    with pytest.raises(ValueError, match="no row"):
        kernels.kernel("fa3_fp8_vllm", "pr999")


@pytest.mark.parametrize("t", ["f32", "f16", "bf16", "fp8", "bf8", "e5m2", "e3m2", "e2m3", "e2m1"])
def test_compiled_format_check_agrees_with_ml_dtypes_cast(t):
    """fa3kernel.all_in_format (which picks an operand's alignment exponent without float64 copies) says what
    a round trip through ml_dtypes says, on every value of the format, its neighbours and its edges."""
    import ml_dtypes

    from kvcost.numerics.instructions import OPERAND_TYPES
    name = OPERAND_TYPES[t][0]
    dt = getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else np.dtype(name)
    fi = ml_dtypes.finfo(dt)
    vals = tensorcore.operand_values(t) if t != "f32" else np.random.default_rng(0).standard_normal(200)
    vals = vals.astype(np.float32).astype(np.float64)
    tiny = 2.0 ** (fi.minexp - fi.nmant)
    cases = [np.array([v]) for v in vals[:: max(1, len(vals) // 40)]]
    cases += [np.array([v * (1 + e)]) for v in vals[1:: max(1, len(vals) // 20)] for e in (2.0 ** -30, 2.0 ** -9, 1e-3)]
    cases += [np.array([x]) for x in (float(fi.max), float(fi.max) * (1 + 2.0 ** -20), tiny, tiny / 2, tiny * 1.5,
                                      -0.0, 5e-324, 1e300)]
    cases += [vals, np.append(vals, vals[-1] * 1.0001)]

    def by_cast(x):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.array_equal(x.astype(dt).astype(np.float64), x)

    got = [fa3kernel.all_in_format(x, fi.nmant, fi.minexp, float(fi.max)) for x in cases]
    assert got == [by_cast(x) for x in cases]
    assert got.count(True) >= 10 and got.count(False) >= 10            # both answers are exercised
    assert fa3kernel.all_in_format(np.array([1.0, np.inf]), fi.nmant, fi.minexp, float(fi.max)) is None


def test_prepared_operands_give_the_same_attention_and_are_reused_only_for_the_same_objects():
    """fa3.attend(prepared=...) shares stored, transposed and weighted operands across calls on the same
    arrays: every kernel's output equals its unshared pass, bit for bit; a V with one row changed (the needle
    swapped) is another object and is prepared anew, before and after the cache holds others."""
    rng = np.random.default_rng(5)
    q = fa3.store(rng.standard_normal((2, 1, 64)), "e4m3")
    k = fa3.store(rng.standard_normal((2, 3000, 64)), "e4m3")
    v = fa3.store(rng.standard_normal((2, 3000, 64)) + 0.3, "e4m3")
    v2 = v.copy()
    v2[:, 1500] = 0.0
    ks = kernels.lineup(None, head_dim=64)
    cache: dict = {}
    for kern in ks:
        for vv in (v, v2):
            assert np.array_equal(kern.attend(q, k, vv, prepared=cache), kern.attend(q, k, vv)), kern.label
    held = {id(x) for x, _ in cache.values()}
    assert {id(q), id(k), id(v), id(v2)} <= held
    v3 = v2.copy()
    v3[:, 7] = 448.0                                                  # other values in a new object
    assert np.array_equal(fa3.attend(q, k, v3, prepared=cache), fa3.attend(q, k, v3))
    assert not np.array_equal(fa3.attend(q, k, v3), fa3.attend(q, k, v2))
    with pytest.raises(ValueError, match="prepared"):
        fa3.attend(q, k, v, prepared=[])
