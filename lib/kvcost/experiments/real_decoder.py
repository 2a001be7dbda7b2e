"""What notebook 08 computes from the real-decoder runs: SmolLM2-135M's K/V formats end to end.

Everything here reads committed results (``data/real_model/``) with numpy and pandas; the runs
themselves (torch) are ``scripts/real_model_*.py`` and ``scripts/llamacpp_reference.py``.

- :func:`format_table`: per format and context, perplexity, Δ perplexity from the fp32 cache,
  KL divergence, top-1 agreement, each with a Student-t 95% interval over text windows.
- :func:`llamacpp_comparison`: our Δ from the fp16 cache beside llama.cpp's on the same windows,
  with the tolerance the comparison is judged by (:func:`agreement`).
- :func:`passkey_table`: retrieval success per (context, variant) with Wilson intervals.
- :func:`storage_retrieval`: whether a stored format loses the passkey against exact attention on
  the same trials (McNemar, Holm-corrected), beside the format's KL divergence.
- :func:`layout_comparison`: a block format's loss with K's channels in the GGUF file's order
  (llama.cpp's, the default) against transformers' order (``@hf``), on the same windows.
- :func:`live_slice`: the numpy part of the pipeline on the committed extract (storage error of
  each format on real K/V, score spread and sink share of real queries), for nbval.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.inputs import extracts
from kvcost.models import decoders
from kvcost.paths import data_path, repo_path
from kvcost.provenance import checked
from kvcost.retrieval.collapse import frac_bits_of
from kvcost.storage.spec import CacheSpec, parse_spec

__all__ = ["DATA", "KL_MEASURABLE", "KL_REL_TOL", "STORE_FORMATS_NUMPY", "agreement", "engine_order",
           "element_of", "paired_ratio",
           "fast_vs_faithful",
           "fast_vs_faithful_summary", "format_table", "head_summary", "structure_by_layer_type",
           "layout_comparison", "live_slice",
           "llamacpp_comparison",
           "unit_rederivation", "load_provenance", "load_windows", "passkey_pivot",
           "passkey_table", "storage_retrieval"]

DATA = Path("data") / "real_model"
#: KL agreement: llama.cpp's KL minus its own floor (its bf16-cache KL on the same windows: K and V in
#: bf16 and Q rounded to K's vec-dot type, bf16 or q8_0 — noise our fp32 attention does not have) within
#: this relative distance of ours, for formats whose KL is at least KL_MEASURABLE times that floor. Chosen
#: after the first window was seen (not pre-registered): the engines' weights and Q rounding differ, so a
#: factor of 1.5 either way is what "the same loss" can mean here. (With K's blocks in llama.cpp's channel
#: order the ratios came out 0.97-1.14 on 2k windows; in transformers' order, up to 1.6.)
KL_REL_TOL = 0.5
KL_MEASURABLE = 2.0
#: The formats :func:`live_slice` round-trips by default (kvcost.models.decoders.store_kv is numpy alone).
STORE_FORMATS_NUMPY = ("bf16", "fp8_e4m3", "q8_0", "q4_0", "q5_1", "iq4_nl", "kivi2")


def _path(name: str, root: Path | None) -> Path:
    return (root / DATA if root else data_path("real_model")) / name


def load_windows(name: str = "ppl_windows.csv", root: Path | None = None) -> pd.DataFrame:
    """The per-window rows a run wrote (``ppl_windows.csv`` or ``llamacpp_windows.csv``)."""
    p = _path(name, root)
    if not p.is_file():
        raise ValueError(f"parameter 'name': no results file {name!r} in {DATA}")
    df = pd.read_csv(checked(p))
    need = {"context", "window", "format", "n", "nll_sum", "kl_fp32_sum", "kl_fp16_sum", "top1_fp32"}
    if not need <= set(df.columns):
        raise ValueError(f"parameter 'name': {name!r} lacks columns {sorted(need - set(df.columns))}")
    return df


def load_provenance(name: str, root: Path | None = None) -> dict:
    """The JSON provenance file written beside a results file (command, versions, date, digests)."""
    return json.loads(_path(name, root).read_text())


def _t_interval(x: np.ndarray) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = stats.t95(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


def _per_window(df: pd.DataFrame) -> pd.DataFrame:
    """Per-window perplexity, Δ from fp32 and fp16, mean KL and top-1 agreement (only windows
    that have both references)."""
    d = df.assign(ppl=np.exp(df["nll_sum"] / df["n"]), kl=df["kl_fp32_sum"] / df["n"],
                  kl16=df["kl_fp16_sum"] / df["n"], top1=df["top1_fp32"] / df["n"])
    ref = d[d["format"] == "fp32"].set_index(["context", "window"])["ppl"]
    ref16 = d[d["format"] == "fp16"].set_index(["context", "window"])["ppl"]
    key = list(zip(d["context"], d["window"]))
    ok = [k in ref.index and k in ref16.index for k in key]
    d = d[ok].copy()
    key = list(zip(d["context"], d["window"]))
    d["dppl"] = d["ppl"].to_numpy() - ref.loc[key].to_numpy()
    d["dppl16"] = d["ppl"].to_numpy() - ref16.loc[key].to_numpy()
    return d


_RANGE = {"ppl": (1.0, math.inf), "kl": (0.0, math.inf), "top1": (0.0, 1.0)}


def format_table(df: pd.DataFrame, min_windows: int = 1) -> pd.DataFrame:
    """One row per (context, format): ``windows``, ``tokens`` scored, and mean with a 95%
    Student-t interval over windows of ``ppl``, ``dppl`` (minus the fp32 cache's on the same
    window), ``dppl16`` (minus the fp16 cache's), ``kl`` (nats,
    from the fp32 cache) and ``top1`` (agreement with the fp32 cache); the intervals of ppl, kl
    and top1 are clipped to what they can be (ppl >= 1, kl >= 0, top1 in [0, 1]). Formats with
    fewer than ``min_windows`` windows are dropped. ``k_order``: the channel order K's blocks are cut in
    (``gguf``, llama.cpp's, the default; ``hf``, transformers' and vLLM's, the ``@hf`` formats; ``any`` for a
    format without blocks of channels) and ``rotated``:
    whether the spec rotates K and V (``+hadamard``), both read from the parsed spec; ``engine_order``
    (:func:`engine_order`): whether the row is measured as the engine that ships the format lays K out. Sorted
    by context, then mean KL."""
    rows = []
    for (c, fmt), g in _per_window(df).groupby(["context", "format"], sort=False):
        if len(g) < min_windows:
            continue
        spec = _spec(fmt)
        row = {"context": int(c), "format": fmt,
               "k_order": spec.k_order or ("gguf" if spec.k_format.channel_blocks else "any"),
               "engine_order": engine_order(spec), "rotated": spec.rotation is not None, "windows": len(g),
               "tokens": int(g["n"].sum())}
        for col in ("ppl", "dppl", "dppl16", "kl", "top1"):
            m, lo, hi = _t_interval(g[col].to_numpy())
            if col in _RANGE:                           # a t interval can reach past what the quantity can be
                lo, hi = max(lo, _RANGE[col][0]), min(hi, _RANGE[col][1])
            row.update({col: m, f"{col}_lo": lo, f"{col}_hi": hi})
        rows.append(row)
    cols = ["context", "format", "k_order", "engine_order", "rotated", "windows", "tokens"] + [
        f"{c}{s}" for c in ("ppl", "dppl", "dppl16", "kl", "top1") for s in ("", "_lo", "_hi")]
    return pd.DataFrame(rows, columns=cols).sort_values(["context", "kl", "format"], ignore_index=True)


def paired_ratio(df: pd.DataFrame, context: int, fmt: str, ref: str, col: str = "kl") -> dict | None:
    """``fmt``'s ``col`` (``kl`` or ``dppl``, per window, :func:`format_table`'s quantities) against ``ref``'s on
    the same windows at ``context``: the geometric mean of the per-window ratio fmt / ref with a Student-t 95%
    interval over windows (on the logs), and the windows paired. None when they share fewer than two windows or a
    ratio is not positive."""
    d = _per_window(df)
    d = d[d["context"] == context]
    a = d[d["format"] == fmt].set_index("window")[col]
    b = d[d["format"] == ref].set_index("window")[col]
    common = a.index.intersection(b.index)
    if len(common) < 2:
        return None
    r = a.loc[common].to_numpy() / b.loc[common].to_numpy()
    if not np.all(r > 0):
        return None
    m, lo, hi = _t_interval(np.log(r))
    return {"format": fmt, "ref": ref, "context": int(context), "col": col, "windows": len(common),
            "ratio": math.exp(m), "lo": math.exp(lo), "hi": math.exp(hi)}


def agreement(ours: float, ours_half: float, theirs: float, theirs_half: float, floor: float) -> bool:
    """True when two Δ-perplexity estimates agree: their difference is within the combined 95%
    half-widths (added in quadrature) plus ``floor`` — the model difference between the two
    engines (llama.cpp's Q4_1 weights with q8_1 activations and Q rounded to K's vec-dot type,
    against transformers' fp32 weights), measured as the fp16-cache gap."""
    return abs(ours - theirs) <= math.hypot(ours_half, theirs_half) + floor


def llamacpp_comparison(ours: pd.DataFrame, theirs: pd.DataFrame) -> pd.DataFrame:
    """Δ perplexity from each engine's own fp16 cache and KL from its own fp32 cache, on the
    windows both engines ran. Columns ``context, format, windows, ours_dppl, ours_lo, ours_hi,
    llamacpp_dppl, llamacpp_lo, llamacpp_hi, ours_kl, llamacpp_kl, floor, agrees``; ``floor``
    is the two engines' fp16-cache perplexity gap (mean absolute over the windows); ``agrees``
    is None (not tested) with fewer than two windows, where no interval exists. ``kl_ratio`` is
    (llama.cpp's KL − its bf16 floor) / ours and ``kl_agrees`` whether it is within
    :data:`KL_REL_TOL` of 1 (None when our KL is below :data:`KL_MEASURABLE` floors).
    ``kl_ratio_hf``: the same ratio against our ``@hf`` row (K's blocks cut in transformers'
    channel order instead of llama.cpp's) where it ran on the same windows, else NaN."""
    a, b = _per_window(ours), _per_window(theirs)
    common = set(zip(b["context"], b["window"], b["format"])) & set(zip(a["context"], a["window"], a["format"]))
    rows = []
    for c in sorted({k[0] for k in common}):
        wins = sorted({k[1] for k in common if k[0] == c and k[2] == "fp16"})
        kl_floor = b[(b["context"] == c) & (b["format"] == "bf16")].set_index("window")["kl"]
        pa = a[(a["context"] == c) & (a["format"] == "fp16") & a["window"].isin(wins)].set_index("window")["ppl"]
        pb = b[(b["context"] == c) & (b["format"] == "fp16") & b["window"].isin(wins)].set_index("window")["ppl"]
        floor = float(np.mean(np.abs(pa - pb.loc[pa.index]))) if len(pa) else math.nan
        for fmt in sorted({k[2] for k in common if k[0] == c} - {"fp32", "fp16"}):
            w = sorted({k[1] for k in common if k[0] == c and k[2] == fmt} & set(wins))
            if not w:
                continue
            ga = a[(a["context"] == c) & (a["format"] == fmt) & a["window"].isin(w)].sort_values("window")
            gb = b[(b["context"] == c) & (b["format"] == fmt) & b["window"].isin(w)].sort_values("window")
            ma, la, ha = _t_interval(ga["dppl16"].to_numpy())
            mb, lb, hb = _t_interval(gb["dppl16"].to_numpy())
            half_a = 0.0 if math.isnan(la) else (ha - la) / 2
            half_b = 0.0 if math.isnan(lb) else (hb - lb) / 2
            ours_kl, their_kl = float(ga["kl"].mean()), float(gb["kl"].mean())
            fl = float(kl_floor.reindex(w).mean()) if len(kl_floor) else math.nan
            measurable = fmt != "bf16" and not math.isnan(fl) and ours_kl >= KL_MEASURABLE * fl
            ratio = (their_kl - fl) / ours_kl if measurable else math.nan
            hf = a[(a["context"] == c) & (a["format"] == decoders.with_spec(fmt, k_order="hf")) & a["window"].isin(w)]
            ratio_hf = (their_kl - fl) / float(hf["kl"].mean()) if measurable and len(hf) == len(w) else math.nan
            rows.append({"context": c, "format": fmt, "windows": len(w), "ours_dppl": ma, "ours_lo": la,
                         "ours_hi": ha, "llamacpp_dppl": mb, "llamacpp_lo": lb, "llamacpp_hi": hb,
                         "ours_kl": ours_kl, "llamacpp_kl": their_kl, "llamacpp_kl_floor": fl,
                         "kl_ratio": ratio, "kl_agrees": bool(abs(ratio - 1) <= KL_REL_TOL) if measurable else None,
                         "kl_ratio_hf": ratio_hf, "floor": floor,
                         "agrees": agreement(ma, half_a, mb, half_b, floor) if len(w) >= 2 else None})
    return pd.DataFrame(rows)


def layout_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Each block format (plain or rotated) stored with K's channels in llama.cpp's order (the GGUF file's,
    the default) and in transformers' (``@hf``), on the windows both ran: one row per (context,
    format) with ``windows``, ``kl_gguf``, ``kl_hf``, ``ratio`` (gguf / hf, of the mean KLs) and its
    Student-t 95% interval over windows of the per-window ratio (``ratio_lo``, ``ratio_hi``; NaN
    with one window), ``dppl_gguf``, ``dppl_hf``. Sorted by context, then ratio."""
    d = _per_window(df)
    rows = []
    in_hf = np.array([_spec(f).k_order == "hf" for f in d["format"]], dtype=bool)
    for (c, fmt), g in d[in_hf].groupby(["context", "format"]):
        base = decoders.with_spec(fmt, k_order=None)
        hf = g.set_index("window")
        gg = d[(d["context"] == c) & (d["format"] == base)].set_index("window")
        w = sorted(set(hf.index) & set(gg.index))
        if not w:
            continue
        _, lo, hi = _t_interval((gg.loc[w, "kl"] / hf.loc[w, "kl"]).to_numpy())
        kg, kh = float(gg.loc[w, "kl"].mean()), float(hf.loc[w, "kl"].mean())
        rows.append({"context": int(c), "format": base, "windows": len(w), "kl_gguf": kg, "kl_hf": kh,
                     "ratio": kg / kh, "ratio_lo": lo, "ratio_hi": hi,
                     "dppl_gguf": float(gg.loc[w, "dppl"].mean()), "dppl_hf": float(hf.loc[w, "dppl"].mean())})
    cols = ["context", "format", "windows", "kl_gguf", "kl_hf", "ratio", "ratio_lo", "ratio_hi", "dppl_gguf",
            "dppl_hf"]
    return pd.DataFrame(rows, columns=cols).sort_values(["context", "ratio", "format"], ignore_index=True)


def passkey_table(df: pd.DataFrame) -> pd.DataFrame:
    """Success per (context, variant): ``trials``, ``successes``, ``rate``, Wilson 95% ``lo``/``hi``,
    ``text`` (stats.rate_text) and the median answer-logit ``margin``."""
    rows = []
    for (c, v), g in df.groupby(["context", "variant"], sort=False):
        k, n = int(g["success"].sum()), len(g)
        lo, hi = stats.wilson(k, n)
        rows.append({"context": int(c), "variant": v, "trials": n, "successes": k, "rate": k / n, "lo": lo,
                     "hi": hi, "text": stats.rate_text(k, n), "margin": float(g["margin"].median())})
    return pd.DataFrame(rows)


def passkey_pivot(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`passkey_table` as variants x contexts, each cell ``k/n = r% [lo, hi]`` ("" where the
    cell was not run). Rows: exact, the kernel by fraction bits (13 first), the kernel's other
    settings (vLLM's fixes, fast-mode rows), the faithful mode, then the storage formats (those in
    transformers' channel order, ``@hf``, last)."""
    if table.empty:
        return pd.DataFrame()

    def rank(v: str) -> tuple:
        bits = frac_bits_of(v)
        group = (0 if v == "exact" else 1 if bits is not None else 3 if v.startswith("fa3full")
                 else 2 if v.startswith("fa3") else 5 if _in_hf_order(v) else 4)
        return group, -(bits or 0), v

    order = sorted(dict.fromkeys(table["variant"]), key=rank)
    out = table.pivot(index="variant", columns="context", values="text").reindex(order).fillna("")
    out.columns = [f"{c} tokens" for c in out.columns]
    return out


