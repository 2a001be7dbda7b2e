"""Notebook 02's verdict: the post's axis table to the digits printed, and its three readings of it."""
from __future__ import annotations

import pandas as pd

from .. import post
from .report import Check, compare_table, untested_rows

__all__ = ["axis_readings", "reproduction_checks", "untested"]

_KEYS = ["cache", "bits"]


def reproduction_checks(table: pd.DataFrame) -> list[Check]:
    """``table`` (from :func:`kvcost.experiments.axis.axis_table`) against the post's printed table, for
    the rows both have. Only meaningful on the post's stream (its seed, n_tokens and head_dim)."""
    return compare_table(post.axis_table(), table, _KEYS,
                         {"per_token": ".3e", "per_channel": ".3e", "winner": "s"}, label="axis")


def untested(table: pd.DataFrame) -> list[str]:
    """The rows of ``table`` the post printed nothing for."""
    return untested_rows(post.axis_table(), table, _KEYS)


def axis_readings(table: pd.DataFrame) -> list[Check]:
    """The post's three readings of its axis table, checked against ``table`` at the widths the post
    printed (8, 4 and 2 bits). A reading whose widths were not all computed is left out: the post's
    words are about its own widths."""
    post_bits = sorted({int(b) for b in post.axis_table()["bits"]}, reverse=True)
    computed = {int(b) for b in table["bits"]}

    def rows(cache: str, bits: list[int]) -> pd.DataFrame:
        sel = table[(table["cache"] == cache) & (table["bits"].isin(bits))]
        return sel.sort_values("bits", ascending=False)

    def winners(cache: str, bits: list[int]) -> str:
        r = rows(cache, bits)
        return "; ".join(f"{cache} {b}-bit: {w}" for b, w in zip(r["bits"], r["winner"]))

    def won(cache: str, bits: list[int], who: str) -> bool:
        return bool((rows(cache, bits)["winner"] == who).all())

    readings = [("per-channel wins for K at 8 and 4 bits", "K", [8, 4], "per-channel"),
                ("per-token for V at every width", "V", post_bits, "per-token"),
                ("at 2 bits the K advantage flips", "K", [2], "per-token")]
    return [Check(claim, who, winners(cache, bits), won(cache, bits, who))
            for claim, cache, bits, who in readings if set(bits) <= computed]
