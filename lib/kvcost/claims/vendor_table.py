"""Notebook 05's verdict: every number of the post's vendor table that arithmetic can check.

Most rows are measurements no laptop can redo; some carry numbers that arithmetic can check:
cache sizes from a model's geometry, block-format byte ratios, differences of published
percentages. :func:`errata` recomputes each of those.
"""
from __future__ import annotations

from fractions import Fraction

import pandas as pd

from kvcost.claims.report import ERRATUM, Check, Verdict, checks_frame
from kvcost.experiments.vendor_table import published
from kvcost.models import footprint
from kvcost.storage import formats
from kvcost.units import GB, GIB, MIB

__all__ = ["UNCHECKED", "checks_table", "dgx_spark_buffer_checks", "errata", "printed", "qwen3_q8_0_checks",
           "readings", "verdict", "weights_ratio_check"]

#: Said under the verdict: the rows no arithmetic can check.
UNCHECKED = ("Rows without a check (reasoning accuracy, throughput, H2O, KIVI speed-ups) are measurements that need "
             "the original hardware and models.")


def _saving_gib(model: str, context: int, base: str, quantized: str) -> float:
    g = footprint.load_model(model)
    return (footprint.cache_bytes(g, context, base) - footprint.cache_bytes(g, context, quantized)) / GIB


def _same(computed: float, key: str, fmt: str) -> tuple[str, str, bool]:
    """Computed vs published, both formatted to the digits published."""
    pub = format(published(key), fmt)
    out = format(computed, fmt)
    return pub, out, pub == out


def qwen3_q8_0_checks() -> list[Check]:
    """llama.cpp on one A100: Qwen3-8B's 32K cache, -ctk q8_0 -ctv q8_0 against f16."""
    qwen = footprint.load_model("Qwen3-8B")
    f16_32k = footprint.cache_bytes(qwen, 32768, "fp16") / GIB
    saving = _saving_gib("Qwen3-8B", 32768, "fp16", "q8_0")
    exact_pct = float(1 - formats.bytes_per_value("q8_0") / formats.bytes_per_value("fp16"))
    return [
        Check(ERRATUM, "Qwen3-8B 32K cache in f16 (the post: 144 KiB/token, so 4.500 GiB)",
              *_same(f16_32k, "qwen3_8b_f16_32k_gib", ".3f")),
        Check(ERRATUM, "q8_0 cuts Qwen3-8B's 32K cache by 2.1 GiB (A100 test)",
              *_same(saving, "qwen3_8b_q8_0_saving_gib", ".1f"),
              f"exactly {saving:.6f} GiB: q8_0 keeps 34 of every 64 f16 bytes"),
        Check(ERRATUM, "'a 47% saving on that is 2.115 GiB'", *_same(saving, "post_q8_0_saving_gib", ".3f"),
              f"q8_0's saving is exactly {exact_pct:.3%}, not 47%; 47% of 4.5 GiB is 2.115"),
    ]


def dgx_spark_buffer_checks() -> list[Check]:
    """llama.cpp community, DGX Spark: KV buffer 768 -> 408 -> 216 MiB at 128K for a 30B-A3B."""
    nano = footprint.load_model("Nemotron-3-Nano-30B-A3B")
    qwen_moe = footprint.cache_bytes(footprint.load_model("Qwen3-30B-A3B"), 131072, "fp16") / MIB
    out = []
    for fmt in ("fp16", "q8_0", "q4_0"):
        mib = footprint.cache_bytes(nano, 131072, fmt) / MIB
        how = (f"Qwen3-30B-A3B, the other 30B-A3B, would need {qwen_moe:,.0f} MiB" if fmt == "fp16" else
               f"{fmt} stores {formats.get(fmt).block_bytes} bytes per {formats.get(fmt).block} values")
        out.append(Check(ERRATUM, f"KV buffer at 128K in {fmt} (Nemotron-3-Nano-30B-A3B: "
                         f"{nano.count('full')} attention layers x {nano.kv_heads} KV heads x {nano.head_dim})",
                         *_same(mib, f"dgx_spark_kv_{'f16' if fmt == 'fp16' else fmt}_mib", "g"), how))
    return out


def weights_ratio_check(weights_gib: float | None = None) -> Check:
    """"16 GiB of KV at 128k is more than three times the 4.68 GiB Q4_K_M weight file"."""
    weights_gib = published("q4_k_m_weights_gib") if weights_gib is None else weights_gib
    kv128 = footprint.cache_bytes(footprint.load_model("Llama-3.1-8B"), 131072, "bf16") / GIB
    ratio = kv128 / weights_gib
    return Check(ERRATUM, f"16 GiB of KV at 128k is more than 3x the {weights_gib:g} GiB weight file", "> 3x",
                 f"{kv128:g} GiB / {weights_gib:g} GiB = {ratio:.2f}x", ratio > 3)