def engine_order(spec: CacheSpec) -> bool:
    """Whether ``spec`` cuts K's blocks in the channel order of the engine that ships K's format: llama.cpp's
    (the GGUF file's, the default) for a format llama.cpp has, the model's own (``@hf``: vLLM and SGLang keep
    transformers' order) for a blocked format it lacks; any order for formats without blocks of channels,
    where the order changes nothing."""
    k = spec.k_format
    if not k.channel_blocks:
        return True
    in_llamacpp = any(engine == "llama.cpp" for engine, _ in k.engines)
    return (spec.k_order == "hf") != in_llamacpp


def _spec(fmt: str) -> CacheSpec:
    return parse_spec(fmt, param="format")


def element_of(fmt: str) -> str:
    """The element type (an ml_dtypes name, or the registry's family for formats without one) of K's format
    in a stored-format spec such as ``nvfp4@hf`` or ``q8_0/q4_0``."""
    f = _spec(fmt).k_format
    return f.element or f.family


def _in_hf_order(variant: str) -> bool:
    """A ``store:`` variant (or a format) whose K blocks are cut in transformers' channel order."""
    fmt = decoders.stored_format(variant) or variant
    try:
        return _spec(fmt).k_order == "hf"
    except ValueError:
        return False


def storage_retrieval(pk_rows: pd.DataFrame, fmt_table: pd.DataFrame, min_trials: int = 20,
                      alpha: float = 0.05) -> pd.DataFrame:
    """Does a storage format's loss reach retrieval? Per (context, ``store:`` variant) run on at least
    ``min_trials`` trials that exact attention also ran: ``successes`` against exact's on the same trials,
    its ``rate`` with the Wilson 95% interval ``lo``/``hi``, the discordant trials (``lost``: exact
    retrieved, the format did not; ``gained``: the reverse), the
    exact McNemar ``p_value`` and ``loses_needle`` — rejected by Holm's correction over all the rows at
    family-wise ``alpha`` (Tarone's refinement: rows with too few discordant trials to ever be
    significant do not count), with more trials lost than gained. Beside it, the format's mean KL divergence
    and Δ perplexity from the fp32 cache (``fmt_table``, :func:`format_table`) at the same context, or at
    the nearest context measured (the shorter on a tie) when the passkey's was not (``kl_context`` says
    which; a format's KL barely moves between 2k and 8k tokens, notebook 08). Sorted by context, then KL."""
    cols = ["context", "format", "trials", "successes", "rate", "lo", "hi", "exact_successes", "lost", "gained",
            "p_value", "loses_needle", "text", "kl", "dppl", "kl_context"]
    if pk_rows.empty:
        return pd.DataFrame(columns=cols)
    exact = pk_rows[pk_rows["variant"] == "exact"].set_index(["context", "trial"])["success"]
    rows = []
    stored = np.array([decoders.stored_format(v) is not None for v in pk_rows["variant"]], dtype=bool)
    for (c, v), g in pk_rows[stored].groupby(["context", "variant"]):
        key = [(c, t) for t in g["trial"]]
        paired = [k in exact.index for k in key]
        if sum(paired) < min_trials:
            continue
        ref = exact.loc[[k for k, ok in zip(key, paired) if ok]].to_numpy()
        one = stats.paired_binary(g["success"].to_numpy()[paired], ref)
        fmt = decoders.stored_format(v)
        k, n = one["successes"], one["trials"]
        measured = fmt_table[fmt_table["format"] == fmt].sort_values("context")
        near = measured.iloc[(measured["context"] - c).abs().argsort(kind="stable")].iloc[0] if len(measured) else None
        rows.append({"context": int(c), "format": fmt, "trials": n, "successes": k, "rate": k / n, "lo": one["lo"],
                     "hi": one["hi"], "exact_successes": one["ref_successes"], "lost": one["lost"],
                     "gained": one["gained"], "p_value": one["p_value"], "loses_needle": False,
                     "text": stats.rate_text(k, n),
                     "kl": float(near["kl"]) if near is not None else math.nan,
                     "dppl": float(near["dppl"]) if near is not None else math.nan,
                     "kl_context": int(near["context"]) if near is not None else None})
    out = pd.DataFrame(rows, columns=cols)
    if len(out):
        out["loses_needle"] = stats.paired_losses(out["lost"], out["gained"], alpha)
    return out.sort_values(["context", "kl", "format"], ignore_index=True)


