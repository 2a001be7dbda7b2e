"""A decode-speed estimate from memory traffic — an estimate, never a measurement.

Per step one replica reads its weights once (MoE: the non-expert weights and the experts the batch's
tokens reach) and every request's KV cache at its format's true bytes (sliding layers capped at their
window, :func:`kvcost.models.footprint.cache_bytes`), over the GPU's bandwidth x a stated ``efficiency``.

Reading a quantized cache is not free: the attention kernel converts what it reads. That cost is a
per-kernel factor taken from published measurements, not a guess (:func:`kernel_factors`): the share of
bf16's bandwidth a format's KV reads reach in the kernel an engine uses on that GPU architecture, from
the ITL slopes of ``data/decode_published.csv`` on :data:`CALIBRATION_MODEL` (slope ratio over byte
ratio). A format and architecture with no measurement keep factor 1 (bytes only) and say so.
``kvcost.claims.plan.decode_checks`` holds the estimate against every published row, the calibration
rows and the held-out ones apart, and shows where bytes and one factor per kernel are too simple.

Standard library only (the CLI path).
"""
from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from typing import Any

from kvcost.models.footprint import cache_bytes, check_context, growth_bytes_per_token, layer_breakdown, state_bytes
from kvcost.models.hfconfig import FULL, MLA, Geometry
from kvcost.models.registry import load_model
from kvcost.models.weights import Weights
from kvcost.paths import data_path
from kvcost.planning.gpus import GPU, gpu
from kvcost.provenance import checked
from kvcost.storage import formats
from kvcost.storage.spec import CacheSpec, parse_spec

__all__ = ["CALIBRATION_MODEL", "DEFAULT_EFFICIENCY", "Decode", "KernelFactor", "estimate", "kernel_factor",
           "kernel_factors", "published", "rank_share"]

#: The share of a GPU's memory bandwidth the estimate assumes is reached: a stated modelling choice, not a
#: fit. claims.plan.decode_checks shows the shares the published ITL fits imply.
DEFAULT_EFFICIENCY = 0.8
#: The model whose published ITL slopes calibrate each kernel's factor (head_dim 128, the common case);
#: the other models' rows are held out to test it.
CALIBRATION_MODEL = "Llama-3.1-8B"


