"""Notebook 10: which GPU and kernel lose the needle — error and retrieval against context per kernel.

Every kernel of :data:`kvcost.numerics.kernels.KERNELS` (its facts from ``data/attention_kernels.csv``) runs
on the same haystacks: notebook 06's real score profiles (:func:`kvcost.experiments.haystacks.real_haystack`:
SmolLM2-135M's query heads, real sink and recent window, the bulk resampled from real keys, a needle of
stated exact weight), each run with the needle and with its value replaced by the haystack mean, read by
notebook 06's measures: the output's error and gain against exact attention on the stored cache
(:func:`~kvcost.experiments.measure.metrics`) and the needle's carried weight, kept by
:data:`~kvcost.experiments.measure.KEEP` (:func:`~kvcost.experiments.measure.carried`).

- :func:`grid`: rows per kernel x context x head x haystack;
- :func:`law_grid`: FA3's no-fix pass with P·V's kept fraction bits set to F (13: Hopper's FP8 unit, 25:
  Blackwell's tcgen05, 35: the block-scaled units' exact 16-term groups) for the n·2^-F law, and
  :func:`law_fit`, its constant per F with a head-clustered bootstrap interval;
- :func:`summary`, :func:`first_loss`: kept rates with head-clustered intervals, and where each kernel
  first loses the needle (or the context up to which no loss was detected, with the loss it could detect).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.numerics import fa3, kernels
from kvcost.paths import data_path
from kvcost.provenance import checked
from kvcost.retrieval import haystacks, measure

__all__ = ["COMMITTED", "EVERY_HEAD_KERNELS", "GEMMA_HEAD_GRIDS", "LAW_FRAC_BITS", "LAW_GRIDS", "SLICE_TOL",
           "SMOLLM2_HEAD_GRIDS", "committed", "first_loss", "grid", "head_rates", "head_spread", "law_fit", "law_fits",
           "law_grid", "law_runs", "pick_heads", "restored", "slice_check", "summary"]

#: The committed grid and law runs (scripts/which_gpu_grid.py, sweeps/which_gpu.yaml): a folder of the package
#: data (``data/which_gpu`` in a checkout).
COMMITTED = "which_gpu"
#: Kept fraction bits of the three unit families the law is fitted across.
LAW_FRAC_BITS = (13, 25, 35)
#: The kernels run on every query head (data/which_gpu/grid_heads*.csv): all of kvcost.numerics.kernels.KERNELS,
#: the six run first (the one that loses the needle at 4k, FA4's stale running max, and its two
#: fixes; FA3 without and with the two-level fix; CDNA3's), then the other seven in the registry's order, as the
#: committed tables hold them (sweeps/which_gpu_heads.yaml).
_RUN_FIRST = ("FA4 FP8, offset 8, stale max 4 (PR #2109)", "FA3 FP8, no fix", "CK fmha FP8 (CDNA3)",
              "FA4 FP8, offset 4 (PR #2717)", "FA4 FP8, offset 8, max every tile (PR #2731)",
              "FA3 FP8, PR #104 (every tile)")
EVERY_HEAD_KERNELS = _RUN_FIRST + tuple(k for k in kernels.KERNELS if k not in _RUN_FIRST)
#: The same kernels on every query head of Gemma 3 270M's global layers (haystacks.QUERY_SOURCES "gemma3-heads"),
#: one committed table per context run.
GEMMA_HEAD_GRIDS = ("grid_heads_gemma.csv", "grid_heads_gemma_32k.csv", "grid_heads_gemma_128k.csv",
                    "grid_heads_gemma_1m.csv")
#: SmolLM2's every-head grid beyond 4k (grid_heads.csv): the same kernels, heads and haystacks per head at 32k,
#: 128k and 1M, one committed table per context run (sweeps/which_gpu_heads.yaml).
SMOLLM2_HEAD_GRIDS = ("grid_heads_32k.csv", "grid_heads_128k.csv", "grid_heads_1m.csv")
#: The n·2^-F law's committed runs per decoder: its table, the query heads it ran on (haystacks.QUERY_SOURCES) and
#: which of them: SmolLM2's on ``heads`` spread over its 4-layer extract (law.csv, 4 heads), Gemma 3 270M's on all
#: 12 query heads of its global layers (law_gemma.csv); one haystack per head and context, 4k to 128k.
LAW_GRIDS: dict[str, tuple[str, str, str]] = {"SmolLM2-135M": ("law.csv", "smollm2", "spread"),
                                              "Gemma 3 270M": ("law_gemma.csv", "gemma3-heads", "all")}
_BATCH_ELEMENTS = 1 << 25


def pick_heads(count: int, source: str = "smollm2") -> list[haystacks.QueryHead]:
    """``count`` query heads spread evenly over the extract's layers and heads (first and last included)."""
    heads = haystacks.query_heads(source)
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= len(heads):
        raise ValueError(f"parameter 'heads' must be an integer between 2 and {len(heads)}, got {count!r}")
    idx = np.unique(np.round(np.linspace(0, len(heads) - 1, count)).astype(int))
    return [heads[i] for i in idx]