def fast_vs_faithful(df: pd.DataFrame) -> pd.DataFrame:
    """Trials run in both modes: per (context, trial) and fast-mode variant, the answer-logit margin
    and success of the fast mode (``fa3[...]``: question and answer rows emulated, or with
    ``rows=answer`` only the answer's) beside the faithful mode with the same kernel options
    (``fa3full[...]``: every row of every layer) and exact attention."""
    def options(variant: str) -> frozenset[str]:
        opts = variant.partition(":")[2]
        return frozenset(o for o in opts.split(",") if o and not o.startswith("rows="))

    rows = []
    for (c, t), g in df.groupby(["context", "trial"]):
        by = g.set_index("variant")
        faithful = {options(v): v for v in by.index if v.startswith("fa3full")}
        for fast in by.index:
            if not (fast == "fa3" or fast.startswith("fa3:")) or options(fast) not in faithful:
                continue
            v = faithful[options(fast)]
            rows.append({"context": int(c), "trial": int(t), "kernel": fast, "faithful": v,
                         "exact_margin": float(by.loc["exact", "margin"]) if "exact" in by.index else math.nan,
                         "fast_margin": float(by.loc[fast, "margin"]), "faithful_margin": float(by.loc[v, "margin"]),
                         "fast_success": bool(by.loc[fast, "success"]),
                         "faithful_success": bool(by.loc[v, "success"]),
                         "fast_seconds": float(by.loc[fast, "seconds"]),
                         "faithful_seconds": float(by.loc[v, "seconds"])})
    return pd.DataFrame(rows)


