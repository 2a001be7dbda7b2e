"""Whether a kernel kept the needle: measures on a haystack's outputs, each tested on cases whose answer
is known (:func:`known_cases`).

Metrics against float64 attention on the same stored cache (:func:`metrics`): relative L2 error, gain
(o·ref/|ref|²), and the needle's share: its recovered weight ((o − h)·(v_j − h)/|v_j − h|², h the
exact haystack mean) over its exact weight. A needle counts as retrieved when its share is
within a factor 2 of the exact one. **The share is the old measure, kept labelled**: it reads the
output against h, so when the kernel shrinks the whole output (gain below 1) the shrinkage leaks into
it and a needle the kernel carries intact can score far from 1.

**The retrieval measure** (issue 22, :func:`carried`): each haystack is run twice, once as it is and once
with the needle's value replaced by the stored haystack mean h̄ (its key, hence every weight, unchanged).
The difference of the two outputs is what the needle contributes; read against exact attention's same
difference, w_j·(v_j − h̄), it is the needle's **carried weight** (1: the kernel carries the needle's
whole contribution, 0: the needle is gone), reported apart from the output's gain. A haystack keeps
the needle when the carried weight is within :data:`KEEP` (a factor 2 of 1).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvcost.retrieval.haystacks import Haystack

__all__ = ["KEEP", "carried", "known_cases", "metrics"]


def metrics(h: Haystack, out: np.ndarray) -> dict[str, float | bool]:
    """rel_l2, gain, share (recovered / exact needle weight) and retrieved (share within 2x)."""
    dv = h.v[h.needle].astype(np.float64) - h.hbar
    share = float((out - h.hbar) @ dv / (dv @ dv)) / h.weight
    rr = float(h.ref @ h.ref)
    return {"rel_l2": float(np.linalg.norm(out - h.ref) / math.sqrt(rr)), "gain": float(out @ h.ref / rr),
            "share": share, "retrieved": bool(0.5 <= share <= 2.0)}


#: The keep rule: a haystack keeps the needle when its carried weight lies in [KEEP[0], KEEP[1]] — the
#: kernel carries at least half and at most twice the needle's exact contribution (the factor 2 the old
#: share rule used, now on a quantity that the haystack's shrinkage does not enter).
KEEP = (0.5, 2.0)


def carried(h: Haystack, out: np.ndarray, out_off: np.ndarray) -> dict[str, float | bool]:
    """The needle's carried weight: (out − out_off)·Δ/|Δ|² with Δ = ref − ref_off = w_j (v_j − h̄) the
    exact difference; ``off_axis`` = |(out − out_off) − carried·Δ|/|Δ| (what of the difference points
    elsewhere); ``kept`` by :data:`KEEP`."""
    de = h.ref - h.ref_off
    dk = np.asarray(out, np.float64) - np.asarray(out_off, np.float64)
    c = float(dk @ de / (de @ de))
    return {"carried": c, "off_axis": float(np.linalg.norm(dk - c * de) / np.linalg.norm(de)),
            "kept": bool(KEEP[0] <= c <= KEEP[1])}


def known_cases(h: Haystack, gain: float = 0.5) -> pd.DataFrame:
    """The measures on outputs whose answer is known, built from one haystack's exact outputs: exact
    attention (kept, gain 1); the needle removed (the output without it, in both runs: carried 0, gone);
    the haystack alone shrunk by ``gain`` with the needle's contribution intact (kept); the needle's
    contribution cut to a quarter and the haystack intact (carried 0.25: lost). Rows: case, gain,
    carried, kept, share (old measure), share_within_2x."""
    wj = h.weight
    vj, sw = h.v[h.needle].astype(np.float64), h.swap.astype(np.float64)
    hay, hay_off = h.ref - wj * vj, h.ref_off - wj * sw          # the haystack's part of each output
    cases = {"exact attention": (h.ref, h.ref_off),
             "needle removed": (h.ref_off, h.ref_off),
             f"haystack shrunk to {gain:g}, needle intact": (gain * hay + wj * vj, gain * hay_off + wj * sw),
             "needle's contribution cut to a quarter": (h.ref - 0.75 * wj * (vj - sw), h.ref_off)}
    rows = []
    for name, (o, o_off) in cases.items():
        m = metrics(h, o)
        rows.append({"case": name, "gain": m["gain"], **carried(h, o, o_off), "share": m["share"],
                     "share_within_2x": m["retrieved"]})
    return pd.DataFrame(rows)
