"""Each notebook's parameters, declared once: names, defaults, the post's values, ranges.

A notebook's first code cell after ``parameters`` is::

    p = notebook_params.validate("03_needle_cliff", globals())

and later cells read ``p.seed``, ``p.out``, ``p.figure_dir``; no cell rebinds a parameter.
The runner (``make run``) and sweeps validate against the same schema before a run starts,
and reject parameter names the notebook does not declare. docs/notebooks.md lists them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcost import floats
from kvcost.experiments import long_range_needle, needle_cliff, real_decoder
from kvcost.experiments.which_gpu import EVERY_HEAD_KERNELS
from kvcost.models import decoders, registry
from kvcost.numerics import accum, kernels
from kvcost.params import Bool, Custom, Float, FloatList, Int, IntList, Pairs, Params, PathStr, Schema, Str, StrList
from kvcost.retrieval import haystacks
from kvcost.storage import formats

__all__ = ["SCHEMAS", "get", "validate", "stems"]


def _float_format(name: str, value: Any) -> str:
    try:
        floats.parse_format(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"parameter {name!r}: {err}") from None
    return value


def _models(min_len: int):
    return lambda name, value: registry.check_models(name, value, min_len=min_len)


def _n_range(values: dict[str, Any]) -> None:
    if values["n_max_log2"] < values["n_min_log2"]:
        raise ValueError(f"parameter 'n_max_log2' must be >= n_min_log2 ({values['n_min_log2']}), "
                         f"got {values['n_max_log2']}")


_POST_MODELS = ["Llama-3.1-8B", "Qwen3-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Llama-2-7B"]

SCHEMAS: dict[str, Schema] = {s.stem: s for s in [
    Schema("01_sizing", [
        Int("context", 131072, lo=0, post=131072, doc="tokens per sequence"),
        Float("budget_gib", 24.0, lo=0.0, lo_open=True, post=24.0, doc="KV budget per GPU, GiB"),
        Int("request_tokens", 8192, lo=1, post=8192, doc="tokens per request for the requests column"),
        Custom("models", _POST_MODELS, _models(1), post=_POST_MODELS, allowed="model names in data/models"),
        Custom("compare_models", ["Qwen3-30B-A3B", "Gemma-3-27B", "DeepSeek-V3", "Phi-3-mini-4k-instruct",
                                  "Falcon-7B", "Qwen3-Next-80B-A3B", "Nemotron-H-8B", "Nemotron-3-Nano-30B-A3B",
                                  "Jamba-v0.1"], _models(0), allowed="model names in data/models"),
        Custom("plot_models", ["Llama-3.1-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Qwen3-Next-80B-A3B"],
               _models(1), allowed="model names in data/models"),
        StrList("plot_formats", ["bf16", "fp8_e4m3", "q8_0", "q4_0", "kivi2"], choices=formats.names),
    ]),
    Schema("09_plan", [
        Custom("models", _POST_MODELS, _models(1), allowed="model names in data/models with cited parameter counts"),
        Str("gpu", "H100-80GB", doc="a GPU from data/gpus.csv"),
        Int("gpus", 1, lo=1),
        Int("tp", 1, lo=1),
        Float("gpu_memory_utilization", 0.9, lo=0.0, hi=1.0, lo_open=True),
        IntList("contexts", [8192, 32768, 131072], lo=1, hi=2**22),
        StrList("dtypes", ["bf16", "fp8_e4m3", "q8_0", "q4_0", "q8_0/q4_0"], doc="K or K/V formats"),
        Str("needle_source", "committed", choices=["committed", "live"],
            doc="accuracy column from data/plan_needle (measured once, 200 haystacks per cell) or measured live"),
        Int("needle_trials", 4, lo=1, hi=1000, doc="haystacks recomputed live per format: the check slice of the "
            "committed data (smallest context), or per context and format with needle_source='live'"),
        Float("needle_weight", 0.1, lo=0.0, hi=1.0, lo_open=True, doc="attention weight of the needle"),
        Int("seed", 0, lo=0, doc="haystack t uses seed + t"),
    ]),
    Schema("02_axis_choice", [
        Int("seed", 7, lo=0, post=7),
        Int("n_tokens", 4096, lo=2, post=4096),
        Int("head_dim", 128, lo=1, post=128),
        IntList("bits", [8, 4, 2], lo=2, hi=16, post=[8, 4, 2]),
        IntList("group_sizes", [16, 32, 128], lo=1),
        FloatList("outlier_strengths", [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0], lo=0.0, lo_open=True),
        Int("attn_trials", 20, lo=1, doc="needle trials per scheme for the attention-level error"),
        Float("margin", 0.5),
    ]),
    Schema("03_needle_cliff", [
        Int("seed", 7, lo=0, post=7),
        Int("n_tokens", 4096, lo=2, post=4096),
        Int("head_dim", 128, lo=1, post=128),
        Int("trials", 200, lo=1, post=200),
        Float("margin", 0.5, post=0.5),
        Pairs("bit_pairs", [[8, 8], [4, 4], [3, 3], [2, 2]], lo=needle_cliff.MIN_BITS, hi=needle_cliff.MAX_BITS,
              post=[[8, 8], [4, 4], [3, 3], [2, 2]]),
        FloatList("sweep_margins", [0.1, 0.25, 0.5, 1.0, 2.0, 4.0], lo=0.0),
        IntList("sweep_bits", [8, 6, 4, 3], lo=needle_cliff.MIN_BITS, hi=needle_cliff.MAX_BITS),
        Int("sweep_trials", 100, lo=1, doc="trials per margin in the margin sweep"),
    ]),
    Schema("04_accumulator_floor", [
        IntList("n_tokens", [64, 256, 1024, 4096, 16384, 65536, 131072], lo=1, hi=2**26,
                post=[64, 256, 1024, 4096, 16384, 65536, 131072]),
        IntList("compare_n", [156, 1000, 3000], lo=1, hi=2**26, min_len=0),
        Int("two_level_block", 128, lo=1),
    ]),
    Schema("04b_accumulation_beyond_flat", [
        Int("seed", 0, lo=0),
        Int("n_min_log2", 8, lo=1, hi=24),
        Int("n_max_log2", 20, lo=1, hi=24),
        StrList("formats", ["fp32", "bf16", "fp16"], item=_float_format),
        StrList("strategies", ["flat", "two_level", "pairwise", "kahan", "hopper", "hopper_promoted"],
                choices=[*accum.STRATEGIES[:4], "hopper", "hopper_promoted"]),
        Int("block", 128, lo=1),
        Int("d", 4, lo=1, hi=256),
        Float("needle_mass", 0.5, lo=0.0, hi=0.99),
        IntList("flush_intervals", [1, 4, 64, 128, 256], lo=1),
        Int("flush_n", 131072, lo=1, hi=2**24),
        Int("tokens_per_step", 96, lo=32, doc="KV block: FA3's FP8 decode tile at head_dim 128 (192/224 prefill)"),
        Int("deepseek_K", 4096, lo=32, hi=2**20),
        Int("deepseek_trials", 200, lo=1, hi=10_000),
    ], checks=[_n_range]),
    Schema("05_vendor_table", [
        Float("weights_gib", 4.68, lo=0.0, lo_open=True, post=4.68,
              doc="the Q4_K_M weight file the post compares the 128k cache with"),
    ]),
    Schema("06_long_range_needle", [
        Int("seed", 0, lo=0),
        IntList("n_tokens", [4096, 16384, 65536, 131072], lo=64, hi=2**21, doc="contexts of the main grid"),
        Int("head_dim", 128, lo=32, hi=256, doc="Llama-3.1-8B's, as in vLLM's runs"),
        Int("block_n", 96, lo=32, hi=512, doc="KV block: FA3's FP8 decode tile for head_dim 128"),
        Str("source", "smollm2", choices=list(haystacks.SOURCES),
            doc="head statistics: SmolLM2-135M's (data/real_model) or MiniLM's (data/real_kv)"),
        Int("heads", 3, lo=1, hi=72, doc="real heads at channel-mean-ratio quantiles 0.5 to 1"),
        Int("trials", 1, lo=1, hi=100, doc="haystacks per head and context"),
        Float("needle_weight", 0.05, lo=0.0, hi=0.5, lo_open=True, doc="the needle's exact attention weight"),
        Str("needle_source", "committed", choices=["committed", "live"],
            doc="retrieval rates at the longest context from data/long_range (20 haystacks per head, the "
            "run's own haystacks recomputed live as a check) or from this run's haystacks only"),
        StrList("fixes", list(long_range_needle.FIXES), choices=list(long_range_needle.FIXES)),
        Str("retrieval_source", "committed", choices=["committed", "live"],
            doc="the carried-weight retrieval run over every query head of SmolLM2's extract: from "
            "data/long_range/retrieval.csv (live_heads of its haystacks recomputed as a check) or run live"),
        Int("live_heads", 3, lo=1, hi=45, doc="query heads (spread over the extract's layers) run live"),
        Int("live_trials", 1, lo=1, hi=100, doc="haystacks per query head in a live retrieval run"),
        Int("where_n", 131072, lo=64, hi=2**21, doc="context of the where-is-the-loss and kernel-knob runs"),
        IntList("splits", [1, 2, 8], lo=1, hi=64),
        IntList("block_sizes", [96, 128, 192, 224], lo=32, hi=512),
        IntList("scaling_frac_bits", [7, 9, 11, 13], lo=3, hi=20),
        IntList("scaling_n", [2**k for k in range(10, 18)], lo=64, hi=2**21),
    ]),
    Schema("10_which_gpu", [
        Str("source", "committed", choices=["committed", "live"],
            doc="the kernel grid and the law's run from data/which_gpu (a slice recomputed live as a check) "
                "or run live"),
        StrList("kernels", list(kernels.KERNELS), choices=list(kernels.KERNELS),
                doc="kernels of kvcost.numerics.kernels.KERNELS (facts: data/attention_kernels.csv)"),
        Str("phase", "chunked prefill", choices=list(kernels.PHASES), doc="which tile each kernel runs"),
        IntList("contexts", [4096, 32768, 131072, 1048576], lo=256, hi=2**21,
                doc="contexts of the kernel grid (committed: 4k-128k for every kernel, 1M for four)"),
        Int("heads", 4, lo=2, hi=45, doc="query heads of SmolLM2's extract, spread over its layers"),
        Int("trials", 1, lo=1, hi=100, doc="haystacks per head and context"),
        Int("focus_n", 4096, lo=256, hi=2**21, doc="the context run on more haystacks (its rows replace the grid's)"),
        Int("focus_heads", 16, lo=2, hi=45, doc="query heads at focus_n"),
        Int("focus_trials", 2, lo=1, hi=100, doc="haystacks per head at focus_n"),
        StrList("every_head_kernels", list(EVERY_HEAD_KERNELS), choices=list(kernels.KERNELS),
                doc="kernels of the every-head grids: SmolLM2's 270 query heads at focus_n "
                    "(data/which_gpu/grid_heads.csv, the every-head extract; live with source 'live'), "
                    "at 32k and 128k, and Gemma 3 270M's 12 global-layer heads (committed)"),
        Int("every_head_trials", 2, lo=1, hi=100, doc="haystacks per head in the every-head run"),
        Float("needle_weight", 0.05, lo=0.0, hi=0.5, lo_open=True, doc="the needle's exact attention weight"),
        Int("seed", 0, lo=0),
        Int("live_n", 4096, lo=256, hi=2**21, doc="context of the live slice (a committed context)"),
        Int("live_heads", 2, lo=1, hi=45, doc="heads of the live slice (the grid's first)"),
        StrList("live_kernels", ["FA3 FP8, no fix", "FA4 FP8, offset 8, stale max 4 (PR #2109)"],
                choices=list(kernels.KERNELS), doc="kernels of the live slice"),
        Float("loss_ceiling", 0.95, lo=0.0, hi=1.0, lo_open=True,
              doc="a kernel loses the needle where its kept rate's 95% upper bound falls below this"),
        Int("published_n", 131072, lo=256, hi=2**21, doc="the context set beside the published 128k figures"),
        IntList("law_contexts", [4096, 32768, 131072], lo=256, hi=2**21, doc="contexts of the n·2^-F law's run"),
        Int("law_boot", 1000, lo=100, hi=100000, doc="bootstrap resamples (over heads) for the law's interval"),
    ]),
    Schema("07_real_kv", [
        IntList("bits", [8, 4, 2], lo=2, hi=16),
        Float("outlier_threshold", 3.0, lo=1.0, lo_open=True),
        Float("majority", 0.5, lo=0.0, hi=0.99),
        Bool("include_special", True),
        Int("token_group", 32, lo=1),
        Int("seed", 7, lo=0),
        Int("synthetic_tokens", 4096, lo=2),
        Int("synthetic_head_dim", 128, lo=1),
        PathStr("data_path", "", doc="'' for the committed data/real_kv file"),
    ]),
    Schema("08_real_decoder", [
        StrList("live_formats", list(real_decoder.STORE_FORMATS_NUMPY),
                choices=[f for f in decoders.BASE_FORMATS if f != "fp32"],
                doc="formats the live slice round-trips on the committed extract"),
        Bool("hadamard", True, doc="also the Hadamard-rotated twin of each live format"),
        Bool("hf_layout", True, doc="also each block format with K's blocks cut in transformers' channel order "
                                    "(@hf) instead of llama.cpp's"),
        Int("min_windows", 1, lo=1, doc="formats with fewer text windows are left out of the tables"),
        StrList("context_formats", ["fp16", "q8_0", "fp8_e4m3", "q5_1", "q5_1+hadamard", "iq4_nl", "q4_0",
                                    "q4_0+hadamard", "kivi4", "kivi2"], choices=decoders.STORAGE_FORMATS,
                doc="formats drawn in the storage-loss-against-context figure (the table has every format "
                    "run at two or more contexts)"),
    ]),
    Schema("08b_two_decoders", [
        Int("context", 2048, lo=256, doc="tokens per text window of the storage comparison (a context both "
                                         "decoders' committed windows have)"),
        Int("long_context", 8192, lo=256, doc="the longer window the storage loss at `context` is set against "
                                              "(does a stored format's KL grow with the context?)"),
        Int("longest_context", 32768, lo=256, doc="the longest window, set against `long_context` for a decoder "
                                                  "whose committed windows reach it (Gemma 3 270M: 32k; SmolLM2 "
                                                  "stops at 8k)"),
        IntList("passkey_contexts", [4096, 8192, 16384, 32768], lo=256,
                doc="prompt lengths of the passkey comparison (one family per decoder over them; a context a "
                    "decoder's grid lacks is left out for it)"),
        Int("min_trials", 20, lo=1, doc="trials a passkey cell needs, paired with exact, to enter the comparison"),
        Float("alpha", 0.05, lo=0.0, hi=0.5, lo_open=True, doc="family-wise level of the McNemar tests and of "
                                                               "the rank-agreement test"),
        Int("permutations", 20000, lo=100, doc="random orders behind the rank agreement's permutation p"),
    ]),
]}


def stems() -> list[str]:
    return sorted(SCHEMAS)


def get(stem: str) -> Schema:
    """The schema of notebook ``stem`` (e.g. ``"03_needle_cliff"``; a leading ``"03"`` works too)."""
    if stem in SCHEMAS:
        return SCHEMAS[stem]
    matches = [s for s in SCHEMAS if s.split("_", 1)[0] == stem]
    if len(matches) == 1:
        return SCHEMAS[matches[0]]
    raise ValueError(f"unknown notebook {stem!r}; notebooks: {stems()}")


def validate(stem: str, values: Mapping[str, Any]) -> Params:
    """Validate a notebook's parameters (``values`` may be its ``globals()``)."""
    return get(stem).validate(values)
