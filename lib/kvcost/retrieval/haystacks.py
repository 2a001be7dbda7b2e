"""Needle-in-a-haystack inputs for one decode row, built from real heads.

A haystack for a head profile (:func:`head_profiles`, from ``data/real_kv``; :func:`decoder_profiles`
from a real decoder's extract):

- V rows drawn per channel with the head's channel means and spreads (so its channel-mean
  ratio ρ = RMS(channel means) / RMS(channel spreads) is the real head's), tiled to ``head_dim``;
- keys N(0, 1) and a query scaled so that scores q·k/√d have the head's score spread;
- an attention sink at position 0 holding the head's sink share of the exact weight, and a
  needle in the middle with exact weight ``needle_weight`` (keys along q, solved in closed form);
- Q, K, V stored in e4m3 at scale 1.0 (vLLM's uncalibrated FP8 cache).

:func:`query_heads` / :func:`real_haystack`: every query head of the committed SmolLM2-135M extract
(5 layers x 9 query heads, their 3 KV heads' real keys and values), with the score profile taken from
the real rows — the real sink token, the real last 64 keys (recency) and a bulk resampled from the
head's real keys — at any context (see :func:`real_haystack` for what is held fixed as n grows).

Each :class:`Haystack` carries its float64 reference output on the stored cache and the same with the
needle's value replaced by the haystack mean, which :mod:`kvcost.retrieval.measure` reads.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvcost.inputs import extracts
from kvcost.numerics import fa3
from kvcost.paths import repo_path
from kvcost.provenance import checked

__all__ = ["QUERY_SOURCES", "RECENT", "SOURCES", "Haystack", "HeadProfile", "QueryHead", "decoder_profiles",
           "head_profiles", "load_profiles", "make_haystack", "pick_profiles", "profile_table", "query_heads",
           "query_table", "real_haystack"]


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


def head_profiles(kv: extracts.RealKV) -> list[HeadProfile]:
    """Every layer x head of ``kv``: V's channel statistics over non-special tokens, and from
    K·K/√d scores within each window (a key standing in for the query, itself excluded) the
    median score spread and the median weight on the window's first token ([CLS])."""
    keep = ~kv.special
    out = []
    for layer in range(kv.k.shape[0]):
        for head in range(kv.k.shape[1]):
            v = kv.v[layer, head][keep]
            mu, sd = v.mean(axis=0), v.std(axis=0)
            rho = extracts.channel_mean_ratio(v)
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


def decoder_profiles(kv: extracts.RealKV, query_stats: pd.DataFrame) -> list[HeadProfile]:
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
            rho = extracts.channel_mean_ratio(v)
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
    kv = extracts.load_real_kv(kv_path)
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


#: Tokens before the query that form the recent window of a real score profile.
RECENT = 64


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


#: The committed extracts with real queries, by name: SmolLM2-135M's five layers (0, 1, 10, 20, 29; 64 query
#: rows per head) and its every-head extract (all 30 layers, 8 rows per head; ``real_model_extract --heads``), and
#: Gemma 3 270M's every-head extract (its three global layers 5, 11, 17, four query heads on one KV head of 256
#: channels, 8 rows per head).
QUERY_SOURCES = {"smollm2": "data/real_model/smollm2_kv.npz", "smollm2-heads": "data/real_model/smollm2_heads.npz",
                 "gemma3-heads": "data/real_model/gemma3_270m/gemma3_270m_heads.npz"}


def query_heads(source: str = "smollm2") -> list[QueryHead]:
    """Every query head of ``source``'s committed extract (:data:`QUERY_SOURCES`; SmolLM2-135M's 9 query
    heads a layer, grouped three to a KV head; Gemma 3 270M's 4 on one), in layer then head order."""
    if source not in QUERY_SOURCES:
        raise ValueError(f"parameter 'source' must be one of {list(QUERY_SOURCES)} (the extracts with real "
                         f"queries), got {source!r}")
    path = repo_path(QUERY_SOURCES[source])
    kv = extracts.load_real_kv(path)                     # checks the extract's sha256
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
    k = h.k[idx]                                          # fancy indexing: new arrays already
    v = h.v[idx]
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
