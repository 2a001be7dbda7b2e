"""Attention kernels as they run: a registry read from ``data/attention_kernels.csv``, run on the units.

Each :class:`Kernel` is one row of ``data/attention_kernels.csv`` (kernel x phase x head_dim x fix, every
fact cited first-hand there: repository, path, commit or PR; ``data/attention_kernels.md``) turned into
:func:`kvcost.numerics.fa3.attend`'s arguments, so that the same emulated forward pass — QKᵀ and P·V on
the GPU's tensor-core unit, bit for bit MMA-Sim (:mod:`kvcost.numerics.tensorcore`) — runs each kernel's
own facts:

- ``block_n``: keys per KV tile, by head_dim and phase (decode / chunked prefill, before and after a fix);
- ``max_offset``: P = exp2(s − m + max_offset), P scaled by 2^max_offset before the cast (FA3 and FA4: 8;
  FA4 after PR #2717: 4; dense FlashMLA: 0, P in [0, 1] cast straight to e4m3);
- ``rescale_threshold``: FA4 keeps the running max stale while it grows by at most this many log2 units,
  so P reaches 2^(max_offset + threshold) and saturates above e4m3's 448 (Dao-AILab issue #2716);
- ``p_scale``: composable_kernel multiplies P by a caller's ``scale_p`` (240 in its example) instead;
- the P format (``e4m3``; e4m3fnuz on CDNA3; ``bf16`` for the kernels that only *store* FP8 or FP4);
- ``flush_every``: two-level accumulation every N tiles (vLLM's PR #104: 1; PR #122: 1, 4, 64; FlashInfer
  PR #3234: 4, opt-in), None for one register over every tile;
- the P·V instruction: the GPU's FP8 unit (:func:`kvcost.numerics.fa3.unit_for`) or, for storage-only
  kernels, its bf16 MMA (dequantized operands, fp32 accumulation);
- split-KV: the kernels choose splits by a heuristic of batch and SM count that is not modelled:
  ``splits`` is the caller's, and :attr:`Kernel.facts` says what the source says.

Where a row leaves a fact empty (not found first-hand), :func:`kernel` fills it by a stated rule and lists
it in :attr:`Kernel.assumed` — the notebook prints that list; nothing is filled in silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from kvcost.floats import round_to
from kvcost.numerics import fa3, kernel_facts
from kvcost.numerics.kernel_facts import KERNELS
from kvcost.storage.quant import roundtrip

__all__ = ["KERNELS", "PHASES", "Kernel", "kernel", "kernels", "lineup", "lineup_table",
           "stored"]

PHASES = ("decode", "chunked prefill")


#: The bf16 MMA a storage-only kernel issues on each GPU (MMA-Sim's names for the pv_instruction column).
_BF16_INSTR = {"Hopper": "m64n8k16.f32.bf16.bf16", "Blackwell": "m64n8k16.kind::f16.f32.bf16.bf16"}
#: Where a storage-only row has no tile (not read first-hand): the FlashMLA / FlashInfer MLA tile of 64 keys.
_DEFAULT_BLOCK_N = 64


@dataclass(frozen=True)
class Kernel:
    """One attention kernel as it runs (see the module docstring)."""

    label: str
    kernel: str
    fix: str
    phase: str
    head_dim: int
    arch: str
    block_n: int
    max_offset: int
    rescale_threshold: float
    p_format: str                 # fa3's name: e4m3 (the GPU's own e4m3: e4m3fnuz on CDNA3) or bf16
    p_scale: float | None
    flush_every: int | None
    instr: str | None             # None: the GPU's FP8 attention unit
    kv_format: str                # what the cache stores: e4m3 (scale 1.0) or nvfp4
    facts: dict = field(repr=False, default_factory=dict)   # the CSV row, as read
    assumed: tuple[str, ...] = ()

    @property
    def storage_only(self) -> bool:
        """The cache is stored in FP8 / FP4 but P·V multiplies in bf16."""
        return self.p_format == "bf16"

    @property
    def p_max(self) -> float:
        """The largest P the kernel can cast: 2^(max_offset + rescale_threshold), or scale_p."""
        if self.p_scale is not None:
            return self.p_scale
        return 2.0 ** (self.max_offset + self.rescale_threshold)

    @property
    def p_clips(self) -> bool:
        """P can exceed its format's largest value (e4m3 448, e4m3fnuz 240) and saturate."""
        top = {"bf16": math.inf}.get(self.p_format, 240.0 if self.arch == "CDNA3" else 448.0)
        return self.p_max > top

    @property
    def flush_tokens(self) -> int | None:
        """Keys per two-level flush (flush_every x block_n), None for one register."""
        return None if self.flush_every is None else self.flush_every * self.block_n

    def attend_kwargs(self, splits: int = 1) -> dict[str, Any]:
        """:func:`kvcost.numerics.fa3.attend`'s arguments for this kernel (Q, K, V already stored)."""
        kw: dict[str, Any] = {"arch": self.arch, "block_n": self.block_n, "max_offset": self.max_offset,
                              "rescale_threshold": self.rescale_threshold, "p_scale": self.p_scale,
                              "flush_every": self.flush_every, "splits": splits, "instr": self.instr,
                              "p_format": self.p_format, "accumulator": "tensorcore"}
        if self.storage_only:
            kw.update(q_format="bf16", kv_format="bf16")     # dequantized to bf16 before the MMA
        elif fa3.unit_for(self.arch).scheme != "T":
            kw["qk"] = "fp32"                                # QKᵀ on MFMA is not modelled (fa3.attend)
        return kw

    def attend(self, q: Any, k: Any, v: Any, *, splits: int = 1, causal: bool = False,
               prepared: dict | None = None) -> np.ndarray:
        """The kernel's forward pass on Q, K, V as the cache holds them (:func:`stored`): (heads, n_q, d);
        ``prepared``: :func:`kvcost.numerics.fa3.attend`'s, shared by calls on the same arrays."""
        return fa3.attend(q, k, v, causal=causal, prepared=prepared, **self.attend_kwargs(splits))


