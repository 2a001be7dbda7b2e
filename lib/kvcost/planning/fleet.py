"""A fleet plan: which KV dtype fits how many requests of what context on given GPUs, how fast they
decode, and what the accuracy evidence for each format is — one row per KV format.

It joins the concepts that live in their own modules: the weights (:mod:`kvcost.models.weights`), the GPU
(:mod:`kvcost.planning.gpus`), capacity as an engine counts it (:mod:`kvcost.planning.capacity`), the decode estimate
(:mod:`kvcost.planning.decode`, an estimate, never a measurement) and the accuracy evidence
(:mod:`kvcost.planning.evidence`). KV budget per GPU = memory x utilization - weights / tp - a stated reserve.

Standard library only (the CLI path).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvcost.engines import llamacpp, vllm
from kvcost.models.footprint import check_context, check_layers, kv_bytes_per_token
from kvcost.models.hfconfig import MLA, SLIDING, Geometry
from kvcost.models.weights import Weights, model_weights
from kvcost.planning.capacity import ENGINES, Capacity, bytes_capacity, llamacpp_capacity, vllm_capacity, vllm_spec
from kvcost.planning.decode import DEFAULT_EFFICIENCY, estimate
from kvcost.planning.evidence import PasskeyTable, accuracy_evidence
from kvcost.planning.gpus import GPU, gpu, kernel_support
from kvcost.storage import formats
from kvcost.storage.spec import CacheSpec, parse_spec
from kvcost.units import GIB

__all__ = ["DEFAULT_DTYPES", "RESERVE_GIB", "Fleet", "FleetRow", "plan"]

#: KV formats compared by default: K and V the same, or (K, V) pairs.
DEFAULT_DTYPES = ["bf16", "fp8_e4m3", "q8_0", "q4_0"]
#: Reserve per GPU for activations, CUDA graphs and non-torch memory (GiB). vLLM logs show 1.42 GiB peak
#: activation + 0.03 GiB non-torch for a 7B model (https://github.com/vllm-project/vllm/issues/13882) and
#: ~2.1 GiB peak over weights for Llama-3.1-8B on a 24 GB GPU (https://github.com/vllm-project/vllm/issues/10517);
#: the peak grows with max_num_batched_tokens (vllm-project/vllm PR #48322). 2.0 GiB is the stated default.
RESERVE_GIB = 2.0


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
    spec: str = ""
    engine_note: str = ""
    kernel: str = "native"
    decode_batch: int | None = None
    itl_ms: float | None = None
    tokens_per_s_request: float | None = None
    tokens_per_s_gpu: float | None = None
    evidence: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    kv_read_factor: float | None = None
    kv_read_basis: str = ""


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
    engine: str = "none"
    bandwidth_tbs: float | None = None
    bandwidth_source: str = ""
    efficiency: float = DEFAULT_EFFICIENCY
    decode_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [dict(asdict(r), warnings=list(r.warnings), evidence=list(r.evidence)) for r in self.rows]
        d["warnings"] = list(self.warnings)
        return d


def _tp_ok(g: Geometry, tp: int) -> bool:
    try:
        vllm.check_tp(g, tp)
    except ValueError:
        return False
    return True


def plan(g: Geometry, model: str | None, gpu_name: str | None, context: int, n_gpus: int = 1, tp: int = 1,
         utilization: float = 0.9, concurrency: int | None = None, dtypes: list[str] | None = None,
         reserve_gib: float = RESERVE_GIB, accuracy_csv: str | Path | None = None, *, engine: str = "none",
         card: GPU | None = None, weights_: Weights | None = None, efficiency: float = DEFAULT_EFFICIENCY,
         block_size: int = 16, max_num_batched_tokens: int = 2048, swa_full: bool = False,
         passkey_csv: str | Path | Sequence[PasskeyTable] | None = None,
         kernel_dir: str | Path | None = None) -> Fleet:
    """Plan ``model`` on ``n_gpus`` x a GPU (``gpu_name`` from the catalogue, or ``card``) at ``context``
    tokens per request, per KV format: capacity as ``engine`` counts it, a decode-speed estimate and the
    accuracy evidence.

    ``tp`` GPUs form one replica (weights and KV heads split over them); ``n_gpus // tp`` replicas.
    KV budget per GPU = total x ``utilization`` - weights / tp - ``reserve_gib``. ``dtypes`` are
    storage specs (``K``, ``K/V``, ``fp8_e4m3;skip=sliding_window``; default :data:`DEFAULT_DTYPES`).
    ``weights_`` overrides the weights (:func:`kvcost.models.weights.model_weights`); the decode estimate runs at
    ``concurrency`` requests, or at as many as fit, and needs the GPU's bandwidth. The accuracy evidence reads
    ``accuracy_csv`` (a needle table), ``passkey_csv`` (the real decoders' passkey grids,
    :func:`kvcost.planning.evidence.default_passkey_tables`, or one grid's path) and ``kernel_dir`` (notebook
    10's kernel grids), each left out when None (:func:`kvcost.planning.evidence.accuracy_evidence`).
    """
    context = check_context(context, "--context", lo=1)
    for name, value in (("--gpus", n_gpus), ("--tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_gpus % tp:
        raise ValueError(f"--gpus ({n_gpus}) must be a multiple of --tp ({tp})")
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {utilization!r}")
    if (isinstance(reserve_gib, bool) or not isinstance(reserve_gib, (int, float)) or not math.isfinite(reserve_gib)
            or reserve_gib < 0):
        raise ValueError(f"--reserve-gib must be a number of GiB of 0 or more, got {reserve_gib!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ValueError(f"--concurrency must be a positive integer, got {concurrency!r}")
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    vllm.check_tp(g, tp)
    card = card if card is not None else gpu(gpu_name)  # type: ignore[arg-type]
    w = weights_ if weights_ is not None else model_weights(model)
    replicas = n_gpus // tp
    budget_gpu = card.total_gib * utilization - w.gib / tp - reserve_gib
    warnings = []
    if g.max_position_embeddings is not None and context > g.max_position_embeddings:
        warnings.append(f"--context {context:,} exceeds max_position_embeddings {g.max_position_embeddings:,} "
                        f"of {g.name}")
    if g.count(SLIDING) and engine == "none":
        warnings.append(f"{g.count(SLIDING)} of {g.num_layers} layers of {g.name} slide over {g.window} tokens: "
                        f"the engine-independent counts keep only the window; vLLM reserves window - 1 + "
                        f"max_num_batched_tokens per sliding layer and llama.cpp --swa-full keeps every token "
                        f"(--engine vllm or --engine llama.cpp for their counts)")
    if not g.count(MLA) and g.kv_heads < tp:
        warnings.append(f"{g.kv_heads} KV heads over --tp {tp}: each rank keeps a replica of one KV head, so each "
                        f"GPU holds 1/{g.kv_heads} of the cache, not 1/{tp} (weights split {tp} ways)")
    bw = card.bandwidth_tbs

    def capacity_at(sp: CacheSpec, t: int) -> Capacity | None:
        """The engine's capacity of one replica of ``t`` GPUs (None where the weights leave no KV budget)."""
        per_gpu = card.total_gib * utilization - w.gib / t - reserve_gib
        if per_gpu <= 0:
            return None
        if engine == "vllm":
            return vllm_capacity(g, sp, per_gpu, t, context, block_size, max_num_batched_tokens)
        if engine == "llama.cpp":
            return llamacpp_capacity(g, sp, int(per_gpu * t * GIB), context, swa_full)
        return bytes_capacity(g, sp, per_gpu * t, context)

    rows, parsed = [], {}
    for spec in dtypes or DEFAULT_DTYPES:
        sp = check_layers(g, parse_spec(spec, param="dtypes"), param="dtypes")   # MLA records: MLA models only
        parsed[sp.label] = sp
        kf, vf = formats.get(sp.k), formats.get(sp.v)
        row_warn: list[str] = []
        if sp.k in llamacpp.GGML_TYPES.values() and sp.v in llamacpp.GGML_TYPES.values() and engine != "vllm":
            try:
                row_warn = llamacpp.cpu_fallback_warnings(sp.k, sp.v)
            except ValueError:
                row_warn = []
        kernel, why = max((kernel_support(card, sp.k), kernel_support(card, sp.v)),
                          key=lambda kw: ("native", "software", "emulated").index(kw[0]))
        if why:
            row_warn.append(why)
        # under vLLM a turboquant_* cache keeps its boundary layers in bf16: its bytes per token (and the decode
        # estimate's KV reads) count them
        sp_bytes = vllm_spec(g, sp) if engine == "vllm" else sp
        per_token = kv_bytes_per_token(g, sp_bytes)
        cap_r = capacity_at(sp, tp)
        tokens, req = (cap_r.kv_tokens * replicas, cap_r.requests * replicas) if cap_r else (0, 0)
        mc = cap_r.longest_context if cap_r else 0
        note = cap_r.note if cap_r else ""
        fits = req > 0
        acc_text, evidence = accuracy_evidence(sp, context, card, engine, accuracy_csv, passkey_csv, kernel_dir,
                                               mla=bool(g.count(MLA)))
        label = sp.kv_label
        if concurrency is not None and req < concurrency:
            row_warn = [*row_warn, f"{label}: {req} requests of {context:,} tokens fit, {concurrency} asked"]
        batch = concurrency if concurrency is not None else (req // replicas if req else None)
        dec = estimate(g, w, sp_bytes, context, batch, bw, tp, efficiency, card) if bw and batch else None
        rows.append(FleetRow(sp.k, sp.v, float(kf.bits_per_value(g.head_dim) + vf.bits_per_value(g.head_dim)) / 2,
                             per_token / 1024, tokens, req, mc, fits, acc_text, tuple(row_warn), sp.label, note,
                             kernel, batch, dec.itl_ms if dec else None, dec.tokens_per_s_request if dec else None,
                             dec.tokens_per_s_gpu if dec else None, evidence,
                             dec.kv_factor if dec else None, dec.kv_factor_source if dec else ""))
    if budget_gpu <= 0:
        warnings.append(f"does not fit: weights ({w.gib:.1f} GiB / tp {tp}) and the {reserve_gib:g} GiB "
                        f"reserve exceed {utilization:g} x {card.total_gib:.2f} GiB per GPU")
    elif not any(r.fits for r in rows):
        warnings.append(f"does not fit: no KV format holds one request of {context:,} tokens in "
                        f"{budget_gpu * tp:.2f} GiB per replica")
    short = [r.spec for r in rows if not r.fits]
    if short and n_gpus > tp:
        # the smallest --tp over these GPUs at which one of them holds a request (weights and cache split t ways)
        specs = {r.spec: parsed[r.spec] for r in rows if not r.fits}
        for t in (t for t in range(tp + 1, n_gpus + 1) if n_gpus % t == 0 and _tp_ok(g, t)):
            held = [label for label, sp in specs.items() if (c := capacity_at(sp, t)) is not None and c.requests > 0]
            if held:
                warnings.append(f"{', '.join(short)}: no request of {context:,} tokens fits at --tp {tp}; at --tp {t} "
                                f"(weights and cache split over {t} of the {n_gpus} GPUs) {', '.join(held)} "
                                f"hold{'s' if len(held) == 1 else ''} one")
                break
        else:
            warnings.append(f"{', '.join(short)}: no request of {context:,} tokens fits at any --tp up to {n_gpus}")
    if bw:
        dnote = (f"decode speed is an estimate, not a measurement: memory traffic (weights once per step, each "
                 f"request's KV at its format's bytes) over {bw:g} TB/s x {efficiency:g}, a quantized cache's reads "
                 f"slowed by its kernel's published factor on {card.arch or card.name} where one is measured "
                 f"(kvcost.planning.decode.kernel_factors; else bytes only); kernel launches and other compute are "
                 "left out")
    else:
        dnote = f"no decode estimate: {card.name} has no catalogued memory bandwidth (give --bandwidth-tbs)"
    return Fleet(g.name, card.name, card.total_gib, card.basis, n_gpus, tp, replicas, utilization, w.gib, w.source,
                 reserve_gib, budget_gpu, context, concurrency, tuple(rows), tuple(warnings), engine, bw,
                 card.bandwidth_source, float(efficiency), dnote)
