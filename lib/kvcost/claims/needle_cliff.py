"""Notebook 03's verdict: the post's needle table to the digits printed, and its readings of it."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvcost.claims.report import READING, Check, Verdict, compare_table
from kvcost.inputs import post
from kvcost.stats import intervals_overlap, rate_text, wilson

__all__ = ["errata", "printed", "readings", "verdict"]


def printed(table: pd.DataFrame) -> list[Check]:
    """``table`` (from :func:`kvcost.experiments.needle_cliff.post_needle_table`) against the post's printed
    table, for the bit pairs both have. Only meaningful at the post's seed, sizes, trials and margin."""
    return compare_table(post.needle_table(), table, ["k_bits", "v_bits"],
                         {"flips": "d", "max_w_err": ".2e", "out_rel_l2": ".2e"})


def readings(table: pd.DataFrame, sources: pd.DataFrame, sweep: pd.DataFrame) -> list[Check]:
    """The post's readings of its needle table, checked against computed results.

    ``table`` is :func:`~kvcost.experiments.needle_cliff.post_needle_table`, ``sources``
    :func:`~kvcost.experiments.needle_cliff.error_sources` and ``sweep``
    :func:`~kvcost.experiments.needle_cliff.margin_sweep` output. Rates are compared by their Wilson
    95% intervals, so a reading holds or fails only when the trials can tell.
    """
    checks = []
    # "The margin, not the bit count, decides": at the widest margin swept, do bits still matter?
    widest = sweep[sweep.margin == sweep.margin.max()].sort_values("flip_rate")
    lo_row, hi_row = widest.iloc[0], widest.iloc[-1]
    lo_ci = wilson(int(lo_row.flips), int(lo_row.trials))
    hi_ci = wilson(int(hi_row.flips), int(hi_row.trials))
    checks.append(Check(
        READING, "The margin, not the bit count, decides whether you lose the needle",
        "margin decides",
        f"at a {sweep.margin.max():g}-logit margin the flip rate runs from "
        f"{rate_text(int(lo_row.flips), int(lo_row.trials), digits=1)} (K {int(lo_row.k_bits)}-bit) to "
        f"{rate_text(int(hi_row.flips), int(hi_row.trials), digits=1)} (K {int(hi_row.k_bits)}-bit)",
        intervals_overlap(lo_ci, hi_ci),
        "both decide: the margin a needle needs grows as K's bits shrink"))
    # "the drift compounds through the value mix": compare V-only to K-only output error.
    for r in sources.itertuples(index=False):
        if int(r.k_bits) == 4 and int(r.v_bits) == 4:
            checks.append(Check(
                READING, "At 4 bits the output error (0.98) is drift compounding through the value mix",
                "value-mix drift",
                f"V rounded alone: {r.out_rel_l2_v_only:.3f}; K rounded alone: {r.out_rel_l2_k_only:.3f} "
                f"({rate_text(int(r.flips_k_only), int(r.trials), digits=1)} flips)",
                bool(r.out_rel_l2_v_only > r.out_rel_l2_k_only),
                "the output error is the needle lost to K's rounding; V's rounding adds little"))
    # Key takeaways: "Accumulation precision: fix the register, or lose 155/200 at 4 bits".
    four = table[(table.k_bits == 4) & (table.v_bits == 4)]
    if len(four):
        checks.append(Check(
            READING, "Key takeaways: accumulation precision, 'or lose 155/200 at 4 bits'",
            "an accumulation loss",
            f"{rate_text(int(four.flips.iloc[0]), int(four.trials.iloc[0]), digits=1)} lost at 4 bits with float64 "
            "arithmetic throughout: a storage loss",
            False,
            "the needle table rounds only the stored K and V; no accumulator is involved"))
    return checks


def errata() -> list[Check]:
    """None here: the post's needle table is checked to the digits printed (:func:`printed`)."""
    return []


def verdict(table: pd.DataFrame, sources: pd.DataFrame, sweep: pd.DataFrame, tested: bool = True,
            changed: Sequence[str] = ()) -> Verdict:
    """Notebook 03's verdict: ``table``'s printed numbers and the readings (:func:`readings`); ``tested``:
    whether the run is at the post's defaults (``changed``: the parameters it changes)."""
    return Verdict(printed=printed(table), readings=readings(table, sources, sweep), errata=errata(),
                   tested=tested, changed=changed)
