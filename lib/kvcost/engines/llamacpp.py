"""The KV buffers llama.cpp allocates, cell for cell, as its ``llama_kv_cache`` log lines report them.

Rules (llama.cpp ``src/llama-context.cpp``, ``src/llama-kv-cache.cpp``, ``src/llama-kv-cache-iswa.cpp``,
``src/llama-memory-recurrent.cpp``; sources in ``data/engine_logs/README.md``):

- ``n_ctx`` is padded to a multiple of 256 (``GGML_PAD(n_ctx, 256)``, since PR #17046; before it the
  padding was 256 with flash attention and 32 without — ``version="legacy"``).
- Non-unified cache (the library default): ``n_seq`` streams of ``GGML_PAD(n_ctx / n_seq, 256)``
  cells each; ``kv_unified``: one stream of ``n_ctx`` cells shared by all sequences.
- Interleaved sliding-window models keep two caches: the full layers at ``n_ctx`` cells, the SWA
  layers at ``GGML_PAD(min(n_ctx, n_swa * (n_seq if unified else 1) + n_ubatch), 256)`` cells —
  or ``n_ctx`` cells with ``--swa-full``. Builds between PR #21277 and its revert #21332 (April
  2026) kept the SWA cache in f16 whatever ``-ctk``/``-ctv`` said (``swa_f16=True``).
- K and V rows are ``ggml_row_size(type, n_embd_k_gqa)``; MLA keeps one latent of
  ``kv_lora_rank + qk_rope_head_dim`` values in K and no separate V (V is a view of K).
- Recurrent layers (Mamba, linear attention) keep their state in a separate
  ``llama_memory_recurrent`` of ``n_seq`` cells, f32 by default (``R`` conv state, ``S`` SSM state).

Standard library only.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvcost.models.hfconfig import FULL, MLA, SLIDING, Geometry
from kvcost.storage import formats
from kvcost.units import MIB

__all__ = [
    "CUDA_FA_PAIRS",
    "GGML_TYPES",
    "VERSIONS",
    "Allocation",
    "KVBuffer",
    "allocate",
    "cpu_fallback_warnings",
    "padded_n_ctx",
]

#: ggml type names llama.cpp accepts for -ctk / -ctv, as kvcost.storage.formats names (the registry's table).
GGML_TYPES = formats.ENGINES["llama.cpp"]

#: K/V type pairs the CUDA flash-attention kernels are compiled for in a default build
#: (ggml-cuda/fattn.cu without GGML_CUDA_FA_ALL_QUANTS). Other pairs run attention on the CPU.
CUDA_FA_PAIRS = {("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "q8_0"), ("bf16", "bf16")}


def _ggml(name: str, flag: str) -> str:
    """A ggml type name from a ggml or kvcost spelling; ValueError naming the flag."""
    if name in GGML_TYPES:
        return name
    try:
        ggml_name = formats.engine_name(name, "llama.cpp")
    except ValueError:
        ggml_name = None
    if ggml_name is not None:
        return ggml_name
    raise ValueError(f"{flag} must be a llama.cpp cache type ({', '.join(GGML_TYPES)}), got {name!r}")


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


#: Build eras of the n_ctx rule: "early" (before the padding, early 2024: n_ctx as given), "legacy"
#: (padded to 256 with flash attention, else 32), "nopad" (PR #16812, 2025-10-28: padding removed),
#: "current" (PR #17046, November 2025: GGML_PAD(n_ctx, 256) in llama_context).
VERSIONS = ("early", "legacy", "nopad", "current")


def padded_n_ctx(n_ctx: int, version: str = "current", flash_attn: bool = True) -> int:
    """``n_ctx`` as llama.cpp pads it in a build era of :data:`VERSIONS`."""
    if version == "legacy":
        return _pad(n_ctx, 256 if flash_attn else 32)
    if version in ("early", "nopad"):
        return n_ctx
    return _pad(n_ctx, 256)


@dataclass(frozen=True)
class KVBuffer:
    """One ``llama_kv_cache`` (or ``llama_memory_recurrent``) as llama.cpp logs it."""

    cache: str          # "kv" (non-SWA), "swa" or "recurrent"
    cells: int          # per stream, as the log's "(N cells, ...)"
    streams: int
    seqs: int
    layers: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int

    @property
    def mib(self) -> float:
        return (self.k_bytes + self.v_bytes) / MIB

    def log_line(self) -> str:
        """The line llama.cpp prints for this buffer (``llama_kv_cache: size = ...``)."""
        if self.cache == "recurrent":
            return (f"llama_memory_recurrent: size = {self.mib:7.2f} MiB ({self.cells:6d} cells, {self.layers:3d} "
                    f"layers, {self.seqs:2d} seqs), R ({self.type_k}): {self.k_bytes / MIB:7.2f} MiB, "
                    f"S ({self.type_v}): {self.v_bytes / MIB:7.2f} MiB")
        return (f"llama_kv_cache: size = {self.mib:7.2f} MiB ({self.cells:6d} cells, {self.layers:3d} layers, "
                f"{self.seqs:2d}/{self.streams} seqs), K ({self.type_k}): {self.k_bytes / MIB:7.2f} MiB, "
                f"V ({self.type_v}): {self.v_bytes / MIB:7.2f} MiB")


@dataclass(frozen=True)
class Allocation:
    """Everything llama.cpp allocates for the cache of one context (see :func:`allocate`)."""

    model: str
    n_ctx: int
    n_ctx_padded: int
    n_seq: int
    kv_unified: bool
    swa_full: bool
    buffers: tuple[KVBuffer, ...]
    warnings: tuple[str, ...]

    @property
    def kv_bytes(self) -> int:
        """KV buffers (full and SWA caches), recurrent state excluded."""
        return sum(b.k_bytes + b.v_bytes for b in self.buffers if b.cache != "recurrent")

    @property
    def recurrent_bytes(self) -> int:
        return sum(b.k_bytes + b.v_bytes for b in self.buffers if b.cache == "recurrent")

    @property
    def cells(self) -> int:
        """Cells per stream of the non-SWA cache (the SWA cache when every KV layer slides)."""
        kv = [b for b in self.buffers if b.cache != "recurrent"]
        return kv[0].cells if kv else 0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["buffers"] = [dict(asdict(b), mib=b.mib, log_line=b.log_line()) for b in self.buffers]
        d.update(kv_mib=self.kv_bytes / MIB, kv_bytes=self.kv_bytes, cells=self.cells,
                 recurrent_mib=self.recurrent_bytes / MIB, warnings=list(self.warnings), engine="llama.cpp")
        return d


def _row(type_name: str, n_values: int) -> int:
    """``ggml_row_size``: bytes of one row of ``n_values`` (block types need whole blocks)."""
    fmt = formats.get(GGML_TYPES[type_name])
    if fmt.block > 1 and n_values % fmt.block:
        raise ValueError(f"llama.cpp cannot store rows of {n_values} values as {type_name} "
                         f"(blocks of {fmt.block}); choose another --dtype")
    b = fmt.row_bytes(n_values)
    assert b.denominator == 1
    return int(b)


def _buffer(cache: str, g: Geometry, layers: int, cells: int, streams: int, seqs: int, tk: str,
            tv: str) -> KVBuffer:
    if g.count(MLA):
        assert g.mla_latent is not None
        k = _row(tk, g.mla_latent) * cells * streams * layers
        return KVBuffer(cache, cells, streams, seqs, layers, tk, tv, k, 0)
    k = _row(tk, g.kv_heads * g.head_dim) * cells * streams * layers
    v = _row(tv, g.kv_heads * g.v_head_dim) * cells * streams * layers
    return KVBuffer(cache, cells, streams, seqs, layers, tk, tv, k, v)


def cpu_fallback_warnings(type_k: str, type_v: str) -> list[str]:
    """K/V type pairs llama.cpp's CUDA flash attention does not compile by default (attention runs on the CPU)."""
    tk, tv = _ggml(type_k, "--dtype"), _ggml(type_v, "--v-dtype")
    if (tk, tv) in CUDA_FA_PAIRS or (tk in ("f16", "f32") and tv in ("f16", "f32")):
        return []
    return [f"K {tk} / V {tv}: llama.cpp's CUDA flash-attention kernels are built only for matching f16, "
            f"q8_0 or q4_0 K/V (unless compiled with GGML_CUDA_FA_ALL_QUANTS); this mix runs attention on the "
            f"CPU — the post measured prefill at 43-63 tokens/s for q5_1 and K q8_0 / V q4_0, with no warning"]


