"""KV-cache sizing from configs: every family with a hand-computed expectation, bad configs, planner."""
import json
import math

import numpy as np
import pytest

from kvcost.experiments import sizing as exp
from kvcost.models import footprint, registry
from kvcost.models.footprint import cache_bytes, from_hf_config, load_model
from kvcost.storage import formats, quant

GIB, MIB = 2**30, 2**20


def per_layer_token(kv_heads: int, head_dim: int, nbytes: int = 2) -> int:
    """Hand formula for one layer, one token: K and V of every KV head."""
    return 2 * kv_heads * head_dim * nbytes


# --------------------------------------------------------------------------- MHA / GQA / MQA

def test_gqa_llama_3_1_8b() -> None:
    g = load_model("Llama-3.1-8B")
    assert (g.num_layers, g.kv_heads, g.head_dim) == (32, 8, 128)       # head_dim derived 4096/32
    assert cache_bytes(g, 131072) == 32 * per_layer_token(8, 128) * 131072 == 16 * GIB
    assert footprint.kv_bytes_per_token(g) == 131072


@pytest.mark.parametrize("name, per_token", [
    ("Llama-3.1-70B", 80 * 4096), ("Llama-3.1-405B", 126 * 4096), ("Qwen3-8B", 36 * 4096),
    ("Qwen3-32B", 64 * 4096), ("Qwen3-30B-A3B", 48 * 2048), ("Mixtral-8x7B-v0.1", 32 * 4096),
    ("Llama-2-7B", 32 * 16384), ("Falcon-40B", 60 * 2048), ("Qwen2.5-7B-Instruct", 28 * 2048),
])
def test_full_attention_models(name: str, per_token: int) -> None:
    g = load_model(name)
    assert g.count("full") == g.num_layers
    assert cache_bytes(g, 1000) == per_token * 1000


def test_mha_when_kv_heads_absent() -> None:
    g = from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 16, "hidden_size": 1024})
    assert (g.kv_heads, g.head_dim) == (16, 64)
    assert cache_bytes(g, 3) == 2 * per_layer_token(16, 64) * 3


def test_falcon_multi_query_is_one_kv_head() -> None:
    g = load_model("Falcon-7B")
    assert (g.kv_heads, g.head_dim) == (1, 64)                         # 4544 / 71 = 64
    assert cache_bytes(g, 2048) == 32 * per_layer_token(1, 64) * 2048 == 16 * MIB


def test_kv_heads_explicit_null_means_mha() -> None:
    g = from_hf_config({"num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": None,
                        "hidden_size": 512})
    assert g.kv_heads == 8


# --------------------------------------------------------------------------- head_dim

def test_explicit_head_dim_wins_gpt_oss() -> None:
    g = load_model("gpt-oss-20b")
    assert g.head_dim == 64                                             # not 2880 / 64 = 45
    g2 = load_model("Qwen3-32B")
    assert g2.head_dim == 128                                           # not 5120 / 64 = 80


def test_attention_head_dim_alias_nemotron_h() -> None:
    assert load_model("Nemotron-H-8B").head_dim == 128


# --------------------------------------------------------------------------- sliding windows

def test_mistral_window_on_every_layer() -> None:
    g = load_model("Mistral-7B-v0.1")
    assert g.count("sliding") == 32 and g.window == 4096
    assert cache_bytes(g, 1000) == 32 * per_layer_token(8, 128) * 1000
    assert cache_bytes(g, 131072) == 32 * per_layer_token(8, 128) * 4096 == 512 * MIB


def test_phi3_window_2047() -> None:
    g = load_model("Phi-3-mini-4k-instruct")
    assert (g.kv_heads, g.head_dim, g.window) == (32, 96, 2047)
    assert cache_bytes(g, 4096) == 32 * per_layer_token(32, 96) * 2047 == 804913152