def restored(h: haystacks.Haystack, k: kernels.Kernel) -> haystacks.Haystack:
    """Haystack ``h`` (stored e4m3) as kernel ``k`` reads it: unchanged for an e4m3 cache; for a cache in
    another format (NVFP4) K, V and the swapped-in mean are stored in it from ``h``'s values and the exact
    reference outputs recomputed on what is stored (so error means the kernel's arithmetic, not storage)."""
    if k.kv_format == "e4m3":
        return h
    kk = kernels.stored(h.k, k)
    vv = kernels.stored(h.v, k)
    q = h.q.astype(np.float64)
    s = kk.astype(np.float64) @ q / math.sqrt(q.shape[0])
    w = np.exp(s - s.max())
    w /= w.sum()
    j = h.needle
    ref = w @ vv.astype(np.float64)
    hbar = (ref - w[j] * vv[j].astype(np.float64)) / (1.0 - w[j])
    swap = kernels.stored(hbar[None, :], k)[0]
    ref_off = ref + w[j] * (swap.astype(np.float64) - vv[j].astype(np.float64))
    return haystacks.Haystack(h.q, kk, vv, j, float(w[j]), ref, hbar, swap, ref_off, h.parts)


def _heads(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays stacked along a new first (head) axis; one array as a view (no copy of a 1M-token cache)."""
    return arrays[0][None] if len(arrays) == 1 else np.stack(arrays)


def grid(ks: Sequence[kernels.Kernel], heads: Sequence[haystacks.QueryHead], n: int, trials: int, needle_weight: float,
         seed: int, splits: int = 1) -> pd.DataFrame:
    """Every head x haystack (seeds ``seed + t``) at context ``n`` through each kernel, with the needle and
    with its value replaced by h̄: rows kernel, gpu, n_tokens, head, layer, trial, needle_w, rel_l2, gain,
    carried, off_axis, kept."""
    d = heads[0].k.shape[1]
    per = max(1, _BATCH_ELEMENTS // (n * d))
    keys = [(h, t) for h in heads for t in range(trials)]
    rows = []
    for b0 in range(0, len(keys), per):
        batch = keys[b0:b0 + per]
        base = [haystacks.real_haystack(h, n, needle_weight, seed + t) for h, t in batch]
        group = None
        for kern in ks:
            # kernels in a row that read the cache alike share its stacked, stored, transposed and weighted
            # operands (fa3.attend's ``prepared``); a new group lets the last one's go
            if (kern.kv_format, kern.storage_only) != group:
                group, prepared = (kern.kv_format, kern.storage_only), {}
                hs = [restored(x, kern) for x in base]
                q, k, v, v_off = (_heads([a(x) for x in hs]) for a in (lambda x: x.q[None, :], lambda x: x.k,
                                                                      lambda x: x.v, lambda x: x.v_off()))
            outs = kern.attend(q, k, v, splits=splits, prepared=prepared)[:, 0]
            offs = kern.attend(q, k, v_off, splits=splits, prepared=prepared)[:, 0]
            for i, ((h, t), x) in enumerate(zip(batch, hs)):
                m = measure.metrics(x, outs[i])
                rows.append({"kernel": kern.label, "gpu": kern.arch, "n_tokens": n, "head": h.label,
                             "layer": h.layer, "trial": t, "needle_w": x.weight, "splits": splits,
                             "rel_l2": m["rel_l2"], "gain": m["gain"], **measure.carried(x, outs[i], offs[i])})
    return pd.DataFrame(rows)


def law_grid(heads: Sequence[haystacks.QueryHead], ns: Sequence[int], trials: int, needle_weight: float, seed: int,
             frac_bits: Sequence[int] = LAW_FRAC_BITS, block_n: int = 128) -> pd.DataFrame:
    """FA3's no-fix FP8 pass on Hopper's unit with P·V's kept fraction bits set to each F (the register
    e8m{min(F, 23)}, truncated): rows frac_bits, n_tokens, head, trial, rel_l2, gain, x = n·2^-F."""
    rows = []
    for n in ns:
        hs = [(h, t, haystacks.real_haystack(h, n, needle_weight, seed + t)) for h in heads for t in range(trials)]
        q = np.stack([x.q for _, _, x in hs])[:, None, :]
        k = np.stack([x.k for _, _, x in hs])
        v = np.stack([x.v for _, _, x in hs])
        for f in frac_bits:
            outs = fa3.attend(q, k, v, block_n=block_n, frac_bits=int(f))[:, 0]
            for i, (h, t, x) in enumerate(hs):
                m = measure.metrics(x, outs[i])
                rows.append({"frac_bits": int(f), "n_tokens": n, "head": h.label, "trial": t,
                             "rel_l2": m["rel_l2"], "gain": m["gain"], "x": n * 2.0 ** -int(f)})
    return pd.DataFrame(rows)


def law_fit(df: pd.DataFrame, boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per F: the constant c of rel_l2 = c·n·2^-F (the geometric mean of rel_l2 / (n·2^-F) over haystacks)
    with a 95% bootstrap interval that resamples heads (clusters), and the slope of log rel_l2 on log n
    (1 where the law holds), its interval from the same bootstrap."""
    rng = np.random.default_rng(seed)
    out = []
    for f, g in df.groupby("frac_bits", sort=True):
        g = g[g["rel_l2"] > 0]
        heads = sorted(g["head"].unique())
        by = {h: g[g["head"] == h] for h in heads}

        def fit(sub: pd.DataFrame) -> tuple[float, float]:
            lc = float(np.mean(np.log(sub["rel_l2"]) - np.log(sub["x"])))
            slope = float(np.polyfit(np.log(sub["n_tokens"]), np.log(sub["rel_l2"]), 1)[0])
            return math.exp(lc), slope

        c, slope = fit(g)
        bs = np.array([fit(pd.concat([by[heads[i]] for i in rng.integers(0, len(heads), len(heads))]))
                       for _ in range(boot)])
        out.append({"frac_bits": int(f), "c": c, "c_lo": float(np.quantile(bs[:, 0], 0.025)),
                    "c_hi": float(np.quantile(bs[:, 0], 0.975)), "slope": slope,
                    "slope_lo": float(np.quantile(bs[:, 1], 0.025)), "slope_hi": float(np.quantile(bs[:, 1], 0.975)),
                    "heads": len(heads), "haystacks": len(g)})
    return pd.DataFrame(out)


