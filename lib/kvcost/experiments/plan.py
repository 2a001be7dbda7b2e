"""Notebook 09's tables: the fleet planner for several models, contexts and KV formats, and a
needle measured in each K/V storage format at each planned context."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import pandas as pd

from .. import fleet, floats, formats, ggml, realkv, vllm
from ..models import load_model
from ..units import GIB
from . import longrange

__all__ = ["dtype_choice", "needle_by_format", "plan_table", "store_as", "vllm_table"]

_FLOAT_STORES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
#: numpy / ml_dtypes types whose cast from float32 rounds once, to nearest even (the fast path of store_as)
_CASTS = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
          "fp8_e5m2": ml_dtypes.float8_e5m2}


def store_as(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` (rows along the last axis) as a cache in ``fmt`` hands it back to attention: a float
    format rounded to nearest (fp8 saturating, per-tensor scale 1), a llama.cpp block format through
    its reference quantizer; ``none`` unchanged. Float64 out."""
    if fmt == "none":
        return np.asarray(x, dtype=np.float64)
    name = formats.get(fmt).name
    if name in _FLOAT_STORES:
        a = np.asarray(x, dtype=np.float64)
        a32 = a.astype(np.float32)
        if np.array_equal(a32, a):
            # float32 values: one cast rounds to nearest even; clipping to the largest finite value first
            # saturates exactly as floats.round_to(..., saturate=True) does (tests compare the two)
            top = floats.parse_format(_FLOAT_STORES[name]).max
            return np.clip(a32, -top, top).astype(_CASTS[name]).astype(np.float64)
        return np.asarray(floats.round_to(a, _FLOAT_STORES[name], saturate=True))
    if name in formats.GGML_BLOCKS:
        return ggml.ggml_roundtrip(np.asarray(x, dtype=np.float32), name).astype(np.float64)
    raise ValueError(f"parameter 'dtypes': {fmt!r} has no storage emulation here (float formats and llama.cpp "
                     f"blocks: {sorted(_FLOAT_STORES) + sorted(formats.GGML_BLOCKS)})")


def needle_by_format(contexts: Sequence[int], dtypes: Sequence[str], trials: int = 4, needle_weight: float = 0.1,
                     seed: int = 0, head_dim: int = 64, first_trial: int = 0) -> pd.DataFrame:
    """A needle in each K/V format at each context: rows ``n_tokens, trial, storage, share, rel_l2, retrieved``.

    Notebook 06's haystack (:func:`kvcost.experiments.longrange.make_haystack`) for the median real
    head of ``data/real_kv``, kept exact; K and V stored in each format (``K`` or ``K/V`` names;
    ``none/none`` is the reference); attention in float64. Retrieved: the needle's recovered weight
    within a factor 2 of its exact weight (notebook 06's criterion). Trial ``t`` (from ``first_trial``)
    is haystack seed ``seed + t``, so any slice of trials can be recomputed on its own.
    """
    profile = longrange.pick_profiles(longrange.head_profiles(realkv.load_real_kv()), 1)[0]
    specs = ["none/none"] + [d if "/" in d else f"{d}/{d}" for d in dtypes]
    rows = []
    for n in contexts:
        for t in range(first_trial, first_trial + trials):
            h = longrange.make_haystack(profile, n, head_dim, needle_weight, seed + t, kv_format="exact")
            q = h.q.astype(np.float64)
            stored: dict[tuple[str, str], np.ndarray] = {}        # K and V in each format, once per haystack
            for spec in specs:
                kf, vf = spec.split("/")
                for key, x, f in (("k", h.k, kf), ("v", h.v, vf)):
                    if (key, f) not in stored:
                        stored[key, f] = store_as(x, f)
                k, v = stored["k", kf], stored["v", vf]
                s = k @ q / math.sqrt(head_dim)
                w = np.exp(s - s.max())
                out = (w / w.sum()) @ v
                m = longrange.metrics(h, out)
                label = "none/none" if spec == "none/none" else "/".join(formats.get(f).name for f in (kf, vf))
                rows.append({"n_tokens": n, "trial": t, "storage": label, "accumulator": "exact",
                             "share": m["share"], "rel_l2": m["rel_l2"], "retrieved": m["retrieved"]})
    return pd.DataFrame(rows)


def plan_table(models: Sequence[str], gpu: str, contexts: Sequence[int], dtypes: Sequence[str], n_gpus: int = 1,
               tp: int = 1, utilization: float = 0.9, accuracy_csv: str | Path | None = None) -> pd.DataFrame:
    """One row per model, context and K/V format: budget, tokens, requests, longest context, accuracy, warnings."""
    rows = []
    for name in models:
        g = load_model(name)
        for ctx in contexts:
            f = fleet.plan(g, g.name, gpu, ctx, n_gpus, tp, utilization, None, list(dtypes),
                           accuracy_csv=accuracy_csv)
            for r in f.rows:
                rows.append({"model": g.name, "context": ctx, "kv_format": f"{r.dtype}/{r.v_dtype}",
                             "bits_per_value": r.bits_per_value, "weights_gib": f.weights_gib,
                             "kv_budget_gib_per_gpu": f.kv_budget_gib_per_gpu, "kib_per_token": r.kib_per_token,
                             "kv_tokens": r.kv_tokens, "requests": r.requests, "longest_context": r.longest_context,
                             "fits": r.fits, "accuracy": r.accuracy,
                             "beyond_max_context": g.max_position_embeddings is not None
                             and ctx > g.max_position_embeddings,
                             "warnings": " | ".join(list(f.warnings) + list(r.warnings))})
    return pd.DataFrame(rows)


def dtype_choice(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and context: requests in each format side by side ('-' past the model's maximum context)."""
    t = table.copy()
    t["cell"] = [("-" if b else str(r)) for r, b in zip(t.requests, t.beyond_max_context)]
    wide = t.pivot_table(index=["model", "context"], columns="kv_format", values="cell", aggfunc="first", sort=False)
    return wide.reset_index()


def vllm_table(models: Sequence[str], kv_memory_gib: dict[str, float], max_model_len: int) -> pd.DataFrame:
    """What vLLM would log for each model's KV budget (bf16 and fp8 caches)."""
    rows = []
    for name in models:
        g = load_model(name)
        mml = min(max_model_len, g.max_position_embeddings or max_model_len)
        for dt in ("auto", "fp8"):
            v = vllm.plan(g, kv_memory_gib[name], max_model_len=mml, kv_cache_dtype=dt)
            rows.append({"model": g.name, "kv_cache_dtype": dt, "kv_memory_gib": v.kv_memory_gib, "max_model_len": mml,
                         "groups": "+".join(v.groups), "kv_tokens": v.kv_tokens,
                         "max_concurrency": v.max_concurrency, "budget_bytes": int(v.kv_memory_gib * GIB)})
    return pd.DataFrame(rows)
