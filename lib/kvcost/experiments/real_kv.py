"""Notebook 07's tables: the post's axis test on real keys and values, per head, whole cache and grouped."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost.inputs import post
from kvcost.inputs.extracts import as4d
from kvcost.numerics.attention import rel_l2
from kvcost.numerics.axis import axis_by_head, axis_table
from kvcost.storage.quant import intk_roundtrip

__all__ = ["axis_by_head", "axis_summary", "grouped_axis_table"]


def axis_summary(k: np.ndarray, v: np.ndarray, by_head: pd.DataFrame) -> pd.DataFrame:
    """The post's axis table on a whole cache, beside how its heads vote.

    ``per_token``/``per_channel``/``winner`` are :func:`kvcost.axis_table` on all layers
    and heads together (one relative L2 over the cache); ``per_channel_heads`` is the
    fraction of heads where per-channel wins; ``post_winner`` is what the post's table says.
    """
    bits_list = sorted({int(b) for b in by_head["bits"]}, reverse=True)
    table = axis_table(as4d("k", k), as4d("v", v), bits_list)
    votes = (by_head.assign(pc=by_head["winner"] == "per-channel")
             .groupby(["cache", "bits"])["pc"].mean())
    table["per_channel_heads"] = [float(votes.loc[(c, b)]) for c, b in zip(table["cache"], table["bits"])]
    printed = {(r.cache, int(r.bits)): r.winner for r in post.axis_table().itertuples(index=False)}
    table["post_winner"] = [printed.get((c, int(b)), "") for c, b in zip(table["cache"], table["bits"])]
    return table


def grouped_axis_table(k: np.ndarray, v: np.ndarray, bits_list: Sequence[int],
                       token_group: int) -> pd.DataFrame:
    """Per-token against per-channel scales over groups of ``token_group`` tokens (KIVI's K layout).

    With ``tokens / token_group == head_dim`` both sides store the same number of scales, so
    this compares the axes at equal overhead (the post's per-channel scale spans every token).
    ``token_group`` must divide the token count. Columns ``cache, bits, per_token,
    per_channel_grouped, winner`` (relative L2 over the whole cache; ties go to per-channel).
    """
    rows = []
    for name, cache in (("K", as4d("k", k)), ("V", as4d("v", v))):
        if cache.shape[-2] % token_group:
            raise ValueError(f"parameter 'token_group' must divide the token count {cache.shape[-2]}, "
                             f"got {token_group}")
        for b in bits_list:
            pt = rel_l2(intk_roundtrip(cache, b, "token"), cache)
            pc = rel_l2(intk_roundtrip(cache, b, "channel", group_size=token_group), cache)
            rows.append({"cache": name, "bits": int(b), "per_token": pt, "per_channel_grouped": pc,
                         "winner": "per-token" if pt < pc else "per-channel"})
    return pd.DataFrame(rows, columns=["cache", "bits", "per_token", "per_channel_grouped", "winner"])
