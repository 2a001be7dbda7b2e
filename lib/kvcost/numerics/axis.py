"""The post's axis test (Block 2, first table): along which axis of a cache a symmetric absmax int-k
round trip should put its scales — one per token or one per channel — measured by the post's relative L2
error. Notebook 02 runs it on the post's synthetic cache, notebook 07 on real keys and values.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kvcost.numerics.attention import rel_l2
from kvcost.storage.quant import intk_roundtrip

__all__ = ["AXIS_COLUMNS", "axis_table"]

#: The columns of ``axis.csv`` (docs/notebooks.md).
AXIS_COLUMNS = ["cache", "bits", "per_token", "per_channel", "winner"]


def axis_table(k: np.ndarray, v: np.ndarray, bits_list: list[int] | tuple[int, ...]) -> pd.DataFrame:
    """The post's first table: reconstruction error of K and V, per-token vs per-channel.

    Columns ``cache, bits, per_token, per_channel, winner``: relative L2 error of the symmetric
    absmax round trip (the post's ``quant``) along each axis, and ``"per-token"`` when
    ``per_token < per_channel``, else ``"per-channel"`` (the post's tie rule). Rows: K at each
    width, then V.
    """
    rows = []
    for name, cache in (("K", np.asarray(k)), ("V", np.asarray(v))):
        for b in bits_list:
            pt = rel_l2(intk_roundtrip(cache, b, "token"), cache)
            pc = rel_l2(intk_roundtrip(cache, b, "channel"), cache)
            rows.append({"cache": name, "bits": int(b), "per_token": pt, "per_channel": pc,
                         "winner": "per-token" if pt < pc else "per-channel"})
    return pd.DataFrame(rows, columns=AXIS_COLUMNS)
