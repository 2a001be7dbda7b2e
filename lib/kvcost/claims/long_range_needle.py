"""Notebook 06's readings: the post's and vLLM's claims about the long-range failure, each checked
against the FA3 emulation's tables (:mod:`kvcost.experiments.long_range_needle`). Every sentence is
computed from the tables; published figures are read from ``data/accumulation_published.csv``.

Each reading holds, does not hold, or is not shown at this number of haystacks (a comparison of rates
whose Wilson 95% intervals overlap: the check's ``agrees`` is None, its word ``report.NOT_SHOWN``)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.claims.report import READING, Check, Verdict
from kvcost.experiments.long_range_needle import REFERENCE, kept_table, published_niah, rate_table
from kvcost.retrieval.measure import KEEP

__all__ = ["errata", "loss_verdicts", "not_shown_markdown", "pct", "pct_table", "printed", "propagation_reading",
           "readings", "scaling_fit",
           "threshold_table", "verdict"]

#: The output "shrinks" when the gain's 95% interval (over heads) lies below 1 - SHRINK_TOL.
SHRINK_TOL = 0.01

def pct(x: float) -> str:
    """A relative error as a percentage with two significant digits (never rounding noise)."""
    if not np.isfinite(x):
        return "n/a"
    if x < 1e-6:
        return "< 0.0001%"
    return f"{100 * x:.2g}%"


def pct_table(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    """A display copy of ``df`` with the relative-error columns ``cols`` shown by :func:`pct`."""
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(pct)
    return out


def _med(df: pd.DataFrame, col: str, name: str, metric: str = "rel_l2") -> float:
    sel = df[df[col] == name]
    return float(sel[metric].median()) if len(sel) else float("nan")


def _rate(df: pd.DataFrame) -> str:
    return stats.rate_text(int(df["retrieved"].sum()), len(df))


def scaling_fit(scaling: pd.DataFrame, level: float = 0.1) -> dict[str, float]:
    """How well the acc_o error curves for different frac_bits collapse onto one function of
    x = n·2^-frac_bits: ``spread_dex`` = the largest gap between curves (log10 units) where
    their x ranges overlap, ``range_dex`` = how far the error moves over x, and ``x_at_level``
    = the x where the pooled curve first reaches ``level`` (NaN if it never does)."""
    g = scaling.groupby(["frac_bits", "x"], as_index=False)["acc_error"].median()
    curves = {fb: d.sort_values("x") for fb, d in g.groupby("frac_bits")}
    lo = max(float(d["x"].min()) for d in curves.values())
    hi = min(float(d["x"].max()) for d in curves.values())
    spread = float("nan")
    if lo < hi:
        grid = np.geomspace(lo, hi, 9)
        vals = np.array([np.interp(np.log(grid), np.log(d["x"]), np.log10(np.maximum(d["acc_error"], 1e-12)))
                         for d in curves.values()])
        spread = float((vals.max(axis=0) - vals.min(axis=0)).max())
    pooled = g.groupby("x")["acc_error"].median().sort_index()
    lg = np.log10(np.maximum(pooled.to_numpy(), 1e-12))
    above = np.flatnonzero(pooled.to_numpy() >= level)
    x_level = float("nan")
    if len(above) and above[0] > 0:
        i = above[0]
        x0, x1 = np.log(pooled.index[i - 1]), np.log(pooled.index[i])
        y0, y1 = lg[i - 1], lg[i]
        x_level = float(np.exp(x0 + (np.log10(level) - y0) * (x1 - x0) / (y1 - y0)))
    elif len(above):
        x_level = float(pooled.index[above[0]])
    return {"spread_dex": spread, "range_dex": float(lg.max() - lg.min()), "x_at_level": x_level}


def _needle_reading(needle: pd.DataFrame) -> Check:
    """The needle reading from retrieval rows at their longest context: holds when the no-fix rate's
    Wilson 95% interval lies below the reference kernel's; does not hold when the intervals overlap
    and the no-fix interval lies above one half (most needles are kept); not shown otherwise."""
    nn = int(needle["n_tokens"].max())
    rates = rate_table(needle[needle["n_tokens"] == nn], ["fix"]).set_index("fix")
    per_head = rate_table(needle[(needle["n_tokens"] == nn) & (needle["fix"] == "no fix")], ["head"])
    nf, base = rates.loc["no fix"], rates.loc["bf16 P, fp32 acc"]
    gain = needle[(needle["n_tokens"] == nn) & (needle["fix"] == "no fix")]["gain"].median()
    if nf["hi"] < base["lo"]:
        status = True
    elif nf["lo"] > 0.5:
        status = False
    else:
        status = None
    each = f" ({len(per_head)} heads x {int(per_head['n'].iloc[0])})" if per_head["n"].nunique() == 1 else ""
    return Check(
        READING, "At ~100k tokens a low-precision accumulator silently drops the needle", "needle lost",
        f"n = {nn:,} tokens, needle's share within 2x of exact over {int(nf['n'])} haystacks{each}: "
        f"no fix {nf['retrieved (Wilson 95%)']}, "
        f"bf16 P with fp32 accumulation {base['retrieved (Wilson 95%)']}; no fix per head: "
        + ", ".join(f"{r['head']} {r['retrieved (Wilson 95%)']}" for _, r in per_head.iterrows())
        + f"; median gain {gain:.2f} (below 1: the output shrinks)",
        status,
        "without a fix most needles are kept (the rate's interval lies above one half) and the rate is not "
        "separated from the reference kernel's"
        if status is False else f"not shown at n = {int(nf['n'])} (the two 95% intervals overlap)")


def _mean_interval(x: pd.Series) -> tuple[float, float, float]:
    """Mean of per-cluster values and its normal 95% interval over the clusters (the clusters' spread)."""
    m = len(x)
    mu = float(x.mean())
    half = stats.Z95 * float(x.std(ddof=1)) / math.sqrt(m) if m > 1 else float("inf")
    return mu, mu - half, mu + half


def loss_verdicts(ret: pd.DataFrame, reference: tuple[str, str] = ("Hopper", REFERENCE)) -> pd.DataFrame:
    """Per (arch, fix) cell of a retrieval table (:func:`kvcost.experiments.long_range_needle.retrieval_grid`): which
    loss the kernel causes. ``shrinks``: the mean over heads of each head's mean gain has its 95% interval
    below 1 - :data:`SHRINK_TOL` (the output loses haystack mass); ``needle_lost``: the kept rate's clustered
    interval lies wholly below the reference kernel's (cell ``reference``). ``verdict`` names the loss;
    ``text`` gives the numbers; ``excluded`` = 1 - the kept rate's lower bound (loss rates above it are
    excluded at 95%)."""
    kt = kept_table(ret, ["arch", "fix"]).set_index(["arch", "fix"])
    ref = kt.loc[reference]
    rows = []
    for (arch, fix), g in ret.groupby(["arch", "fix"], sort=False):
        r = kt.loc[(arch, fix)]
        gmu, glo, ghi = _mean_interval(g.groupby("head")["gain"].mean())
        cmu, clo, chi = _mean_interval(g.groupby("head")["carried"].mean())
        shrinks = ghi < 1 - SHRINK_TOL
        lost = (arch, fix) != tuple(reference) and r["hi"] < ref["lo"]
        verdict = {(True, True): "needle loss and haystack shrinkage", (True, False): "needle loss",
                   (False, True): "haystack shrinkage, no needle loss detected",
                   (False, False): "neither detected"}[(bool(lost), bool(shrinks))]
        n_tok = int(g["n_tokens"].max())
        text = (f"{arch}, {fix}, {n_tok:,} tokens: gain {gmu:.2f} [{glo:.2f}, {ghi:.2f}], carried weight "
                f"{cmu:.2f} [{clo:.2f}, {chi:.2f}] (means over {int(r['heads'])} heads, 95%); kept {r['text']}"
                + ("" if lost else f"; loss rates above {1 - r['lo']:.0%} excluded"))
        rows.append({"arch": arch, "fix": fix, "haystacks": int(r["n"]), "heads": int(r["heads"]), "gain": gmu,
                     "gain_lo": glo, "gain_hi": ghi, "carried": cmu, "carried_lo": clo, "carried_hi": chi,
                     "kept": r["rate"], "kept_lo": r["lo"], "kept_hi": r["hi"], "excluded": 1 - r["lo"],
                     "shrinks": bool(shrinks), "needle_lost": bool(lost), "verdict": verdict, "text": text})
    return pd.DataFrame(rows)


def threshold_table(ret: pd.DataFrame, cuts: Sequence[float] = (0.25, 0.5, 0.75, 0.9)) -> pd.DataFrame:
    """How the kept rate of each (arch, fix) moves with the cut on the carried weight (kept when carried >=
    cut and <= KEEP[1]), pooled over heads with clustered intervals; and the old share rule beside it."""
    out = {}
    for c in cuts:
        d = ret.assign(kept=(ret["carried"] >= c) & (ret["carried"] <= KEEP[1]))
        out[f"carried >= {c:g}"] = kept_table(d, ["arch", "fix"]).set_index(["arch", "fix"])["text"]
    old = ret.assign(kept=ret["share_within_2x"].astype(bool))
    out["old: share within 2x"] = kept_table(old, ["arch", "fix"]).set_index(["arch", "fix"])["text"]
    return pd.DataFrame(out)


def _retrieval_reading(ret: pd.DataFrame) -> Check:
    """The needle reading from a retrieval table: on Hopper without a fix, holds when the needle is lost
    (kept rate's clustered interval below the reference kernel's); does not hold when it is not and the
    kept rate's interval lies above one half; not shown otherwise."""
    lv = loss_verdicts(ret).set_index(["arch", "fix"])
    nf = lv.loc[("Hopper", "no fix")]
    if nf["needle_lost"]:
        status = True
    elif nf["kept_lo"] > 0.5:
        status = False
    else:
        status = None
    others = "; ".join(f"{a}: {r['verdict']}" for (a, f), r in lv.iterrows() if f == "no fix" and a != "Hopper")
    return Check(
        READING, "At ~100k tokens a low-precision accumulator silently drops the needle", "needle lost",
        f"by the needle's carried weight (kept within {KEEP[0]:g}-{KEEP[1]:g}x of its exact contribution): "
        f"{nf['text']} — {nf['verdict']}; reference kernel (bf16 P, fp32 accumulation) kept "
        f"{lv.loc[('Hopper', REFERENCE), 'kept']:.0%}; FA3's algorithm without a fix on the other units: {others}",
        status,
        "what the kernel loses is the haystack's mass (the gain), while the needle's own contribution is carried: "
        "the needle is kept" if status is False else
        f"not shown at n = {int(nf['haystacks'])} haystacks over {int(nf['heads'])} heads")


def propagation_reading(table: pd.DataFrame) -> Check:
    """Does the haystack's shrinkage alone change a real decoder's answer, or only the needle's loss?

    ``table``: :func:`kvcost.experiments.real_decoder_passkey.propagation_table` (SmolLM2-135M's passkey with
    the needle's and the haystack's attention contributions scaled apart). The reading "only the needle's loss
    changes the answer" holds when some needle cut at every layer changes the answer and no haystack
    shrinkage at every layer does; it does not hold when a haystack shrinkage does; it is not shown when
    removing the needle (the case whose answer is known) does not change the answer — then the test cannot
    tell — or when no row decides."""
    every = table[table["layer"].astype(str) == "every"]
    hay = every[(every["needle"] == 1.0) & (every["haystack"] < 1.0)].sort_values("haystack")
    cut = every[(every["haystack"] == 1.0) & (every["needle"] < 1.0)].sort_values("needle")
    one = table[table["layer"].astype(str) != "every"]

    def row(r: pd.Series, what: str) -> str:
        change = "changes the answer" if r["changes_answer"] else (
            f"no change detected (a change needs {int(r['detectable'])}+ lost trials)")
        return (f"{what}: {int(r['successes'])}/{int(r['trials'])} (exact {int(r['exact_successes'])}/"
                f"{int(r['trials'])}; {int(r['lost'])} lost, {int(r['gained'])} gained; {change})")

    removed = cut[cut["needle"] == 0.0]
    parts = [row(r, f"needle x {r['needle']:g} at every layer") for _, r in cut.iterrows()]
    parts += [row(r, f"haystack x {r['haystack']:g} at every layer") for _, r in hay.iterrows()]
    parts += [row(r, f"haystack x {r['haystack']:g} at layer {r['layer']}") for _, r in one.iterrows()]
    if removed.empty or not bool(removed["changes_answer"].all()):
        status = None
    elif bool(hay["changes_answer"].any()):
        status = False
    else:
        status = True if bool(cut["changes_answer"].any()) else None
    n = int(table["context"].max()) if len(table) else 0
    worst = hay[hay["changes_answer"]]
    if status is False:
        note = (f"shrinking the haystack's contribution to {worst['haystack'].max():g} at every layer changes the "
                "answer with the needle intact: the gain the kernel loses is not harmless once every layer loses it "
                f"(at one layer no change is detected at n = {int(one['trials'].max()) if len(one) else 0})")
    elif removed.empty or not bool(removed["changes_answer"].all()):
        note = "removing the needle did not change the answer, so this test cannot tell"
    else:
        note = "no needle cut changed the answer"
    return Check(
        READING, "What the FP8 kernel loses is haystack mass, not the needle, so the answer survives; only losing "
        "the needle changes it (issue 22, carried through SmolLM2-135M's layers)", "only the needle's loss matters",
        f"passkey at {n:,} tokens, question and answer rows attending exactly with the needle sentence's and the "
        "rest's contributions scaled apart — " + "; ".join(parts), status, note)


def readings(context: pd.DataFrame, where: pd.DataFrame, knobs: pd.DataFrame, scaling: pd.DataFrame,
             published: pd.DataFrame, frac_bits: int = 13, needle: pd.DataFrame | None = None,
             retrieval: pd.DataFrame | None = None, propagation: pd.DataFrame | None = None) -> list[Check]:
    """The readings for notebook 06 (see the module docstring), each holding, not holding or not shown
    (``agrees`` None). ``retrieval``: a
    retrieval table (carried weight, per GPU) that the needle reading counts; without it, the old reading by
    share on ``needle`` (default: ``context`` at its longest context). ``propagation``: the real decoder's
    split-attention table (:func:`propagation_reading`), read last."""
    out = []
    nmax, nmin = int(context["n_tokens"].max()), int(context["n_tokens"].min())
    top = context[context["n_tokens"] == nmax]
    pub = published_niah(published).drop_duplicates("fix").set_index("fix")["accuracy"]

    # where the loss arises
    nw = int(where["n_tokens"].max())
    e = {v: _med(where, "variant", v) for v in ("kernel", "exact QKᵀ", "exact l", "exact acc_o")}
    ok = e["exact acc_o"] < e["kernel"] / 5 and min(e["exact QKᵀ"], e["exact l"]) > e["kernel"] / 2
    out.append(Check(
        READING, "The cliff is in the accumulator, not the storage", "the accumulator",
        f"n = {nw:,}, median relative error of the output: FA3 FP8 kernel {pct(e['kernel'])}; with QKᵀ exact "
        f"{pct(e['exact QKᵀ'])}; with the row sum l exact {pct(e['exact l'])}; with acc_o exact "
        f"{pct(e['exact acc_o'])} (storage and the e4m3 cast of P remain in all four)",
        bool(ok), "making acc_o exact does not remove most of the error here"))

    # a 4K benchmark cannot see it
    e_min = _med(context[context["n_tokens"] == nmin], "fix", "no fix")
    e_max = _med(top, "fix", "no fix")
    out.append(Check(
        READING, "Test at your real maximum context. A 4K benchmark cannot see the accumulator effect",
        "error grows with context", f"no fix, median error {pct(e_min)} at {nmin:,} tokens and {pct(e_max)} at "
        f"{nmax:,} ({e_max / e_min:.2g}x)", bool(e_max >= 5 * e_min),
        "the error at the short context is already a sizeable part of the long one"))

    # the needle: by share (rates with Wilson intervals), and the gain
    needle = top if needle is None else needle
    out.append(_needle_reading(needle) if retrieval is None else _retrieval_reading(retrieval))
    nn = int(needle["n_tokens"].max())
    rates = rate_table(needle[needle["n_tokens"] == nn], ["fix"]).set_index("fix")
    if retrieval is not None:
        lv = loss_verdicts(retrieval).set_index(["arch", "fix"])
        hop = lv.loc[("Hopper", "no fix")]
        out.append(Check(
            READING, "What the register loses without a fix is haystack mass: the output shrinks (issue 22)",
            "gain below 1", hop["text"], bool(hop["shrinks"]),
            "the gain's interval over heads reaches 1"))

    # the fixes, beside the published accuracies
    order = ["no fix", "PR #122 every 64", "PR #122 every 4", "PR #104 every tile"]
    errs = [_med(top, "fix", f) for f in order]
    mono = all(a >= b for a, b in itertools.pairwise(errs))
    pub_txt = " / ".join(f"{pub[f]:.3g}" for f in order if f in pub.index)
    out.append(Check(
        READING, "Two-level accumulation restores it; flushing less often costs accuracy (vLLM FA PR #104, PR #122)",
        f"NIAH at 128k: {pub_txt} (no fix / every 64 / every 4 / every tile)",
        f"model, median per-head error at {nmax:,}: " + " / ".join(pct(x) for x in errs),
        bool(mono and errs[-1] < 0.01),
        "the model's errors are not in the published order, or the per-tile fix leaves >= 1% error"))
    out.append(Check(
        READING, "vLLM, 128k NIAH on Hopper: 91% (BF16) -> 13% (FP8) -> 89% (two-level accumulation)",
        f"{pub['BF16 (blog)']:.0%} -> {pub['no fix']:.0%} -> {pub['PR #104 every tile']:.0%}",
        f"per-head error at {nmax:,}: {pct(_med(top, 'fix', 'bf16 P, fp32 acc'))} (bf16 P, fp32 accumulation) -> "
        f"{pct(errs[0])} (FP8, no fix) -> {pct(errs[-1])} (PR #104)"
        + (f"; needle kept (carried weight) at {int(retrieval['n_tokens'].max()):,}: " + " -> ".join(
            f"{lv.loc[('Hopper', f), 'kept']:.0%}" for f in (REFERENCE, "no fix", "PR #104 every tile")
            if ("Hopper", f) in lv.index)
           if retrieval is not None else
           f"; needle retrieved by share at {nn:,}: " + " -> ".join(
            rates.loc[f, "retrieved (Wilson 95%)"] for f in ("bf16 P, fp32 acc", "no fix", "PR #104 every tile"))
           if "PR #104 every tile" in rates.index else "")
        + "; the same direction, but a per-head output error or share is not a NIAH accuracy: no model here "
        "turns it into answers",
        bool(errs[0] > 10 * errs[-1]), "the emulated kernel does not separate the three settings"))

    # splits (why tensor-parallel size changes results, vllm issue #23813)
    sp = knobs[knobs["variant"].str.startswith("splits ")]
    if sp["variant"].nunique() >= 2:
        se = sp.groupby("variant")["rel_l2"].median()
        se = se.reindex(sorted(se.index, key=lambda v: int(v.split()[-1])))
        out.append(Check(
            READING, "Split-KV changes the error (results depend on batch x KV heads per GPU, vllm issue #23813)",
            "fewer blocks per split, less error",
            "no fix at " + f"{int(knobs['n_tokens'].max()):,}: " + ", ".join(f"{v} {pct(x)}" for v, x in se.items()),
            bool(all(a >= b for a, b in itertools.pairwise(se.to_numpy())))))

    # the scaling law, per head: the haystack's accumulation is a function of n·2^-b; heads with a
    # sink are reported beside it
    fits = {h: (float(g["sink_share"].iloc[0]), scaling_fit(g)) for h, g in scaling.groupby("head", sort=False)}
    quiet = {h: f for h, (sink, f) in fits.items() if sink < 0.01}
    main = quiet or {h: f for h, (_, f) in fits.items()}
    h0, fit = next(iter(main.items()))
    n_fail = fit["x_at_level"] * 2 ** frac_bits
    others = "; ".join(f"{h} (sink share {sink:.0%}): {f['spread_dex']:.2g} decades" for h, (sink, f) in fits.items()
                       if h not in quiet)
    out.append(Check(
        READING, "acc_o's error is a function of n·2^-frac_bits (a narrower register at short context stands for "
        "13 bits at long context)", "curves collapse",
        f"{h0}: curves for frac_bits {sorted(scaling['frac_bits'].unique().tolist())} differ by at most "
        f"{fit['spread_dex']:.2g} decades where they overlap, while the error moves {fit['range_dex']:.2g} decades; "
        + (f"acc_o's error reaches 10% at n·2^-b ≈ {fit['x_at_level']:.2g}, i.e. about {float(f'{n_fail:.2g}'):,.0f} "
           f"tokens with {frac_bits} bits" if np.isfinite(n_fail) else "the error never reaches 10% in this range")
        + (f". With an attention sink the curves spread more — {others}" if others else ""),
        bool(quiet) and all(f["spread_dex"] <= 0.3 and f["range_dex"] >= 1.0 for f in quiet.values()),
        "the curves of a head without a sink do not collapse within a factor 2, or no such head was run"))
    if propagation is not None and len(propagation):
        out.append(propagation_reading(propagation))
    return out


def printed() -> list[Check]:
    """None here: the notebook goes beyond the post, which printed no long-context numbers."""
    return []


def errata() -> list[Check]:
    """None here: the published claims are read against the emulation (:func:`readings`)."""
    return []


def not_shown_markdown(rs: Sequence[Check]) -> str:
    """Markdown for the readings not shown at this number of haystacks ("" when there are none)."""
    miss = [c for c in rs if c.agrees is None]
    if not miss:
        return ""
    return "\n".join([f"**Not shown at this number of haystacks** ({len(miss)} reading"
                      f"{'s' * (len(miss) > 1)}; the 95% intervals overlap):", ""]
                     + [f"- *{c.claim}* — {c.note}: {c.computed}." for c in miss])


def verdict(context: pd.DataFrame, where: pd.DataFrame, knobs: pd.DataFrame, scaling: pd.DataFrame,
            published: pd.DataFrame, frac_bits: int = 13, needle: pd.DataFrame | None = None,
            retrieval: pd.DataFrame | None = None, propagation: pd.DataFrame | None = None, tested: bool = True,
            changed: Sequence[str] = ()) -> Verdict:
    """Notebook 06's verdict: the decided readings (:func:`readings`, same arguments), then the ones not shown
    at this number of haystacks (:func:`not_shown_markdown`); ``tested``: whether the run is at the defaults
    (``changed``: the parameters it changes)."""
    rs = readings(context, where, knobs, scaling, published, frac_bits=frac_bits, needle=needle,
                  retrieval=retrieval, propagation=propagation)
    return Verdict(printed=printed(), readings=[c for c in rs if c.agrees is not None], errata=errata(),
                   tested=tested, changed=changed, extra=not_shown_markdown(rs))
