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

__all__ = ["BACKEND_ONLY", "GPU", "SM100", "catalogue", "custom_gpu", "gpu", "kernel_support"]

#: Catalogue GPUs of compute capability 10.x (SM100 family: B200 and GB200 are 10.0, B300 10.3, per NVIDIA's CUDA
#: GPU Compute Capability table), where vLLM admits ``nvfp4_ds_mla``: FlashMLASparseBackend.supports_combination
#: refuses it only for ``major != 10`` (flashmla_sparse.py at 008a0c31 and in vLLM 0.33.0), and vLLM's
#: is_device_capability_family(100) is true for any 10.x (platforms/interface.py at c7761993 and in 0.33.0);
#: data/storage_formats_2026_research.md section 5. The catalogue's "Blackwell" also holds DGX Spark (GB10, 12.1)
#: and its "RTX Blackwell" the RTX 5090 (12.0), which it refuses.
SM100 = ("B200", "GB200", "B300")

#: KV formats that one engine's attention backend reads and nothing else does (data/storage_formats.md, each
#: read first-hand in vllm-project/vllm): name -> (engine, backend, the catalogue GPUs it is admitted on, ``()``
#: for every GPU the backend runs on, what the backend does with it).
BACKEND_ONLY: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    **{n: ("vLLM", "TURBOQUANT", (),
           "its supported_kv_cache_dtypes are exactly the four turboquant_* presets and no other backend "
           "(FLASH_ATTN, FLASHINFER, TRITON_ATTN) reads a TurboQuant cache: Triton decode kernels on the packed "
           "slots, FlashAttention prefill on the chunk's uncompressed K/V (vllm/v1/attention/backends/"
           "turboquant_attn.py at commit 0135d081); no other engine has the format") for n in formats.TURBOQUANT},
    "fp8_ds_mla": ("vLLM", "FLASHMLA_SPARSE", (),
                   "DeepSeek's sparse MLA kernels read the 656-byte record (vllm/v1/attention/backends/mla/"
                   "flashmla_sparse.py at commit 008a0c31)"),
    "nvfp4_ds_mla": ("vLLM", "FLASHMLA_SPARSE", SM100,
                     "supports_combination refuses it off SM100 (flashmla_sparse.py at commit 008a0c31 and in the "
                     "vLLM 0.33.0 release, commit 4ba787ec9); on SM100 FlashMLA's sparse decode kernel reads the "
                     "352-byte records as stored (flash_mla_with_kvcache, the format told by its bytes per token) and "
                     "prefill gathers them upconverted to a bf16 workspace (cp_gather_and_upconvert_nvfp4_kv_cache); "
                     "no FlashInfer sparse MLA backend accepts it in 0.33.0 (the fp8 staging path of "
                     "nvfp4_ds_mla_fp8_gather.py at commit 6e0ea942 is not in the release)"),
}


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
    or ``("software", why)`` for a format no GPU has (llama.cpp blocks, per-token scales, KIVI). Formats that
    only one engine backend reads (:data:`BACKEND_ONLY`: TurboQuant in vLLM's TURBOQUANT backend, the DeepSeek
    MLA records in FLASHMLA_SPARSE) say so; ``nvfp4_ds_mla`` off SM100 is refused ("emulated")."""
    f = formats.get(fmt)
    if f.family == "float" or f.name in card.kv_native:
        return "native", ""
    if f.name in BACKEND_ONLY:
        engine, backend, admitted, what = BACKEND_ONLY[f.name]
        if admitted and card.name not in admitted:
            return "emulated", (f"{f.name} on {card.name} ({card.arch or 'unknown architecture'}): {engine} refuses "
                                f"it there, only {backend} on {', '.join(admitted)} reads it: {what}")
        return "software", (f"{f.name} is a software layout that only {engine}'s {backend} attention backend reads: "
                            f"{what}")
    if f.family in ("fp8", "nvfp4", "mx") and f.scale in ("none", "tensor", "block"):
        have = ", ".join(card.kv_native) or "none beyond bf16/fp16"
        return "emulated", (f"{f.name} on {card.name} ({card.arch or 'unknown architecture'}, native KV formats: "
                            f"{have}): no tensor-core path, so an engine stores it and upcasts in the kernel, "
                            f"or refuses it")
    return "software", (f"{f.name} is a software layout on every GPU: the attention kernel dequantizes it")
