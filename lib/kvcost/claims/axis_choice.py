"""Notebook 02's verdict: the post's axis table to the digits printed, and its three readings of it."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvcost.claims.report import READING, Check, Verdict, compare_table, untested_rows
from kvcost.inputs import post

__all__ = ["FP4_FINE", "errata", "fp4_placement", "printed", "readings", "verdict"]

#: FP4 with fine scales (a scale per 16 values): NVFP4 (e4m3 scales, and vLLM's 4-over-6 choice) and SGLang's
#: E8M0-per-16; MXFP4 (E8M0 per 32) is the coarse one. The references they are placed between.
FP4_FINE = ("nvfp4", "nvfp4_4over6", "fp4_mx_block16")
_LOW, _HIGH = "q4_0", "fp8 e4m3 /tensor"      # scheme names (kvcost.experiments.axis_choice.standard_schemes)

_KEYS = ["cache", "bits"]


def printed(table: pd.DataFrame) -> list[Check]:
    """``table`` (from :func:`kvcost.experiments.axis_choice.axis_table`) against the post's printed table, for
    the rows both have. Only meaningful on the post's stream (its seed, n_tokens and head_dim)."""
    return compare_table(post.axis_table(), table, _KEYS,
                         {"per_token": ".3e", "per_channel": ".3e", "winner": "s"}, label="axis")


def _untested(table: pd.DataFrame) -> list[str]:
    """The rows of ``table`` the post printed nothing for."""
    return untested_rows(post.axis_table(), table, _KEYS)


def readings(table: pd.DataFrame) -> list[Check]:
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

    said = [("per-channel wins for K at 8 and 4 bits", "K", [8, 4], "per-channel"),
            ("per-token for V at every width", "V", post_bits, "per-token"),
            ("at 2 bits the K advantage flips", "K", [2], "per-token")]
    return [Check(READING, claim, who, winners(cache, bits), won(cache, bits, who))
            for claim, cache, bits, who in said if set(bits) <= computed]


def errata() -> list[Check]:
    """None here: the post's axis table is checked to the digits printed (:func:`printed`)."""
    return []


def verdict(table: pd.DataFrame, cache_err: pd.DataFrame, tested: bool = True, changed: Sequence[str] = ()) -> Verdict:
    """Notebook 02's verdict: ``table``'s printed numbers and readings, the rows the post did not print, and
    (beyond the post) where FP4 with fine scales sits (:func:`fp4_placement` of ``cache_err``). ``tested``:
    whether the run is on the post's stream (``changed``: the parameters it changes)."""
    return Verdict(printed=printed(table), readings=readings(table), errata=errata(), untested=_untested(table),
                   tested=tested, changed=changed, extra=fp4_placement(cache_err))


def fp4_placement(cache_err: pd.DataFrame) -> str:
    """Where FP4 with fine scales sits between q4_0 (4.5 bits) and fp8 e4m3 (8 bits, per-tensor scale), measured:
    a Markdown paragraph from :func:`kvcost.experiments.axis_choice.scheme_cache_errors`'s table (rows by scheme name),
    for K and for V. Not a reading of the post (it has no FP4); empty when the rows were not computed."""
    rows = cache_err.set_index("scheme")
    names = [n for n in (_LOW, *FP4_FINE, "mxfp4", _HIGH) if n in rows.index]
    if _LOW not in names or _HIGH not in names or not set(FP4_FINE) & set(names):
        return ""
    parts = []
    for cache, col in (("K", "k_rel_l2"), ("V", "v_rel_l2")):
        lo, hi = rows.loc[_LOW, col], rows.loc[_HIGH, col]
        vals = ", ".join(f"{n} {rows.loc[n, col]:.3g} ({rows.loc[n, col[0] + '_bits_per_value']:g} bits)"
                         for n in names)
        fine = [n for n in FP4_FINE if n in rows.index]
        between = [n for n in fine if hi < rows.loc[n, col] < lo]
        above = [n for n in fine if rows.loc[n, col] >= lo]
        where = (f"all {len(fine)} between them" if len(between) == len(fine) else
                 f"{', '.join(between) or 'none'} between them, {', '.join(above) or 'none'} at or above q4_0")
        share = [(lo - rows.loc[n, col]) / (lo - hi) for n in between]
        gap = (f"; they close {min(share):.0%}–{max(share):.0%} of q4_0's gap to fp8" if share else "")
        parts.append(f"- {cache}: {vals} — {where}{gap}.")
    return ("**Beyond the post — FP4 with fine scales between q4_0 and fp8** (relative L2 error on this cache, "
            "measured):\n\n" + "\n".join(parts))
