"""Notebook 07's verdict: the post's assumed outlier structure and axis conclusions, on real keys and values."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost.claims.report import READING, Check, Verdict

__all__ = ["errata", "printed", "readings", "verdict"]


def printed() -> list[Check]:
    """None here: the notebook goes beyond the post (real keys and values; the post printed only its synthetic
    cache's numbers, which notebook 02 reproduces)."""
    return []


def errata() -> list[Check]:
    """None here: the post's assumptions are read on real tables (:func:`readings`)."""
    return []


def readings(k_channels: pd.DataFrame, v_tokens: pd.DataFrame, summary: pd.DataFrame,
             majority: float = 0.5) -> list[Check]:
    """The post's assumptions and axis conclusions, tested on the real tables.

    - K has persistent outlier channels: holds when more than ``majority`` of K's heads have
      at least one persistent outlier channel (:func:`kvcost.inputs.extracts.channel_outlier_table`).
    - V has outlier tokens: holds when more than ``majority`` of V's heads have at least one
      outlier token (:func:`kvcost.inputs.extracts.token_outlier_table`).
    - one row per row of ``summary`` (:func:`kvcost.experiments.real_kv.axis_summary`) that the post has a winner for:
      holds when the whole-cache winner is the post's.
    """
    checks = []
    k_frac = float(np.mean(k_channels["persistent_channels"] > 0))
    n_k = len(k_channels)
    checks.append(Check(
        READING, "K has persistent outlier channels", "yes (every 16th channel x4, on every token)",
        f"{int(np.sum(k_channels['persistent_channels'] > 0))} of {n_k} K heads have one "
        f"(median largest channel ratio {np.median(k_channels['max_ratio']):.2f})",
        k_frac > majority, f"needs more than {majority:.0%} of heads"))
    v_frac = float(np.mean(v_tokens["outlier_tokens"] > 0))
    n_v = len(v_tokens)
    special_note = ""
    total = int(v_tokens["outlier_tokens"].sum())
    if "outlier_special" in v_tokens and total:
        spec = int(v_tokens["outlier_special"].sum())
        special_note = f"; {spec} of {total} outlier (head, token) pairs are [CLS]/[SEP]"
    checks.append(Check(
        READING, "V has outlier tokens", "yes (every 64th token x6, on every channel)",
        f"{int(np.sum(v_tokens['outlier_tokens'] > 0))} of {n_v} V heads have one "
        f"(median largest token ratio {np.median(v_tokens['max_ratio']):.2f}){special_note}",
        v_frac > majority, f"needs more than {majority:.0%} of heads"))
    for row in summary.to_dict("records"):
        want = row.get("post_winner", "")
        if not want:
            continue
        checks.append(Check(
            READING, f"{row['cache']} at {row['bits']} bits: {want} wins", want,
            f"{row['winner']} ({row['per_token']:.3e} per-token vs {row['per_channel']:.3e} "
            f"per-channel; per-channel wins in {row['per_channel_heads']:.0%} of heads)",
            row["winner"] == want, "whole-cache relative L2"))
    # The flip is a claim about the sequence: per-channel above 2 bits, per-token at 2.
    k_rows = {int(r["bits"]): r["winner"] for r in summary.to_dict("records") if r["cache"] == "K"}
    if 2 in k_rows and any(b > 2 for b in k_rows):
        above = [b for b in sorted(k_rows, reverse=True) if b > 2]
        flips = all(k_rows[b] == "per-channel" for b in above) and k_rows[2] == "per-token"
        checks.append(Check(
            READING, "K flips from per-channel to per-token at 2 bits",
            "per-channel at 8 and 4 bits, per-token at 2",
            "K winners: " + ", ".join(f"{b} bits {k_rows[b]}" for b in sorted(k_rows, reverse=True)),
            flips, "no flip without a per-channel win above 2 bits"))
    return checks


def verdict(k_channels: pd.DataFrame, v_tokens: pd.DataFrame, summary: pd.DataFrame, structure: pd.DataFrame,
            grouped: pd.DataFrame, threshold: float, token_group: int, majority: float = 0.5, tested: bool = True,
            changed: Sequence[str] = ()) -> Verdict:
    """Notebook 07's verdict: the readings (:func:`readings`), then the outlier ratios of the real and the
    post's synthetic caches (``structure``: :func:`kvcost.inputs.extracts.structure_table`'s rows by cache, at
    outlier ``threshold``) and the winners at equal span (``grouped``: per-channel groups of ``token_group``
    tokens, :func:`kvcost.experiments.real_kv.grouped_axis_table`)."""
    winners = ", ".join(f"{r.cache} {r.bits}-bit {r.winner}" for r in grouped.itertuples())
    ratios = structure.set_index("cache")
    extra = (f"Threshold {threshold:g}; the largest channel ratio in any real K head is "
             f"{ratios.loc['real K', 'max_channel_ratio']:.2f} (post synthetic K "
             f"{ratios.loc['post synthetic K', 'max_channel_ratio']:.2f}), the largest token ratio "
             f"in any real V head {ratios.loc['real V', 'max_token_ratio']:.2f} (post synthetic V "
             f"{ratios.loc['post synthetic V', 'max_token_ratio']:.2f}). "
             f"At equal span (per-channel groups of {token_group} tokens): {winners}.")
    return Verdict(printed=printed(), readings=readings(k_channels, v_tokens, summary, majority), errata=errata(),
                   tested=tested, changed=changed, extra=extra)