def _num(text: str) -> float | None:
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        return None


def kernel(name: str, fix: str = "none", phase: str = "chunked prefill", head_dim: int = 128,
           label: str | None = None) -> Kernel:
    """The :class:`Kernel` of ``name`` (data/attention_kernels.csv's ``kernel``) with ``fix`` at ``phase``
    and ``head_dim``. A kernel with no row for that phase or head_dim takes its other phase's row, or its
    only head_dim's (MLA kernels: 576/512), and says so in ``assumed``; so does every empty fact filled."""
    if phase not in PHASES:
        raise ValueError(f"parameter 'phase' must be one of {list(PHASES)}, got {phase!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 1:
        raise ValueError(f"parameter 'head_dim' must be a positive integer, got {head_dim!r}")
    rows = [r for r in kernel_facts.rows() if r["kernel"] == name and r["fix"] == fix]
    if not rows:
        have = sorted({(r["kernel"], r["fix"]) for r in kernel_facts.rows()})
        raise ValueError(f"no row of data/attention_kernels.csv for kernel={name!r}, fix={fix!r}; rows: {have}")
    assumed: list[str] = []
    same = [r for r in rows if r["phase"] == phase] or rows
    if same[0]["phase"] != phase:
        assumed.append(f"no {phase} row: the {same[0]['phase']} row's tile")
    exact = [r for r in same if kernel_facts.head_dim(r["head_dim"]) == head_dim]
    if exact:
        r = exact[0]
    else:
        numeric = [r for r in same if kernel_facts.head_dim(r["head_dim"]) is not None]
        r = (min(numeric, key=lambda x: abs(kernel_facts.head_dim(x["head_dim"]) - head_dim)) if numeric
             else same[0])
        assumed.append(f"no head_dim {head_dim} row: run at head_dim {head_dim} with the head_dim "
                       f"{r['head_dim']} row's facts")
    arch = r["gpu_arch"]
    if arch not in fa3.UNIT_ARCHS:
        raise ValueError(f"kernel {name!r} runs on {arch!r}, whose unit kvcost does not model")
    bn = _num(r["block_n"])
    if bn is None:
        bn = _DEFAULT_BLOCK_N
        assumed.append(f"tile not read first-hand: {bn} keys assumed (FlashMLA's and FlashInfer MLA's)")
    p_scale = None
    mo = _num(r["max_offset"])
    storage_only = r["p_format"] == "bf16"
    if mo is None:
        if r["kernel"].startswith("ck_tile"):
            p_scale = 240.0
            mo = 0
            assumed.append("P multiplied by scale_p = 240 (composable_kernel's example, fmha_fwd.cpp: "
                           "dtype max / range_p 1); which scale_p vLLM's ROCm path passes was not confirmed")
        elif storage_only:
            mo = 0
            assumed.append("max_offset not read: P in [0, 1] in bf16 (no shift; bf16 needs none)")
        else:
            raise ValueError(f"kernel {name!r}: no max_offset and no rule to assume one")
    thr = _num(r["rescale_threshold"]) or 0.0
    if r["p_format"].startswith("fp8 e4m3"):
        p_format = "e4m3"
    elif storage_only:
        p_format = "bf16"
    else:
        raise ValueError(f"kernel {name!r}: P format {r['p_format']!r} is not modelled")
    flush = None
    if r["accumulation"].startswith("two-level"):
        flush = int(_num(r["flush_every_tiles"]))
    instr = None
    if storage_only:
        instr = _BF16_INSTR[arch]
        assumed.append(f"P·V (and QKᵀ) on {arch}'s bf16 MMA {instr} (MMA-Sim's name for the row's "
                       f"pv_instruction), Q in bf16")
    if r["confirmed"].strip() != "yes":
        assumed.append(f"row read from a PR description only ({r['source'].split(':')[0]})")
    if r["split_kv"].strip() and not r["split_kv"].startswith("no"):
        assumed.append(f"split-KV ({r['split_kv'].split('(')[0].strip()}, not modelled): splits is the caller's")
    return Kernel(label=label or f"{name} {fix}", kernel=name, fix=fix, phase=phase, head_dim=head_dim, arch=arch,
                  block_n=int(bn), max_offset=int(mo), rescale_threshold=float(thr), p_format=p_format,
                  p_scale=p_scale, flush_every=flush, instr=instr, kv_format=kernel_facts.kv_format(name),
                  facts=dict(r), assumed=tuple(assumed))


def lineup(labels: Any = None, phase: str = "chunked prefill", head_dim: int = 128) -> list[Kernel]:
    """The kernels of :data:`KERNELS` (all, or those ``labels``) at ``phase`` and ``head_dim``."""
    labels = list(KERNELS) if labels is None else list(labels)
    bad = [x for x in labels if x not in KERNELS]
    if bad:
        raise ValueError(f"parameter 'kernels': {bad} not among {list(KERNELS)}")
    return [kernel(*KERNELS[x], phase=phase, head_dim=head_dim, label=x) for x in labels]


def kernels() -> list[tuple[str, str]]:
    """Every (kernel, fix) of data/attention_kernels.csv, in file order."""
    seen: dict[tuple[str, str], None] = {}
    for r in kernel_facts.rows():
        seen[(r["kernel"], r["fix"])] = None
    return list(seen)


def lineup_table(ks: list[Kernel]) -> list[dict[str, Any]]:
    """One dict per kernel: its facts as run (GPU, tile, tokens per flush, max_offset, threshold, P's largest
    value and whether it clips, P and KV formats, unit), the source and what was assumed."""
    out = []
    for k in ks:
        unit = fa3.unit_for(k.arch) if k.instr is None else None
        out.append({"kernel": k.label, "gpu": k.arch, "phase": k.phase, "block_n": k.block_n,
                    "flush_tokens": k.flush_tokens, "max_offset": k.max_offset,
                    "rescale_threshold": k.rescale_threshold, "p_scale": k.p_scale, "p_max": k.p_max,
                    "p_clips": k.p_clips, "p_format": k.p_format if k.arch != "CDNA3" else "e4m3fnuz",
                    "kv_format": k.kv_format, "pv_unit": k.instr or unit.instr,
                    "frac_bits": (unit.frac_bits if unit is not None else 25),
                    "default_on": k.facts.get("default_on", ""), "confirmed": k.facts.get("confirmed", ""),
                    "source": k.facts.get("source", ""), "assumed": "; ".join(k.assumed)})
    return out


def stored(x: Any, k: Kernel) -> np.ndarray:
    """``x`` as kernel ``k`` reads it: e4m3 at scale 1.0 (float32) for FP8 kernels; for storage-only
    kernels the stored format (e4m3, or NVFP4: e2m1 with an e4m3 scale per 16 values,
    :func:`kvcost.storage.quant.roundtrip`) dequantized to bf16, as the kernel dequantizes into shared memory.

    NVFP4's round trip goes a piece of rows (tokens) at a time with the whole array's amax as the tensor scale
    (:data:`kvcost.storage.blockfloat.NVFP4_ROWS_PER_PIECE`), so memory stays bounded at 1M tokens."""
    a = np.asarray(x, dtype=np.float32)
    if k.kv_format == "nvfp4":
        deq = roundtrip(a, "nvfp4")
    else:
        deq = fa3.store(a, "e4m3")
    if not k.storage_only:
        return np.asarray(deq, dtype=np.float32)
    if deq.dtype == np.float32:          # float32 values: ml_dtypes' cast is one rounding to nearest even (fast)
        return deq.astype(ml_dtypes.bfloat16).astype(np.float32)
    return round_to(np.asarray(deq, dtype=np.float64), "bf16").astype(np.float32)