def fast_vs_faithful_summary(both: pd.DataFrame) -> pd.DataFrame:
    """Per fast-mode variant over its trials: how often fast and faithful agree on success, and how
    much the fast mode overstates the answer margin (fast minus faithful: median and largest),
    with the median seconds of each mode."""
    if both.empty:
        return pd.DataFrame()
    rows = []
    for (c, kernel), g in both.groupby(["context", "kernel"], sort=False):
        gap = g["fast_margin"] - g["faithful_margin"]
        rows.append({"context": int(c), "kernel": kernel, "faithful": g["faithful"].iloc[0], "trials": len(g),
                     "same_outcome": int((g["fast_success"] == g["faithful_success"]).sum()),
                     "fast_successes": int(g["fast_success"].sum()),
                     "faithful_successes": int(g["faithful_success"].sum()),
                     "margin_gap_median": float(gap.median()), "margin_gap_max": float(gap.max()),
                     "fast_seconds": float(g["fast_seconds"].median()),
                     "faithful_seconds": float(g["faithful_seconds"].median())})
    return pd.DataFrame(rows)


def head_summary(heads: pd.DataFrame, queries: pd.DataFrame) -> pd.DataFrame:
    """The real decoder's structure in one table: how many KV heads have persistent outlier
    channels in K before / after RoPE, outlier tokens in V, and the medians of ρ, score spread
    and sink share."""
    n = len(heads)
    rows = [
        ("KV heads with a persistent K outlier channel (ratio >= 4), before RoPE",
         f"{int((heads['k_pre_persistent_channels'] > 0).sum())} of {n}"),
        ("... after RoPE", f"{int((heads['k_post_persistent_channels'] > 0).sum())} of {n}"),
        ("median largest K channel ratio, before / after RoPE",
         f"{heads['k_pre_max_channel_ratio'].median():.1f} / {heads['k_post_max_channel_ratio'].median():.1f}"),
        ("KV heads with a V outlier token (norm ratio >= 6)", f"{int((heads['v_outlier_tokens'] > 0).sum())} of {n}"),
        ("largest V token-norm ratio", f"{heads['v_max_token_ratio'].max():.2f}"),
        ("median rho (V channel means / spreads)", f"{heads['rho'].median():.2f}"),
        ("median score spread (std of q.k/sqrt(d) per row)", f"{queries['score_spread'].median():.2f}"),
        ("query heads whose median sink share (weight on token 0) >= 0.5",
         f"{int((queries['sink_share'] >= 0.5).sum())} of {len(queries)}"),
    ]
    return pd.DataFrame(rows, columns=["measure", "value"])


