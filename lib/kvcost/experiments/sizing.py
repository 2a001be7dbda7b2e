"""Notebook 01's tables: the post's Block 1 by its own formula, and the same models sized from their configs."""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from kvcost.models.footprint import (
    cache_bytes,
    check_context,
    growth_bytes_per_token,
    naive_bytes_per_token,
    plan,
    state_bytes,
)
from kvcost.models.hfconfig import SLIDING
from kvcost.models.registry import POST_MODELS, load_model, model_record, naive_geometry
from kvcost.storage import formats
from kvcost.units import GIB, KIB, MIB

__all__ = ["SIZING_COLUMNS", "corrected_table", "curves", "post_listing", "post_table", "within_context"]

#: The columns of ``sizing.csv`` (the notebook contract).
SIZING_COLUMNS = ["model", "layers", "kv_heads", "head_dim", "kib_per_token_bf16",
                  "gib_at_context_bf16", "gib_at_context_fp8", "requests_at_budget"]


def post_table(models: Sequence[str] = POST_MODELS, context: int = 131_072, budget_gib: float = 24.0,
               request_tokens: int = 8192) -> pd.DataFrame:
    """The post's Block 1 table for ``models`` (the ``sizing.csv`` columns).

    Numbers follow the post's formula and rounding exactly: bf16 = 2 bytes, fp8 = 1 byte,
    ``requests = int(budget * 2**30 / (bytes_per_token * request_tokens))``.
    """
    check_context(context)
    rows = []
    for name in models:
        layers, kvh, hd = naive_geometry(name)
        b = naive_bytes_per_token(layers, kvh, hd)
        b8 = naive_bytes_per_token(layers, kvh, hd, 1)
        rows.append({
            "model": model_record(name)["name"], "layers": layers, "kv_heads": kvh, "head_dim": hd,
            "kib_per_token_bf16": b / KIB,
            "gib_at_context_bf16": b * context / GIB,
            "gib_at_context_fp8": b8 * context / GIB,
            "requests_at_budget": int(budget_gib * GIB / (b * request_tokens)),
        })
    return pd.DataFrame(rows, columns=SIZING_COLUMNS)


def post_listing(models: Sequence[str] = POST_MODELS) -> pd.DataFrame:
    """The post's second listing: KV heads, KiB/token and the ratio to 128 KiB/token (Llama-3.1-8B)."""
    rows = []
    for name in models:
        layers, kvh, hd = naive_geometry(name)
        bpt = naive_bytes_per_token(layers, kvh, hd)
        rows.append({"model": model_record(name)["name"], "kv_heads": kvh, "kib_per_token": bpt / KIB,
                     "ratio": bpt / 131_072})
    return pd.DataFrame(rows, columns=["model", "kv_heads", "kib_per_token", "ratio"])


def within_context(models: Sequence[str], context: int) -> tuple[list[str], list[str]]:
    """(models whose ``max_position_embeddings`` reaches ``context``, those it does not)."""
    ok, beyond = [], []
    for name in models:
        g = load_model(name)
        (beyond if g.max_position_embeddings is not None and context > g.max_position_embeddings else ok).append(g.name)
    return ok, beyond


def corrected_table(models: Sequence[str], context: int = 131_072, dtype: str = "bf16",
                    budget_gib: float = 24.0, request_tokens: int = 8192) -> pd.DataFrame:
    """Naive (the post's formula) against corrected sizing, per model, in one storage format.

    ``kib_per_token_past_windows`` is what each further token costs once the context is past
    every sliding window (hybrids: full-attention layers only). ``swa_saving_engine_dependent``
    marks models whose saving over the formula needs an engine that frees tokens outside the
    window (llama.cpp's ``--swa-full`` keeps them all). ``context_ok`` is false where the
    context exceeds ``max_position_embeddings``.
    """
    rows = []
    for name in models:
        g = load_model(name)
        p = plan(g, max(context, 1), dtype, budget_gib=budget_gib, request_tokens=request_tokens)
        layers, kvh, hd = g.naive
        naive_req = int(budget_gib * GIB // (p.naive_cache_bytes / p.context * request_tokens))
        st = p.state_bytes
        rows.append({
            "model": g.name, "architecture": g.summary(),
            "naive_kib_per_token": naive_bytes_per_token(layers, kvh, hd,
                                                         float(formats.bytes_per_value(dtype, hd))) / KIB,
            "kib_per_token": p.bytes_per_token / KIB,
            "kib_per_token_past_windows": growth_bytes_per_token(g, dtype) / KIB,
            "naive_gib_at_context": p.naive_cache_bytes / GIB,
            "gib_at_context": p.cache_bytes / GIB,
            "naive_over_true": (p.naive_cache_bytes / p.cache_bytes) if p.cache_bytes else float("inf"),
            "state_mib": (st / MIB) if st is not None else float("nan"),
            "naive_requests_at_budget": naive_req,
            "requests_at_budget": p.requests,
            "max_position_embeddings": g.max_position_embeddings,
            "context_ok": g.max_position_embeddings is None or context <= g.max_position_embeddings,
            "swa_saving_engine_dependent": bool(g.count(SLIDING)) and context > (g.window or 0),
        })
    return pd.DataFrame(rows)


def curves(models: Sequence[str], contexts: Sequence[int], dtypes: Sequence[str] = ("bf16",),
           budget_gib: float = 24.0) -> pd.DataFrame:
    """Long table for plots: model, dtype, context, cache GiB (true and naive), requests in budget.

    ``requests`` counts sequences of ``context`` tokens (each with its recurrent state) that
    fit in ``budget_gib``; ``naive_requests`` the same by the post's formula. ``within_max``
    is false past the model's ``max_position_embeddings``.
    """
    rows = []
    for name in models:
        g = load_model(name)
        layers, kvh, hd = g.naive
        for dt in dtypes:
            bpv = formats.bytes_per_value(dt, hd)
            st = state_bytes(g) or 0
            for ctx in contexts:
                c = cache_bytes(g, ctx, dt)
                naive = math.ceil(2 * layers * kvh * hd * bpv * ctx)
                rows.append({"model": g.name, "dtype": dt, "context": ctx, "gib": c / GIB,
                             "naive_gib": naive / GIB,
                             "requests": int(budget_gib * GIB // (c + st)) if c + st else None,
                             "naive_requests": int(budget_gib * GIB // naive) if naive else None,
                             "within_max": g.max_position_embeddings is None or ctx <= g.max_position_embeddings})
    return pd.DataFrame(rows)