def allocate(g: Geometry, n_ctx: int, type_k: str = "f16", type_v: str | None = None, n_seq: int = 1,
             kv_unified: bool = False, swa_full: bool = False, n_ubatch: int = 512, swa_f16: bool = False,
             state_type: str = "f32", version: str = "current", flash_attn: bool = True) -> Allocation:
    """The KV buffers llama.cpp allocates for ``g`` at ``-c n_ctx`` (see the module docstring for the rules)."""
    for name, value, lo in (("--context", n_ctx, 1), ("--n-seq", n_seq, 1), ("--n-ubatch", n_ubatch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    tk = _ggml(type_k, "--dtype")
    tv = _ggml(type_v if type_v is not None else type_k, "--v-dtype")
    n_pad = padded_n_ctx(n_ctx, version, flash_attn)
    if kv_unified or version in ("early", "legacy"):
        streams, cells = 1, n_pad
    elif version == "nopad":
        streams, cells = n_seq, n_pad // n_seq
    else:
        streams, cells = n_seq, _pad(n_pad // n_seq, 256)
    warnings = []
    if g.max_position_embeddings is not None and n_ctx > g.max_position_embeddings:
        warnings.append(f"context {n_ctx:,} exceeds max_position_embeddings {g.max_position_embeddings:,} "
                        f"of {g.name}")
    if tv != "f16" and tv != "f32" and not flash_attn:
        warnings.append("llama.cpp requires flash attention for a quantized V cache")
    buffers = []
    base_layers = g.count(FULL) + g.count(MLA)
    if base_layers:
        buffers.append(_buffer("kv", g, base_layers, cells, streams, n_seq, tk, tv))
    if g.count(SLIDING):
        assert g.window is not None
        if swa_full:
            swa_cells = cells
        elif version in ("early", "legacy", "nopad"):
            swa_cells = min(cells, _pad(g.window * n_seq + n_ubatch, 256 if flash_attn else 32))
        else:
            swa_cells = _pad(min(cells, g.window * (n_seq if kv_unified else 1) + n_ubatch), 256)
        sk, sv = ("f16", "f16") if swa_f16 else (tk, tv)
        buffers.append(_buffer("swa", g, g.count(SLIDING), swa_cells, streams, n_seq, sk, sv))
        if not base_layers and not swa_full:
            warnings.append(f"every attention layer of {g.name} slides over {g.window} tokens: llama.cpp keeps "
                            f"{swa_cells} cells per stream unless --swa-full")
    if g.state_layers and g.state is not None:
        sfmt = formats.get(GGML_TYPES[_ggml(state_type, "--state-dtype")])
        r = math.ceil(g.state_layers * g.state.conv_values * n_seq * fmt_bytes(sfmt))
        s = math.ceil(g.state_layers * g.state.ssm_values * n_seq * fmt_bytes(sfmt))
        buffers.append(KVBuffer("recurrent", n_seq, 1, n_seq, g.state_layers, state_type, state_type, r, s))
    return Allocation(g.name, n_ctx, n_pad, n_seq, kv_unified, swa_full, tuple(buffers),
                      tuple(warnings + cpu_fallback_warnings(tk, tv)))


def fmt_bytes(fmt: formats.Format) -> float:
    """Bytes per value of a plain (non-block) format."""
    return float(fmt.bytes_per_value())
