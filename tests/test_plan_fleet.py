"""The fleet planner of issue 25: weights of any model, any GPU, engine-true capacity, a decode estimate held
against published measurements, accuracy that says what it rests on, and one error line for bad input."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest

from kvcost import cli
from kvcost.claims import plan as plan_claims
from kvcost.engines import llamacpp, vllm
from kvcost.experiments import plan as plan_exp
from kvcost.models import registry, weights
from kvcost.models.hfconfig import parameter_counts
from kvcost.paths import repo_root
from kvcost.planning import decode, evidence, fleet, gpus
from kvcost.units import GIB

H100 = gpus.gpu("H100")


@pytest.mark.parametrize("name", [n for n in registry.list_models() if registry.model_record(n).get("parameters")])
def test_parameter_counts_reproduce_the_cited_totals(name):
    rec = registry.model_record(name)
    assert parameter_counts(rec["config"])["total"] == rec["parameters"]["total"]


@pytest.mark.parametrize("name, total, printed", [
    ("DeepSeek-V3", 671_026_419_200, "671B"), ("DeepSeek-V2-Lite", 15_706_484_224, "15.7B"),
    ("Mixtral-8x7B-v0.1", 46_702_792_704, "46.7B"), ("Qwen3-30B-A3B", 30_532_122_624, "30.5B"),
    ("Qwen2.5-7B-Instruct", 7_615_616_512, "7.61B"), ("Jamba-v0.1", 51_570_323_328, "51.57B"),
    ("Gemma-3-27B", 27_432_406_640, "27.4B"), ("Phi-3-mini-4k-instruct", 3_821_079_552, "3.8B"),
    ("Qwen3-Next-80B-A3B", 79_674_391_296, "80B"), ("Nemotron-3-Nano-30B-A3B", 31_577_940_288, "31.6B")])
def test_counted_totals_agree_with_the_published_figures(name, total, printed):
    rec = registry.model_record(name)
    assert rec["parameters"]["total"] == total and printed in rec["parameters"]["source"]
    decimals = len(printed.rstrip("B").partition(".")[2])
    # within one unit of the last printed digit (cards round, 30.53 -> 30.5, or cut, 7.616 -> 7.61)
    assert abs(total / 1e9 - float(printed.rstrip("B"))) < 10.0 ** -decimals


def test_gemma2_non_embedding_count_is_the_reports():
    c = parameter_counts(registry.model_record("Gemma-2-9B")["config"])
    assert c["total"] - c["embedding"] == 8_324_201_984 and c["embedding"] == 256_000 * 3584   # tied


def test_every_record_says_what_it_answers():
    rows = {n: registry.answers(n) for n in registry.list_models()}
    lacking = sorted(n for n, a in rows.items() if not a["weights"])
    assert lacking == []                                          # every registry record sizes its weights
    nano = parameter_counts(registry.model_record("Nemotron-3-Nano-30B-A3B")["config"])
    assert (nano["total"], nano["experts"]) == (31_577_940_288, 23 * 128 * 2 * 2688 * 1856)   # MoE of relu2 MLPs
    n = parameter_counts(registry.model_record("Qwen3-Next-80B-A3B")["config"])
    assert n["total"] == 79_674_391_296 and n["linear_attention"] == 36 * 33_718_464        # Gated DeltaNet layers
    h = parameter_counts(registry.model_record("Nemotron-H-8B")["config"])    # 24 Mamba-2, 4 attention, 24 MLP
    assert (h["total"], h["mamba"], h["dense_mlp"]) == (8_100_852_736, 24 * 109_635_968, 24 * 2 * 4096 * 21504)
    assert "linear layers in fp8_e4m3" in rows["DeepSeek-V3"]["answers"]
    v3 = weights.model_weights("DeepSeek-V3")
    assert v3.bytes == -(-669_065_734_144 * 8.001953125 // 8) + (671_026_419_200 - 669_065_734_144) * 2
    assert (v3.num_experts, v3.experts_per_token) == (256, 8) and v3.expert_bytes > 0.97 * v3.bytes


def test_gpt_oss_weights_split_by_what_is_quantized():
    c = parameter_counts(registry.model_record("gpt-oss-20b")["config"])
    assert c["experts"] == 24 * 32 * 3 * 2880 * 2880 == 19_110_297_600
    assert c["total"] - c["experts"] == 1_804_459_584            # attention, embeddings, routers, norms: bf16
    w = weights.model_weights("gpt-oss-20b")
    assert w.bytes == 19_110_297_600 * 17 // 32 + 1_804_459_584 * 2 and round(w.gib, 2) == 12.82
    assert (w.num_experts, w.experts_per_token, w.expert_bytes) == (32, 4, 19_110_297_600 * 17 // 32)
    assert round(weights.model_weights("gpt-oss-120b").gib, 2) == round(
        (114_661_785_600 * 17 // 32 + (116_829_156_672 - 114_661_785_600) * 2) / GIB, 2)


def test_weights_from_flags_index_and_config(tmp_path):
    assert weights.model_weights(params=70_000_000_000, weights_dtype="fp8_e4m3").bytes == 70_000_000_000
    assert weights.model_weights("Llama-3.1-8B", weights_gib=10).bytes == 10 * GIB
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}))
    assert weights.model_weights(index=tmp_path).bytes == 16_060_522_496
    cfg = dict(registry.model_record("Llama-3.1-8B")["config"], torch_dtype="bfloat16")
    assert weights.model_weights(cfg=cfg).bytes == 2 * 8_030_261_248
    with pytest.raises(ValueError, match="--params N"):
        weights.model_weights("no-such-model")
    with pytest.raises(ValueError, match="--weights-dtype"):
        weights.model_weights(params=10, weights_dtype="int3")
    assert registry.answers("Qwen3-32B")["weights"] and registry.answers("Nemotron-3-Nano-30B-A3B")["weights"]


def test_gpu_catalogue_aliases_bandwidth_and_native_formats():
    names = {g.name for g in gpus.catalogue().values()}
    assert {"H100-SXM", "H100-PCIe", "H200", "B200", "GB200", "B300", "A100-40GB", "A100-80GB", "L40S", "RTX-4090",
            "RTX-5090", "MI300X", "MI325X", "MI355X"} <= names
    assert H100.name == "H100-SXM" and gpus.gpu("h100-80gb") is not None and gpus.gpu("5090").name == "RTX-5090"
    assert (H100.bandwidth_tbs, gpus.gpu("B200").bandwidth_tbs, gpus.gpu("MI300X").bandwidth_tbs) == (3.35, 8.0, 5.3)
    assert all(g.bandwidth_source for g in gpus.catalogue().values())         # a source, or why there is none
    assert gpus.kernel_support(gpus.gpu("B200"), "nvfp4") == ("native", "")
    assert gpus.kernel_support(H100, "nvfp4")[0] == "emulated"
    assert gpus.kernel_support(gpus.gpu("A100"), "fp8_e4m3")[0] == "emulated"
    assert gpus.kernel_support(gpus.gpu("MI355X"), "q4_0")[0] == "software"
    card = gpus.custom_gpu(100, 2.5)
    assert (card.total_gib, card.bandwidth_tbs, card.kv_native) == (100.0, 2.5, ())
    with pytest.raises(ValueError, match=r"--gpu must be one of .*H100-SXM"):
        gpus.gpu("H999")
    with pytest.raises(ValueError, match="--bandwidth-tbs"):
        gpus.custom_gpu(80, -1)


def test_vllm_capacity_reserves_the_sliding_window():
    g = registry.load_model("Mistral-7B-v0.1")
    f = fleet.plan(g, g.name, "H100", 8192, dtypes=["bf16"], engine="vllm")
    v = vllm.plan(g, f.kv_budget_gib_per_gpu, max_model_len=8192)
    # every layer slides: (4096 - 1 + 2048) tokens -> 385 blocks + 1 per request, not 4096 tokens
    assert v.blocks_per_request == -(-(4095 + 2048) // 16) + 1 == 385
    assert f.rows[0].requests == int(v.max_concurrency) == 74
    assert fleet.plan(g, g.name, "H100", 8192, dtypes=["bf16"]).rows[0].requests == 111     # engine-independent
    q4 = fleet.plan(g, g.name, "H100", 8192, dtypes=["q4_0"], engine="vllm").rows[0]
    assert q4.requests == 0 and "not a vLLM --kv-cache-dtype" in q4.engine_note


def test_llamacpp_capacity_is_the_largest_allocation_that_fits():
    g = registry.load_model("gpt-oss-20b")
    f = fleet.plan(g, g.name, "H100", 32768, dtypes=["q8_0"], engine="llama.cpp")
    n, budget = f.rows[0].requests, int(f.kv_budget_gib_per_gpu * GIB)
    fits = [llamacpp.allocate(g, k * 32768, "q8_0", n_seq=k).kv_bytes <= budget for k in (n, n + 1)]
    assert n > 0 and fits == [True, False]
    full = fleet.plan(g, g.name, "H100", 32768, dtypes=["q8_0"], engine="llama.cpp", swa_full=True).rows[0]
    assert full.requests < n                                          # --swa-full keeps every token


def test_decode_estimate_by_hand():
    g = registry.load_model("Llama-3.1-8B")
    d = decode.estimate(g, weights.model_weights("Llama-3.1-8B"), "bf16", 8192, 1, 3.35, efficiency=0.8)
    kv = 32 * 2 * 8 * 128 * 2 * 8192
    assert math.isclose(d.itl_ms, (2 * 8_030_261_248 + kv) / (3.35e12 * 0.8) * 1e3)
    assert math.isclose(d.slope_ms_per_token, 131072 / (3.35e12 * 0.8) * 1e3)
    moe = registry.load_model("gpt-oss-20b")
    w = weights.model_weights("gpt-oss-20b")
    one = decode.estimate(moe, w, "bf16", 1, 1, 3.35, efficiency=1.0)
    assert math.isclose(one.weights_read_bytes, w.bytes - w.expert_bytes + w.expert_bytes * 4 / 32)
    many = decode.estimate(moe, w, "bf16", 1, 64, 3.35, efficiency=1.0)
    assert many.weights_read_bytes > 0.98 * w.bytes                    # 64 tokens reach nearly every expert


def test_decode_checks_against_the_vllm_blog():
    t = plan_claims.decode_checks().set_index(["gpu", "model", "kv", "quantity"])
    eff = t.loc[("H100-SXM", "Llama-3.1-8B", "bf16", "itl_slope"), "implied_efficiency"]
    assert 0.85 < eff < 0.95                                         # bytes explain the bf16 slope
    cal = t.loc[("H100-SXM", "Llama-3.1-8B", "fp8_e4m3", "slope_ratio_to_bf16")]
    assert cal.role == "calibration" and math.isclose(cal.estimate, 2.37e-05 / 4.37e-05)   # by construction
    r = t.loc[("H100-SXM", "gpt-oss-20b", "fp8_e4m3", "slope_ratio_to_bf16")]
    assert r.role == "held out" and round(r.published, 2) == 0.80 and r.estimate_bytes_only == 0.5
    assert math.isclose(r.estimate, 2.37e-05 / 4.37e-05)             # head_dim 64: the kernel is slower still
    assert t.loc[("H100-SXM", "gpt-oss-20b", "fp8_e4m3", "slope_ratio_before_fixes"), "published"] == 0.96
    assert t.loc[("B200", "gpt-oss-20b", "bf16", "itl_intercept"), "implied_efficiency"] < 0.3


def test_kernel_factors_come_from_the_published_slopes():
    f = decode.kernel_factors()
    # H100 (FA3): fp8 bytes are half of bf16's, the slope 2.37/4.37 of it: fp8 reads reach 0.922 of bf16's rate
    assert math.isclose(f["Hopper", "fp8_e4m3"].factor, 0.5 / (2.37e-05 / 4.37e-05))
    assert math.isclose(f["Blackwell", "fp8_e4m3"].factor, 0.5 / (9.72e-06 / 1.80e-05))
    g, w = registry.load_model("Llama-3.1-8B"), weights.model_weights("Llama-3.1-8B")
    plain = decode.estimate(g, w, "fp8_e4m3", 8192, 1, 3.35)
    h100 = decode.estimate(g, w, "fp8_e4m3", 8192, 1, 3.35, card=H100)
    assert h100.kv_factor == f["Hopper", "fp8_e4m3"].factor and h100.itl_ms > plain.itl_ms
    assert math.isclose(h100.slope_ms_per_token, plain.slope_ms_per_token / h100.kv_factor)
    q4 = decode.estimate(g, w, "q4_0", 8192, 1, 3.35, card=H100)
    assert q4.kv_factor == 1.0 and "no published measurement of the q4_0 attention kernel" in q4.kv_factor_source
    moe = registry.load_model("gpt-oss-20b")
    skip = decode.estimate(moe, weights.model_weights("gpt-oss-20b"), "fp8_e4m3;skip=sliding_window", 8192, 1,
                           3.35, card=H100)
    assert 1 > skip.kv_factor > f["Hopper", "fp8_e4m3"].factor    # the bf16 sliding layers read at bf16's rate
    mla = decode.estimate(registry.load_model("DeepSeek-V3"), weights.model_weights("DeepSeek-V3"), "fp8_e4m3", 8192,
                          1, 4.8, card=gpus.gpu("H200"))                 # FA3's factor is not FlashMLA's
    assert mla.kv_factor == 1.0 and "fp8_e4m3 MLA attention kernel on Hopper: bytes only" in mla.kv_factor_source


def test_accuracy_says_what_it_rests_on():
    text, ev = evidence.accuracy_evidence("q4_0", 8192, H100, "vllm", evidence.default_accuracy_csv(),
                                       evidence.default_passkey_csv())
    assert [e["basis"] for e in ev] == ["synthetic", "real decoder"]
    assert "SmolLM2-135M-Instruct" in text and "passkey 5/20 = 25%" in text and "Llama" not in text
    fp8 = evidence.accuracy_evidence("fp8_e4m3", 8192, H100, "vllm", None, evidence.default_passkey_csv())[1]
    # FA3's FP8 attention on Hopper: the grid's emulation, and the same kernel on the MMA-Sim-exact unit
    assert [(e["variant"], e["table"]) for e in fp8] == [("store:fp8_e4m3", "passkey.csv"), ("fa3", "passkey.csv"),
                                                         ("fa3", "passkey_unit.csv")]
    # the unit's rows at the longest context measured at or below the plan's: 8,192 tokens, all 20 trials
    assert (fp8[2]["successes"], fp8[2]["trials"], fp8[2]["context"]) == (19, 20, 8192)
    short = evidence.accuracy_evidence("fp8_e4m3", 2048, H100, "vllm", None, evidence.default_passkey_csv())[1]
    assert (short[2]["successes"], short[2]["trials"], short[2]["context"]) == (20, 20, 2048)
    skip = evidence.accuracy_evidence("fp8_e4m3;skip=sliding_window", 8192, H100, "vllm", None,
                                      evidence.default_passkey_csv())[0]
    assert skip.endswith("this spec keeps sliding_window layers in bf16")
    none = evidence.accuracy_evidence("int4_g32", 8192, H100, "vllm", evidence.default_accuracy_csv(),
                                   evidence.default_passkey_csv())
    assert none == ("no evidence for int4_g32/int4_g32 (no synthetic needle, no real-decoder passkey)", ())


def test_accuracy_reads_both_real_decoders_each_named_and_each_gpus_own_kernel():
    both = evidence.default_passkey_tables()
    assert [t.model for t in both] == ["SmolLM2-135M-Instruct", "Gemma 3 270M"]
    rows = {g: evidence.accuracy_evidence("fp8_e4m3", 8192, gpus.gpu(g), "vllm", None, both)[1]
            for g in ("H100", "B200", "A100")}
    cell = {g: [(e["model"], e["variant"], e["table"], e["successes"], e["trials"], e["context"], e["reference"])
                for e in ev] for g, ev in rows.items()}
    gemma_store = ("Gemma 3 270M", "store:fp8_e4m3", "passkey.csv", 10, 20, 8192, "15/20")   # the committed 8k cell
    # Hopper: SmolLM2's store, its grid's FA3 and the unit's; Gemma's store and its FA3 (run on the unit)
    assert cell["H100"][3:] == [gemma_store, ("Gemma 3 270M", "fa3", "passkey.csv", 14, 20, 8192, "15/20")]
    assert [e[1] for e in cell["H100"][:3]] == ["store:fp8_e4m3", "fa3", "fa3"]
    # Blackwell (SM100): the kernel on Blackwell's unit, which only Gemma's grid has; no Hopper kernel
    assert cell["B200"][1:] == [gemma_store, ("Gemma 3 270M", "fa3:arch=Blackwell", "passkey.csv", 15, 20, 8192,
                                              "15/20")]
    assert [e[1] for e in cell["A100"]] == ["store:fp8_e4m3", "store:fp8_e4m3"]          # no FP8 kernel modelled
    text = evidence.accuracy_evidence("fp8_e4m3", 8192, gpus.gpu("B200"), "vllm", None, both)[0]
    assert "Gemma 3 270M (data/real_model/gemma3_270m), stored cache: passkey 10/20 = 50%" in text
    assert "Blackwell's MMA-Sim-exact tensor-core unit" in text and "Llama" not in text
    # each grid's own channel order: SmolLM2 ran NVFP4 with K's blocks in transformers' order, Gemma has one order
    nv = evidence.accuracy_evidence("nvfp4", 8192, gpus.gpu("B200"), "vllm", None, both)[1]
    assert [(e["model"], e["variant"]) for e in nv] == [("SmolLM2-135M-Instruct", "store:nvfp4@hf"),
                                                        ("Gemma 3 270M", "store:nvfp4")]


def test_the_readme_table_is_the_planners():
    spec = importlib.util.spec_from_file_location("plan_readme_table", repo_root() / "scripts" / "plan_readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (repo_root() / "README.md").read_text(encoding="utf-8")
    assert mod.render(text) == text
    assert "| Mistral-7B-v0.1 | 8,192 | 74 | 148 |" in plan_exp.readme_table(rows=[("Mistral-7B-v0.1", 8192)])


def test_cli_plans_any_model_on_any_gpu(capsys, tmp_path):
    assert cli.main(["plan", "Qwen3-32B", "--gpu", "A100-80GB", "--gpus", "2", "--tp", "2", "--context", "32k",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == "A100-80GB" and out["rows"][0]["requests"] > 0 and out["rows"][0]["itl_ms"] > 0
    assert {r["dtype"]: r["kernel"] for r in out["rows"]}["fp8_e4m3"] == "emulated"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(registry.model_record("Llama-3.1-8B")["config"]))
    assert cli.main(["plan", str(cfg), "--gpu-memory-gib", "40", "--bandwidth-tbs", "1", "--context", "8k",
                     "--engine", "vllm", "--dtypes", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_total_gib"] == 40 and out["bandwidth_tbs"] == 1 and out["weights_gib"] == 2 * 8030261248 / GIB
    assert cli.main(["gpus", "--json"]) == 0
    assert any(g["name"] == "MI355X" for g in json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("argv, flag", [
    (["--gpu", "H999", "--context", "8k"], "--gpu"),
    (["--gpu", "H100", "--context", "8k", "--bandwidth-tbs", "-1"], "--bandwidth-tbs"),
    (["--gpu", "H100", "--context", "8k", "--params", "lots"], "--params"),
    (["--gpu", "H100", "--context", "8k", "--weights-dtype", "int3"], "--weights-dtype"),
    (["--gpu", "H100", "--context", "8k", "--swa-full"], "--swa-full"),
    (["--gpu", "H100", "--context", "8k", "--reserve-gib", "-5"], "--reserve-gib"),
    (["--gpu", "H100", "--context", "8k", "--efficiency", "2"], "--efficiency"),
    (["--gpu", "H100", "--context", "8k", "--tp", "3"], "--tp"),
])
def test_bad_input_is_one_error_line_naming_the_flag(capsys, argv, flag):
    assert cli.main(["plan", "Llama-3.1-8B", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and flag in err


def test_longest_context_text_agrees_with_its_warning(capsys):
    assert cli.main(["size", "Llama-3.1-8B", "--dtype", "q8_0", "--budget-gib", "24"]) == 0
    cap = capsys.readouterr()
    line = next(x for x in cap.out.splitlines() if x.startswith("longest context in 24 GiB"))
    assert line.split(None, 5)[5] == ("131,072 tokens (the model's max_position_embeddings; memory alone: "
                                      "370,085 tokens)")
    assert "longest context reported as 131,072" in cap.err


def test_vllm_skip_layers_pages_and_padding():
    g = registry.load_model("gpt-oss-20b")
    # sliding layers kept in bf16 (32,768-byte pages), full layers fp8 (16,384): fp8 blocks hold 32 tokens
    v = vllm.plan(g, 20.0, max_model_len=32768, kv_cache_dtype="fp8", skip_layers=("sliding_window",))
    assert v.page_bytes == 16 * 8 * 64 * 2 * 2 and v.groups == ("full:fp8", "sliding:auto")
    assert v.block_sizes == (32, 16) and v.group_size == 12 and v.num_blocks == 20 * GIB // 32768 // 12
    assert v.blocks_per_request == 32768 // 32 + -(-(127 + 2048) // 16) + 1
    assert v.kv_tokens == v.num_blocks // 2 * 16
    # one attention type (Llama: all full), two dtypes: one group, a block holds every layer's page
    u = vllm.plan(registry.load_model("Llama-3.1-8B"), 20.0, max_model_len=8192, kv_cache_dtype="fp8",
                  skip_layers=("0", "1"))
    assert u.page_bytes == 2 * 65536 + 30 * 32768 and u.num_blocks == 20 * GIB // u.page_bytes
    assert u.groups == ("full",) and u.kv_tokens == u.num_blocks * 16
    # nvfp4 pages (16 x 8 x 72 bytes) do not divide bf16's: padded to the largest page, with a warning
    n = vllm.plan(g, 20.0, max_model_len=32768, kv_cache_dtype="nvfp4", skip_layers=("sliding_window",))
    assert n.block_sizes == (16, 16) and any("do not divide" in w for w in n.warnings)
    # the planner: fp8 with bf16 sliding layers holds fewer tokens than fp8 everywhere, more than bf16
    f = fleet.plan(g, g.name, "H100", 32768, dtypes=["bf16", "fp8_e4m3;skip=sliding_window", "fp8_e4m3"],
                   engine="vllm")
    bf16, skip, fp8 = (r.requests for r in f.rows)
    assert bf16 < skip < fp8 and "--kv-cache-dtype-skip-layers sliding_window" in f.rows[1].engine_note
    pair = fleet.plan(g, g.name, "H100", 32768, dtypes=["q8_0/q4_0"], engine="vllm").rows[0]
    assert pair.requests == 0 and "one --kv-cache-dtype for K and V" in pair.engine_note


def test_planner_takes_the_mla_records_and_turboquant_with_its_boundary_layers():
    ds = registry.load_model("DeepSeek-V3")
    b200 = gpus.gpu("B200")
    f = fleet.plan(ds, ds.name, "B200", 32768, n_gpus=8, tp=8, dtypes=["fp8_ds_mla", "nvfp4_ds_mla"], engine="vllm")
    fp8, nv = f.rows
    assert (fp8.kib_per_token, nv.kib_per_token) == (61 * 656 / 1024, 61 * 352 / 1024)
    assert fp8.bits_per_value == pytest.approx(656 * 8 / 576) and nv.bits_per_value == pytest.approx(352 * 8 / 576)
    assert nv.requests > fp8.requests > 0 and "--kv-cache-dtype nvfp4_ds_mla" in nv.engine_note
    assert nv.kernel == "software" and gpus.kernel_support(b200, "nvfp4_ds_mla")[0] == "software"
    # refused off SM100 (FlashMLASparseBackend.supports_combination)
    kind, why = gpus.kernel_support(gpus.gpu("H200"), "nvfp4_ds_mla")
    assert kind == "emulated" and "refuses" in why and "B200, GB200, B300" in why
    assert gpus.kernel_support(gpus.gpu("DGX-Spark"), "nvfp4_ds_mla")[0] == "emulated"
    with pytest.raises(ValueError, match=r"parameter 'dtypes': nvfp4_ds_mla .*Llama-3.1-8B has no MLA layers"):
        fleet.plan(registry.load_model("Llama-3.1-8B"), "Llama-3.1-8B", "H100", 4096, dtypes=["nvfp4_ds_mla"])
    # TurboQuant: a software layout only vLLM's TURBOQUANT backend reads; under vLLM its bytes count the
    # boundary layers (Llama-3.1-8B: 46,400 B a token), engine-independently every layer is quantized (34,304)
    kind, why = gpus.kernel_support(H100, "turboquant_4bit_nc")
    assert kind == "software" and "TURBOQUANT" in why and "FLASH_ATTN" in why
    assert gpus.BACKEND_ONLY["turboquant_k8v4"][:2] == ("vLLM", "TURBOQUANT")
    g = registry.load_model("Llama-3.1-8B")
    tqv = fleet.plan(g, g.name, "H100", 32768, dtypes=["turboquant_4bit_nc"], engine="vllm").rows[0]
    tqn = fleet.plan(g, g.name, "H100", 32768, dtypes=["turboquant_4bit_nc"]).rows[0]
    assert tqv.kib_per_token == 46400 / 1024 and tqn.kib_per_token == 34304 / 1024
    assert "boundary layers 0,1,30,31" in tqv.engine_note
    budget = H100.total_gib * 0.9 - weights.model_weights(g.name).gib - fleet.RESERVE_GIB
    assert tqv.kv_tokens == int(budget * GIB) // (16 * 46400) * 16


def test_a_plan_that_does_not_fit_at_its_tp_names_the_tp_that_would():
    g = registry.load_model("Qwen3-32B")
    f = fleet.plan(g, g.name, "A100-80GB", 32768, n_gpus=2, dtypes=["bf16", "fp8_e4m3"])
    assert f.rows[0].requests == 0 and f.rows[1].requests > 0
    assert "bf16: no request of 32,768 tokens fits at --tp 1; at --tp 2 (weights and cache split over 2 of the 2 " \
           "GPUs) bf16 holds one" in " ".join(f.warnings)
    wide = fleet.plan(g, g.name, "A100-80GB", 32768, n_gpus=2, tp=2, dtypes=["bf16"])
    assert wide.rows[0].requests > 0 and not any("no request" in w for w in wide.warnings)
    # the --tp named is the smallest at which a request fits, not the next divisor: DeepSeek-V3's 627 GiB of
    # weights fit 8 x H200 at --tp 8 only
    ds = registry.load_model("DeepSeek-V3")
    big = fleet.plan(ds, ds.name, "H200", 32768, n_gpus=8, dtypes=["fp8_e4m3"])
    [hint] = [w for w in big.warnings if "no request" in w]
    assert "at --tp 8 (weights and cache split over 8 of the 8 GPUs) fp8_e4m3 holds one" in hint
    assert fleet.plan(ds, ds.name, "H200", 32768, n_gpus=8, tp=8, dtypes=["fp8_e4m3"]).rows[0].requests > 0
    small = registry.load_model("Llama-3.1-70B")
    none = fleet.plan(small, small.name, "H100", 131072, n_gpus=2, dtypes=["bf16"])
    assert "bf16: no request of 131,072 tokens fits at any --tp up to 2" in " ".join(none.warnings)


def test_vllm_pages_a_hybrid_models_recurrent_state():
    g = registry.load_model("Jamba-v0.1")            # Mamba-1: d_inner 8192 x state 16, conv 8192 x 3, in bf16
    v = vllm.plan(g, 20.0, max_model_len=32768)
    state = (8192 * 16 + 8192 * 3) * 2
    assert state == 311_296 and v.block_sizes[0] == 16 * -(-state // (16 * 4096)) == 80     # 4,096 B a token
    assert v.page_bytes == 80 * 4096 and v.groups == ("full", *["mamba"] * 7) and v.group_size == 4
    assert v.num_blocks == 20 * GIB // (80 * 4096) // 4 and v.blocks_per_request == -(-32768 // 80) + 7
    assert v.kv_tokens == v.num_blocks // 8 * 80 and "padding the state's page by 5.26%" in " ".join(v.warnings)
    q = vllm.plan(registry.load_model("Qwen3-Next-80B-A3B"), 20.0, max_model_len=32768)
    assert q.block_sizes[0] == 544                                                    # Gated DeltaNet's state


def test_fp8_attention_evidence_names_each_kernel_of_the_gpu_and_the_published_figures(tmp_path):
    kd = evidence.default_kernel_dir()
    text, ev = evidence.accuracy_evidence("fp8_e4m3", 131072, gpus.gpu("B200"), "vllm", None, None, kd)
    kern = {e["variant"]: (e["successes"], e["trials"], e["heads"], e["context"]) for e in ev
            if e["basis"] == "emulated kernel"}
    # notebook 10's every-head grid at 131,072 tokens on Blackwell (grid_heads_128k.csv, read before the 4-head
    # grid.csv): FA4's stale running max keeps 428 of SmolLM2's 540 haystacks, its two fixes all of them
    assert kern == {"FA4 FP8, offset 8, stale max 4 (PR #2109)": (428, 540, 270, 131072),
                    "FA4 FP8, offset 4 (PR #2717)": (540, 540, 270, 131072),
                    "FA4 FP8, offset 8, max every tile (PR #2731)": (540, 540, 270, 131072)}
    assert "428/540 haystacks kept (270 heads) at 131,072 tokens by [FA4 FP8, offset 8, stale max 4 (PR #2109)]" in text
    # every kernel of Hopper from the every-head grid at 128k, and at 1M from the every-head grid at 1,048,576
    # (grid_heads_1m.csv, read before the 2-head grid_1m.csv)
    h128 = {e["variant"]: (e["successes"], e["trials"], e["heads"]) for e in evidence.accuracy_evidence(
        "fp8_e4m3", 131072, H100, "vllm", None, None, kd)[1] if e["basis"] == "emulated kernel"}
    assert h128["FA3 FP8, no fix"] == (540, 540, 270) and h128["fmha_v2 FP8, one register"] == (540, 540, 270)
    h1m = {e["variant"]: (e["successes"], e["trials"], e["heads"], e["context"]) for e in evidence.accuracy_evidence(
        "fp8_e4m3", 1048576, H100, "vllm", None, None, kd)[1] if e["basis"] == "emulated kernel"}
    assert h1m["FA3 FP8, no fix"] == (540, 540, 270, 1048576)
    assert h1m["fmha_v2 FP8, one register"] == (540, 540, 270, 1048576)
    assert [e["test"] for e in ev if e["basis"] == "published"] == ["b200_accumulation_fixed"]
    # at 4k every head of SmolLM2 (grid_heads.csv: 445 of 540 haystacks, the loss notebook 10 reports), for every
    # kernel (before the 16-head grid_4k.csv)
    at4k = {e["variant"]: (e["successes"], e["trials"], e["heads"]) for e in evidence.accuracy_evidence(
        "fp8_e4m3", 8192, gpus.gpu("B200"), "vllm", None, None, kd)[1] if e["basis"] == "emulated kernel"}
    assert at4k["FA4 FP8, offset 8, stale max 4 (PR #2109)"] == (445, 540, 270)
    h4k = {e["variant"]: (e["successes"], e["trials"], e["heads"]) for e in evidence.accuracy_evidence(
        "fp8_e4m3", 8192, H100, "vllm", None, None, kd)[1] if e["basis"] == "emulated kernel"}
    assert h4k["FA3 FP8, no fix"] == (540, 540, 270) and h4k["fmha_v2 FP8, one register"] == (540, 540, 270)
    # Hopper's dense kernels for a dense model, its MLA kernels for an MLA model; the published FA3 figures
    # only for the dense one
    dense = evidence.accuracy_evidence("fp8_e4m3", 131072, H100, "vllm", None, None, kd)[1]
    mla = evidence.accuracy_evidence("fp8_e4m3", 131072, H100, "vllm", None, None, kd, mla=True)[1]
    assert {e["variant"] for e in dense if e["basis"] == "emulated kernel"} == {
        "FA3 FP8, no fix", "FA3 FP8, PR #104 (every tile)", "FA3 FP8, PR #122 every 4 tiles",
        "FA3 FP8, PR #122 every 64 tiles", "fmha_v2 FP8, one register", "fmha_v2 FP8, two-level every 4 (PR #3234)"}
    assert {e["variant"] for e in mla if e["basis"] == "emulated kernel"} == {
        "FlashMLA dense FP8 (P in [0, 1])", "FlashInfer MLA SM90: FP8 stored, bf16 MMA"}
    pub = {e["test"]: e["value"] for e in dense if e["basis"] == "published"}
    assert pub["niah_fp8_tensor_core_accumulation"] == 0.13 and pub["niah_fp8_two_level"] == 0.89
    assert not [e for e in mla if e["basis"] == "published"]
    # NVFP4 is read only by FlashMLA's MLA kernel on Blackwell; no kernel evidence off the modelled GPUs,
    # under llama.cpp, for a software format, or without the grids
    nv = evidence.accuracy_evidence("nvfp4", 131072, gpus.gpu("B200"), "vllm", None, None, kd, mla=True)[1]
    assert [e["variant"] for e in nv if e["basis"] == "emulated kernel"] == ["FlashMLA NVFP4 stored, bf16 MMA"]
    for args in (("fp8_e4m3", gpus.gpu("RTX-5090"), "vllm", kd), ("fp8_e4m3", gpus.gpu("DGX-Spark"), "vllm", kd),
                 ("fp8_e4m3", H100, "llama.cpp", kd), ("q8_0", H100, "vllm", kd), ("fp8_e4m3", H100, "vllm", tmp_path)):
        spec, card, engine, folder = args
        assert not [e for e in evidence.accuracy_evidence(spec, 131072, card, engine, None, None, folder)[1]
                    if e["basis"] == "emulated kernel"], args
    assert evidence.grid_gpu(gpus.gpu("MI300X")) == "CDNA3" and evidence.grid_gpu(gpus.gpu("A100-80GB")) is None
