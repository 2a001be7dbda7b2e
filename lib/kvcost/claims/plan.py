"""Notebook 09's readings: what the post says about bytes and requests, against the fleet plan and the needle."""
from __future__ import annotations

import pandas as pd

from .. import post, stats
from ..models import load_model
from .report import Check

__all__ = ["readings"]


def _ratio(table: pd.DataFrame, fmt: str, base: str = "bf16/bf16") -> pd.Series:
    t = table.drop_duplicates(["model", "kv_format"]).set_index(["model", "kv_format"]).kv_tokens
    return (t.xs(fmt, level="kv_format") / t.xs(base, level="kv_format")).dropna()


def readings(table: pd.DataFrame, needle: pd.DataFrame, post_request_tokens: int = 8192) -> list[Check]:
    """The post's readings on bytes and requests, checked against notebook 09's tables.

    ``table`` is :func:`kvcost.experiments.plan.plan_table`'s output, ``needle`` the needle grid.
    """
    out = []
    fmts = set(table.kv_format)
    if {"bf16/bf16", "fp8_e4m3/fp8_e4m3"} <= fmts:
        r = _ratio(table, "fp8_e4m3/fp8_e4m3")
        out.append(Check("halving it [the cache] with one byte per value is arithmetic", "2x",
                         f"fp8 holds {r.min():.3f}x to {r.max():.3f}x the tokens of bf16 over {len(r)} models",
                         bool((r.round(3) == 2.0).all())))
    if len(needle):
        exact = needle[needle.get("accumulator", "exact") == "exact"]
        lost = [(int(n), s) for (n, s), g in exact.groupby(["n_tokens", "storage"]) if not g.retrieved.all()]
        k, n = int(exact.retrieved.sum()), len(exact)
        out.append(Check("whether the half you keep still answers the question is not arithmetic",
                         "not arithmetic",
                         f"the needle was retrieved in {stats.rate_text(k, n)} of haystacks over every format and "
                         f"context here" + (f"; lost at {lost}" if lost else "; none lost it"),
                         True, "bytes do not predict it: that takes a measurement (notebooks 03 and 06 find where "
                         "losses start; a few trials here cannot exclude small ones)"))
    printed = post.sizing_table().set_index("model")
    for name in printed.index:
        g = load_model(name)
        if g.max_position_embeddings is not None and post_request_tokens > g.max_position_embeddings:
            out.append(Check(f"{name}: {printed.loc[name, 'requests_at_budget']} requests of {post_request_tokens:,} "
                             f"tokens in 24 GiB (the post's table)", printed.loc[name, "requests_at_budget"],
                             f"{post_request_tokens:,} tokens exceed {name}'s max_position_embeddings "
                             f"{g.max_position_embeddings:,}: the row counts requests the model is not trained "
                             f"to serve", False))
    return out
