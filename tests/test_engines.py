"""Engine-exact sizing: llama.cpp's KV buffers and vLLM's block pool against real log lines."""

import numpy as np
import pandas as pd
import pytest

from kvcost.claims import plan as plan_claims
from kvcost.engines import llamacpp, logs, vllm
from kvcost.experiments import plan as plan_exp
from kvcost.models import registry
from kvcost.models.hfconfig import from_hf_config
from kvcost.planning import evidence, fleet
from kvcost.units import GIB, MIB


@pytest.mark.parametrize("row", logs.llamacpp_rows(), ids=lambda r: r["id"])
def test_llamacpp_log_lines(row) -> None:
    res = logs.check_llamacpp(row)
    assert res["agrees"] == (row["expect"] == "explained"), (res["predicted"], row["log_line"])


@pytest.mark.parametrize("row", logs.vllm_rows(), ids=lambda r: r["id"])
def test_vllm_log_lines(row) -> None:
    res = logs.check_vllm(row)
    assert res["agrees"] == (row["expect"] == "explained"), (res.get("predicted"), row["log_line"])
    if row["expect"] != "explained":
        assert len(row["note"]) > 40                      # every unexplained line says why


def test_enough_real_lines_with_sources() -> None:
    ll, vl = logs.llamacpp_rows(), logs.vllm_rows()
    assert all(r["source"] and r["log_line"] for r in ll + vl)
    # counted: lines a reader can follow to a public URL showing them (second-hand and unlocated rows are checked,
    # never counted)
    assert len(logs.first_hand(ll)) >= 15 and len(logs.first_hand(vl)) >= 10
    for r in ll + vl:
        assert not r["source"].startswith("code-index"), r["id"]            # an index id is not a citation
        if r["provenance"] == "first-hand":
            assert r["source"].startswith("https://github.com/"), r["id"]
            if "/blob/" in r["source"]:                                      # a file: repository, ref and path
                assert len(r["source"].split("/blob/")[1].split("/")) >= 2, r["id"]
        else:
            assert ("NOT COUNTED" in r["note"]) == (r["provenance"] == "unlocated"), r["id"]
            assert r["provenance"] == "unlocated" or r["note"].startswith("SECOND-HAND"), r["id"]
    with pytest.raises(ValueError, match="provenance"):
        logs.first_hand([{"id": "x", "provenance": "hearsay", "source": "https://x"}])


def test_every_row_is_checked_and_unexplained_rows_say_why() -> None:
    results = logs.check_all()
    assert len(results) == len(logs.llamacpp_rows()) + len(logs.vllm_rows())
    unexplained = [r for r in results if r["expect"] == "unexplained"]
    assert {r["id"] for r in unexplained} == {"qwen3_235b_tp4", "unnamed_fp8_100k", "unnamed_2k",
                                              "qwen3_8b_4090_mnbt2048", "qwen3_8b_4090_mnbt8192"}
    assert all(not r["agrees"] and len(r["note"]) > 40 for r in unexplained)
    llama = {r["id"]: r for r in results if r["engine"] == "llama.cpp"}
    assert f"{llama['qwen25_32b_q8_0_32k']['mib']:.2f}" == "4352.00"              # q8_0: 34 bytes per 32 values
    assert llama["pythia14b_128"]["cells"] == 128 and llama["llama405b_4k_rpc"]["cells"] == 4096


def test_llamacpp_padding_and_streams() -> None:
    g = registry.load_model("Llama-3.1-8B")
    a = llamacpp.allocate(g, 35000)
    assert a.cells == 35072 and a.n_ctx_padded == 35072                  # GGML_PAD(n_ctx, 256)
    a4 = llamacpp.allocate(g, 8192, n_seq=4)
    assert a4.cells == 2048 and a4.buffers[0].streams == 4               # non-unified: n_ctx / n_seq per stream
    assert llamacpp.allocate(g, 1000, n_seq=3).cells == 512             # pad(1024 / 3 = 341, 256)
    u = llamacpp.allocate(g, 8192, n_seq=4, kv_unified=True)
    assert u.cells == 8192 and u.kv_bytes == a4.kv_bytes
    assert llamacpp.allocate(g, 1000, version="legacy", flash_attn=False).cells == 1024   # pad 32
    assert llamacpp.allocate(g, 1000, version="legacy", flash_attn=True).cells == 1024


def test_llamacpp_swa_rules() -> None:
    g = registry.load_model("gpt-oss-20b")
    a = llamacpp.allocate(g, 131072)
    swa = next(b for b in a.buffers if b.cache == "swa")
    assert swa.cells == 768                                              # pad(128 + 512, 256)
    full = llamacpp.allocate(g, 131072, swa_full=True)
    assert next(b for b in full.buffers if b.cache == "swa").cells == 131072
    unified = llamacpp.allocate(g, 131072, n_seq=4, kv_unified=True)
    assert next(b for b in unified.buffers if b.cache == "swa").cells == 1024   # pad(128 x 4 + 512, 256)
    q = llamacpp.allocate(g, 131072, "q8_0", swa_f16=True)
    assert next(b for b in q.buffers if b.cache == "swa").type_k == "f16"