def law_runs(source: str, contexts: Sequence[int], heads: int, trials: int, needle_weight: float,
             seed: int) -> dict[str, pd.DataFrame]:
    """Each decoder's law table (:data:`LAW_GRIDS`) at ``contexts``: ``source="committed"`` reads the committed
    table (sha256 and parameters checked: SmolLM2's run on ``heads`` heads, Gemma's on all its global-layer
    heads, ``trials`` haystacks each); ``"live"`` runs :func:`law_grid` on the same heads."""
    if source not in ("committed", "live"):
        raise ValueError(f"parameter 'source' must be 'committed' or 'live', got {source!r}")
    out = {}
    for model, (name, query_source, which) in LAW_GRIDS.items():
        count = heads if which == "spread" else "all"
        if source == "committed":
            expect = dict(heads=count, trials=trials, needle_weight=needle_weight, seed=seed)
            if query_source != "smollm2":           # law.csv predates the runner's source parameter
                expect["source"] = query_source
            df, _ = committed(name, expect)
            missing = sorted(set(contexts) - set(df["n_tokens"]))
            if missing:
                raise ValueError(f"parameter 'law_contexts': {missing} not in data/{COMMITTED}/{name} "
                                 f"(committed: {sorted(set(df['n_tokens']))})")
            out[model] = df[df["n_tokens"].isin(contexts)].reset_index(drop=True)
        else:
            hs = pick_heads(heads, query_source) if which == "spread" else haystacks.query_heads(query_source)
            out[model] = law_grid(hs, contexts, trials, needle_weight, seed)
    return out