def structure_by_layer_type(heads: pd.DataFrame, queries: pd.DataFrame) -> pd.DataFrame:
    """A decoder's K/V structure per attention type (Gemma 3's extract: ``layer_type`` sliding or full; a
    decoder without the column counts as all ``full``): one row per type with ``layers``, ``kv_heads``, for
    each K stage in the extract (``k_pre``: k_proj's output; ``k_norm``: after QK-norm; ``k_post``: after
    RoPE) the KV heads with a persistent outlier channel (ratio >= 4) and the median largest channel ratio,
    V's outlier-token heads and largest token-norm ratio, median rho, and over the query heads the median
    score spread, the median sink share (weight on token 0, only where the window reaches it: NaN for a
    sliding layer past its window) and the median top weight."""
    h = heads if "layer_type" in heads else heads.assign(layer_type="full")
    q = queries if "layer_type" in queries else queries.assign(layer_type="full")
    stages = [s for s in ("k_pre", "k_norm", "k_post") if f"{s}_max_channel_ratio" in h]
    rows = []
    for kind, g in h.groupby("layer_type", sort=True):
        qq = q[q["layer_type"] == kind]
        row = {"layer_type": kind, "layers": " ".join(map(str, sorted(g["layer"].unique()))), "kv_heads": len(g)}
        for s in stages:
            row[f"{s}_persistent_heads"] = int((g[f"{s}_persistent_channels"] > 0).sum())
            row[f"{s}_max_ratio_median"] = float(g[f"{s}_max_channel_ratio"].median())
        row.update({"v_outlier_heads": int((g["v_outlier_tokens"] > 0).sum()),
                    "v_max_token_ratio": float(g["v_max_token_ratio"].max()), "rho_median": float(g["rho"].median()),
                    "score_spread_median": float(qq["score_spread"].median()),
                    "sink_share_median": float(qq["sink_share"].median()) if qq["sink_share"].notna().any()
                    else math.nan,
                    "top_weight_median": float(qq["top_weight"].median())})
        rows.append(row)
    return pd.DataFrame(rows)


