"""The GPU catalogue (``data/gpus.csv``): memory, memory bandwidth and the KV formats each GPU computes
attention in natively, each with its source; aliases (``H100`` is the H100 SXM); :func:`custom_gpu` for a
GPU given by its numbers; :func:`kernel_support` says whether a KV format runs natively, emulated or as a
software layout on a GPU.

Standard library only (the CLI path).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from typing import Any

from kvcost.paths import data_path
from kvcost.provenance import checked
from kvcost.storage import formats
from kvcost.units import GIB

__all__ = ["GPU", "catalogue", "custom_gpu", "gpu", "kernel_support"]


@dataclass(frozen=True)
class GPU:
    """One GPU: memory (GiB as the plan uses it), bandwidth and native KV formats, with their sources."""

    name: str
    total_gib: float
    basis: str
    source: str
    aliases: tuple[str, ...] = ()
    vendor: str = ""
    arch: str = ""
    bandwidth_tbs: float | None = None
    bandwidth_source: str = ""
    kv_native: tuple[str, ...] = ()
    note: str = ""


def _split(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(";") if t.strip())


def catalogue() -> dict[str, GPU]:
    """The GPU catalogue (``data/gpus.csv``) by lower-case name: memory as the driver reports it where a
    log shows it, else the vendor's decimal GB; bandwidth in TB/s (decimal) where a source gives it."""
    out = {}
    with open(checked(data_path("gpus.csv")), newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            vendor_gib = float(r["memory"]) * 1e9 / GIB
            if r["total_gib_reported"]:
                total, basis, src = (float(r["total_gib_reported"]), f"{r['total_gib_reported']} GiB as a vLLM log "
                                     f"reports it", r["reported_source"])
            else:
                total, basis, src = (vendor_gib, f"vendor {r['memory']} {r['unit']} (decimal, {vendor_gib:.2f} GiB)",
                                     r["source"])
            out[r["name"].lower()] = GPU(r["name"], total, basis, src, _split(r["aliases"]), r["vendor"], r["arch"],
                                         float(r["bandwidth_tbs"]) if r["bandwidth_tbs"] else None,
                                         r["bandwidth_source"], _split(r["kv_native"]), r["note"])
    return out


def gpu(name: str) -> GPU:
    """One GPU by name or alias (case-insensitive; ``H100`` is the H100 SXM); ValueError naming ``--gpu``."""
    cat = catalogue()
    if isinstance(name, str):
        key = name.lower()
        if key in cat:
            return cat[key]
        for card in cat.values():
            if key in (a.lower() for a in card.aliases):
                return card
    raise ValueError(f"--gpu must be one of {', '.join(g.name for g in cat.values())} (or an alias: "
                     f"{', '.join(a for g in cat.values() for a in g.aliases)}), or give --gpu-memory-gib; "
                     f"got {name!r}")


def _number(flag: str, value: Any, hi: float) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= hi):
        raise ValueError(f"{flag} must be a number above 0 and at most {hi:g}, got {value!r}")
    return float(value)


def custom_gpu(memory_gib: float | None = None, bandwidth_tbs: float | None = None,
               base: GPU | None = None) -> GPU:
    """A GPU given by its numbers (``--gpu-memory-gib``, ``--bandwidth-tbs``), or a catalogued one with
    either number replaced. Natively computed KV formats: the base GPU's, none (bf16 only) without one."""
    if memory_gib is None and base is None:
        raise ValueError("--gpu-memory-gib is needed without --gpu (GiB of memory per GPU)")
    card = base or GPU("custom GPU", 0.0, "", "given on the command line", kv_native=())
    if memory_gib is not None:
        mem = _number("--gpu-memory-gib", memory_gib, 2.0 ** 20)
        card = replace(card, name=f"{card.name} ({mem:g} GiB)" if base else f"{mem:g} GiB GPU", total_gib=mem,
                       basis=f"{mem:g} GiB as given (--gpu-memory-gib)", source="given on the command line")
    if bandwidth_tbs is not None:
        bw = _number("--bandwidth-tbs", bandwidth_tbs, 1000.0)
        card = replace(card, bandwidth_tbs=bw, bandwidth_source="given on the command line (--bandwidth-tbs)")
    return card


def kernel_support(card: GPU, fmt: str | formats.Format) -> tuple[str, str]:
    """Whether ``card`` computes attention in ``fmt`` natively: ``("native", "")``, ``("emulated", why)``
    for a hardware format the GPU lacks (the engine stores it and upcasts in the kernel, or refuses),
    or ``("software", why)`` for a format no GPU has (llama.cpp blocks, per-token scales, KIVI)."""
    f = formats.get(fmt)
    if f.family == "float" or f.name in card.kv_native:
        return "native", ""
    if f.family in ("fp8", "nvfp4", "mx") and f.scale in ("none", "tensor", "block"):
        have = ", ".join(card.kv_native) or "none beyond bf16/fp16"
        return "emulated", (f"{f.name} on {card.name} ({card.arch or 'unknown architecture'}, native KV formats: "
                            f"{have}): no tensor-core path, so an engine stores it and upcasts in the kernel, "
                            f"or refuses it")
    return "software", (f"{f.name} is a software layout on every GPU: the attention kernel dequantizes it")
