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
within a factor 2 of the exact one.
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
from ..output import repo_root
from ..provenance import checked

__all__ = [
    "SOURCES",
    "FIXES",
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
    reference output and the exact haystack mean h (both on the stored cache)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    needle: int
    weight: float
    ref: np.ndarray
    hbar: np.ndarray


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
    return decoder_profiles(kv, pd.read_csv(checked(repo_root() / q_path)))


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
    hbar = (ref - w[j] * v[j].astype(np.float64)) / (1.0 - w[j])
    return Haystack(q.astype(np.float32), k, v, j, float(w[j]), ref, hbar)


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
    root = repo_root() / folder
    prov = json.loads((root / "provenance.json").read_text())
    csv = checked(root / "needle.csv")      # its sha256 against provenance.json's record
    have = prov["parameters"]
    if any(k in expect and have[k] != expect[k] for k in _NEEDLE_KEYS):
        return None
    return pd.read_csv(csv), prov


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