def test_gpt_oss_interleaved_layer_types() -> None:
    g = load_model("gpt-oss-20b")
    assert g.layer_kinds[:2] == ("sliding", "full") and g.count("full") == 12
    expected = 12 * per_layer_token(8, 64) * 131072 + 12 * per_layer_token(8, 64) * 128
    assert cache_bytes(g, 131072) == expected == 3224371200          # 3 GiB + 3 MiB, not 6 GiB
    assert cache_bytes(load_model("gpt-oss-120b"), 131072) == 18 * 2048 * (131072 + 128)


def test_gemma2_alternates_without_layer_types() -> None:
    g = load_model("Gemma-2-9B")
    assert g.layer_kinds[:2] == ("sliding", "full") and g.count("sliding") == 21
    assert cache_bytes(g, 8192) == 21 * 8192 * 8192 + 21 * 8192 * 4096 == 2113929216


def test_gemma3_text_config_and_pattern() -> None:
    g = load_model("Gemma-3-27B")
    full = [i for i, k in enumerate(g.layer_kinds) if k == "full"]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert cache_bytes(g, 131072) == 10 * 8192 * 131072 + 52 * 8192 * 1024 == 11173625856


def test_sliding_window_null_and_use_sliding_window_false() -> None:
    base = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    assert from_hf_config({**base, "sliding_window": None}).count("full") == 4
    g = from_hf_config({**base, "sliding_window": 16, "use_sliding_window": False})
    assert g.count("full") == 4 and g.window is None
    assert load_model("Qwen2.5-7B-Instruct").window is None


def test_qwen2_max_window_layers() -> None:
    g = from_hf_config({"model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 4,
                        "head_dim": 8, "sliding_window": 16, "use_sliding_window": True,
                        "max_window_layers": 2})
    assert g.layer_kinds == ("full", "full", "sliding", "sliding")


# --------------------------------------------------------------------------- MLA

def test_deepseek_v3_mla_latent() -> None:
    g = load_model("DeepSeek-V3")
    assert g.mla_latent == 576 and g.count("mla") == 61
    assert cache_bytes(g, 1000) == 61 * 576 * 2 * 1000 == 70272000       # not x 128 KV heads
    assert cache_bytes(g, 1000, "bf16", v_dtype="q4_0") == 70272000     # no separate V
    assert cache_bytes(g, 1000, "q8_0") == 61 * 18 * 34 * 1000           # 576 = 18 blocks
    assert g.naive == (61, 128, 56)                                       # what a naive reader derives


def test_deepseek_mla_records_fp8_ds_mla_and_nvfp4_ds_mla() -> None:
    """vLLM's per-token records of the 576-value latent (flashmla_sparse.py @ 008a0c31): 656 and 352 bytes a layer."""
    g = load_model("DeepSeek-V3")
    assert footprint.MLA_LAYOUTS == {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
    assert cache_bytes(g, 1000, "fp8_ds_mla") == 61 * 656 * 1000 == 40016000
    assert cache_bytes(g, 1000, "nvfp4_ds_mla") == 61 * 352 * 1000 == 21472000
    assert footprint.kv_bytes_per_token(g, "nvfp4_ds_mla") == 61 * 352 == 21472
    assert footprint.growth_bytes_per_token(g, "fp8_ds_mla") == 61 * 656
    rows = footprint.layer_breakdown(g, 10, "nvfp4_ds_mla")
    assert len(rows) == 1 and rows[0]["latent_bytes"] == 61 * 352 * 10 and rows[0]["k_format"] == "nvfp4_ds_mla"
    assert footprint.requests_in_budget(g, 1.0, 1000, "nvfp4_ds_mla") == (1 << 30) // 21472000 == 50
    p = footprint.plan(g, 1000, "nvfp4_ds_mla", budget_gib=1.0)
    assert (p.dtype, p.cache_bytes, p.requests) == ("nvfp4_ds_mla", 21472000, 50)
    # the post's naive formula prices a record in its NoPE values' format (fp8: 1 byte, nvfp4: 9/16 byte)
    assert footprint.naive_cache_bytes(g, 1000, "fp8_ds_mla") == 61 * 128 * 56 * 1000 * 2
    assert footprint.naive_cache_bytes(g, 1000, "nvfp4_ds_mla") == 61 * 128 * 56 * 1000 * 2 * 9 // 16
    assert formats.bits_per_value("nvfp4_ds_mla") == pytest.approx(352 * 8 / 576)      # 4.89
    assert formats.bits_per_value("fp8_ds_mla") == pytest.approx(656 * 8 / 576)        # 9.11
    assert cache_bytes(load_model("DeepSeek-V2-Lite"), 100, "nvfp4_ds_mla") == 27 * 352 * 100
    for bad in ("fp8_ds_mla", "nvfp4_ds_mla", "bf16;skip=0;skip_dtype=nvfp4_ds_mla"):
        with pytest.raises(ValueError, match=r"parameter 'dtype': .*_ds_mla is vLLM's per-token record.*"
                                             r"Llama-3.1-8B has no MLA layers"):
            cache_bytes(load_model("Llama-3.1-8B"), 100, bad)
    other = from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,
                            "kv_lora_rank": 256, "qk_rope_head_dim": 32})
    with pytest.raises(ValueError, match="latent has 288 values, not 576"):
        cache_bytes(other, 10, "nvfp4_ds_mla")
    with pytest.raises(ValueError, match="no round trip"):
        quant.roundtrip(np.ones((2, 576), np.float32), "nvfp4_ds_mla")


