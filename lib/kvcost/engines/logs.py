"""Real llama.cpp and vLLM KV-cache log lines (``data/engine_logs/*.csv``) against the engine models.

Each row carries its source, the model (a ``data/models`` name, or the geometry the log states) and the
settings; :func:`check_llamacpp` / :func:`check_vllm` recompute what the engine should print and say
whether it agrees (llama.cpp: to the printed 0.01 MiB; vLLM: within the block rounding that the
budget's two printed decimals allow; a line with nothing the model can recompute does not agree). Rows
marked ``unexplained`` carry the reason in ``note``. ``provenance`` says how far the source can be
followed: ``first-hand`` (a public URL showing the line), ``second-hand`` (a cited document quoting
it), ``unlocated`` (a public file whose repository could not be identified; checked, never counted).
"""
from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvcost.engines import llamacpp, vllm
from kvcost.models.hfconfig import Geometry, from_hf_config
from kvcost.models.registry import load_model
from kvcost.paths import data_path
from kvcost.provenance import checked
from kvcost.units import GIB

__all__ = ["PROVENANCE", "check_all", "check_llamacpp", "check_vllm", "data_dir", "first_hand", "llamacpp_rows",
           "vllm_rows"]

#: How far a row's source can be followed (the ``provenance`` column).
PROVENANCE = ("first-hand", "second-hand", "unlocated")


def data_dir() -> Path:
    """``data/engine_logs`` in the package data."""
    return data_path("engine_logs")


def _rows(name: str) -> list[dict[str, str]]:
    with open(checked(data_dir() / name), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def llamacpp_rows() -> list[dict[str, str]]:
    return _rows("llamacpp_kv.csv")


def vllm_rows() -> list[dict[str, str]]:
    return _rows("vllm_kv.csv")


def first_hand(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows whose source is a public URL showing the line itself."""
    bad = sorted({r.get("provenance", "") for r in rows} - set(PROVENANCE))
    if bad:
        raise ValueError(f"column 'provenance' must be one of {PROVENANCE}, got {bad}")
    return [r for r in rows if r["provenance"] == "first-hand" and r["source"].startswith("https://")]


def _geometry(row: dict[str, str]) -> Geometry:
    if row["model"]:
        return load_model(row["model"])
    if not row.get("n_head_kv"):
        raise ValueError(f"row {row['id']!r}: no model and no geometry")
    n_layer, heads, dim = int(row["n_layer"]), int(row["n_head_kv"]), int(row["head_dim"])
    cfg: dict[str, Any] = {"num_hidden_layers": n_layer, "num_attention_heads": heads,
                           "num_key_value_heads": heads, "head_dim": dim}
    g = from_hf_config(cfg, name=row["id"])
    if row.get("head_dim_v"):
        g = replace(g, v_head_dim=int(row["head_dim_v"]))
    return g


def _swa_geometry(row: dict[str, str]) -> Geometry:
    """A stand-in with one full and one sliding layer of the row's window (cells-only rows)."""
    return from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 1, "head_dim": 32,
                           "sliding_window": int(row["n_swa"]),
                           "layer_types": ["sliding_attention", "full_attention"]}, name=row["id"])


def check_llamacpp(row: dict[str, str]) -> dict[str, Any]:
    """Recompute one llama.cpp row: predicted cells / MiB / layers and whether they match the log."""
    g = _swa_geometry(row) if row.get("n_swa") and not row["model"] else _geometry(row)
    alloc = llamacpp.allocate(
        g, int(row["n_ctx"]), row["type_k"], row["type_v"], n_seq=int(row["n_seq"]),
        kv_unified=row["kv_unified"] == "true", swa_full=row["swa_full"] == "true", n_ubatch=int(row["n_ubatch"]),
        version=row["version"], flash_attn=row["flash_attn"] == "true")
    buf = next(b for b in alloc.buffers if b.cache == row["cache"])
    checks = row["checks"].split("+")
    ok = True
    if "cells" in checks:
        ok &= buf.cells == int(row["log_cells"])
    if "mib" in checks:
        ok &= f"{buf.mib:.2f}" == f"{float(row['log_mib']):.2f}"
        if row["log_layers"]:
            ok &= buf.layers == int(row["log_layers"])
    return {"id": row["id"], "engine": "llama.cpp", "logged": row["log_line"], "predicted": buf.log_line(),
            "cells": buf.cells, "mib": buf.mib, "agrees": bool(ok), "expect": row["expect"],
            "source": row["source"], "note": row["note"]}