def printed() -> list[Check]:
    """None here: the vendor table's numbers are published claims, checked as errata (:func:`errata`)."""
    return []


def readings() -> list[Check]:
    """None here (notebook 01 reads three of :func:`errata`'s checks as readings of its sizing section)."""
    return []


def errata(weights_gib: float | None = None) -> list[Check]:
    """Every number of the vendor table (and the prose around it) that arithmetic can check.

    ``weights_gib`` is the Q4_K_M weight file the post compares the 128k cache with
    (default: the published 4.68 GiB).
    """
    return [*qwen3_q8_0_checks(), *dgx_spark_buffer_checks(), weights_ratio_check(weights_gib), *_other_checks()]


def verdict(weights_gib: float | None = None, tested: bool = True) -> Verdict:
    """Notebook 05's verdict: the errata at ``weights_gib``; when the run is not at the post's defaults
    (``tested`` False), the errata that do not depend on ``weights_gib``, and the one that does named as not
    tested."""
    if tested:
        return Verdict(printed=printed(), readings=readings(), errata=errata(weights_gib), extra=UNCHECKED)
    return Verdict(errata=[*qwen3_q8_0_checks(), *dgx_spark_buffer_checks(), *_other_checks()],
                   untested=[weights_ratio_check(weights_gib).claim], extra=UNCHECKED)


def _other_checks() -> list[Check]:
    out = []
    # vLLM: 91% -> 13% -> 89% on 128k NIAH; "worth 76 points of needle accuracy".
    points = published("vllm_niah_two_level_pct") - published("vllm_niah_fp8_pct")
    out.append(Check(ERRATUM, "two-level accumulation was worth 76 points (13% -> 89%)",
                     *_same(points, "post_two_level_points", "g")))
    # A100 test: decode at 64K depth falls to 55% of f16: "cost 45% of decode throughput".
    out.append(Check(ERRATUM, "q8_0 cost 45% of decode throughput at 64K (falls to 55%)",
                     *_same(100 - published("a100_q8_0_decode_64k_pct"), "post_q8_0_decode_cost_pct", "g")))
    # TurboQuant study: "FP8: 2x capacity" (per-tensor scales; per-token scales cost a little).
    cap = float(formats.bytes_per_value("bf16") / formats.bytes_per_value("fp8_e4m3"))
    cap_tok = float(formats.bytes_per_value("bf16") / formats.bytes_per_value("fp8_e4m3_token", 128))
    pub, out_cap, ok = _same(cap, "turboquant_fp8_capacity_x", "g")
    out.append(Check(ERRATUM, "FP8: 2x capacity", f"{pub}x", f"{out_cap}x", ok,
                     f"{cap_tok:.3f}x with an fp32 scale per token and head"))
    # KVQuant: "3-bit ... 1M-token LLaMA-7B on one A100-80GB" (LLaMA-7B shares Llama-2-7B's geometry).
    layers, heads, dim = footprint.naive_geometry("Llama-2-7B")
    tokens, bits, gpu = published("kvquant_tokens"), published("kvquant_bits"), published("a100_memory_gb")
    need = float(tokens * footprint.naive_bytes_per_token(layers, heads, dim, Fraction(int(bits), 8)) / GB)
    need2 = float(tokens * footprint.naive_bytes_per_token(layers, heads, dim, Fraction(2, 8)) / GB)
    weights_fp16 = published("llama_7b_params") * 2 / GB
    out.append(Check(ERRATUM, f"KVQuant at {bits:g} bits: {tokens / 1e6:g}M-token LLaMA-7B on one A100-{gpu:g}GB",
                     f"fits in {gpu:g} GB", f"{tokens / 1e6:g}M tokens of {bits:g}-bit KV alone need {need:.1f} GB",
                     need <= gpu,
                     f"at 2 bits the KV needs {need2:.1f} GB, which fits beside the {weights_fp16:.1f} GB "
                     f"of fp16 weights: a 1M-token LLaMA-7B on one A100-80GB needs fewer bits than the row's {bits:g}"))
    # vLLM skip-layers advice: gpt-oss-20b keeps 128-token sliding windows.
    oss = footprint.load_model("gpt-oss-20b")
    out.append(Check(ERRATUM, "gpt-oss-20b keeps 128-token sliding windows",
                     *_same(oss.window, "gpt_oss_20b_window", "g"),
                     f"{oss.count('sliding')} of its {oss.num_layers} layers"))
    return out


def checks_table(weights_gib: float | None = None) -> pd.DataFrame:
    """:func:`errata` as the contract's ``vendor_checks.csv`` columns: claim, published, computed, agrees."""
    return checks_frame(errata(weights_gib))[["claim", "published", "computed", "agrees"]]