def test_deepseek_v2_lite_mla() -> None:
    assert cache_bytes(load_model("DeepSeek-V2-Lite"), 100) == 27 * 576 * 2 * 100


# --------------------------------------------------------------------------- hybrids

def test_qwen3_next_full_attention_interval() -> None:
    g = load_model("Qwen3-Next-80B-A3B")
    assert g.count("full") == 12 and g.count("linear") == 36
    assert g.layer_kinds[3] == "full" and g.layer_kinds[0] == "linear"
    assert cache_bytes(g, 1000) == 12 * per_layer_token(2, 256) * 1000
    # 36 Gated DeltaNet layers: 32 x 128 x 128 state + (2*16*128 + 32*128) x 3 conv, bf16
    assert footprint.state_bytes(g) == 36 * (32 * 128 * 128 + 8192 * 3) * 2 == 39518208


def test_jamba_attn_layer_period_offset() -> None:
    g = load_model("Jamba-v0.1")
    assert [i for i, k in enumerate(g.layer_kinds) if k == "full"] == [4, 12, 20, 28]
    assert cache_bytes(g, 1000) == 4 * per_layer_token(8, 128) * 1000
    assert footprint.state_bytes(g) == 28 * (8192 * 16 + 8192 * 3) * 2


def test_nemotron_h_pattern() -> None:
    g = load_model("Nemotron-H-8B")
    assert (g.count("full"), g.count("mamba"), g.count("none")) == (4, 24, 24)
    assert cache_bytes(g, 8192) == 4 * per_layer_token(8, 128) * 8192 == 128 * MIB
    assert footprint.state_bytes(g) == 24 * (128 * 64 * 128 + 10240 * 3) * 2 == 51806208


def test_nemotron_3_nano_matches_the_llama_cpp_buffers() -> None:
    g = load_model("Nemotron-3-Nano-30B-A3B")
    assert (g.count("full"), g.kv_heads, g.head_dim) == (6, 2, 128)
    assert cache_bytes(g, 131072, "f16") == 768 * MIB
    assert cache_bytes(g, 131072, "q8_0") == 408 * MIB
    assert cache_bytes(g, 131072, "q4_0") == 216 * MIB
    assert g.state_dtype == "fp32"


