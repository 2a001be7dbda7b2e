"""kvcost.numerics.kernels: each kernel's distinguishing fact on a case whose answer is known."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from kvcost.numerics import fa3, kernels
from references import attention_exact

LN2 = math.log(2.0)


def _row(k: kernels.Kernel, scores: np.ndarray, v: np.ndarray) -> np.ndarray:
    kw = k.attend_kwargs()
    for name in ("q_format", "kv_format", "qk"):
        kw.pop(name, None)
    return fa3.attend_row(scores, v, **kw)


def _stale_case() -> tuple[np.ndarray, np.ndarray, float]:
    """Two tiles of 128 keys, all scores 0 except one key in the tile visited second (the first tile)
    raised by 3 log2 units, below FA4's rescale threshold of 4: V one-hot on that key. Exact: 8 / 263."""
    s = np.zeros(256)
    s[5] = 3 * LN2                      # natural-log units: 3 log2 units once the kernel multiplies by log2(e)
    v = np.zeros((256, 2))
    v[:, 1] = 1.0
    v[5] = (1.0, 0.0)
    return s, v, 8.0 / 263.0


def test_every_lineup_kernel_resolves_with_its_source():
    for k in kernels.lineup(head_dim=64):
        assert k.facts["source"]
        assert k.block_n > 0
    for name, fix in kernels.kernels():
        kernels.kernel(name, fix, head_dim=128)


def test_tiles_by_phase_and_fix():
    k = kernels.kernel("fa3_fp8_vllm", "none", "chunked prefill", 128)
    assert (k.block_n, k.flush_every) == (224, None)
    k = kernels.kernel("fa3_fp8_vllm", "pr104+pr125", "chunked prefill", 128)
    assert (k.block_n, k.flush_tokens) == (192, 192)
    assert kernels.kernel("fa3_fp8_vllm", "pr122_interval4", "chunked prefill", 128).flush_tokens == 768
    assert kernels.kernel("fa3_fp8_vllm", "none", "decode", 64).block_n == 128
    assert kernels.kernel("fa3_fp8_vllm", "none", "decode", 128).block_n == 96
    assert kernels.kernel("fmha_v2_fp8", "pr3234_interval4", "chunked prefill", 128).flush_tokens == 1024
    fm = kernels.kernel("fmha_v2_fp8", "none", "decode", 64)           # no decode row read
    assert any("no decode row" in a for a in fm.assumed)


def test_fa4_offset8_stale_max_clips_p_offset4_does_not():
    s, v, exact = _stale_case()
    k8 = kernels.kernel("fa4_fp8", "pr2109", head_dim=128)
    k4 = kernels.kernel("fa4_fp8", "pr2717", head_dim=128)
    k0 = kernels.kernel("fa4_fp8", "pr2731", head_dim=128)
    assert k8.p_clips and not k4.p_clips and not k0.p_clips
    # offset 8, stale max: P = 2^11 saturates at 448 while l counts 2^11 (and 255 x 2^8)
    assert _row(k8, s, v)[0] == pytest.approx(448.0 / (255 * 256 + 2048), rel=2 ** -10)
    # offset 4 (P <= 2^8 = 256 < 448) and threshold 0 (the max updated): the needle's weight kept
    assert _row(k4, s, v)[0] == pytest.approx(exact, rel=2 ** -8)
    assert _row(k0, s, v)[0] == pytest.approx(exact, rel=2 ** -8)


