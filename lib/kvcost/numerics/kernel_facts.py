"""The attention kernels' facts as data, with the standard library only (the planner reads them without
importing the compiled emulation).

``data/attention_kernels.csv`` holds one row per kernel x phase x head_dim x fix, each fact cited first-hand
(repository, path, commit or PR: ``data/attention_kernels.md``). :data:`KERNELS` names the kernels notebook 10
runs. What a kernel serves is read from its rows, not from its name:

- a kernel whose every row gives a head_dim that is not one number (DeepSeek's MLA latent, "576 (QK) / 512
  (V)", "512 (ckv) + 64 (kpe)") serves MLA models only (:func:`serves_mla`);
- the cache a kernel reads is its rows' ``kv_format`` — FP8 e4m3 at scale 1.0, or NVFP4 (:func:`kv_format`).
"""
from __future__ import annotations

import csv

from kvcost.paths import data_path
from kvcost.provenance import checked

__all__ = ["KERNELS", "head_dim", "kv_format", "rows", "serves_mla"]

#: The kernels notebook 10 runs, by label: (kernel, fix) of data/attention_kernels.csv.
KERNELS: dict[str, tuple[str, str]] = {
    "FA3 FP8, no fix": ("fa3_fp8_vllm", "none"),
    "FA3 FP8, PR #104 (every tile)": ("fa3_fp8_vllm", "pr104+pr125"),
    "FA3 FP8, PR #122 every 4 tiles": ("fa3_fp8_vllm", "pr122_interval4"),
    "FA3 FP8, PR #122 every 64 tiles": ("fa3_fp8_vllm", "pr122_interval64"),
    "FA4 FP8, offset 8, stale max 4 (PR #2109)": ("fa4_fp8", "pr2109"),
    "FA4 FP8, offset 4 (PR #2717)": ("fa4_fp8", "pr2717"),
    "FA4 FP8, offset 8, max every tile (PR #2731)": ("fa4_fp8", "pr2731"),
    "fmha_v2 FP8, one register": ("fmha_v2_fp8", "none"),
    "fmha_v2 FP8, two-level every 4 (PR #3234)": ("fmha_v2_fp8", "pr3234_interval4"),
    "FlashMLA dense FP8 (P in [0, 1])": ("flashmla_dense_fp8", "none"),
    "CK fmha FP8 (CDNA3)": ("ck_tile_fmha_fwd_fp8", "none"),
    "FlashInfer MLA SM90: FP8 stored, bf16 MMA": ("flashinfer_mla_sm90_fp8kv", "none"),
    "FlashMLA NVFP4 stored, bf16 MMA": ("flashmla_sparse_nvfp4kv", "none"),
}


def rows() -> list[dict[str, str]]:
    """Every row of ``data/attention_kernels.csv``, as strings, in file order."""
    with open(checked(data_path("attention_kernels.csv")), newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def head_dim(text: str) -> int | None:
    """A row's head_dim as one number, or None where the row gives several (an MLA latent)."""
    t = text.strip()
    return int(t) if t.isdigit() else None


def _rows_of(kernel: str) -> list[dict[str, str]]:
    mine = [r for r in rows() if r["kernel"] == kernel]
    if not mine:
        raise ValueError(f"no row of data/attention_kernels.csv for kernel={kernel!r}; kernels: "
                         f"{sorted({r['kernel'] for r in rows()})}")
    return mine


def serves_mla(kernel: str) -> bool:
    """Whether ``kernel`` (data/attention_kernels.csv's ``kernel``) serves MLA models only: none of its rows
    gives a head_dim that is one number."""
    return all(head_dim(r["head_dim"]) is None for r in _rows_of(kernel))


def kv_format(kernel: str) -> str:
    """The cache ``kernel`` reads: ``"nvfp4"`` where its rows' head_dim says the latent is stored in e2m1 with an
    e4m3 scale per 16 (FlashMLA's NVFP4 cache), else ``"e4m3"`` (FP8 at scale 1.0)."""
    return "nvfp4" if any("e2m1" in r["head_dim"] for r in _rows_of(kernel)) else "e4m3"
