"""The command line: table, JSON, errors, and speed (stdlib-only imports)."""
import json
import resource
import subprocess
import sys

from kvcost import cli
from kvcost.models import registry


def test_json_plan_llama_q8_0(capsys) -> None:
    assert cli.main(["size", "Llama-3.1-8B", "--context", "131072", "--dtype", "q8_0",
                     "--budget-gib", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 32 layers x (K + V) x 32 blocks x 34 bytes per token = 69632 bytes/token
    assert out["bytes_per_token"] == 69632
    assert out["cache_bytes"] == 69632 * 131072
    assert out["requests"] == 24 * 2**30 // (69632 * 131072)          # 2
    assert out["max_context_memory"] == 24 * 2**30 // 69632            # 370085 by memory alone
    assert out["max_context"] == 131072                                # capped at max_position_embeddings
    assert len(out["warnings"]) == 1 and "max_position_embeddings 131,072" in out["warnings"][0]


def test_split_k_v_formats(capsys) -> None:
    assert cli.main(["size", "Nemotron-3-Nano-30B-A3B", "--context", "131072", "--dtype", "q8_0",
                     "--v-dtype", "q4_0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 6 layers x 128K x (8 blocks x 34 + 8 blocks x 18) = 312 MiB
    assert out["cache_bytes"] == 6 * 131072 * (8 * 34 + 8 * 18) == 312 * 2**20
    assert out["state_dtype"] == "fp32"
    assert out["state_bytes"] == 23 * (64 * 64 * 128 + (64 * 64 + 2 * 8 * 128) * 3) * 4


def test_table_output_and_context_warning(capsys) -> None:
    assert cli.main(["size", "Qwen3-8B", "--context", "131072", "--budget-gib", "24"]) == 0
    cap = capsys.readouterr()
    assert "cache at 131,072 tokens" in cap.out and "18.000 GiB" in cap.out
    assert "max_position_embeddings 40960" in cap.err


def test_config_path(tmp_path, capsys) -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert cli.main(["size", str(tmp_path / "config.json"), "--context", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache_bytes"] == 2 * 2 * 4 * 64 * 2 * 10


def test_a_config_path_is_named_by_the_config_or_the_cache_never_by_a_hash_folder(tmp_path) -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}
    snap = tmp_path / "models--acme--Tiny-2B" / "snapshots" / "0f3c9a1e"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    assert registry.config_name(snap / "config.json") == "acme/Tiny-2B"          # not "0f3c9a1e"
    assert registry.config_name(snap) == "acme/Tiny-2B"
    (snap / "config.json").write_text(json.dumps({**cfg, "_name_or_path": "acme/Tiny-2B-Instruct"}))
    assert registry.config_name(snap / "config.json") == "acme/Tiny-2B-Instruct"  # the config's own name first
    plain = tmp_path / "downloads"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(cfg))
    assert registry.config_name(plain / "config.json") == str(plain / "config.json")
    assert registry.resolve(str(plain / "config.json")).name == str(plain / "config.json")


def test_errors_exit_2_with_one_line_naming_the_flag(capsys, tmp_path) -> None:
    assert cli.main(["size", "No-Such-Model"]) == 2
    assert "known models" in capsys.readouterr().err
    assert cli.main(["size", "Qwen3-8B", "--dtype", "q9"]) == 2
    assert "--dtype" in capsys.readouterr().err
    for bad in (["--context", "-5"], ["--context", "0"], ["--request-tokens", "0", "--budget-gib", "1"]):
        assert cli.main(["size", "Qwen3-8B", *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error:") and bad[0] in err
    assert cli.main(["size", "Qwen3-8B", "--request-tokens", "8192"]) == 2
    err = capsys.readouterr().err
    assert "--request-tokens needs --budget-gib" in err and "'" + "budget_gib'" not in err
    assert cli.main(["size", "nope/config.json"]) == 2
    assert "file not found" in capsys.readouterr().err
    assert cli.main(["size", "someorg/Some-Model-7B"]) == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "config.json" in err
    bad = tmp_path / "config.json"
    bad.write_bytes(b"\xff\xfe{not utf-8")
    assert cli.main(["size", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "UTF-8" in err


def test_plan_refuses_vllms_unmodelled_cache_dtypes_saying_why(capsys) -> None:
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--kv-cache-dtype", "octave_k3v4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-cache-dtype" in err and "does not model" in err
    assert "ROCM_OCTAVE" in err and "modelled: auto, bfloat16" in err
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--kv-cache-dtype", "fp9"]) == 2
    err = capsys.readouterr().err
    assert "must be one of auto" in err and "'fp9'" in err and "does not model" not in err


def test_contexts_with_suffixes() -> None:
    assert cli.parse_tokens("128k") == 131072 and cli.parse_tokens("1M") == 1048576 and cli.parse_tokens("4096") == 4096


def test_warnings_beyond_max_context_and_does_not_fit(capsys) -> None:
    assert cli.main(["size", "gpt-oss-20b", "--budget-gib", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_context"] == 131072 and out["max_context_memory"] > 131072 and out["warnings"]
    assert cli.main(["size", "Llama-3.1-8B", "--context", "128k", "--budget-gib", "10"]) == 0
    cap = capsys.readouterr()
    assert "does not fit" in cap.err and "(does not fit)" in cap.out


def test_hybrid_growth_mla_latent_and_fp8_ds_mla(capsys) -> None:
    assert cli.main(["size", "gpt-oss-20b", "--context", "128k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_per_token"] == 24 * 2048 and out["bytes_per_token_past_windows"] == 12 * 2048
    assert cli.main(["size", "DeepSeek-V3", "--context", "1k", "--dtype", "fp8_ds_mla", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cache_bytes"] == 61 * 1024 * 656 and out["breakdown"][0]["latent_bytes"] == 61 * 1024 * 656
    assert cli.main(["size", "DeepSeek-V3", "--context", "1k", "--dtype", "nvfp4_ds_mla", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache_bytes"] == 61 * 1024 * 352
    assert cli.main(["size", "DeepSeek-V3", "--context", "1k"]) == 0
    assert "latent bytes" in capsys.readouterr().out
    # the planner's --dtypes takes the records for MLA models, refuses them for others naming the flag
    assert cli.main(["plan", "DeepSeek-V3", "--gpu", "B200", "--gpus", "8", "--tp", "8", "--context", "32k",
                     "--dtypes", "fp8_ds_mla,nvfp4_ds_mla", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["kib_per_token"] for r in rows] == [61 * 656 / 1024, 61 * 352 / 1024]
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100", "--context", "4k", "--dtypes", "bf16,nvfp4_ds_mla"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dtypes: nvfp4_ds_mla is vLLM's per-token record") and "no MLA layers" in err


def test_cpu_fallback_warning_for_mixed_kv(capsys) -> None:
    assert cli.main(["size", "Qwen3-8B", "--context", "32k", "--dtype", "q8_0", "--v-dtype", "q4_0"]) == 0
    assert "CPU" in capsys.readouterr().err


def test_engine_llamacpp_and_vllm_json(capsys) -> None:
    assert cli.main(["size", "gpt-oss-20b", "--context", "4096", "--dtype", "f16", "--engine", "llama.cpp",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cells"] == 4096 and out["kv_mib"] == 96 + 18
    assert cli.main(["size", "Llama-3.1-8B", "--context", "35000", "--engine", "llama.cpp", "--n-seq", "1",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"] == 35072
    assert cli.main(["size", "gpt-oss-20b", "--context", "4096", "--dtype", "q8_0", "--engine", "llama.cpp",
                     "--swa-f16", "--json"]) == 0
    bufs = json.loads(capsys.readouterr().out)["buffers"]
    assert [b["type_k"] for b in bufs] == ["q8_0", "f16"]
    assert cli.main(["size", "Llama-3.1-8B", "--context", "1000", "--engine", "llama.cpp", "--llama-version",
                     "early", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"] == 1000
    assert cli.main(["plan", "Qwen3-32B", "--engine", "vllm", "--kv-memory-gib", "8.22", "--tp", "2",
                     "--max-model-len", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_tokens"] == 8.22 * 2**30 // (16 * 4 * 256 * 2 * 64) * 16 and out["max_concurrency"] > 2


def test_fleet_plan(capsys) -> None:
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "128k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["dtype"]: r for r in out["rows"]}
    assert rows["bf16"]["requests"] == 3 and rows["q4_0"]["requests"] == 12
    # every accuracy says what it rests on: the synthetic head, never the planned model
    assert all(r["accuracy"].startswith("synthetic head with MiniLM statistics (data/plan_needle), not a decoder: "
                                        "needle ") for r in out["rows"])
    # the planned model is named only where a published figure's source names it (PR #122 ran
    # Llama-3.1-8B-Instruct); every measurement kvcost made names what it ran on
    measured = {d: [p for p in r["accuracy"].split(" | ") if not p.startswith("published: ")] for d, r in rows.items()}
    assert all("Llama" not in p for parts in measured.values() for p in parts)
    published = [p for p in rows["fp8_e4m3"]["accuracy"].split(" | ") if p.startswith("published: ")]
    assert len(published) == 1 and "PR #122 (FP8 KV cache, FA3 Hopper, Llama-3.1-8B-Instruct" in published[0]
    assert "FP8, no fix 13%" in published[0] and "model not named" in published[0]
    assert all(e["basis"] != "published" for d in ("bf16", "q8_0", "q4_0") for e in rows[d]["evidence"])
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H999"]) == 2
    assert "--gpu" in capsys.readouterr().err


def test_models_and_formats_lists(capsys) -> None:
    assert cli.main(["models"]) == 0
    assert "gpt-oss-20b" in capsys.readouterr().out
    assert cli.main(["formats", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"format": "q4_0", "bits_per_value": 4.5}.items() <= next(r for r in rows if r["format"] == "q4_0").items()


def test_module_entry_point_is_fast_and_light() -> None:
    code = ("import sys, runpy; sys.argv = ['kvcost', 'size', 'gpt-oss-20b', '--json'];\n"
            "try:\n    runpy.run_module('kvcost', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert res.stdout.strip().endswith("[]")            # no heavy imports on the CLI path
    assert cpu < 1.5            # ~0.2 s in practice; CPU time: a loaded machine stretches wall time, not this
    full = subprocess.run([sys.executable, "-m", "kvcost", "size", "gpt-oss-20b", "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(full.stdout)["cache_bytes"] == 3224371200


def test_fleet_plan_reads_the_committed_needle_measurement(capsys) -> None:
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "128k", "--json"]) == 0
    rows = {r["dtype"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    synthetic, smollm2, gemma = rows["q8_0"]["accuracy"].split(" | ")
    assert synthetic == ("synthetic head with MiniLM statistics (data/plan_needle), not a decoder: needle 200/200 = "
                         "100% [98%, 100%] at 131,072 tokens; unquantized 200/200")
    assert smollm2 == ("SmolLM2-135M-Instruct (data/real_model), stored cache: passkey 18/20 = 90% [70%, 97%] at "
                       "8,192 tokens (shorter than the planned 131,072); unquantized 18/20")
    # the second decoder's own grid, at the longest context it has for q8_0 (which grows as its grid does)
    assert gemma.startswith("Gemma 3 270M (data/real_model/gemma3_270m), stored cache: passkey ")
    assert "(shorter than the planned 131,072)" in gemma
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "128k", "--accuracy-csv", "none",
                     "--json"]) == 0
    assert [r["accuracy"] for r in json.loads(capsys.readouterr().out)["rows"]] == [
        f"no evidence for {f} (no synthetic needle, no real-decoder passkey)"
        for f in ("bf16/bf16", "fp8_e4m3/fp8_e4m3", "q8_0/q8_0", "q4_0/q4_0")]
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k",
                     "--accuracy-csv", "missing.csv"]) == 2
    assert capsys.readouterr().err.strip() == "error: --accuracy-csv: file not found: missing.csv"


def test_a_plan_whose_weights_do_not_fit_says_there_is_no_kv_budget(capsys) -> None:
    assert cli.main(["plan", "Llama-3.1-70B", "--gpu", "H100", "--context", "32k"]) == 0
    out = capsys.readouterr().out
    assert "KV budget none (weights and reserve exceed 0.9 x the GPU's memory by 62.09 GiB)" in out
    assert "-62.09" not in out