def test_linear_attention_layer_types_without_state_sizes() -> None:
    g = from_hf_config({"num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 8,
                        "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    assert cache_bytes(g, 10) == 1 * per_layer_token(4, 8) * 10
    assert footprint.state_bytes(g) is None


# --------------------------------------------------------------------------- formats in the cache

def test_qwen3_8b_q8_0_saves_2_1_gib_at_32k() -> None:
    g = load_model("Qwen3-8B")
    f16 = cache_bytes(g, 32768, "fp16")
    q8 = cache_bytes(g, 32768, "q8_0")
    assert f16 == 4.5 * GIB
    assert q8 == 36 * 2 * 32 * 34 * 32768                                # 32 blocks per 1024-value row
    assert round((f16 - q8) / GIB, 1) == 2.1


def test_kivi_residual_window() -> None:
    g = load_model("Llama-3.1-8B")
    # 1000 tokens: 872 in int2 groups of 32 (0.375 B/value), 128 in fp16; 1024 values per row.
    assert cache_bytes(g, 1000, "kivi2") == 2 * 32 * (872 * 384 + 128 * 2048)
    assert cache_bytes(g, 100, "kivi2") == cache_bytes(g, 100, "fp16")  # all inside the window


def test_fp8_scales_counted() -> None:
    g = load_model("Llama-3.1-8B")
    assert cache_bytes(g, 10, "fp8_e4m3") == 32 * 2 * 1024 * 10
    assert cache_bytes(g, 10, "fp8_e4m3_token") == 32 * 2 * (1024 + 8 * 4) * 10
    assert footprint.shared_bytes(g, "fp8_e4m3_head") == 32 * 2 * 8 * 4


def test_k_and_v_formats_separately() -> None:
    g = load_model("Llama-3.1-8B")
    assert cache_bytes(g, 1, "q8_0", "q4_0") == 32 * (32 * 34 + 32 * 18)


def test_context_zero_and_bad_inputs() -> None:
    g = load_model("Llama-3.1-8B")
    assert cache_bytes(g, 0) == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="context"):
            cache_bytes(g, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="format"):
        cache_bytes(g, 10, "int3")


# --------------------------------------------------------------------------- bad configs

BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16}


@pytest.mark.parametrize("patch, key", [
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"layer_types": ["full_attention"] * 3 + ["chunky_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 4}, "sliding_window"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_hidden_layers": -2}, "num_hidden_layers"),
    ({"num_attention_heads": None}, "num_attention_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"head_dim": -8}, "head_dim"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
    ({"hybrid_override_pattern": "M*M"}, "hybrid_override_pattern"),
    ({"hybrid_override_pattern": "M*MX"}, "hybrid_override_pattern"),
    ({"attn_layer_period": 4, "attn_layer_offset": 4}, "attn_layer_offset"),
    ({"full_attention_interval": 0}, "full_attention_interval"),
])
def test_bad_configs_name_the_key(patch: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        from_hf_config({**BASE, **patch})


def test_head_dim_underivable() -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 3}
    with pytest.raises(ValueError, match="head_dim"):
        from_hf_config(cfg)
    with pytest.raises(ValueError, match="head_dim"):
        from_hf_config({**cfg, "hidden_size": 100})                     # 100 / 3 is not whole
    with pytest.raises(ValueError, match=r"text_config\.'num_hidden_layers'"):
        from_hf_config({"text_config": {"num_attention_heads": 4}})