def published() -> list[dict[str, str]]:
    """The rows of ``data/decode_published.csv`` (sha256-checked): published decode measurements, each cited."""
    with open(checked(data_path("decode_published.csv")), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class KernelFactor:
    """The share of bf16's KV-read bandwidth a format's attention kernel reaches on one GPU architecture."""

    arch: str
    kv: str
    factor: float
    source: str


@functools.lru_cache(maxsize=1)
def kernel_factors() -> dict[tuple[str, str], KernelFactor]:
    """Per (GPU architecture, KV format): (bf16 slope / format slope) / (bf16 bytes / format bytes) from the
    published ITL slopes of :data:`CALIBRATION_MODEL` on a GPU of that architecture (1.0: the format's
    bytes are read as fast as bf16's; below 1: the kernel spends time converting them)."""
    rows = [r for r in published() if r["quantity"] == "itl_slope" and r["model"] == CALIBRATION_MODEL]
    g = load_model(CALIBRATION_MODEL)
    slope = {(r["gpu"], r["kv"]): float(r["value"]) for r in rows}
    out = {}
    for (gname, kv), value in slope.items():
        base = slope.get((gname, "bf16"))
        if kv == "bf16" or base is None:
            continue
        sp = parse_spec(kv, param="kv")
        if sp.k != sp.v or sp.skip_layers or sp.rotation:
            continue                            # one format per kernel: K = V, every layer
        byte_ratio = growth_bytes_per_token(g, sp) / growth_bytes_per_token(g, "bf16")
        arch = gpu(gname).arch
        f = byte_ratio / (value / base)
        out[arch, sp.k] = KernelFactor(arch, sp.k, f, (
            f"{CALIBRATION_MODEL} on {gname}: ITL slope {value:g} ms/token ({kv}) against {base:g} (bf16), bytes "
            f"x {byte_ratio:g}, so {kv} reads reach {f:.3f} of bf16's bandwidth"))
    return out


def _is_float(name: str) -> bool:
    try:
        return formats.get(name).family == "float"
    except ValueError:                          # an engine layout name (fp8_ds_mla), not a format
        return False


def kernel_factor(card: GPU, fmt: str) -> KernelFactor | None:
    """The published factor for ``fmt``'s attention kernel on ``card``'s architecture, or None."""
    if _is_float(fmt):
        return KernelFactor(card.arch, fmt, 1.0, "bf16/fp16: the reference")
    return kernel_factors().get((card.arch, fmt))


@dataclass(frozen=True)
class Decode:
    """A decode-speed estimate for one KV format at one context and batch (see :func:`estimate`)."""

    batch: int
    context: int
    weights_read_bytes: float
    kv_read_bytes: float
    bytes_per_gpu: float
    bandwidth_tbs: float
    efficiency: float
    kv_factor: float
    itl_ms: float
    tokens_per_s_request: float
    tokens_per_s_gpu: float
    slope_ms_per_token: float
    kv_factor_source: str = ""


def rank_share(g: Geometry, tp: int) -> float:
    """The share of a request's KV bytes one tensor-parallel rank reads (KV heads split, or replicated)."""
    if g.count(MLA):
        return 1.0                              # one latent per token, kept whole on every rank
    return max(1, g.kv_heads // tp) / g.kv_heads


def _positive(flag: str, value: Any, hi: float) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= hi):
        raise ValueError(f"{flag} must be a number above 0 and at most {hi:g}, got {value!r}")
    return float(value)


def estimate(g: Geometry, w: Weights, spec: str | CacheSpec, context: int, batch: int, bandwidth_tbs: float,
             tp: int = 1, efficiency: float = DEFAULT_EFFICIENCY, card: GPU | None = None) -> Decode:
    """Estimated decode speed of ``batch`` requests at ``context`` tokens each on one replica of ``tp`` GPUs.

    Memory traffic per step, per GPU: the weights / tp (MoE: the non-expert weights, and the experts that
    ``batch`` tokens of ``experts_per_token`` reach out of ``num_experts``, 1 - (1 - k/E)^batch of them),
    plus every request's KV cache (the format's true bytes, sliding layers at their window) and recurrent
    state, split over ranks as the heads are. Time = weights / (bandwidth x ``efficiency``) + KV /
    (bandwidth x ``efficiency`` x the kernel's factor on ``card``'s architecture, :func:`kernel_factor`;
    1 without a ``card`` or a published measurement). It leaves out kernel launches and the rest of compute.
    """
    check_context(context, "--context", lo=1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"--concurrency must be a positive integer, got {batch!r}")
    bw = _positive("--bandwidth-tbs", bandwidth_tbs, 1000.0)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ValueError(f"--efficiency must be in (0, 1], got {efficiency!r}")
    sp = parse_spec(spec, param="dtypes")
    rows = layer_breakdown(g, context, sp)
    # the factors were measured on GQA attention (FlashAttention-3 / FlashInfer): MLA latents read through
    # another kernel (FlashMLA and the like), for which nothing is published here
    factors: dict[tuple[str, str], KernelFactor | None] = {}
    for r in rows:
        attn = "mla" if r["kind"] == MLA else "gqa"
        for name in (r["k_format"], r["v_format"]):
            if (attn, name) not in factors:
                factors[attn, name] = (kernel_factor(card, name) if card is not None and (attn == "gqa"
                                       or _is_float(name)) else None)
    missing = list(dict.fromkeys(f"{n}{' MLA' if a == 'mla' else ''}" for (a, n), kf in factors.items()
                                 if kf is None and not _is_float(n)))
    quantized = list(dict.fromkeys(kf for (_, n), kf in factors.items() if kf is not None and not _is_float(n)))
    if card is None:
        fsrc = "no GPU named: bytes only"
    elif missing:
        fsrc = (f"no published measurement of the {', '.join(missing)} attention kernel on "
                f"{card.arch or card.name}: bytes only (its conversion cost is not in the estimate)")
    else:
        fsrc = "; ".join(kf.source for kf in quantized) or "bf16/fp16: the reference"

    def f_of(r: dict[str, Any], name: str) -> float:
        kf = factors.get(("mla" if r["kind"] == MLA else "gqa", name))
        return kf.factor if kf is not None else 1.0

    def eff_bytes(r: dict[str, Any]) -> float:
        """A layer group's K and V (or MLA latent) bytes at bf16's read rate."""
        return float(r["k_bytes"] / f_of(r, r["k_format"]) + r["v_bytes"] / f_of(r, r["v_format"])
                     + r["latent_bytes"] / f_of(r, r["k_format"]))

    kv_eff = sum(eff_bytes(r) for r in rows)
    growth = sum(eff_bytes(r) / r["tokens"] for r in layer_breakdown(g, 1, sp) if r["kind"] in (FULL, MLA))
    kv_raw = float(sum(r["k_bytes"] + r["v_bytes"] + r["latent_bytes"] for r in rows))
    factor = kv_raw / kv_eff if kv_eff else 1.0
    touched = 1.0
    if w.num_experts and w.experts_per_token and w.expert_bytes:
        touched = 1 - (1 - w.experts_per_token / w.num_experts) ** batch
    w_read = (w.bytes - w.expert_bytes) + w.expert_bytes * touched
    state = state_bytes(g) or 0
    kv_read = batch * (cache_bytes(g, context, sp) + state)
    share = rank_share(g, tp)
    rate = bw * 1e12 * efficiency
    t = w_read / tp / rate + batch * (kv_eff + state) * share / rate
    slope = growth * share / rate * 1e3
    return Decode(batch, context, w_read, kv_read, w_read / tp + kv_read * share, bw, float(efficiency), factor,
                  t * 1e3, 1 / t, batch / t / tp, slope, fsrc)
