"""A fleet plan: which KV dtype fits how many requests of what context on given GPUs, and at what measured cost.

Weights come from the model record (parameter count x weight format, cited in ``data/models``);
the GPU from ``data/gpus.csv``; a stated reserve for activations and workspace is taken off;
what is left per GPU is the KV budget. Per KV format side by side: tokens (every KV layer keeping
each token, as vLLM counts its "GPU KV cache size"), requests at the context, the longest context
one request can have, and the accuracy cost measured at that context by the notebooks (retrieved
k/n with its Wilson interval; "not measured" where there is no result). Standard library only.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import formats, llamacpp, stats
from .hfconfig import SLIDING, Geometry
from .models import model_record
from .output import repo_root
from .provenance import checked
from .sizing import cache_bytes, check_context, kv_bytes_per_token, kv_formats, max_context, state_bytes
from .units import GIB

__all__ = [
    "DEFAULT_DTYPES",
    "GPU",
    "RESERVE_GIB",
    "Fleet",
    "FleetRow",
    "accuracy_lookup",
    "gpu",
    "gpus",
    "plan",
    "weights_bytes",
]

#: KV formats compared by default: K and V the same, or (K, V) pairs.
DEFAULT_DTYPES = ["bf16", "fp8_e4m3", "q8_0", "q4_0"]
#: Reserve per GPU for activations, CUDA graphs and non-torch memory (GiB). vLLM logs show 1.42 GiB peak
#: activation + 0.03 GiB non-torch for a 7B model (https://github.com/vllm-project/vllm/issues/13882) and
#: ~2.1 GiB peak over weights for Llama-3.1-8B on a 24 GB GPU (https://github.com/vllm-project/vllm/issues/10517);
#: the peak grows with max_num_batched_tokens (vllm-project/vllm PR #48322). 2.0 GiB is the stated default.
RESERVE_GIB = 2.0


@dataclass(frozen=True)
class GPU:
    name: str
    total_gib: float
    basis: str
    source: str


def _data() -> Path:
    return Path(__file__).resolve().parents[2] / "data"


def gpus() -> dict[str, GPU]:
    """The GPU catalogue (``data/gpus.csv``): memory as reported by the driver where a log shows it, else vendor GB."""
    out = {}
    with open(checked(_data() / "gpus.csv"), newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["total_gib_reported"]:
                g = GPU(r["name"], float(r["total_gib_reported"]), f"{r['total_gib_reported']} GiB as a vLLM log "
                        f"reports it", r["reported_source"])
            else:
                g = GPU(r["name"], float(r["memory"]) * 1e9 / GIB, f"vendor {r['memory']} {r['unit']} "
                        f"(decimal, {float(r['memory']) * 1e9 / GIB:.2f} GiB)", r["source"])
            out[r["name"].lower()] = g
    return out


def gpu(name: str) -> GPU:
    """One GPU by name (case-insensitive); ValueError naming ``--gpu`` and the known names."""
    cat = gpus()
    if not isinstance(name, str) or name.lower() not in cat:
        raise ValueError(f"--gpu must be one of {', '.join(g.name for g in cat.values())}, got {name!r}")
    return cat[name.lower()]


def weights_bytes(model: str) -> tuple[int, str]:
    """Bytes of the model's weights (parameter count x weight format) and where the numbers come from."""
    rec = model_record(model)
    p = rec.get("parameters")
    if not isinstance(p, dict) or not isinstance(p.get("total"), int):
        raise ValueError(f"model record {rec['name']!r} has no cited parameter count (data/models/*.json "
                         f"'parameters'); the fleet planner needs one")
    bits = float(p.get("bits_per_weight") or 8 * formats.bytes_per_value(p.get("dtype", "bf16")))
    src = f"{p['total']:,} parameters x {bits:g} bits ({p.get('dtype')}); {p['source']}"
    return math.ceil(p["total"] * bits / 8), src


def _retrieved(rows: list[dict[str, str]]) -> int:
    return sum(1 for r in rows if r["retrieved"] in ("True", "true", "1", "1.0"))


def default_accuracy_csv() -> Path:
    """The committed needle measurement (notebook 09's, ``scripts/plan_needle.py``): 200 haystacks per cell."""
    return repo_root() / "data" / "plan_needle" / "needle.csv"


def accuracy_lookup(path: str | Path | None, storage: str,
                    context: int) -> tuple[int, int, int, int, int] | None:
    """Needle results for ``storage`` ('K/V' names) at the largest measured length <= ``context``.

    Returns (retrieved, trials, n_tokens, reference retrieved, reference trials), the reference being
    the unquantized cache (``none/none``) at the same length. Reads a needle table with columns
    ``storage``, ``n_tokens``, ``retrieved`` (exact-arithmetic rows when it has ``accumulator``), as
    notebook 06 writes ``storage_formats.csv`` and notebook 09 ``needle.csv``. None when the file or
    a matching row is missing.
    """
    if path is None or not Path(path).is_file():
        return None
    with open(checked(path), newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("accumulator", "exact") == "exact"]
    mine = [r for r in rows if r.get("storage") == storage]
    lengths = sorted({int(r["n_tokens"]) for r in mine if int(r["n_tokens"]) <= context})
    if not lengths:
        return None
    at = [r for r in mine if int(r["n_tokens"]) == lengths[-1]]
    ref = [r for r in rows if r.get("storage") == "none/none" and int(r["n_tokens"]) == lengths[-1]]
    return _retrieved(at), len(at), lengths[-1], _retrieved(ref), len(ref)