def check_vllm(row: dict[str, str]) -> dict[str, Any]:
    """Recompute one vLLM row: tokens (and blocks) within the budget's printed rounding, and the concurrency."""
    checks = row["checks"].split("+")
    max_len = int(row["max_model_len"]) if row["max_model_len"] else None
    blocks = int(row["log_blocks"]) if row["log_blocks"] else None
    tokens = int(row["log_tokens"]) if row["log_tokens"] else None
    out: dict[str, Any] = {"id": row["id"], "engine": "vllm", "logged": row["log_line"], "expect": row["expect"],
                           "source": row["source"], "note": row["note"]}
    ok, checked = True, False
    if row["model"] or row["n_head_kv"]:
        g = _geometry(row)
        tp, pp, bs = int(row["tp"]), int(row["pp"]), int(row["block_size"])
        if pp > 1:                                   # each stage keeps its share of the layers
            cfg = {"num_hidden_layers": math.ceil(g.num_layers / pp), "num_attention_heads": g.num_attention_heads,
                   "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim}
            g = from_hf_config(cfg, name=g.name)
        if row["kv_memory_gib"]:
            gib = float(row["kv_memory_gib"])
            lo = vllm.plan(g, gib, tp, bs, max_len, row["kv_cache_dtype"], int(row["max_num_batched_tokens"]),
                           kv_memory_bytes=math.ceil((gib - 0.005) * GIB))
            hi = vllm.plan(g, gib, tp, bs, max_len, row["kv_cache_dtype"], int(row["max_num_batched_tokens"]),
                           kv_memory_bytes=math.floor((gib + 0.005) * GIB))
            out.update(predicted=f"{lo.kv_tokens:,} to {hi.kv_tokens:,} tokens", tokens_lo=lo.kv_tokens,
                       tokens_hi=hi.kv_tokens)
            if "tokens" in checks or "blocks" in checks:
                logged = tokens if tokens is not None else blocks * bs
                ok &= lo.kv_tokens <= logged <= hi.kv_tokens
                checked = True
            if "blocks" in checks and blocks is not None:
                ok &= lo.num_blocks // len(lo.groups) <= blocks <= hi.num_blocks // len(hi.groups)
        if "concurrency" in checks and blocks is not None:
            need = math.ceil(max_len / bs)
            conc = blocks / need if row["engine"] == "v1" else blocks * bs / max_len
            out["predicted_concurrency"] = conc
            ok &= f"{conc:.2f}" == f"{float(row['log_concurrency']):.2f}"
            checked = True
        elif "concurrency" in checks and tokens is not None:
            conc = tokens / max_len
            out["predicted_concurrency"] = conc
            ok &= f"{conc:.2f}" == f"{float(row['log_concurrency']):.2f}"
            checked = True
    elif "concurrency" in checks:
        logged_tokens = tokens if tokens is not None else blocks * int(row["block_size"])
        conc = logged_tokens / max_len
        out["predicted_concurrency"] = conc
        out["predicted"] = f"{conc:.2f}x from the logged tokens (geometry unknown)"
        ok = False                                    # the model is unknown: the line is not explained
    if not checked:
        out.setdefault("predicted", "nothing to recompute: the line gives no budget the model can start from")
    out["agrees"] = bool(ok and checked)
    return out


def check_all() -> list[dict[str, Any]]:
    """Every row of both files, checked."""
    return [check_llamacpp(r) for r in llamacpp_rows()] + [check_vllm(r) for r in vllm_rows()]
