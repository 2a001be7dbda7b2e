"""Notebook 09's tables: the fleet planner for several models, contexts and KV formats, and a
needle measured in each K/V storage format at each planned context (measured once at full scale
into ``data/plan_needle/`` by ``scripts/plan_needle.py``; the notebook reads it and recomputes a slice)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.engines import vllm
from kvcost.inputs import extracts
from kvcost.models.registry import load_model
from kvcost.paths import data_path
from kvcost.planning import decode, fleet
from kvcost.planning.gpus import gpu as catalogue_gpu
from kvcost.provenance import checked
from kvcost.retrieval import haystacks, measure
from kvcost.storage import quant
from kvcost.storage.spec import CacheSpec, parse_spec
from kvcost.units import GIB

__all__ = ["NEEDLE_DIR", "README_COLUMNS", "README_ROWS", "check_slice", "committed_format_needle", "decode_table",
           "dtype_choice", "needle_by_format", "needle_summary", "paired_worse", "plan_table", "readme_table",
           "store_as", "vllm_table"]

#: The committed full-scale needle measurement (needle.csv + provenance.json).
NEEDLE_DIR = data_path("plan_needle")

def store_as(x: np.ndarray, fmt: str | CacheSpec, role: str = "v") -> np.ndarray:
    """``x`` (rows along the last axis) as a cache in ``fmt`` hands it back to attention, through the
    one round trip :func:`kvcost.storage.quant.roundtrip` (float formats rounded to nearest and saturating,
    fp8 at per-tensor scale 1, llama.cpp blocks through their reference quantizers, MX / NVFP4 / per
    token·head as the registry says; ``none`` unchanged). KIVI stores K and V jointly with a residual
    window and has no single-tensor emulation here. Float64 out."""
    spec = parse_spec(fmt, param="dtypes")
    if "kivi" in (spec.k_format.family, spec.v_format.family):
        raise ValueError(f"parameter 'dtypes': {spec.label!r} has no storage emulation here (KIVI keeps K and V "
                         f"with a residual window; every other kvcost.storage.formats name does)")
    return np.asarray(quant.roundtrip(np.asarray(x, dtype=np.float64), spec, role=role), dtype=np.float64)


def needle_by_format(contexts: Sequence[int], dtypes: Sequence[str], trials: int = 4, needle_weight: float = 0.1,
                     seed: int = 0, head_dim: int = 64, first_trial: int = 0) -> pd.DataFrame:
    """A needle in each K/V format at each context: rows ``n_tokens, trial, storage, share, rel_l2, retrieved``.

    Notebook 06's haystack (:func:`kvcost.experiments.haystacks.make_haystack`) for the median real
    head of ``data/real_kv``, kept exact; K and V stored in each format (storage specs, ``K`` or
    ``K/V``, :mod:`kvcost.storage.spec`; ``none/none`` is the reference);
    attention in float64. Retrieved: the needle's recovered weight
    within a factor 2 of its exact weight (notebook 06's criterion). Trial ``t`` (from ``first_trial``)
    is haystack seed ``seed + t``, so any slice of trials can be recomputed on its own.
    """
    profile = haystacks.pick_profiles(haystacks.head_profiles(extracts.load_real_kv()), 1)[0]
    specs = [parse_spec("none")] + [parse_spec(d, param="dtypes") for d in dtypes]
    rows = []
    for n in contexts:
        for t in range(first_trial, first_trial + trials):
            h = haystacks.make_haystack(profile, n, head_dim, needle_weight, seed + t, kv_format="exact")
            q = h.q.astype(np.float64)
            stored: dict[tuple[str, str, str | None], np.ndarray] = {}  # K and V in each format, once per haystack
            for spec in specs:
                for key, x, f in (("k", h.k, spec.k), ("v", h.v, spec.v)):
                    if (key, f, spec.rotation) not in stored:
                        one = CacheSpec(f, f, spec.rotation)
                        stored[key, f, spec.rotation] = store_as(x, one, role=key)
                k, v = stored["k", spec.k, spec.rotation], stored["v", spec.v, spec.rotation]
                s = k @ q / math.sqrt(head_dim)
                w = np.exp(s - s.max())
                out = (w / w.sum()) @ v
                m = measure.metrics(h, out)
                label = "none/none" if spec.k == "exact" else spec.kv_label + ("+hadamard" if spec.rotation else "")
                rows.append({"n_tokens": n, "trial": t, "storage": label, "accumulator": "exact",
                             "share": m["share"], "rel_l2": m["rel_l2"], "retrieved": m["retrieved"]})
    return pd.DataFrame(rows)


def committed_format_needle(folder: str | Path | None = None, needle_weight: float | None = None,
                     seed: int | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The committed needle table and its provenance; ValueError when ``needle.csv`` no longer has the
    sha256 that ``provenance.json`` records, or when ``needle_weight`` / ``seed`` (notebook parameters)
    differ from the ones it was measured with."""
    folder = Path(folder) if folder is not None else NEEDLE_DIR
    prov = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
    path = checked(folder / "needle.csv")   # its sha256 against provenance.json's record
    used = prov["parameters"]
    for name, value in (("needle_weight", needle_weight), ("seed", seed)):
        if value is not None and value != used[name]:
            raise ValueError(f"parameter {name!r}: the committed needle was measured with {name}={used[name]!r}, "
                             f"got {value!r}; use needle_source='live' to measure with other values")
    return pd.read_csv(path), prov


def check_slice(live: pd.DataFrame, committed: pd.DataFrame) -> dict[str, Any]:
    """Compare a live recomputation with the committed rows of the same context, trial and storage."""
    keys = ["n_tokens", "trial", "storage"]
    m = live.merge(committed, on=keys, how="left", suffixes=("_live", "_committed"), validate="one_to_one")
    if m.share_committed.isna().any():
        raise ValueError(f"{int(m.share_committed.isna().sum())} live rows have no committed counterpart")
    return {"rows": len(m), "retrieved_equal": bool((m.retrieved_live == m.retrieved_committed.astype(bool)).all()),
            "max_share_diff": float((m.share_live - m.share_committed).abs().max())}


def needle_summary(needle: pd.DataFrame) -> pd.DataFrame:
    """Per context and storage: retrieved k/n with its Wilson 95% interval, and how far the recovered
    needle weight moved (|share - 1|: median and 95th percentile over the haystacks)."""
    rows = []
    for (n, storage), g in needle.groupby(["n_tokens", "storage"], sort=False):
        k, t = int(g.retrieved.astype(bool).sum()), len(g)
        lo, hi = stats.wilson(k, t)
        err = (g.share - 1).abs() if "share" in g else pd.Series([math.nan])      # a table without shares
        rows.append({"n_tokens": int(n), "storage": storage, "retrieved": k, "trials": t, "lo": lo, "hi": hi,
                     "rate": stats.rate_text(k, t), "median_share_error": float(err.median()),
                     "p95_share_error": float(err.quantile(0.95))})
    return pd.DataFrame(rows)


def paired_worse(needle: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per context, in how many haystacks storage ``a`` moved the needle's weight further than ``b``
    (|share - 1| larger on the same haystack): k, n, Wilson interval and text; a last row (``context``
    'all', ``n_tokens`` 0) pools the contexts."""
    d = needle.assign(err=(needle.share - 1).abs())
    w = d.pivot_table(index=["n_tokens", "trial"], columns="storage", values="err", aggfunc="first")
    if a not in w or b not in w:
        raise ValueError(f"parameter 'dtypes': the needle table has no {a if a not in w else b!r} rows")
    worse = (w[a] > w[b])
    rows = []
    for n, g in [*worse.groupby(level="n_tokens"), (0, worse)]:
        k, t = int(g.sum()), len(g)
        lo, hi = stats.wilson(k, t)
        rows.append({"context": f"{int(n):,}" if n else "all", "n_tokens": int(n), "a": a, "b": b, "worse": k,
                     "trials": t, "lo": lo, "hi": hi, "rate": stats.rate_text(k, t)})
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


#: The README's "Which KV dtype for which context" table: (model, context) rows, and (header, engine, spec)
#: columns — each format counted by the engine that runs it (vLLM has no llama.cpp block types).
README_ROWS = [("Llama-3.1-8B", 8192), ("Llama-3.1-8B", 32768), ("Llama-3.1-8B", 131072), ("Qwen3-8B", 8192),
               ("Qwen3-8B", 32768), ("Mistral-7B-v0.1", 8192), ("Mistral-7B-v0.1", 32768), ("gpt-oss-20b", 8192),
               ("gpt-oss-20b", 32768), ("gpt-oss-20b", 131072)]
README_COLUMNS = [("bf16 (vLLM)", "vllm", "bf16"), ("fp8 (vLLM)", "vllm", "fp8_e4m3"),
                  ("f16 (llama.cpp)", "llama.cpp", "fp16"), ("q8_0 (llama.cpp)", "llama.cpp", "q8_0"),
                  ("q4_0 (llama.cpp)", "llama.cpp", "q4_0"), ("K q8_0 / V q4_0 (llama.cpp)", "llama.cpp", "q8_0/q4_0")]


def readme_table(gpu: str = "H100", utilization: float = 0.9, rows: Sequence[tuple[str, int]] | None = None,
                 columns: Sequence[tuple[str, str, str]] | None = None) -> str:
    """The README's table, computed: requests of each context on one ``gpu`` per format, each counted by its
    engine (:func:`kvcost.planning.fleet.plan` with ``engine="vllm"`` or ``"llama.cpp"``; vLLM's defaults: block size
    16, max_num_batched_tokens 2048), weights from each record, the default reserve. Markdown."""
    rows = list(rows or README_ROWS)
    columns = list(columns or README_COLUMNS)
    card = catalogue_gpu(gpu)
    lines = ["| model | context | " + " | ".join(h for h, _, _ in columns) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in columns) + " |"]
    for name, ctx in rows:
        g = load_model(name)
        cells = []
        for _, engine, spec in columns:
            f = fleet.plan(g, g.name, None, ctx, utilization=utilization, dtypes=[spec], engine=engine, card=card)
            cells.append(f"{f.rows[0].requests:,}")
        lines.append(f"| {g.name} | {ctx:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decode_table(models: Sequence[str], gpus: Sequence[str], contexts: Sequence[int], dtypes: Sequence[str],
                 engine: str = "vllm", utilization: float = 0.9,
                 efficiency: float = decode.DEFAULT_EFFICIENCY) -> pd.DataFrame:
    """Per model, GPU, context and KV format: requests that fit (as ``engine`` counts them) and the decode
    estimate at that many requests (ITL, tokens/s per request and per GPU). An estimate, not a measurement."""
    out = []
    for name in models:
        g = load_model(name)
        for gname in gpus:
            card = catalogue_gpu(gname)
            for ctx in contexts:
                f = fleet.plan(g, g.name, None, ctx, utilization=utilization, dtypes=list(dtypes), engine=engine,
                               card=card, efficiency=efficiency)
                for r in f.rows:
                    out.append({"model": g.name, "gpu": card.name, "context": ctx, "kv_format": r.spec,
                                "engine": engine, "requests": r.requests, "kernel": r.kernel,
                                "itl_ms": r.itl_ms, "tokens_per_s_request": r.tokens_per_s_request,
                                "tokens_per_s_gpu": r.tokens_per_s_gpu,
                                "beyond_max_context": g.max_position_embeddings is not None
                                and ctx > g.max_position_embeddings})
    return pd.DataFrame(out)
