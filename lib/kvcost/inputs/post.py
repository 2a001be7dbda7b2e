"""The post's printed tables, parsed from its verbatim output (``data/post/block*.out``).

Verdicts compare kvcost's numbers with the strings the post printed, to the digits printed.
Every value is returned as the printed string; the column names follow the CSV tables.
"""
from __future__ import annotations

import re
from functools import cache

import pandas as pd

from kvcost.paths import data_path
from kvcost.provenance import checked

__all__ = [
    "axis_table",
    "block_text",
    "flat_sum_table",
    "needle_table",
    "sizing_listing",
    "sizing_table",
    "ulp_lines",
]


@cache
def block_text(block: int) -> str:
    """The verbatim printed output of the post's Block ``block`` (1, 2 or 3)."""
    if block not in (1, 2, 3):
        raise ValueError(f"parameter 'block' must be 1, 2 or 3, got {block!r}")
    return checked(data_path("post", f"block{block}.out")).read_text()


def _rows(block: int, pattern: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in re.finditer(pattern, block_text(block), flags=re.MULTILINE)]


def sizing_table() -> pd.DataFrame:
    """Block 1's table: model, kib_per_token_bf16, gib_at_context_bf16, gib_at_context_fp8, requests_at_budget."""
    rows = _rows(1, r"^(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$")
    return pd.DataFrame(rows, columns=["model", "kib_per_token_bf16", "gib_at_context_bf16",
                                       "gib_at_context_fp8", "requests_at_budget"])


def sizing_listing() -> pd.DataFrame:
    """Block 1's second listing: model, kv_heads, kib_per_token, ratio (vs Llama-3.1-8B)."""
    rows = _rows(1, r"^\s+(\S+)\s+KV heads\s+(\d+) ->\s+(\d+) KiB/token \(([\d.]+)x\)$")
    return pd.DataFrame(rows, columns=["model", "kv_heads", "kib_per_token", "ratio"])


def axis_table() -> pd.DataFrame:
    """Block 2's first table: cache, bits, per_token, per_channel, winner."""
    rows = _rows(2, r"^([KV])\s+(\d+)\s+(\S+)\s+(\S+)\s+(per-token|per-channel)$")
    return pd.DataFrame(rows, columns=["cache", "bits", "per_token", "per_channel", "winner"])


def needle_table() -> pd.DataFrame:
    """Block 2's second table: k_bits, v_bits, flips, trials, max_w_err, out_rel_l2."""
    rows = _rows(2, r"^\s+(\d+)/(\d+)\s+(\d+)/(\d+)\s+(\S+)\s+(\S+)$")
    return pd.DataFrame(rows, columns=["k_bits", "v_bits", "flips", "trials", "max_w_err", "out_rel_l2"])


def flat_sum_table() -> pd.DataFrame:
    """Block 3's table: n, fp32_flat, fp16_flat, bf16_flat, bf16_two_level."""
    rows = _rows(3, r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
    return pd.DataFrame(rows, columns=["n", "fp32_flat", "fp16_flat", "bf16_flat", "bf16_two_level"])


def ulp_lines() -> pd.DataFrame:
    """Block 3's ULP lines: fmt, mantissa (the exponent printed), ulp, tokens (the stall length)."""
    rows = _rows(3, r"^\s+(\w+): 1 ULP at a sum of 1.0 = 2\^-(\d+) = ([\d.]+) -> "
                    r"a flat distribution longer than ([\d,]+) tokens")
    return pd.DataFrame(rows, columns=["fmt", "mantissa", "ulp", "tokens"])
