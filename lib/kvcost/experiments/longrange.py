"""Notebook 06's tables: one decode row through FlashAttention-3's FP8 kernel (:mod:`kvcost.fa3`)
at long context, on haystacks whose per-head statistics come from real tensors.

A haystack for a head profile (:func:`head_profiles`, from ``data/real_kv``):

- V rows drawn per channel with the head's channel means and spreads (so its channel-mean
  ratio ρ = RMS(channel means) / RMS(channel spreads) is the real head's), tiled to ``head_dim``;
- keys N(0, 1) and a query scaled so that scores q·k/√d have the head's score spread;
- an attention sink at position 0 holding the head's sink share of the exact weight, and a
  needle in the middle with exact weight ``needle_weight`` (keys along q, solved in closed form);
- Q, K, V stored in e4m3 at scale 1.0 (vLLM's uncalibrated FP8 cache).

Metrics against float64 attention on the same stored cache: relative L2 error, gain
(o·ref/|ref|²), and the needle's share: its recovered weight ((o − h)·(v_j − h)/|v_j − h|², h the
exact haystack mean) over its exact weight. A needle counts as retrieved when its share is
within a factor 2 of the exact one. **The share is the old measure, kept labelled**: it reads the
output against h, so when the kernel shrinks the whole output (gain below 1) the shrinkage leaks into
it and a needle the kernel carries intact can score far from 1.

**The retrieval measure** (issue 22): each haystack is run twice, once as it is and once with the
needle's value replaced by the stored haystack mean h̄ (its key, hence every weight, unchanged). The
difference of the two outputs is what the needle contributes; read against exact attention's same
difference, w_j·(v_j − h̄), it is the needle's **carried weight** (1: the kernel carries the needle's
whole contribution, 0: the needle is gone), reported apart from the output's gain. A haystack keeps
the needle when the carried weight is within :data:`KEEP` (a factor 2 of 1).

:func:`query_heads` / :func:`real_haystack`: every query head of the committed SmolLM2-135M extract
(5 layers x 9 query heads, their 3 KV heads' real keys and values), with the score profile taken from
the real rows — the real sink token, the real last 64 keys (recency) and a bulk resampled from the
head's real keys — at any context (see :func:`real_haystack` for what is held fixed as n grows).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import realkv, stats
from ..numerics import fa3, tensorcore
from ..paths import repo_path
from ..provenance import checked

__all__ = [
    "SOURCES",
    "FIXES",
    "KEEP",
    "RECENT",
    "REFERENCE",
    "RETRIEVAL_CELLS",
    "QueryHead",
    "cell_kwargs",
    "carried",
    "carried_grid",
    "committed_retrieval",
    "retrieval_difference",
    "known_cases",
    "query_heads",
    "query_table",
    "real_haystack",
    "retrieval_grid",
    "kept_table",
    "WHERE",
    "Haystack",
    "HeadProfile",
    "NEEDLE_DIR",
    "committed_needle",
    "context_grid",
    "decoder_profiles",
    "head_profiles",
    "load_profiles",
    "knob_grid",
    "make_haystack",
    "metrics",
    "pick_profiles",
    "profile_table",
    "published_niah",
    "rate_table",
    "scaling_grid",
    "slice_difference",
    "where_grid",
]

#: vLLM's fixes as fa3 arguments: none (FA3 as released), PR #104 (every tile), PR #122 (every N tiles).
FIXES: dict[str, dict] = {"no fix": {}, "PR #122 every 64": {"flush_every": 64},
                          "PR #122 every 4": {"flush_every": 4}, "PR #104 every tile": {"flush_every": 1}}
#: The kernel with one part made exact at a time (and all three).
_BATCH_ELEMENTS = 1 << 26        # K (or V) elements per fa3.attend call: 256 MiB in float32
WHERE: dict[str, dict] = {"kernel": {}, "exact QKᵀ": {"qk": "exact"}, "exact l": {"l_accumulator": "exact"},
                          "exact acc_o": {"accumulator": "exact"},
                          "all three exact": {"qk": "exact", "l_accumulator": "exact", "accumulator": "exact"}}


@dataclass(frozen=True)
class HeadProfile:
    """One real head's statistics: V's channel means ``mu`` and spreads ``sd``, ρ, the score
    spread and the sink share (both from K·K scores: MiniLM's queries are not stored)."""

    layer: int
    head: int
    rho: float
    spread: float
    sink: float
    mu: np.ndarray
    sd: np.ndarray

    @property
    def label(self) -> str:
        return f"L{self.layer}H{self.head} (ρ {self.rho:.2f})"


@dataclass(frozen=True)
class Haystack:
    """Stored q (d,), k and v (n, d) float32; the needle's row and exact weight; the float64
    reference output and the exact haystack mean h (both on the stored cache); ``swap``, h as stored
    (the value that replaces the needle's for the carried weight), and ``ref_off``, the exact output
    with it in the needle's place; ``parts``: exact weights of the sink and the recent window."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    needle: int
    weight: float
    ref: np.ndarray
    hbar: np.ndarray
    swap: np.ndarray | None = None
    ref_off: np.ndarray | None = None
    parts: dict | None = None

    def v_off(self) -> np.ndarray:
        """V with the needle's value replaced by ``swap`` (a copy)."""
        v = self.v.copy()
        v[self.needle] = self.swap
        return v


def _swapped(q: np.ndarray, k: np.ndarray, v: np.ndarray, j: int, w: np.ndarray, ref: np.ndarray,
             parts: dict | None = None) -> Haystack:
    """The Haystack with h̄, its stored copy and the exact output with it in the needle's place."""
    hbar = (ref - w[j] * v[j].astype(np.float64)) / (1.0 - w[j])
    swap = fa3.store(hbar.astype(np.float32), "e4m3")
    ref_off = ref + w[j] * (swap.astype(np.float64) - v[j].astype(np.float64))
    return Haystack(q.astype(np.float32), k, v, j, float(w[j]), ref, hbar, swap, ref_off, parts)


def head_profiles(kv: realkv.RealKV) -> list[HeadProfile]:
    """Every layer x head of ``kv``: V's channel statistics over non-special tokens, and from
    K·K/√d scores within each window (a key standing in for the query, itself excluded) the
    median score spread and the median weight on the window's first token ([CLS])."""
    keep = ~kv.special
    out = []
    for layer in range(kv.k.shape[0]):
        for head in range(kv.k.shape[1]):
            v = kv.v[layer, head][keep]
            mu, sd = v.mean(axis=0), v.std(axis=0)
            rho = float(np.sqrt(np.mean(mu ** 2)) / np.sqrt(np.mean(sd ** 2)))
            spreads, sinks = [], []
            for w in np.unique(kv.window):
                idx = np.flatnonzero(kv.window == w)
                k = kv.k[layer, head][idx]
                s = k @ k.T / math.sqrt(k.shape[1])
                np.fill_diagonal(s, -np.inf)
                rows = s[1:]                                   # queries: every token but the first
                fin = np.where(np.isfinite(rows), rows, np.nan)
                spreads.append(np.nanstd(fin, axis=1))
                e = np.exp(rows - rows.max(axis=1, keepdims=True))
                sinks.append(e[:, 0] / e.sum(axis=1))
            out.append(HeadProfile(layer, head, rho, float(np.median(np.concatenate(spreads))),
                                   float(np.median(np.concatenate(sinks))), mu, sd))
    return out


def decoder_profiles(kv: realkv.RealKV, query_stats: pd.DataFrame) -> list[HeadProfile]:
    """A real decoder's KV heads (SmolLM2-135M's extract in ``data/real_model``): V's channel
    statistics from the extract, score spread and sink share from its real queries
    (``query_stats``: one row per layer and query head, medians over query rows), each the
    median over the query heads that share the KV head (grouped-query attention)."""
    layers = list(kv.meta.get("layers", range(kv.v.shape[0])))
    n_kv = kv.v.shape[1]
    out = []
    for li, layer in enumerate(layers):
        qs = query_stats[query_stats["layer"] == layer]
        group = max(1, int(qs["head"].max()) + 1) // n_kv if len(qs) else 1
        for h in range(n_kv):
            v = kv.v[li, h]
            mu, sd = v.mean(axis=0), v.std(axis=0)
            rho = float(np.sqrt(np.mean(mu ** 2)) / np.sqrt(np.mean(sd ** 2)))
            mine = qs[(qs["head"] // group) == h]
            out.append(HeadProfile(int(layer), h, rho, float(mine["score_spread"].median()),
                                   float(mine["sink_share"].median()), mu, sd))
    return out


def profile_table(profiles: Sequence[HeadProfile]) -> pd.DataFrame:
    """layer, head, rho, score_spread, sink_share per profile."""
    return pd.DataFrame([{"layer": p.layer, "head": p.head, "rho": p.rho, "score_spread": p.spread,
                          "sink_share": p.sink} for p in profiles])


#: Where the head statistics come from: a real decoder (SmolLM2-135M, ``data/real_model``) or
#: the MiniLM encoder (``data/real_kv``, K·K scores standing in for queries).
SOURCES = {"smollm2": ("data/real_model/smollm2_kv.npz", "data/real_model/query_stats.csv"),
           "minilm": ("data/real_kv/minilm_l6_kv.npz", None)}


def load_profiles(source: str) -> list[HeadProfile]:
    """The head profiles of ``source`` (:data:`SOURCES`)."""
    if source not in SOURCES:
        raise ValueError(f"parameter 'source' must be one of {list(SOURCES)}, got {source!r}")
    kv_path, q_path = SOURCES[source]
    kv = realkv.load_real_kv(kv_path)
    if q_path is None:
        return head_profiles(kv)
    return decoder_profiles(kv, pd.read_csv(checked(repo_path(q_path))))


def pick_profiles(profiles: Sequence[HeadProfile], count: int) -> list[HeadProfile]:
    """``count`` heads at ρ quantiles from the median to the largest (the typical head and the
    worst ones for accumulation)."""
    order = sorted(profiles, key=lambda p: (p.rho, p.layer, p.head))
    qs = [0.5] if count == 1 else np.linspace(0.5, 1.0, count)
    idx = sorted({min(len(order) - 1, round(float(q) * (len(order) - 1))) for q in qs})
    return [order[i] for i in idx]


def _place(q: np.ndarray, others: np.ndarray, weight: float) -> float:
    """The score that gives exact weight ``weight`` against scores ``others``."""
    m = float(others.max())
    lse = m + math.log(float(np.exp(others - m).sum()))
    return math.log(weight) - math.log1p(-weight) + lse


def make_haystack(p: HeadProfile, n: int, d: int, needle_weight: float, seed: int,
                  kv_format: str = "e4m3") -> Haystack:
    """A haystack of ``n`` tokens for profile ``p`` (see the module docstring); deterministic in seed."""
    rng = np.random.default_rng([seed, p.layer, p.head, n])
    mu, sd = np.resize(p.mu, d).astype(np.float32), np.resize(p.sd, d).astype(np.float32)
    v = fa3.store(mu + sd * rng.standard_normal((n, d), dtype=np.float32), kv_format)
    g = rng.standard_normal(d)
    q = fa3.store(g * (p.spread * math.sqrt(d) / np.linalg.norm(g)), "e4m3").astype(np.float64)
    k = rng.standard_normal((n, d), dtype=np.float32)
    j = n // 2
    qq = float(q @ q)
    base = _rows(k, lambda blk: blk @ q) / math.sqrt(d)
    rest = np.delete(base, [0, j])
    t_sink = _place(q, rest, min(max(p.sink, 1e-6), 0.9))            # the sink's share of the haystack
    k[0] = q * (t_sink * math.sqrt(d) / qq)
    s0 = np.concatenate([[t_sink], rest])
    k[j] = q * (_place(q, s0, needle_weight) * math.sqrt(d) / qq)
    k = fa3.store(k, kv_format)
    s = _rows(k, lambda blk: blk @ q) / math.sqrt(d)
    w = np.exp(s - s.max())
    w /= w.sum()
    ref = _rows(v, lambda blk, i0: w[i0:i0 + len(blk)] @ blk, reduce=True)
    return _swapped(q, k, v, j, w, ref, {"sink": float(w[0]), "recent": float("nan")})


def _rows(m: np.ndarray, fn, reduce: bool = False, chunk: int = 1 << 16) -> np.ndarray:
    """``fn`` over float64 copies of row blocks of the float32 matrix ``m`` (bounded memory):
    the results concatenated, or summed when ``reduce`` (then ``fn`` also gets the block's start)."""
    parts = []
    for i0 in range(0, m.shape[0], chunk):
        blk = m[i0:i0 + chunk].astype(np.float64)
        parts.append(fn(blk, i0) if reduce else fn(blk))
    return np.sum(parts, axis=0) if reduce else np.concatenate(parts)


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
#: Tokens before the query that form the recent window of a real score profile.
RECENT = 64


def carried(h: Haystack, out: np.ndarray, out_off: np.ndarray) -> dict[str, float | bool]:
    """The needle's carried weight: (out − out_off)·Δ/|Δ|² with Δ = ref − ref_off = w_j (v_j − h̄) the
    exact difference; ``off_axis`` = |(out − out_off) − carried·Δ|/|Δ| (what of the difference points
    elsewhere); ``kept`` by :data:`KEEP`."""
    de = h.ref - h.ref_off
    dk = np.asarray(out, np.float64) - np.asarray(out_off, np.float64)
    c = float(dk @ de / (de @ de))
    return {"carried": c, "off_axis": float(np.linalg.norm(dk - c * de) / np.linalg.norm(de)),
            "kept": bool(KEEP[0] <= c <= KEEP[1])}


@dataclass(frozen=True)
class QueryHead:
    """One query head of a real decoder: its real queries ``q`` (rows, d) at positions ``q_pos``, and its
    KV head's real keys ``k`` (after RoPE) and values ``v`` (t, d), from a committed extract."""

    layer: int
    head: int
    kv_head: int
    q: np.ndarray
    q_pos: np.ndarray
    k: np.ndarray
    v: np.ndarray

    @property
    def label(self) -> str:
        return f"L{self.layer}q{self.head}"

    def weights(self, row: int) -> np.ndarray:
        """Exact softmax weights of query row ``row`` over its causal keys (positions 0 .. q_pos[row])."""
        p = int(self.q_pos[row])
        s = self.k[:p + 1] @ self.q[row] / math.sqrt(self.k.shape[1])
        w = np.exp(s - s.max())
        return w / w.sum()


def query_heads(source: str = "smollm2") -> list[QueryHead]:
    """Every query head of ``source``'s committed extract (SmolLM2-135M: layers 0, 1, 10, 20, 29 x 9
    query heads, grouped three to a KV head), in layer then head order."""
    if source != "smollm2":
        raise ValueError(f"parameter 'source' must be 'smollm2' (the extract with real queries), got {source!r}")
    path = repo_path(SOURCES[source][0])
    kv = realkv.load_real_kv(path)                     # checks the extract's sha256
    with np.load(path, allow_pickle=False) as z:
        q, q_pos = z["q"].astype(np.float64), z["q_pos"].astype(np.int64)
    layers = list(kv.meta.get("layers", range(kv.k.shape[0])))
    group = q.shape[1] // kv.k.shape[1]
    return [QueryHead(int(layer), h, h // group, q[li, h], q_pos, kv.k[li, h // group], kv.v[li, h // group])
            for li, layer in enumerate(layers) for h in range(q.shape[1])]


def query_table(heads: Sequence[QueryHead]) -> pd.DataFrame:
    """Per query head, medians over its real rows: the sink's weight (token 0), the recent window's
    (:data:`RECENT` keys up to the query), the largest weight, and the bulk's score spread."""
    rows = []
    for h in heads:
        sink, recent, top, spread = [], [], [], []
        for r in range(len(h.q_pos)):
            w = h.weights(r)
            p = int(h.q_pos[r])
            sink.append(w[0])
            recent.append(w[p + 1 - RECENT:].sum())
            top.append(w.max())
            spread.append(np.std(h.k[1:p + 1 - RECENT] @ h.q[r] / math.sqrt(h.k.shape[1])))
        rows.append({"head": h.label, "layer": h.layer, "q_head": h.head, "kv_head": h.kv_head,
                     "sink_share": float(np.median(sink)), "recent_share": float(np.median(recent)),
                     "top_weight": float(np.median(top)), "bulk_spread": float(np.median(spread))})
    return pd.DataFrame(rows)


def real_haystack(h: QueryHead, n: int, needle_weight: float, seed: int, kv_format: str = "e4m3") -> Haystack:
    """A haystack of ``n`` tokens whose score profile is real query head ``h``'s: query row
    ``seed mod rows`` (real q at real position p), and keys and values taken from the extract —

    - position 0: the real sink token (token 0's key and value);
    - the last :data:`RECENT` positions: the real keys and values at p − RECENT + 1 .. p (recency);
    - the bulk in between: real (key, value) pairs drawn with replacement from positions 1 .. p − RECENT,
      so the bulk's scores have the real row's distribution (heavy tails included), not a Gaussian's;
    - the needle at n // 2: a key along q giving exact weight ``needle_weight``, with a value drawn from
      the bulk's real values.

    Held fixed as n grows: the shares of the weight that the sink and the recent window take (excluding
    the needle) are the real row's at p + 1 tokens (their scores are shifted by a constant, a component
    along q added to their keys); the bulk spreads the rest over n − RECENT − 2 tokens. SmolLM2 was
    trained to 8,192 tokens, so what its heads do at 128k is not measured anywhere: this holds its
    attention pattern as measured at ~500 tokens. Q, K, V stored in ``kv_format`` at scale 1.0."""
    rows = len(h.q_pos)
    r = seed % rows
    p = int(h.q_pos[r])
    d = h.k.shape[1]
    if n < 2 * RECENT + 4:
        raise ValueError(f"parameter 'n' must be at least {2 * RECENT + 4}, got {n!r}")
    rng = np.random.default_rng([seed, h.layer, h.head, n])
    w_real = h.weights(r)
    sink_share = float(w_real[0])
    recent_share = float(w_real[p + 1 - RECENT:].sum())
    pool = np.arange(1, p + 1 - RECENT)
    nb = n - RECENT - 1
    pick = rng.choice(pool, size=nb)
    idx = np.concatenate([[0], pick, np.arange(p + 1 - RECENT, p + 1)])
    k = h.k[idx].copy()
    v = h.v[idx].copy()
    j = n // 2
    v[j] = h.v[rng.choice(pool)]
    q = fa3.store(h.q[r].astype(np.float32), "e4m3").astype(np.float64)
    qq = float(q @ q)
    sq = math.sqrt(d)
    s = k @ q / sq
    bulk = np.ones(n, bool)
    bulk[0] = bulk[j] = False
    bulk[n - RECENT:] = False
    mb = float(s[bulk].max())
    lse_bulk = mb + math.log(float(np.exp(s[bulk] - mb).sum()))
    rest = max(1e-12, 1.0 - sink_share - recent_share)

    def shift(rows_: np.ndarray | slice, share: float) -> None:
        """Add a component along q to these keys so that they take ``share`` of the weight (vs the bulk)."""
        sub = s[rows_]
        ms = float(np.max(sub))
        lse = ms + math.log(float(np.exp(sub - ms).sum()))
        delta = math.log(max(share, 1e-12) / rest) + lse_bulk - lse
        k[rows_] += q * (delta * sq / qq)

    shift(slice(0, 1), sink_share)
    shift(slice(n - RECENT, n), recent_share)
    s = k @ q / sq
    others = np.delete(s, j)
    k[j] = q * (_place(q, others, needle_weight) * sq / qq)
    k = fa3.store(k.astype(np.float32), kv_format)
    v = fa3.store(v.astype(np.float32), kv_format)
    s = _rows(k, lambda blk: blk @ q) / sq
    w = np.exp(s - s.max())
    w /= w.sum()
    ref = _rows(v, lambda blk, i0: w[i0:i0 + len(blk)] @ blk, reduce=True)
    return _swapped(q, k, v, j, w, ref, {"sink": float(w[0]), "recent": float(w[n - RECENT:].sum()),
                                         "query_pos": p, "row": r})


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


def cell_kwargs(arch: str, fix: str) -> dict:
    """fa3.attend arguments for one (GPU, fix) cell: FA3's FP8 forward pass on ``arch``'s FP8 unit
    (:data:`kvcost.numerics.fa3.UNIT_ARCHS`) with fix :data:`FIXES` or the reference kernel
    ``"bf16 P, fp32 acc"``. On CDNA3 QKᵀ runs as an fp32 chain (MFMA QKᵀ is not modelled; the
    where-grid shows QKᵀ's share of the loss is nil on Hopper)."""
    if arch not in fa3.UNIT_ARCHS:
        raise ValueError(f"parameter 'arch' must be one of {list(fa3.UNIT_ARCHS)}, got {arch!r}")
    if fix == REFERENCE:
        kw = {"p_format": "bf16", "accumulator": "fp32"}
    elif fix in FIXES:
        kw = dict(FIXES[fix])
    else:
        raise ValueError(f"parameter 'fix' must be one of {[*FIXES, REFERENCE]}, got {fix!r}")
    kw["arch"] = arch
    if fa3.unit_for(arch).scheme != "T":
        kw["qk"] = "fp32"
    return kw


#: The reference kernel: the same tiling with P in bf16 and an fp32 accumulator.
REFERENCE = "bf16 P, fp32 acc"
#: The committed retrieval run's (GPU, fix) cells: Hopper with and without vLLM's per-tile fix and the
#: reference kernel, and FA3's algorithm without a fix on each other GPU's FP8 unit whose arithmetic
#: differs (RTX Blackwell's mma.sync unit keeps Blackwell's 25 bits with the same grouping and rounding,
#: so its rows would repeat Blackwell's: the notebook checks that on a haystack instead of running it).
RETRIEVAL_CELLS = (("Hopper", "no fix"), ("Hopper", "PR #104 every tile"), ("Hopper", REFERENCE),
                   ("Blackwell", "no fix"), ("Ada Lovelace", "no fix"), ("CDNA3", "no fix"))


def retrieval_grid(heads: Sequence[QueryHead], n: int, trials: int, needle_weight: float, seed: int,
                   cells: Sequence[tuple[str, str]], block_n: int = 128, trial_list: Sequence[int] | None = None,
                   frac_bits: int | None = None) -> pd.DataFrame:
    """Every head x haystack (seeds ``seed + t``) at context ``n`` through each (arch, fix) cell, each
    haystack run with the needle and with its value replaced by h̄: rows head, layer, q_head, kv_head,
    n_tokens, trial, query_pos, needle_w, sink_w, recent_w (exact weights), arch, fix, block_n,
    rel_l2, gain, carried, off_axis, kept, and the old measure share, share_within_2x. ``frac_bits``
    narrows or widens P·V's kept fraction bits on every unit (None: each unit's own), for the scaling law.
    ``trial_list``: the trials to run (default 0 .. trials - 1)."""
    trial_list = list(range(trials)) if trial_list is None else list(trial_list)
    d = heads[0].k.shape[1]
    per = max(1, (_BATCH_ELEMENTS // 2) // (n * d))
    keys = [(h, t) for h in heads for t in trial_list]
    rows = []
    for b0 in range(0, len(keys), per):
        batch = keys[b0:b0 + per]
        hs = [real_haystack(h, n, needle_weight, seed + t) for h, t in batch]
        q = np.stack([x.q for x in hs] * 2)[:, None, :]
        k = np.stack([x.k for x in hs] * 2)
        v = np.stack([x.v for x in hs] + [x.v_off() for x in hs])
        for arch, fix in cells:
            outs = fa3.attend(q, k, v, block_n=block_n, frac_bits=frac_bits, **cell_kwargs(arch, fix))[:, 0]
            for i, ((h, t), x) in enumerate(zip(batch, hs)):
                m = metrics(x, outs[i])
                rows.append({"head": h.label, "layer": h.layer, "q_head": h.head, "kv_head": h.kv_head,
                             "n_tokens": n, "trial": t, "query_pos": x.parts["query_pos"], "needle_w": x.weight,
                             "sink_w": x.parts["sink"], "recent_w": x.parts["recent"], "arch": arch, "fix": fix,
                             "block_n": block_n, "rel_l2": m["rel_l2"], "gain": m["gain"],
                             **carried(x, outs[i], outs[len(hs) + i]),
                             "share": m["share"], "share_within_2x": m["retrieved"]})
        del hs, q, k, v
    return pd.DataFrame(rows)


def kept_table(df: pd.DataFrame, by: Sequence[str], col: str = "kept", cluster: str = "head") -> pd.DataFrame:
    """Per group of ``by``: haystacks k kept of n, the rate pooled over ``cluster`` (heads) with its
    clustered 95% interval (:func:`kvcost.stats.clustered_rate`: lo, hi, n_eff), the heads, the spread of
    per-head rates (min, median, max), median gain and median carried weight, and the text."""
    out = []
    for key, g in df.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        per = g.groupby(cluster, sort=False)[col].agg(["sum", "count"])
        ks, ns = per["sum"].astype(int).tolist(), per["count"].astype(int).tolist()
        rates = per["sum"] / per["count"]
        if len(per) >= 2:
            p, lo, hi, n_eff = stats.clustered_rate(ks, ns)
            txt = stats.clustered_rate_text(ks, ns, "heads")
        else:
            p, (lo, hi), n_eff = sum(ks) / sum(ns), stats.wilson(sum(ks), sum(ns)), float(sum(ns))
            txt = stats.rate_text(sum(ks), sum(ns)) + " (one head: Wilson)"
        out.append({**dict(zip(by, key)), "k": sum(ks), "n": sum(ns), "heads": len(per), "rate": p, "lo": lo,
                    "hi": hi, "n_eff": n_eff, "head_min": float(rates.min()), "head_median": float(rates.median()),
                    "head_max": float(rates.max()), "gain": float(g["gain"].median()),
                    "carried": float(g["carried"].median()) if "carried" in g else float("nan"), "text": txt})
    return pd.DataFrame(out)


def carried_grid(profiles: Sequence[HeadProfile], n: int, d: int, trials: int, needle_weight: float, seed: int,
                 fixes: Sequence[str] = ("no fix",), block_n: int = 96) -> pd.DataFrame:
    """The old synthetic haystacks (:func:`make_haystack`, seeds seed .. seed + trials - 1) re-read with the
    carried weight: each run with the needle and with its value replaced by h̄, on Hopper. Rows head,
    n_tokens, trial, fix, gain, share, retrieved (the old rule), carried, off_axis, kept."""
    rows = []
    for prof in profiles:
        for t in range(trials):
            h = make_haystack(prof, n, d, needle_weight, seed + t)
            for fix in fixes:
                kw = cell_kwargs("Hopper", fix)
                kw.pop("arch")
                out = fa3.attend(np.stack([h.q, h.q])[:, None, :], np.stack([h.k, h.k]), np.stack([h.v, h.v_off()]),
                                 block_n=block_n, **kw)[:, 0]
                m = metrics(h, out[0])
                rows.append({"head": prof.label, "n_tokens": n, "trial": t, "fix": fix, "gain": m["gain"],
                             "share": m["share"], "retrieved": m["retrieved"], **carried(h, out[0], out[1])})
    return pd.DataFrame(rows)


def _attend(hs: Sequence[Haystack], block_n: int, **kw: object) -> np.ndarray:
    """One fa3.attend call for several haystacks of the same length, each its own KV head
    (rows run in parallel): returns (len(hs), d)."""
    q = np.stack([h.q for h in hs])[:, None, :]
    k = np.stack([h.k for h in hs])
    v = np.stack([h.v for h in hs])
    return fa3.attend(q, k, v, block_n=block_n, **kw)[:, 0]


def _grid(profiles: Sequence[HeadProfile], ns: Sequence[int], d: int, trials: int, needle_weight: float,
          seed: int, variants: dict[str, dict], block_n: int, column: str, frac_bits: int) -> pd.DataFrame:
    rows = []
    for n in ns:
        keys = [(p, t) for p in profiles for t in range(trials)]
        per = max(1, _BATCH_ELEMENTS // (n * d))        # haystacks per batch: bounded memory at 1M tokens
        for b0 in range(0, len(keys), per):
            batch = keys[b0:b0 + per]
            hs = [make_haystack(p, n, d, needle_weight, seed + t) for p, t in batch]
            for name, kw in variants.items():
                kw = dict(kw)
                bn = int(kw.pop("block_n", block_n))
                outs = _attend(hs, bn, frac_bits=frac_bits, **kw)
                for (p, t), h, out in zip(batch, hs, outs):
                    rows.append({"head": p.label, "rho": p.rho, "n_tokens": n, "trial": t, column: name,
                                 "block_n": bn, **metrics(h, out)})
            del hs
    cols = ["head", "rho", "n_tokens", "trial", column, "block_n"]
    return pd.DataFrame(rows).sort_values(cols[:5], kind="stable").reset_index(drop=True)


def context_grid(profiles: Sequence[HeadProfile], ns: Sequence[int], d: int, trials: int, needle_weight: float,
                 seed: int, fixes: Sequence[str] = tuple(FIXES), block_n: int = 96,
                 frac_bits: int = tensorcore.FRAC_BITS) -> pd.DataFrame:
    """Every head x context x trial under each fix (:data:`FIXES`), plus the exact-arithmetic
    kernel (P bf16, fp32 accumulation) as ``"bf16 P, fp32 acc"``. ``frac_bits``: the tensor core's
    kept fraction bits (fewer stand for a longer context: the scaling law)."""
    variants = {f: FIXES[f] for f in fixes}
    variants["bf16 P, fp32 acc"] = {"p_format": "bf16", "accumulator": "fp32"}
    return _grid(profiles, ns, d, trials, needle_weight, seed, variants, block_n, "fix", frac_bits)


def where_grid(profiles: Sequence[HeadProfile], n: int, d: int, trials: int, needle_weight: float, seed: int,
               block_n: int = 96, frac_bits: int = tensorcore.FRAC_BITS) -> pd.DataFrame:
    """The kernel with QKᵀ, the row sum l, acc_o, and all three made exact in turn (:data:`WHERE`)."""
    return _grid(profiles, [n], d, trials, needle_weight, seed, WHERE, block_n, "variant", frac_bits)


def knob_grid(profiles: Sequence[HeadProfile], n: int, d: int, trials: int, needle_weight: float, seed: int,
              splits: Sequence[int], block_sizes: Sequence[int], block_n: int = 96,
              frac_bits: int = tensorcore.FRAC_BITS) -> pd.DataFrame:
    """No fix at context n: split-KV counts, KV block sizes, and rounding to nearest."""
    variants: dict[str, dict] = {}
    for s in splits:
        variants[f"splits {s}"] = {"splits": s}
    for b in block_sizes:
        variants[f"block_n {b}"] = {"block_n": b}
    variants["terms cut to nearest"] = {"rounding": "nearest"}
    return _grid(profiles, [n], d, trials, needle_weight, seed, variants, block_n, "variant", frac_bits)


def scaling_grid(p: HeadProfile, ns: Sequence[int], frac_bits: Sequence[int], d: int, trials: int,
                 needle_weight: float, seed: int, block_n: int = 96) -> pd.DataFrame:
    """acc_o's own error (the kernel against the same kernel with an exact acc_o) for a narrower
    or wider tensor core: rows head, sink_share, n_tokens, trial, frac_bits, x = n·2^-frac_bits,
    acc_error, rel_l2."""
    rows = []
    for n in ns:
        hs = [make_haystack(p, n, d, needle_weight, seed + t) for t in range(trials)]
        exact_acc = _attend(hs, block_n, accumulator="exact")
        for fb in frac_bits:
            outs = _attend(hs, block_n, frac_bits=fb)
            for t, (h, out, ex) in enumerate(zip(hs, outs, exact_acc)):
                rows.append({"head": p.label, "sink_share": p.sink, "n_tokens": n, "trial": t, "frac_bits": fb,
                             "x": n * 2.0 ** -fb,
                             "acc_error": float(np.linalg.norm(out - ex) / np.linalg.norm(ex)),
                             "rel_l2": metrics(h, out)["rel_l2"]})
    return pd.DataFrame(rows)


def published_niah(published: pd.DataFrame) -> pd.DataFrame:
    """The published 128k NIAH accuracies per kernel variant, read from
    ``data/accumulation_published.csv``: fix, source, accuracy."""
    pub = published.set_index("quantity")
    pairs = [("BF16 (blog)", "niah_bf16"), ("no fix", "niah_fp8_tensor_core_accumulation"),
             ("PR #104 every tile", "niah_fp8_two_level"), ("PR #104 every tile", "niah_two_level_flush_every_1_step"),
             ("PR #122 every 4", "niah_two_level_flush_every_4_steps"),
             ("PR #122 every 64", "niah_two_level_flush_every_64_steps")]
    return pd.DataFrame([{"fix": fix, "quantity": q, "source": pub.loc[q, "source"].split(",")[0],
                          "accuracy": float(pub.loc[q, "value"])} for fix, q in pairs])


#: The committed heavier needle run (``scripts/long_range_needle.py``): needle.csv and provenance.json.
NEEDLE_DIR = "data/long_range"
_NEEDLE_KEYS = ("n_tokens", "source", "heads", "head_dim", "block_n", "needle_weight", "seed")


def committed_needle(expect: dict[str, object], folder: str = NEEDLE_DIR) -> tuple[pd.DataFrame, dict] | None:
    """The committed needle table and its provenance, or None when its parameters are not ``expect``'s
    (keys n_tokens, source, heads, head_dim, block_n, needle_weight, seed). A needle.csv whose sha256
    is not the one in provenance.json raises ValueError naming the file."""
    root = repo_path(folder)
    prov = json.loads((root / "provenance.json").read_text())
    csv = checked(root / "needle.csv")      # its sha256 against provenance.json's record
    have = prov["parameters"]
    if any(k in expect and have[k] != expect[k] for k in _NEEDLE_KEYS):
        return None
    return pd.read_csv(csv), prov


_RETRIEVAL_KEYS = ("n_tokens", "trials", "block_n", "needle_weight", "seed", "recent")


def committed_retrieval(expect: dict[str, object] | None = None, folder: str = NEEDLE_DIR
                        ) -> tuple[pd.DataFrame, dict] | None:
    """The committed retrieval table (``retrieval.csv``, :func:`retrieval_grid` over every query head, written
    by ``scripts/long_range_retrieval.py``) and its provenance (``retrieval.json``), or None when its
    parameters are not ``expect``'s. A retrieval.csv whose sha256 differs raises ValueError naming the file."""
    root = repo_path(folder)
    prov = json.loads((root / "retrieval.json").read_text())
    csv = checked(root / "retrieval.csv")
    have = prov["parameters"]
    if expect and any(k in expect and have[k] != expect[k] for k in _RETRIEVAL_KEYS):
        return None
    return pd.read_csv(csv), prov


def retrieval_difference(committed: pd.DataFrame, live: pd.DataFrame) -> tuple[int, float, bool]:
    """The committed retrieval rows that ``live`` recomputed (same head, trial, arch, fix): how many, the
    largest |difference| of rel_l2, gain, carried and share, and whether every keep verdict agrees."""
    keys = ["head", "trial", "arch", "fix"]
    m = committed.merge(live, on=keys, suffixes=("_c", "_l"))
    if not len(m):
        return 0, float("nan"), True
    diff = max(float((m[f"{c}_c"] - m[f"{c}_l"]).abs().max()) for c in ("rel_l2", "gain", "carried", "share"))
    return len(m), diff, bool((m["kept_c"].astype(bool) == m["kept_l"].astype(bool)).all())


def rate_table(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Retrieval by share per group of ``by``: k retrieved of n haystacks, the rate, its Wilson 95%
    interval (lo, hi) and the text ``"k/n = r% [lo%, hi%]"``."""
    rows = []
    for key, g in df.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        k, n = int(g["retrieved"].astype(bool).sum()), len(g)
        lo, hi = stats.wilson(k, n)
        rows.append({**dict(zip(by, key)), "k": k, "n": n, "rate": k / n, "lo": lo, "hi": hi,
                     "retrieved (Wilson 95%)": stats.rate_text(k, n)})
    return pd.DataFrame(rows)


def slice_difference(committed: pd.DataFrame, live: pd.DataFrame) -> tuple[int, float, bool]:
    """The committed rows that ``live`` recomputed (same head, n_tokens, trial, fix): how many, the
    largest |difference| of rel_l2, gain and share, and whether every retrieval verdict agrees."""
    keys = ["head", "n_tokens", "trial", "fix"]
    m = committed.merge(live, on=keys, suffixes=("_c", "_l"))
    if not len(m):
        return 0, float("nan"), True
    diff = max(float((m[f"{c}_c"] - m[f"{c}_l"]).abs().max()) for c in ("rel_l2", "gain", "share"))
    return len(m), diff, bool((m["retrieved_c"].astype(bool) == m["retrieved_l"].astype(bool)).all())