def _flat(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every score equal and every value 1: the exact output is 1 and P = 2^max_offset = 256 every key."""
    return np.zeros(n), np.ones((n, 2))


def test_fa3_register_stalls_and_each_fix_restores_it():
    """Hopper's e8m13 register cuts a term of 2^8 to zero once acc_o reaches 2^22 (16,384 keys of P = 256):
    without a fix the output is 16,384 / n; flushing every tile (PR #104) or every 4 (PR #122) gives 1."""
    n = 65536
    s, v = _flat(n)
    none = kernels.kernel("fa3_fp8_vllm", "none", "chunked prefill", 128)
    assert _row(none, s, v)[0] == pytest.approx(16384 / n, rel=2 ** -6)
    for fix in ("pr104+pr125", "pr122_interval4", "pr122_interval64"):
        out = _row(kernels.kernel("fa3_fp8_vllm", fix, "chunked prefill", 128), s, v)
        assert out[0] == pytest.approx(1.0, abs=2 ** -20), fix


def test_split_kv_shortens_the_register_run():
    """Split-KV (the kernels' heuristic; the caller's ``splits`` here): splits of whole 224-key tiles. Four
    (74 tiles, 16,576 keys) run 192 keys past the 2^22 stall in three splits; eight (37 tiles, 8,288 keys)
    stay below it, and the fp32 log-sum-exp combine gives 1 on the flat row that one split stalls."""
    s, v = _flat(65536)
    k = kernels.kernel("fa3_fp8_vllm", "none", "chunked prefill", 128)
    kw = {n: x for n, x in k.attend_kwargs().items() if n not in ("q_format", "kv_format", "qk", "splits")}
    lost = 3 * 192 / 65536                       # three splits' last 192 keys cut to zero
    assert fa3.attend_row(s, v, splits=4, **kw)[0] == pytest.approx(1 - lost, rel=2 ** -12)
    assert fa3.attend_row(s, v, splits=8, **kw)[0] == pytest.approx(1.0, abs=2 ** -20)


def test_fmha_v2_two_level_off_stalls_on_does_not():
    n = 65536
    s, v = _flat(n)
    off = kernels.kernel("fmha_v2_fp8", "none", "chunked prefill", 128)
    on = kernels.kernel("fmha_v2_fp8", "pr3234_interval4", "chunked prefill", 128)
    assert _row(off, s, v)[0] < 0.5
    assert _row(on, s, v)[0] == pytest.approx(1.0, abs=2 ** -20)


def test_blackwell_register_does_not_stall_there():
    """tcgen05 keeps 25 bits: the same flat row loses nothing at 65,536 keys (the blog's B200 statement)."""
    s, v = _flat(65536)
    assert _row(kernels.kernel("fa4_fp8", "pr2731", head_dim=128), s, v)[0] == pytest.approx(1.0, abs=2 ** -16)


def test_dense_mla_p_unshifted_drops_a_key_below_2_to_minus_10():
    """FlashMLA's dense FP8 kernel casts P in [0, 1] straight to e4m3 (smallest subnormal 2^-9): a key 11
    log2 units below the max has P = 2^-11 -> 0, and its value vanishes; FA3's 2^8 shift keeps it."""
    s = np.zeros(64)
    s[7] = -11 * LN2
    v = np.zeros((64, 2))
    v[:, 1] = 1.0
    v[7] = (1.0, 0.0)
    exact = 2.0 ** -11 / (63 + 2.0 ** -11)
    mla = kernels.kernel("flashmla_dense_fp8", "none", "decode", 64)
    assert mla.max_offset == 0 and any("head_dim 64" in a for a in mla.assumed)
    assert _row(mla, s, v)[0] == 0.0
    fa3k = kernels.kernel("fa3_fp8_vllm", "none", "decode", 64)
    assert _row(fa3k, s, v)[0] == pytest.approx(exact, rel=2 ** -3)


def test_ck_scale_p_never_saturates_where_offset_8_would_on_fnuz():
    """CDNA3's e4m3fnuz tops out at 240: CK's scale_p = 240 puts the max key at 240 exactly (output 1 on a
    flat row), where a 2^8 shift would saturate 256 -> 240 and shrink every output by 240/256."""
    s, v = _flat(128)
    ck = kernels.kernel("ck_tile_fmha_fwd_fp8", "none", "chunked prefill", 128)
    assert ck.p_scale == 240.0 and not ck.p_clips
    assert _row(ck, s, v)[0] == pytest.approx(1.0, abs=2 ** -20)
    kw = dict(ck.attend_kwargs(), p_scale=None, max_offset=8)
    for name in ("q_format", "kv_format", "qk"):
        kw.pop(name, None)
    assert fa3.attend_row(s, v, **kw)[0] == pytest.approx(240 / 256, abs=2 ** -20)


@pytest.mark.parametrize("name", ["flashinfer_mla_sm90_fp8kv", "flashmla_sparse_nvfp4kv"])
def test_storage_only_equals_exact_attention_on_the_dequantized_cache(name):
    rng = np.random.default_rng(3)
    n, d = 8192, 64
    k0 = kernels.kernel(name, "none", "decode", d)
    q = kernels.stored(rng.normal(size=(1, 1, d)), k0)
    kk = kernels.stored(rng.normal(size=(1, n, d)), k0)
    vv = kernels.stored(rng.normal(size=(1, n, d)) + 0.5, k0)
    ref = attention_exact(q, kk, vv)
    out = k0.attend(q, kk, vv)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 2 ** -8                        # bf16 P's rounding, nothing of the cache's format
    fp8 = kernels.kernel("fa3_fp8_vllm", "none", "decode", d)
    q8, k8, v8 = (kernels.stored(x, fp8) for x in (q, kk, vv))
    assert np.linalg.norm(fp8.attend(q8, k8, v8) - attention_exact(q8, k8, v8)) / np.linalg.norm(ref) > 4 * err


def test_lineup_table_lists_assumptions():
    rows = kernels.lineup_table(kernels.lineup(head_dim=64))
    assert len(rows) == len(kernels.KERNELS)
    by = {r["kernel"]: r for r in rows}
    assert by["FA4 FP8, offset 8, stale max 4 (PR #2109)"]["p_clips"]
    assert by["FlashMLA NVFP4 stored, bf16 MMA"]["assumed"]
    assert by["FA3 FP8, no fix"]["flush_tokens"] is None


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="phase"):
        kernels.kernel("fa3_fp8_vllm", "none", "prefill")
    with pytest.raises(ValueError, match="kernels"):
        kernels.lineup(["no such kernel"])
    with pytest.raises(ValueError, match="rescale_threshold"):
        fa3.attend_row(np.zeros(4), np.ones((4, 2)), rescale_threshold=-1)
    with pytest.raises(ValueError, match="p_scale"):
        fa3.attend_row(np.zeros(4), np.ones((4, 2)), p_scale=0)


def test_what_a_kernel_serves_is_read_from_its_rows():
    from kvcost.numerics import kernel_facts
    mla = {k for k, _ in kernel_facts.KERNELS.values() if kernel_facts.serves_mla(k)}
    assert mla == {"flashmla_dense_fp8", "flashinfer_mla_sm90_fp8kv", "flashmla_sparse_nvfp4kv"}
    assert {k for k, _ in kernel_facts.KERNELS.values() if kernel_facts.kv_format(k) == "nvfp4"} == {
        "flashmla_sparse_nvfp4kv"}
    assert kernel_facts.head_dim(" 128 ") == 128 and kernel_facts.head_dim("576 (QK) / 512 (V)") is None
    with pytest.raises(ValueError, match="kernel='fa9'"):
        kernel_facts.serves_mla("fa9")


def test_storage_only_kernels_read_the_stored_values_rounded_once_to_bf16():
    """kernels.stored for a kernel that dequantizes into bf16: NVFP4's round trip (or e4m3) rounded to nearest
    bf16 by kvcost.floats.round_to; the fast path (ml_dtypes' cast of float32 values) is the same rounding."""
    from kvcost.floats import round_to
    from kvcost.storage.quant import roundtrip
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 512, 64)) * rng.standard_t(3, (2, 512, 1)) * 40).astype(np.float32)
    nv, e4 = kernels.lineup(["FlashMLA NVFP4 stored, bf16 MMA", "FlashInfer MLA SM90: FP8 stored, bf16 MMA"],
                            head_dim=64)
    deq = roundtrip(x.reshape(-1, 64).astype(np.float64), "nvfp4").reshape(x.shape)
    want = round_to(deq, "bf16")
    got = kernels.stored(x, nv)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert not np.array_equal(want, deq)                        # the bf16 rounding is not a no-op here
    assert np.array_equal(kernels.stored(x, e4), fa3.store(x, "e4m3"))   # e4m3 values are bf16 values