def test_llamacpp_mla_latent_and_recurrent_state() -> None:
    d = llamacpp.allocate(registry.load_model("DeepSeek-V3"), 4096)
    assert d.buffers[0].v_bytes == 0 and d.kv_bytes == 61 * 4096 * 576 * 2
    n = llamacpp.allocate(registry.load_model("Nemotron-3-Nano-30B-A3B"), 4096, n_seq=2)
    rec = next(b for b in n.buffers if b.cache == "recurrent")
    assert rec.cells == 2 and rec.type_k == "f32"


def test_cpu_fallback_warning() -> None:
    assert llamacpp.cpu_fallback_warnings("q8_0", "q8_0") == []
    assert "CPU" in llamacpp.cpu_fallback_warnings("q8_0", "q4_0")[0]
    assert llamacpp.cpu_fallback_warnings("q5_1", "q5_1")


def test_vllm_rules() -> None:
    g = registry.load_model("Llama-3.1-8B")
    p = vllm.plan(g, 20.0, max_model_len=131072)
    assert p.page_bytes == 16 * 8 * 256 * 2 and p.num_blocks == 20 * GIB // p.page_bytes // 32
    assert p.kv_tokens == p.num_blocks * 16 and p.max_concurrency == p.num_blocks / 8192
    tp16 = vllm.plan(g, 20.0, tp=16, max_model_len=131072)                # 8 KV heads < 16 ranks: replicated
    assert tp16.kv_heads_per_rank == 1 and tp16.warnings
    o = vllm.plan(registry.load_model("gpt-oss-20b"), 20.0)
    assert o.groups == ("full", "sliding") and o.kv_tokens == o.num_blocks // 2 * 16
    assert o.blocks_per_request == 8192 + (-(-(128 - 1 + 2048) // 16) + 1)
    ds = registry.load_model("DeepSeek-V3")
    assert vllm.page_bytes(ds, 16, kv_cache_dtype="fp8_ds_mla") == 16 * 656
    assert vllm.page_bytes(ds, 16, kv_cache_dtype="nvfp4_ds_mla") == 16 * 352
    assert vllm.plan(ds, 10.0, kv_cache_dtype="nvfp4_ds_mla").num_blocks == 10 * GIB // (16 * 352) // 61
    with pytest.raises(ValueError, match="nvfp4_ds_mla is vLLM's layout for MLA models"):
        vllm.page_bytes(g, 16, kv_cache_dtype="nvfp4_ds_mla")
    assert vllm.page_bytes(ds, 16, kv_cache_dtype="fp8") == 16 * 576
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        vllm.page_bytes(g, 16, kv_cache_dtype="int3")
    assert vllm.plan(g, 0.5, max_model_len=131072).warnings[-1].startswith("does not fit")
    assert MIB


def test_vllm_turboquant_keeps_its_boundary_layers() -> None:
    """get_boundary_skip_layers (turboquant/config.py @ 1471680b): dense models keep the first and last min(2, L//2)
    layers in auto (bf16); hybrids none. 32 layers x 8 KV heads x hd 128 under turboquant_4bit_nc: 46,400 B a token."""
    g = registry.load_model("Llama-3.1-8B")
    assert vllm.turboquant_boundary_layers(g, "turboquant_4bit_nc") == ("0", "1", "30", "31")
    assert vllm.turboquant_boundary_layers(g, "fp8") == ()
    p = vllm.plan(g, 20.0, max_model_len=131072, kv_cache_dtype="turboquant_4bit_nc")
    assert p.skip_layers == ("0", "1", "30", "31") and p.groups == ("full",)
    assert p.page_bytes == 16 * (28 * 8 * 134 + 4 * 8 * 512) == 16 * 46400
    assert p.num_blocks == 20 * GIB // (16 * 46400) and p.kv_tokens == p.num_blocks * 16
    assert any("boundary layers 0, 1, 30, 31" in w for w in p.warnings)
    assert 32 * 8 * 134 == 34304 and round(131072 / 46400, 2) == 2.82
    # every preset, k8v4 included (196-byte slots)
    k8 = vllm.plan(g, 20.0, max_model_len=131072, kv_cache_dtype="turboquant_k8v4")
    assert k8.page_bytes == 16 * (28 * 8 * 196 + 4 * 8 * 512)
    # the user's skip list is kept (union, sorted by index)
    u = vllm.plan(g, 20.0, max_model_len=131072, kv_cache_dtype="turboquant_3bit_nc", skip_layers=("5", "0"))
    assert u.skip_layers == ("0", "1", "5", "30", "31") and u.page_bytes == 16 * (27 * 8 * 102 + 5 * 8 * 512)
    # min(2, L // 2): 3 layers -> 0 and 2; 1 layer -> none
    def dense(n: int):
        return from_hf_config({"num_hidden_layers": n, "num_attention_heads": 8, "num_key_value_heads": 8,
                               "hidden_size": 1024, "max_position_embeddings": 4096})
    assert vllm.turboquant_boundary_layers(dense(3), "turboquant_k3v4_nc") == ("0", "2")
    assert vllm.turboquant_boundary_layers(dense(1), "turboquant_k3v4_nc") == ()
    # a hybrid (Mamba / linear attention beside attention): none
    assert vllm.turboquant_boundary_layers(registry.load_model("Qwen3-Next-80B-A3B"), "turboquant_4bit_nc") == ()
    assert vllm.turboquant_boundary_layers(registry.load_model("Jamba-v0.1"), "turboquant_4bit_nc") == ()


def test_fleet_accuracy_lookup_with_interval(tmp_path) -> None:
    path = tmp_path / "storage_formats.csv"
    rows = ["storage,n_tokens,accumulator,retrieved"]
    rows += [f"q8_0/q8_0,4096,exact,{'True' if i < 9 else 'False'}" for i in range(10)]
    rows += ["q8_0/q8_0,4096,hopper,False", "q8_0/q8_0,262144,exact,True"]
    path.write_text("\n".join(rows) + "\n")
    assert evidence.accuracy_lookup(path, "q8_0/q8_0", 131072) == (9, 10, 4096, 0, 0)
    assert evidence.accuracy_lookup(path, "q4_0/q4_0", 131072) is None
    assert evidence.accuracy_lookup(tmp_path / "missing.csv", "q8_0/q8_0", 131072) is None
    f = fleet.plan(registry.load_model("Llama-3.1-8B"), "Llama-3.1-8B", "H100-80GB", 131072, dtypes=["q8_0"],
                   accuracy_csv=path)
    assert f.rows[0].accuracy == ("needle table storage_formats.csv (a synthetic haystack, not a decoder): needle "
                                  "9/10 = 90% [60%, 98%] at 4,096 tokens (shorter than the planned 131,072)")


def test_fleet_weights_budget_and_warnings() -> None:
    g = registry.load_model("gpt-oss-20b")
    f = fleet.plan(g, "gpt-oss-20b", "RTX-4090", 131072)
    # MXFP4 experts (19,110,297,600 parameters at 4.25 bits) and the other 1,804,459,584 in bf16: 12.82 GiB
    assert f.weights_gib == (19110297600 * 17 // 32 + 1804459584 * 2) / GIB
    assert round(f.weights_gib, 2) == 12.82
    assert any("--swa-full" in w for w in f.warnings)
    big = fleet.plan(registry.load_model("Llama-2-7B"), "Llama-2-7B", "RTX-4090", 8192, concurrency=64)
    assert any("asked" in w for r in big.rows for w in r.warnings)
    assert fleet.plan(registry.load_model("Llama-2-7B"), "Llama-2-7B", "RTX-4090", 8192).rows[0].requests >= 1
    with pytest.raises(ValueError, match="--gpus"):
        fleet.plan(g, "gpt-oss-20b", "H100-80GB", 4096, n_gpus=3, tp=2)
    over = fleet.plan(registry.load_model("Qwen3-8B"), "Qwen3-8B", "H100-80GB", 131072)
    assert any("max_position_embeddings" in w for w in over.warnings)


def test_plan_readings() -> None:
    table = plan_exp.plan_table(["Llama-3.1-8B", "gpt-oss-20b"], "H100-80GB", [8192], ["bf16", "fp8_e4m3"])
    needle = pd.DataFrame({"n_tokens": [8192] * 4, "storage": ["none/none", "bf16/bf16"] * 2,
                           "accumulator": ["exact"] * 4, "retrieved": [True, True, True, False]})
    checks = {c.claim.split(":")[0]: c for c in plan_claims.readings(table, needle)}
    assert checks["halving it [the cache] with one byte per value is arithmetic"].agrees
    needle_check = checks["whether the half you keep still answers the question is not arithmetic"]
    assert "lost in bf16/bf16 at 8,192 tokens (1/2 = 50% [" in needle_check.computed      # no fp8/q8_0 pair here
    assert not checks["Llama-2-7B"].agrees and "4,096" in checks["Llama-2-7B"].computed


def test_needle_by_format_small() -> None:
    df = plan_exp.needle_by_format([512], ["q8_0", "fp8_e4m3/q4_0"], trials=1)
    assert list(df.storage) == ["none/none", "q8_0/q8_0", "fp8_e4m3/q4_0"]
    ref = df[df.storage == "none/none"].iloc[0]
    assert ref.retrieved and abs(ref.share - 1) < 1e-9
    x = np.linspace(-3, 3, 64).reshape(2, 32)
    assert np.array_equal(plan_exp.store_as(x, "none"), x)
    assert np.abs(plan_exp.store_as(x, "q8_0") - x).max() < 3 / 127
    with pytest.raises(ValueError, match="dtypes"):
        plan_exp.store_as(x, "kivi2")
