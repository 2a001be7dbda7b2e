"""Notebook 08's readings: published claims about KV formats set beside SmolLM2-135M's results.

Each reading is a :class:`kvcost.claims.report.Check` whose ``agrees`` is computed from the
tables of :mod:`kvcost.experiments.realmodel`; the published numbers come from
``data/real_model/published_claims.csv`` (first-hand citations there), never from code.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..experiments import realmodel as tables
from ..output import repo_root
from .report import Check

__all__ = ["MATCH_REL", "load_claims", "readings", "llamacpp_checks"]

#: "matches f16 perplexity" is read as: the mean Δ perplexity from the fp16 cache is within
#: 0.5% of the fp16 perplexity (the published example, llama.cpp issue #20977, is 0.006%).
MATCH_REL = 0.005


def load_claims(root: Path | None = None) -> pd.DataFrame:
    """The published claims, indexed by ``claim``."""
    return pd.read_csv((root or repo_root()) / tables.DATA / "published_claims.csv").set_index("claim")


def _row(table: pd.DataFrame, context: int, fmt: str) -> pd.Series | None:
    sel = table[(table["context"] == context) & (table["format"] == fmt)]
    return None if sel.empty else sel.iloc[0]


def _interval(r: pd.Series, col: str, digits: int = 3) -> str:
    if math.isnan(r[f"{col}_lo"]):
        return f"{r[col]:.{digits}f} (1 window, no interval)"
    return f"{r[col]:.{digits}f} [{r[f'{col}_lo']:.{digits}f}, {r[f'{col}_hi']:.{digits}f}] over {r['windows']} windows"


def readings(fmt_table: pd.DataFrame, claims: pd.DataFrame, context: int) -> list[Check]:
    """The three published storage claims, read on SmolLM2-135M at ``context`` tokens."""
    out = []
    q8, f16 = _row(fmt_table, context, "q8_0"), _row(fmt_table, context, "fp16")
    if q8 is not None and f16 is not None:
        d = float(q8["dppl16"])
        rel = abs(d) / float(f16["ppl"])
        pub = claims.loc["llamacpp_issue_20977_q8_0_ppl", "value"] - claims.loc["llamacpp_issue_20977_f16_ppl", "value"]
        out.append(Check("llama.cpp: q8_0 K/V matches f16 perplexity", f"matches (issue #20977: Δ {pub:+.3f})",
                         f"q8_0 − fp16 perplexity, same windows: {_interval(q8, 'dppl16', 4)} on "
                         f"{f16['ppl']:.3f} ({rel:.3%})", rel <= MATCH_REL,
                         f"'matches' read as within {MATCH_REL:.1%} of the fp16 perplexity"))
    bound = float(claims.loc["kvquant_3bit_ppl_delta", "value"])
    low = fmt_table[(fmt_table["context"] == context)
                    & fmt_table["format"].str.match(r"^(q4_|iq4_nl|kivi[24])")].sort_values("dppl")
    if not low.empty:
        best = low.iloc[0]
        out.append(Check(f"KVQuant: under {bound:g} perplexity degradation at 3 bits",
                         f"< {bound:g} (LLaMA-family, Wikitext-2 / C4)",
                         f"best 4-bit-or-lower format here: {best['format']} Δ {_interval(best, 'dppl')}; "
                         f"2-bit KIVI Δ {low[low['format'] == 'kivi2']['dppl'].min():.2f}",
                         bool(best["dppl"] < bound),
                         "KVQuant's own method (pre-RoPE non-uniform, dense-and-sparse) is not simulated; "
                         "the nearest formats shipped by engines are"))
    plain, rot = _row(fmt_table, context, "q5_1"), _row(fmt_table, context, "q5_1+hadamard")
    if plain is not None and rot is not None:
        before = float(claims.loc["post_hadamard_q5_1_before", "value"])
        after = float(claims.loc["post_hadamard_q5_1_after", "value"])
        out.append(Check("The post: a Hadamard rotation takes q5_1 K/V perplexity from 61.70 to 14.15",
                         f"{before:.2f} → {after:.2f} on a 0.6B model (× {before / after:.1f})",
                         f"q5_1 {plain['ppl']:.3f} → {rot['ppl']:.3f} with the rotation (fp32 cache "
                         f"{plain['ppl'] - plain['dppl']:.3f}; Δ {plain['dppl']:.3f} → {rot['dppl']:.3f})",
                         bool(rot["dppl"] < plain["dppl"]),
                         "holds when the rotation lowers q5_1's loss; the size of the anecdote is a broken "
                         "build's, not reproducible on a healthy cache"))
    return out


def llamacpp_checks(comparison: pd.DataFrame) -> list[Check]:
    """One check per format with at least two windows: our simulated Δ perplexity (from fp16)
    agrees with llama.cpp's (:func:`kvcost.experiments.realmodel.agreement`)."""
    out = []
    for r in comparison.itertuples():
        if r.agrees is None:
            continue
        out.append(Check(f"{r.format} at {r.context} tokens: our Δ perplexity agrees with llama.cpp's",
                         f"llama.cpp Δ {r.llamacpp_dppl:+.4f}", f"ours Δ {r.ours_dppl:+.4f} over {r.windows} "
                         f"window(s); tolerance: intervals + engine gap {r.floor:.4f}", bool(r.agrees)))
    return out