def law_fits(laws: dict[str, pd.DataFrame], boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """:func:`law_fit` per decoder (``laws``: name → its law table), a leading ``model`` column."""
    return pd.concat([law_fit(df, boot=boot, seed=seed).assign(model=model) for model, df in laws.items()],
                     ignore_index=True).pipe(lambda f: f[["model", *[c for c in f.columns if c != "model"]]])


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel x context: kept k/n, the rate pooled over heads with its clustered 95% interval
    (:func:`kvcost.stats.clustered_rate`), median error, gain and carried weight."""
    out = []
    for (kern, n), g in df.groupby(["kernel", "n_tokens"], sort=False):
        per = g.groupby("head", sort=False)["kept"].agg(["sum", "count"])
        rate, lo, hi, n_eff = stats.clustered_rate(per["sum"].astype(int).tolist(), per["count"].astype(int).tolist())
        out.append({"kernel": kern, "gpu": g["gpu"].iloc[0], "n_tokens": int(n), "kept": int(g["kept"].sum()),
                    "haystacks": len(g), "kept_rate": rate, "lo": lo, "hi": hi, "n_eff": n_eff,
                    "rel_l2": float(g["rel_l2"].median()), "gain": float(g["gain"].median()),
                    "carried": float(g["carried"].median())})
    res = pd.DataFrame(out)
    order = {k: i for i, k in enumerate(df["kernel"].unique())}
    return res.sort_values(["kernel", "n_tokens"], key=lambda c: c.map(order) if c.name == "kernel" else c,
                           kind="stable").reset_index(drop=True)


def head_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel x context x head: haystacks kept of haystacks and the rate (the spread across heads that
    :func:`summary`'s pooled rate hides), with the head's layer and query-head index."""
    g = df.groupby(["kernel", "gpu", "n_tokens", "layer", "head"], sort=False)["kept"]
    out = g.agg(kept="sum", haystacks="count").reset_index()
    out["kept"] = out["kept"].astype(int)
    out.insert(4, "q_head", [int(h.rsplit("q", 1)[1]) for h in out["head"]])    # labels are L<layer>q<head>
    out["rate"] = out["kept"] / out["haystacks"]
    return out


def head_spread(rates: pd.DataFrame) -> pd.DataFrame:
    """Per kernel x context, from :func:`head_rates`: layers, heads, heads that kept every haystack and heads
    that kept none, the layers whose heads lost any, and the pooled rate with its interval clustered by head."""
    out = []
    for (kern, n), g in rates.groupby(["kernel", "n_tokens"], sort=False):
        rate, lo, hi, n_eff = stats.clustered_rate(g["kept"].tolist(), g["haystacks"].tolist())
        lossy = g[g["kept"] < g["haystacks"]]
        out.append({"kernel": kern, "gpu": g["gpu"].iloc[0], "n_tokens": int(n), "layers": g["layer"].nunique(),
                    "heads": len(g),
                    "heads_all_kept": int((g["kept"] == g["haystacks"]).sum()),
                    "heads_none_kept": int((g["kept"] == 0).sum()),
                    "kept": int(g["kept"].sum()), "haystacks": int(g["haystacks"].sum()),
                    "kept_rate": rate, "lo": lo, "hi": hi, "n_eff": n_eff,
                    "lossy_layers": " ".join(str(x) for x in sorted(lossy["layer"].unique())),
                    "all_layers": " ".join(str(x) for x in sorted(g["layer"].unique()))})
    return pd.DataFrame(out)


def first_loss(summ: pd.DataFrame, ceiling: float = 0.95) -> pd.DataFrame:
    """Per kernel: the first context whose kept rate's upper bound falls below ``ceiling`` (a loss detected),
    else the largest context run with the smallest loss rate its interval excludes (1 − lo)."""
    out = []
    for kern, g in summ.groupby("kernel", sort=False):
        g = g.sort_values("n_tokens")
        lost = g[g["hi"] < ceiling]
        if len(lost):
            r = lost.iloc[0]
            out.append({"kernel": kern, "gpu": r["gpu"], "loses_at": int(r["n_tokens"]), "checked_to": None,
                        "kept": f"{r['kept']}/{r['haystacks']}", "kept_rate": r["kept_rate"], "lo": r["lo"],
                        "hi": r["hi"], "detectable_loss": None})
        else:
            r = g.iloc[-1]
            out.append({"kernel": kern, "gpu": r["gpu"], "loses_at": None, "checked_to": int(r["n_tokens"]),
                        "kept": f"{r['kept']}/{r['haystacks']}", "kept_rate": r["kept_rate"], "lo": r["lo"],
                        "hi": r["hi"], "detectable_loss": 1.0 - r["lo"]})
    return pd.DataFrame(out)


def committed(name: str, expect: dict | None = None, folder: str = COMMITTED) -> tuple[pd.DataFrame, dict]:
    """A committed table of ``folder`` (``grid.csv`` or ``law.csv``), its sha256 checked against the
    provenance recorded beside it, and that provenance; ``expect``: parameters it must have been run with."""
    path = data_path(folder, name)
    prov_path = data_path(folder, name.replace(".csv", ".json"))
    prov = json.loads(prov_path.read_text())
    if expect:
        diff = {k: (prov["parameters"].get(k), v) for k, v in expect.items() if prov["parameters"].get(k) != v}
        if diff:
            raise ValueError(f"{folder}/{name} was run with other parameters (committed, asked): {diff}")
    return pd.read_csv(checked(path)), prov


#: The largest difference of rel_l2 or carried weight :func:`slice_check` reads as float64 rounding.
SLICE_TOL = 1e-12


def slice_check(committed_df: pd.DataFrame, live: pd.DataFrame, keys: Sequence[str] = ("kernel", "n_tokens", "head",
                                                                                        "trial")) -> dict:
    """The live rows against the committed rows of the same keys: rows matched, the largest difference of
    rel_l2 and of the carried weight, and whether every kept verdict agrees; ``same_to_rounding``: the verdicts agree
    and both differences are at most ``SLICE_TOL`` (the emulation is deterministic on one machine, but numpy's float64
    reductions may round differently on another CPU: differences of 1e-17 were seen between two machines here, so a
    larger difference means the code or the data changed)."""
    m = live.merge(committed_df, on=list(keys), suffixes=("_live", "_committed"))
    if not len(m):
        raise ValueError("no committed row matches the live slice: were the grid's heads, trials or contexts changed?")
    cols = [c for c in ("rel_l2", "carried") if f"{c}_live" in m]
    diff = {c: float((m[f"{c}_live"] - m[f"{c}_committed"]).abs().max()) for c in cols}
    agree = bool((m["kept_live"] == m["kept_committed"]).all()) if "kept_live" in m else True
    return {"rows": len(m), **{f"max_diff_{c}": v for c, v in diff.items()}, "kept_agree": agree,
            "same_to_rounding": agree and all(v <= SLICE_TOL for v in diff.values())}