def test_nvfp4_stored_is_the_registry_round_trip_read_back_in_bf16():
    """kernels.stored reads an NVFP4 cache as the registry's round trip over the whole array (one tensor scale
    from its amax, wherever it sits), dequantized to bf16."""
    from kvcost.storage.quant import roundtrip
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 700, 64)).astype(np.float32)
    x[2, 650, 7] = 900.0                                        # the tensor's amax, in the last head
    (nv,) = kernels.lineup(["FlashMLA NVFP4 stored, bf16 MMA"], head_dim=64)
    got = kernels.stored(x, nv)
    one = roundtrip(x.reshape(-1, 64).astype(np.float64), "nvfp4").reshape(x.shape)
    assert np.array_equal(got, one.astype(ml_dtypes.bfloat16).astype(np.float32))
    own = roundtrip(x[0, :7].astype(np.float64), "nvfp4")     # a slice calibrated on itself is another store
    assert not np.array_equal(own.astype(ml_dtypes.bfloat16).astype(np.float32), got[0, :7])
    assert np.array_equal(kernels.stored(np.zeros((5, 16)), nv), np.zeros((5, 16)))


def test_kernel_lineup_bench_row_holds_shared_and_own_passes_to_the_same_outputs():
    from kvcost import bench
    assert bench.bench_kernel_lineup in bench.BENCHMARKS
    (row,) = bench.bench_kernel_lineup(n=1024)
    assert row.note.endswith("bit for bit the same: True") and row.unit == "x faster" and row.value > 0
