"""Notebook 06's tables: one decode row through FlashAttention-3's FP8 kernel (:mod:`kvcost.fa3`)
at long context, on haystacks whose per-head statistics come from real tensors.

The haystacks and the retrieval measure are the primitives of :mod:`kvcost.retrieval` (shared with
notebooks 09 and 10): :mod:`kvcost.retrieval.haystacks` builds them from real heads,
:mod:`kvcost.retrieval.measure` says whether the kernel kept the needle (the carried weight, apart from
the output's gain). Here: the grids over kernels, fixes, contexts and heads, and the committed runs.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.numerics import fa3, tensorcore
from kvcost.paths import repo_path
from kvcost.provenance import checked
from kvcost.retrieval.haystacks import Haystack, HeadProfile, QueryHead, make_haystack, real_haystack
from kvcost.retrieval.measure import carried, metrics

__all__ = [
    "FIXES",
    "REFERENCE",
    "RETRIEVAL_CELLS",
    "cell_kwargs",
    "carried_grid",
    "committed_retrieval",
    "retrieval_difference",
    "retrieval_grid",
    "kept_table",
    "WHERE",
    "NEEDLE_DIR",
    "committed_needle",
    "context_grid",
    "knob_grid",
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