@dataclass(frozen=True)
class FleetRow:
    """One KV format on the fleet."""

    dtype: str
    v_dtype: str
    bits_per_value: float
    kib_per_token: float
    kv_tokens: int
    requests: int
    longest_context: int | None
    fits: bool
    accuracy: str
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Fleet:
    model: str
    gpu: str
    gpu_total_gib: float
    gpu_basis: str
    gpus: int
    tp: int
    replicas: int
    utilization: float
    weights_gib: float
    weights_source: str
    reserve_gib: float
    kv_budget_gib_per_gpu: float
    context: int
    concurrency: int | None
    rows: tuple[FleetRow, ...]
    warnings: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        d["warnings"] = list(self.warnings)
        return d


def _pair(spec: str) -> tuple[str, str]:
    k, _, v = spec.partition("/")
    return k, v or k


def plan(g: Geometry, model: str, gpu_name: str, context: int, n_gpus: int = 1, tp: int = 1,
         utilization: float = 0.9, concurrency: int | None = None, dtypes: list[str] | None = None,
         reserve_gib: float = RESERVE_GIB, accuracy_csv: str | Path | None = None) -> Fleet:
    """Plan ``model`` on ``n_gpus`` x ``gpu_name`` at ``context`` tokens per request, per KV format.

    ``tp`` GPUs form one replica (weights and KV heads split over them); ``n_gpus // tp`` replicas.
    KV budget per GPU = total x ``utilization`` - weights / tp - ``reserve_gib``. ``dtypes`` are
    format names or ``K/V`` pairs (default :data:`DEFAULT_DTYPES`).
    """
    context = check_context(context, "--context", lo=1)
    for name, value in (("--gpus", n_gpus), ("--tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_gpus % tp:
        raise ValueError(f"--gpus ({n_gpus}) must be a multiple of --tp ({tp})")
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {utilization!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ValueError(f"--concurrency must be a positive integer, got {concurrency!r}")
    card = gpu(gpu_name)
    wbytes, wsrc = weights_bytes(model)
    replicas = n_gpus // tp
    budget_gpu = card.total_gib * utilization - wbytes / GIB / tp - reserve_gib
    warnings = []
    if g.max_position_embeddings is not None and context > g.max_position_embeddings:
        warnings.append(f"--context {context:,} exceeds max_position_embeddings {g.max_position_embeddings:,} "
                        f"of {g.name}")
    if g.count(SLIDING):
        warnings.append(f"{g.count(SLIDING)} of {g.num_layers} layers of {g.name} slide over {g.window} tokens: "
                        f"the counts assume an engine that frees tokens outside the window (vLLM, llama.cpp without "
                        f"--swa-full); llama.cpp --swa-full keeps every token and fits fewer")
    if g.kv_heads < tp and not g.count("mla"):
        warnings.append(f"{g.kv_heads} KV heads over --tp {tp}: engines replicate KV heads, so the cache "
                        f"splits less than the weights")
    rows = []
    for spec in dtypes or DEFAULT_DTYPES:
        k, v = _pair(spec)
        kf, vf = kv_formats(k, v)
        budget_replica = max(0.0, budget_gpu) * tp
        row_warn = []
        if kf.name in llamacpp.GGML_TYPES.values() or vf.name in llamacpp.GGML_TYPES.values():
            try:
                row_warn = llamacpp.cpu_fallback_warnings(kf.name, vf.name)
            except ValueError:
                row_warn = []
        per = cache_bytes(g, context, kf.name, vf.name) + (state_bytes(g) or 0)
        fits = budget_replica > 0 and per <= budget_replica * GIB
        req = int(budget_replica * GIB // per) * replicas if budget_replica > 0 else 0
        mc = max_context(g, budget_replica, kf.name, vf.name) if budget_replica > 0 else 0
        if g.max_position_embeddings is not None:
            mc = g.max_position_embeddings if mc is None else min(mc, g.max_position_embeddings)
        # every KV layer holding the token: vLLM's "GPU KV cache size" counts tokens the same way
        per_token = kv_bytes_per_token(g, kf.name, vf.name)
        tokens = int(budget_replica * GIB // per_token) * replicas if budget_replica > 0 and per_token else 0
        label = f"{kf.name}/{vf.name}"
        acc = accuracy_lookup(accuracy_csv, label, context)
        if acc is None:
            acc_text = "not measured"
        else:
            kk, nn, at, k0, n0 = acc
            ref = f"; unquantized {k0}/{n0}" if n0 else ""
            acc_text = f"needle {stats.rate_text(kk, nn)} at {at:,} tokens{ref}"
        if concurrency is not None and req < concurrency:
            row_warn = [*row_warn, f"{label}: {req} requests of {context:,} tokens fit, {concurrency} asked"]
        rows.append(FleetRow(kf.name, vf.name, float(kf.bits_per_value(g.head_dim) + vf.bits_per_value(g.head_dim)) / 2,
                             per_token / 1024, tokens, req, mc, fits, acc_text, tuple(row_warn)))
    if budget_gpu <= 0:
        warnings.append(f"does not fit: weights ({wbytes / GIB:.1f} GiB / tp {tp}) and the {reserve_gib:g} GiB "
                        f"reserve exceed {utilization:g} x {card.total_gib:.2f} GiB per GPU")
    elif not any(r.fits for r in rows):
        warnings.append(f"does not fit: no KV format holds one request of {context:,} tokens in "
                        f"{budget_gpu * tp:.2f} GiB per replica")
    return Fleet(g.name, card.name, card.total_gib, card.basis, n_gpus, tp, replicas, utilization, wbytes / GIB, wsrc,
                 reserve_gib, budget_gpu, context, concurrency, tuple(rows), tuple(warnings))