def live_slice(path: str | Path | None = None, formats: tuple[str, ...] = STORE_FORMATS_NUMPY,
               hadamard: bool = True, hf_layout: bool = False) -> pd.DataFrame:
    """The storage step on real K/V, recomputed from the committed extract with numpy alone.

    For each format (and its Hadamard-rotated twin, where the format has one; with ``hf_layout`` also
    its ``@hf`` twin where K's channel order matters): relative L2 error of K and V, and of the attention output of the
    extract's last 64 real queries (their scores against the stored K, softmax, times the stored
    V) against the unquantized cache, median over layers and heads. The round trip is
    :func:`kvcost.models.decoders.store_kv`, the one the model runs use.
    """
    p = repo_path(Path(path) if path else DATA / "smollm2_kv.npz")
    kv = extracts.load_real_kv(p)
    with np.load(p, allow_pickle=False) as z:
        q, q_pos = z["q"].astype(np.float64), z["q_pos"]
    k, v = kv.k, kv.v
    n_l, hk, t, d = k.shape
    group = q.shape[1] // hk
    mask = np.arange(t)[None, :] > q_pos[:, None]

    def attend(kk: np.ndarray, vv: np.ndarray) -> np.ndarray:
        out = np.empty(q.shape)
        for layer in range(n_l):
            for h in range(q.shape[1]):
                s = q[layer, h] @ kk[layer, h // group].T / math.sqrt(d)
                s = np.where(mask, -np.inf, s)
                e = np.exp(s - s.max(axis=1, keepdims=True))
                out[layer, h] = (e / e.sum(axis=1, keepdims=True)) @ vv[layer, h // group]
        return out

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.median(np.linalg.norm(a - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))))

    ref = attend(k, v)
    names = []
    for fmt in formats:
        decoders.parse_format(fmt)
        twin = decoders.with_spec(fmt, rotation="hadamard")
        for name in ([fmt, twin] if hadamard and twin in decoders.STORAGE_FORMATS else [fmt]):
            names.append(name)
            if hf_layout and decoders.layout_matters(name):
                names.append(decoders.with_spec(name, k_order="hf"))
    rows = []
    for name in names:
        kh, vh = (np.asarray(x, dtype=np.float64) for x in decoders.store_kv(k, v, name))
        rows.append({"format": name, "k_rel_l2": rel(kh, k), "v_rel_l2": rel(vh, v),
                     "out_rel_l2": rel(attend(kh, vh), ref)})
    return pd.DataFrame(rows)