def test_not_a_config() -> None:
    with pytest.raises(ValueError):
        from_hf_config([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="config"):
        from_hf_config("/no/such/config.json")


def test_path_and_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert cache_bytes(from_hf_config(tmp_path / "config.json"), 5) == 4 * per_layer_token(2, 16) * 5
    assert from_hf_config(str(tmp_path)).num_layers == 4


# --------------------------------------------------------------------------- registry

def test_registry_has_the_families() -> None:
    names = registry.list_models()
    assert len(names) >= 20
    for must in [*registry.POST_MODELS, "DeepSeek-V3", "Jamba-v0.1", "Qwen3-Next-80B-A3B", "Gemma-3-27B",
                 "Falcon-7B", "Phi-3-mini-4k-instruct", "Nemotron-H-8B"]:
        assert must in names
    for n in names:
        rec = registry.model_record(n)
        assert rec["sources"] and all(s["where"] for s in rec["sources"])
    assert registry.load_model("qwen3-8b").name == "Qwen3-8B"                # case-insensitive
    assert registry.load_model("openai/gpt-oss-20b").name == "gpt-oss-20b"   # by repo id
    with pytest.raises(ValueError, match=r"Llama-3\.1-8B"):
        registry.load_model("Llama-9")


# --------------------------------------------------------------------------- planner

def test_requests_and_max_context() -> None:
    g = load_model("Llama-3.1-8B")
    assert footprint.requests_in_budget(g, 24.0, 8192) == 24
    assert footprint.max_context(g, 24.0) == 24 * GIB // 131072 == 196608
    assert footprint.max_context(g, 24.0, "q8_0", requests=2) == 24 * GIB // 2 // 69632
    m = load_model("Mistral-7B-v0.1")
    assert footprint.max_context(m, 24.0) is None                           # windowed: unbounded
    assert footprint.max_context(m, 0.25) == 2048
    n = load_model("Nemotron-H-8B")
    assert footprint.max_context(n, 1.0) == (GIB - 51806208) // 16384 == 62374
    assert footprint.requests_in_budget(n, 1.0, 8192) == GIB // (128 * MIB + 51806208)
    with pytest.raises(ValueError, match="budget_gib"):
        footprint.requests_in_budget(g, 0, 8192)


def test_context_warnings() -> None:
    assert footprint.context_warnings(load_model("Llama-3.1-8B"), 131072) == []
    w = footprint.context_warnings(load_model("Qwen3-8B"), 131072)
    assert len(w) == 1 and "max_position_embeddings 40960" in w[0]
    assert footprint.plan(load_model("Llama-2-7B"), 8192).warnings


def test_plan_naive_vs_true() -> None:
    p = footprint.plan(load_model("gpt-oss-20b"), 131072, "bf16", budget_gib=24.0, request_tokens=8192)
    assert p.naive_cache_bytes == 6 * GIB and p.cache_bytes == 3224371200
    assert p.requests == 24 * GIB // (12 * 2048 * 8192 + 12 * 2048 * 128)


# --------------------------------------------------------------------------- the post's formula

def test_post_table_reproduces_block_1() -> None:
    df = exp.post_table()
    assert list(df.columns) == ["model", "layers", "kv_heads", "head_dim", "kib_per_token_bf16",
                                "gib_at_context_bf16", "gib_at_context_fp8", "requests_at_budget"]
    assert df["kib_per_token_bf16"].tolist() == [128, 144, 128, 48, 512]
    assert df["gib_at_context_bf16"].tolist() == [16, 18, 16, 6, 64]
    assert df["gib_at_context_fp8"].tolist() == [8, 9, 8, 3, 32]
    assert df["requests_at_budget"].tolist() == [24, 21, 24, 64, 6]
    assert exp.post_listing()["ratio"].tolist() == [1.0, 1.125, 1.0, 0.375, 4.0]


def test_post_table_other_parameters() -> None:
    df = exp.post_table(["DeepSeek-V3"], context=65536, budget_gib=80.0, request_tokens=4096)
    b = 2 * 61 * 128 * 56 * 2
    row = df.iloc[0]
    assert row["gib_at_context_bf16"] == b * 65536 / GIB
    assert row["requests_at_budget"] == int(80.0 * GIB / (b * 4096))
    assert math.isclose(row["kib_per_token_bf16"], b / 1024)


def test_check_models_accepts_case_and_repo_ids_and_names_the_parameter() -> None:
    assert registry.check_models("models", ["llama-3.1-8b", "Qwen3-8B"]) == ["Llama-3.1-8B", "Qwen3-8B"]
    repo = registry.model_record("Qwen3-8B")["hf_repo"]
    assert registry.check_models("models", [repo]) == ["Qwen3-8B"]
    with pytest.raises(ValueError, match="parameter 'models': unknown model 'No-Such'"):
        registry.check_models("models", ["No-Such"])
    with pytest.raises(ValueError, match="parameter 'plot_models' must be a list"):
        registry.check_models("plot_models", "Qwen3-8B")
    assert registry.check_models("compare_models", [], min_len=0) == []
