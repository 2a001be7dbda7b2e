"""Notebook 09's tables: the fleet planner for several models, contexts and KV formats."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .. import fleet, vllm
from ..models import load_model
from ..units import GIB

__all__ = ["dtype_choice", "plan_table", "vllm_table"]


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