def unit_rederivation(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """The FP8 kernel's passkey cells run twice on the same trials: ``old`` on the products-only FP8 model
    (the committed grid, ``frac_bits`` narrowing QKᵀ and P·V), ``new`` on Hopper's unit bit for bit MMA-Sim
    (``frac_bits`` narrowing P·V alone). One row per (context, variant) present in both: trials,
    successes_old / successes_new, lost / gained (trials only the old / only the new kernel retrieved),
    exact McNemar ``p``, the smallest p the discordant trials could give (``min_p``), the median margin
    of each and the median change of margin."""
    keys = ["context", "trial", "variant"]
    cols = [*keys, "success", "margin"]
    both = old[cols].merge(new[cols], on=keys, suffixes=("_old", "_new"))
    rows = []
    for (c, v), g in both.groupby(["context", "variant"], sort=False):
        lost = int(((g["success_old"] == 1) & (g["success_new"] == 0)).sum())
        gained = int(((g["success_old"] == 0) & (g["success_new"] == 1)).sum())
        rows.append({"context": int(c), "variant": v, "trials": len(g), "successes_old": int(g["success_old"].sum()),
                     "successes_new": int(g["success_new"].sum()), "lost": lost, "gained": gained,
                     "p": stats.mcnemar_exact(lost, gained), "min_p": stats.mcnemar_min_p(lost + gained),
                     "margin_old": float(g["margin_old"].median()), "margin_new": float(g["margin_new"].median()),
                     "margin_change": float((g["margin_new"] - g["margin_old"]).median())})
    return pd.DataFrame(rows)
