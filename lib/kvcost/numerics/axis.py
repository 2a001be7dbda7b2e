"""The post's axis test (Block 2, first table): along which axis of a cache a symmetric absmax int-k
round trip should put its scales — one per token or one per channel — measured by the post's relative L2
error. Notebook 02 runs it on the post's synthetic cache, notebook 07 on real keys and values, notebook 08b on
both real decoders' (per head, :func:`axis_by_head`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost.inputs.extracts import as4d
from kvcost.numerics.attention import rel_l2
from kvcost.storage.quant import intk_roundtrip

__all__ = ["AXIS_COLUMNS", "axis_table", "axis_by_head"]

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


def axis_by_head(k: np.ndarray, v: np.ndarray, bits_list: Sequence[int]) -> pd.DataFrame:
    """The post's axis test per layer and head, with the post's quantizer.

    For each cache, width and head: relative L2 error of the symmetric absmax int-k round trip
    with one scale per token (over the head's channels) and one per channel (over all the
    tokens given). Columns ``cache, bits, layer, head, per_token, per_channel, winner`` with
    the post's tie rule (``per-token`` only when strictly smaller).
    """
    rows = []
    for name, cache in (("K", as4d("k", k)), ("V", as4d("v", v))):
        ref = np.sqrt(np.sum(cache * cache, axis=(-2, -1)))
        ref = np.where(ref == 0, 1.0, ref)
        for b in bits_list:
            err = {}
            for axis in ("token", "channel"):
                d = intk_roundtrip(cache, b, axis) - cache
                err[axis] = np.sqrt(np.sum(d * d, axis=(-2, -1))) / ref
            for layer in range(cache.shape[0]):
                for head in range(cache.shape[1]):
                    pt, pc = float(err["token"][layer, head]), float(err["channel"][layer, head])
                    rows.append({"cache": name, "bits": int(b), "layer": layer, "head": head,
                                 "per_token": pt, "per_channel": pc,
                                 "winner": "per-token" if pt < pc else "per-channel"})
    return pd.DataFrame(rows, columns=["cache", "bits", "layer", "head", "per_token", "per_channel", "winner"])
