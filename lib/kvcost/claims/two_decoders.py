"""Notebook 08b's claims: the post's storage and retrieval claims read on two real decoders at once.

Notebook 08 reads the published claims on SmolLM2-135M; here the same readings are made on Gemma 3 270M
beside it (a different family: QK-norm, one KV head, 15 of 18 layers on a 512-token sliding window), so that a
finding that holds on one model only says so:

- llama.cpp's "q8_0 matches f16 perplexity", on both;
- where FP4 with fine scales sits between q4_0 and fp8 (kvcost.claims.real_decoder.fp4_placement), on both;
- whether a format's storage loss ranks the same on both (Spearman's ρ over the formats both ran);
- the post's division of symptoms: the FP8 kernels' and the stored formats' passkey against exact attention on
  the same trials, per decoder, "loss detected" or "no loss detected at n = …" with what loss was detectable;
- what the FP8 kernel costs the answer's logit margin at each context, and how much of it vLLM's fixes (which
  change accumulation only) restore: the part of the cost that is accumulation's, apart from the FP8 operands';
- the n·2^-b law per decoder: where a 13-bit register would lose the passkey, with its interval, or that the rows
  cannot say; and whether the law fitted on the passkey predicts which narrowed registers lose a multi-key task's
  needle on the same decoder (a test of the law on trials it was not fitted to).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from kvcost.claims import real_decoder as one
from kvcost.claims.report import READING, Check, Verdict
from kvcost.experiments import real_decoder as tables
from kvcost.experiments import two_decoders as two
from kvcost.inputs import post
from kvcost.models import decoders
from kvcost.retrieval import collapse

__all__ = ["printed", "readings", "errata", "verdict", "q8_0_reading", "ranking_reading", "retrieval_reading",
           "effects_reading", "law_reading", "k_axis_reading", "kernel_cost_reading", "growth_reading",
           "law_transfer_reading"]


def printed() -> list[Check]:
    """None here: the post prints no number for a second decoder (notebook 08 holds llama.cpp's against kvcost's)."""
    return []


def errata() -> list[Check]:
    """None here: the claims are read (:func:`readings`), not recomputed."""
    return []


def _title(model: str) -> str:
    return decoders.decoder(model).title


def q8_0_reading(fmt_tables: Mapping[str, pd.DataFrame], context: int) -> Check | None:
    """llama.cpp's "q8_0 K/V matches f16 perplexity" on every decoder: q8_0's perplexity minus the fp16 cache's
    on the same windows within kvcost.claims.real_decoder.MATCH_REL of the fp16 perplexity, on each."""
    parts, ok = [], []
    for model, t in fmt_tables.items():
        t = t[t["context"] == context].set_index("format")
        if "q8_0" not in t.index or "fp16" not in t.index:
            return None
        q8, f16 = t.loc["q8_0"], t.loc["fp16"]
        rel = abs(float(q8["dppl16"])) / float(f16["ppl"])
        ok.append(rel <= one.MATCH_REL)
        lo, hi = q8["dppl16_lo"], q8["dppl16_hi"]
        ci = "" if math.isnan(lo) else f" [{lo:+.3f}, {hi:+.3f}]"
        parts.append(f"{_title(model)} {float(q8['dppl16']):+.3f}{ci} on {float(f16['ppl']):.2f} ({rel:.2%}, "
                     f"{int(q8['windows'])} windows)")
    return Check(READING, "llama.cpp: q8_0 K/V matches f16 perplexity, on both decoders", "matches",
                 f"q8_0 − fp16 perplexity at {context:,} tokens: " + "; ".join(parts), all(ok),
                 f"'matches' read as within {one.MATCH_REL:.1%} of the fp16 perplexity, as notebook 08 reads it")


def ranking_reading(side: pd.DataFrame, alpha: float = 0.05, permutations: int = 20_000) -> Check | None:
    """A format's storage loss ranks the same on both decoders: Spearman's ρ of the two KL rankings
    (kvcost.experiments.two_decoders.rank_agreement), holding where the permutation p is below ``alpha``."""
    if side.empty:
        return None
    r = two.rank_agreement(side, permutations=permutations)
    if not r["formats"] >= 3:
        return None
    wide = side.pivot(index="format", columns="model", values="rank")
    moved = (wide[r["models"][0]] - wide[r["models"][1]]).abs().sort_values(ascending=False)
    far = ", ".join(f"{f} ({int(wide.loc[f, r['models'][0]])} vs {int(wide.loc[f, r['models'][1]])})"
                    for f in moved.index[:3] if moved[f] >= 3)
    return Check(READING, "A storage format's loss ranks the same on two decoders", "not claimed (the post uses one "
                 "ranking for every model)",
                 f"Spearman ρ = {r['rho']:.2f} over {r['formats']} formats (permutation p ≤ {max(r['p'], 1e-4):.0e})"
                 + (f"; furthest apart: {far}" if far else ""), r["p"] < alpha,
                 "ranks by mean KL to each decoder's fp32 cache at the same context; the post ranks formats once, "
                 "for any model")


def _judged(t: pd.DataFrame, kind: str) -> pd.DataFrame:
    stored = t["variant"].map(lambda v: decoders.stored_format(v) is not None)
    if kind == "stored":
        return t[stored]
    return t[~stored & ~t["variant"].str.contains("frac_bits")]


def _cells(rows: pd.DataFrame, span: pd.DataFrame) -> list[str]:
    """Variant names, each with its context where the rows judged beside them (``span``) span more than one."""
    if span["context"].nunique() < 2:
        return list(rows["variant"])
    return [f"{v} at {int(c):,}" for v, c in zip(rows["variant"], rows["context"])]


def _detectable_text(judged: pd.DataFrame) -> str:
    """What loss the grid could have detected, context by context: the largest of the rows' detectable losses
    over the contexts where one could be, and the contexts where exact attention retrieves too few for any (a
    context the count is blind at is named, never pooled into the others' figure)."""
    seen, blind = [], []
    for c, g in judged.groupby("context"):
        d = g["detectable"].dropna()
        (seen if len(d) else blind).append((int(c), int(d.max()) if len(d) else int(g["exact_successes"].max())))
    out = []
    if seen:
        out.append(f"a loss of {max(d for _, d in seen)} trials would have been detected"
                   + (f" at {', '.join(f'{c:,}' for c, _ in seen)}" if blind else ""))
    if blind:
        out.append("; ".join(f"at {c:,} exact attention retrieves {e}" for c, e in blind)
                   + ": no loss this grid is sure to detect")
    return " (" + "; ".join(out) + ")"


def retrieval_reading(against: Mapping[str, pd.DataFrame], kind: str, task: str = "") -> Check | None:
    """The post's division of symptoms on each decoder, one effect at a time: "the needle stops being attended
    to" is accumulation's (``kind="kernel"``: the FP8 kernels at full register width; the narrowed registers,
    the stand-in for longer contexts, are notebook 08's) and storage gives "slight output drift"
    (``kind="stored"``: the stored formats). ``against``: decoder name → kvcost.experiments.two_decoders.
    against_exact. Holds where no such variant loses the needle on either decoder; with none lost it says what
    loss the grid could have detected, and where no loss could have been (exact attention retrieves too few) the
    reading is not shown. ``task``: the RULER task the grids ran, named in the claim (niah_single_1 unnamed)."""
    parts, lost_any, n_min, blind = [], [], None, False
    for model, t in against.items():
        judged = _judged(t, kind) if not t.empty else t
        if judged.empty:
            continue
        lost = judged[judged["loses_needle"]]
        n_min = min(int(judged["trials"].min()), n_min or 10**9)
        ctx = ", ".join(f"{c:,}" for c in sorted(judged["context"].unique()))
        detect = judged["detectable"].dropna()
        blind = blind or (not len(lost) and not len(detect))
        parts.append(f"{_title(model)} at {ctx} tokens: "
                     + (f"loss detected for {', '.join(_cells(lost, judged))} (of {len(judged)})" if len(lost) else
                        f"no loss detected for {len(judged)} variants at n = {int(judged['trials'].min())}"
                        + _detectable_text(judged)))
        lost_any.append(len(lost) > 0)
    if not parts:
        return None
    claim = ("No needle lost to the FP8 kernels at full register width at these contexts (the post: lost at ~100k, "
             "to accumulation)" if kind == "kernel" else
             "No needle lost to storage (the post: storage gives 'slight output drift, higher perplexity')")
    if task:
        claim += f", on RULER {task}"
    agrees = False if any(lost_any) else None if blind else True
    return Check(READING, claim, "not lost" if kind == "kernel" else "drift, not a lost needle", "; ".join(parts),
                 agrees,
                 f"exact McNemar against exact attention on the same trials, Holm–Tarone per decoder; n ≥ {n_min}")


def growth_reading(growth: Mapping[str, pd.DataFrame], factor: float = 1.5) -> Check | None:
    """Storage's loss is per value, so a stored format's KL should not grow with the context (only accumulation's
    loss grows with n). ``growth``: decoder name → kvcost.experiments.two_decoders.storage_growth (fp16 and bf16,
    the references' own rounding, left out; its rows may hold several pairs of contexts, each read on its own).
    Holds where every format's interval excludes growth beyond ``factor``, does not where one's interval lies
    above ``factor``; otherwise the windows cannot say, and the text gives how many formats each way."""
    parts, calls = [], []
    pairs = ((model, pair) for model, g in growth.items()
             for pair in g[["base", "longer"]].drop_duplicates().itertuples(index=False))
    for model, (base, longer) in pairs:
        g = growth[model]
        g = g[(g["base"] == base) & (g["longer"] == longer) & ~g["format"].isin(["fp16", "bf16"])]
        if g.empty:
            continue
        grows = g[g["lo"] > 1]
        excluded = int((g["hi"] <= factor).sum())
        base, longer = int(base), int(longer)
        parts.append(f"{_title(model)}, {longer:,} against {base:,} tokens ({int(g['windows_longer'].min())}–"
                     f"{int(g['windows_base'].max())} windows): KL ratio median ×{g['ratio'].median():.2f} over "
                     f"{len(g)} formats, growth beyond ×{factor:g} excluded for {excluded}, growth detected for "
                     + (", ".join(f"{r.format} ×{r.ratio:.2f} [{r.lo:.2f}, {r.hi:.2f}]" for r in grows.itertuples())
                        if len(grows) else "none"))
        calls.append(False if (g["lo"] > factor).any() else True if excluded == len(g) else None)
    if not calls:
        return None
    agrees = False if False in calls else True if all(calls) else None
    return Check(READING, "A stored format's loss does not grow with the context (the post: storage is one loss, "
                          "accumulation the one that grows with the context)",
                 f"KL at the longer context within ×{factor:g} of the shorter's", "; ".join(parts), agrees,
                 "KL to the fp32 cache per scored token, geometric mean over each context's windows, Welch 95% "
                 "interval on the log ratio (the windows of the two contexts differ: unpaired)")


def _shift_text(shift: float, lo: float, hi: float) -> str:
    return f"{shift:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def kernel_cost_reading(rows: Mapping[str, pd.DataFrame], min_trials: int = 20, share: float = 0.5) -> Check | None:
    """Is the FP8 kernel's cost accumulation's, as the post has it (two-level accumulation restores it)? On each
    decoder's passkey grid (``rows``: decoder name → rows with ``margin``) and context, the kernel without a fix
    (``fa3``) against exact attention by the answer's logit margin, and each fix that changes only accumulation
    (kvcost.experiments.two_decoders.KERNEL_FIXES) against ``fa3`` on the same trials. Where the kernel's cost is
    detected (its interval below zero), the fix restoring most restores ``share`` of it or more (its interval's
    low end at least ``share`` of the cost: holds), less (its high end below: does not hold at that context), or
    the runs cannot say. Holds where it holds at every context; does not where it fails at one and holds at none."""
    parts, calls = [], []
    for model, r in rows.items():
        cost = two.margin_against(r, "exact", ["fa3"], min_trials)
        fixes = two.margin_against(r, "fa3", two.KERNEL_FIXES, min_trials)
        for c in cost.itertuples():
            f = fixes[fixes["context"] == c.context]
            if f.empty:
                continue
            best = f.loc[f["shift"].idxmax()]
            text = (f"{_title(model)} at {c.context:,}: FA3 {_shift_text(c.shift, c.lo, c.hi)} against exact")
            if c.hi >= 0:
                parts.append(text + " (no cost detected)")
                continue
            need = share * -c.shift
            calls.append(True if best["lo"] >= need else False if best["hi"] < need else None)
            parts.append(text + f", the best fix ({best['variant'].split(':', 1)[1]}) "
                         f"{_shift_text(best['shift'], best['lo'], best['hi'])} against FA3, "
                         f"{best['shift'] / -c.shift:.0%} of the cost")
    if not calls:
        return None
    agrees = (True if all(c is True for c in calls) else
              False if False in calls and True not in calls else None)
    return Check(READING, "vLLM's accumulation fixes restore most of what the FP8 kernel costs the answer, at these "
                          "contexts (the post: two-level accumulation restores the needle retrieval the FP8 path "
                          "lost at ~100k)",
                 f"at least {share:.0%} of the margin the kernel costs", "; ".join(parts), agrees,
                 f"the answer's logit margin (least over its tokens), mean paired shift with a 95% bootstrap "
                 f"interval over the same trials; n ≥ {min_trials}")


def _split_row(t: pd.DataFrame, haystack: float, needle: float) -> pd.Series | None:
    """The every-layer row of a propagation table with these gains, None when it was not run."""
    r = t[(t["layer"] == "every") & (t["haystack"] == haystack) & (t["needle"] == needle)]
    return r.iloc[0] if len(r) else None


def _split_text(r: pd.Series) -> str:
    return (f"{int(r['successes'])}/{int(r['trials'])} (−{int(r['lost'])} +{int(r['gained'])}, "
            f"p {r['p_value']:.2g}{', answer changed' if r['changes_answer'] else ''})")


def effects_reading(effects: Mapping[str, pd.DataFrame], gain: float = 0.5, alpha: float = 0.05) -> Check | None:
    """Which of the FP8 kernel's two effects loses the passkey on each decoder, one at a time: the haystack's part
    of attention scaled by ``gain`` at every layer with the needle's kept (what a narrow P·V register does,
    notebook 06: the haystack shrinks, the needle is carried), and the needle's part scaled by ``gain`` with the
    haystack's kept. ``effects``: decoder name → kvcost.experiments.real_decoder_passkey.propagation_table (at
    ``alpha``) on its split grid (kvcost.experiments.two_decoders.propagation_rows). The needle removed
    (``split:needle=0``), the case whose answer is known, must lose it, or the measure does not mean retrieval and
    the reading is not shown.
    Holds where haystack shrinkage changes the answer on every decoder: only then can a narrowed register stand in
    for a longer context (the n·2^-b law) there."""
    parts, holds, valid = [], [], True
    for model, t in effects.items():
        if t.empty:
            continue
        hay, ndl, gone = _split_row(t, gain, 1.0), _split_row(t, 1.0, gain), _split_row(t, 1.0, 0.0)
        if hay is None or ndl is None:
            continue
        if gone is not None and gone["successes"] > 0:
            valid = False
        parts.append(f"{_title(model)} at {int(hay['context']):,} tokens (exact {int(hay['exact_successes'])}/"
                     f"{int(hay['trials'])}): the haystack at ×{gain:g} {_split_text(hay)}, "
                     f"the needle at ×{gain:g} {_split_text(ndl)}"
                     + (f", the needle removed {int(gone['successes'])}/{int(gone['trials'])}" if gone is not None
                        else ""))
        holds.append(bool(hay["changes_answer"]))
    if not parts:
        return None
    agrees = (all(holds) if valid else None)
    return Check(READING, "A narrow P·V register's effect — the haystack shrunk, the needle carried (notebook 06) — "
                          "loses the passkey on each decoder, so a narrowed register stands in for a longer context",
                 "the post: accumulation loses the needle", "; ".join(parts), agrees,
                 f"exact attention split at the needle sentence at every layer for the question and answer rows, "
                 f"one part scaled by {gain:g}; exact McNemar against exact on the same trials, each row at "
                 f"p < {alpha:g} alone (two rows per decoder); where shrinking the haystack does not change the "
                 "answer, no narrowed register predicts a longer context's failure on that decoder")


def k_axis_reading(axes: pd.DataFrame, windows: Mapping[str, pd.DataFrame] | None = None,
                   context: int = 2048) -> Check | None:
    """The post's "scale K per channel" on both decoders, one of them with QK-norm (Gemma): at each width where
    the post's axis table gives K to per-channel, the share of heads whose per-channel error is the smaller
    (``axes``: kvcost.experiments.two_decoders.axis_by_decoder, intervals clustered by layer), and where a decoder's
    per-window rows (``windows``) hold ``int{b}_channel/int{b}_token`` and ``int{b}_token`` at ``context``, what it
    does end to end: K per channel (V per token either way) as a KL ratio on the same windows
    (kvcost.experiments.real_decoder.paired_ratio). Holds where every interval is on per-channel's side (share above
    one half, KL ratio below 1), does not where one is on the other side, not shown otherwise."""
    printed = post.axis_table()
    widths = sorted((int(r.bits) for r in printed.itertuples() if r.cache == "K" and r.winner == "per-channel"),
                    reverse=True)
    k = axes[(axes["cache"] == "K") & axes["bits"].isin(widths)]
    if k.empty:
        return None
    parts, sides = [], []
    titles = {_title(m): m for m in two.DECODERS}
    for model, g in k.groupby("model", sort=False):
        cells = []
        for r in g.sort_values("bits", ascending=False).itertuples():
            cells.append(f"{r.bits}-bit: per-channel in {r.per_channel_wins}/{r.heads} heads [{r.lo:.0%}, {r.hi:.0%}],"
                         f" error ×{r.ratio:.2f} ({r.ratio_min:.2f}–{r.ratio_max:.2f})")
            sides.append(True if r.lo > 0.5 else False if r.hi < 0.5 else None)
        w = (windows or {}).get(titles.get(model, model))
        for b in widths:
            ratio = None if w is None else tables.paired_ratio(w, context, f"int{b}_channel/int{b}_token",
                                                                f"int{b}_token")
            if ratio is not None:
                cells.append(f"end to end at {context:,} tokens, K per channel's KL ×{ratio['ratio']:.2f} "
                             f"[{ratio['lo']:.2f}, {ratio['hi']:.2f}] of per token's at {b} bits "
                             f"({ratio['windows']} windows)")
                sides.append(True if ratio["hi"] < 1 else False if ratio["lo"] > 1 else None)
        layers = int(g["layers"].iloc[0])
        parts.append(f"{model} ({layers} layers of its extract): " + "; ".join(cells))
    agrees = False if False in sides else None if None in sides else True
    return Check(READING, "Scale K per channel (the post's axis table), on a model with QK-norm too",
                 "K: per-channel at " + " and ".join(f"{b}" for b in widths) + " bits", "; ".join(parts), agrees,
                 "absmax int-b with one scale per token or per channel over the extract's tokens (the post's "
                 "quantizer), relative L2 per head; K after RoPE, as the cache stores it; Gemma's K is QK-normed")


def law_reading(laws: Mapping[str, dict], published_n: int | None = None) -> Check | None:
    """The n·2^-b law on each decoder: where a 13-bit P·V register would lose the passkey, from each decoder's
    narrowed-register rows (``laws``: decoder name → the summary kvcost.retrieval.collapse.
    collapse_bootstrap returns). Set against vLLM's published loss at ``published_n`` (default: the context the
    data file gives it, kvcost.claims.real_decoder.published_register_loss; one model the post does not name):
    does not hold where a decoder's interval lies above or below it, not shown where a decoder's rows collapse at no
    width tried (its prediction is a lower bound only) or where its interval holds it only by being open at one end
    (no upper bound, or a lower bound of 0 tokens: the full register itself collapsed in some resamples), holds
    where every interval holds it and is bounded."""
    if not laws:
        return None
    if published_n is None:
        published_n = one.published_register_loss()["context"]
    parts, verdicts = [], []
    for model, d in laws.items():
        if d["contexts"] == 0 or not math.isfinite(d["n_fail"]):
            parts.append(f"{_title(model)}: no collapse at the register widths run, so no prediction "
                         f"(the narrowest register tried kept the passkey)")
            verdicts.append(None)
            continue
        parts.append(f"{_title(model)}: x_c = {d['x_c']:.0f} [{d['x_lo']:.0f}, {d['x_hi']:.0f}] over {d['contexts']} "
                     f"context(s), a {d['full_bits']}-bit register fails near {d['n_fail']:,.0f} tokens "
                     f"[{d['n_lo']:,.0f}, " + (f"{d['n_hi']:,.0f}]" if math.isfinite(d["n_hi"]) else "no upper bound]"))
        inside = d["n_lo"] <= published_n <= d["n_hi"]
        bounded = d["n_lo"] > 0 and math.isfinite(d["n_hi"])
        if inside and not bounded:
            parts[-1] += " (an interval open at one end holds any context: it places nothing)"
        verdicts.append(None if inside and not bounded else inside)
    agrees = False if False in verdicts else None if None in verdicts else True
    return Check(READING, "vLLM: FP8 attention's 13-bit register loses the needle at 128k, on these decoders",
                 f"lost at {published_n:,}", "; ".join(parts), agrees,
                 "collapse: the largest b whose passkey rate is at most half exact's; x_c = n·2^-b, 95% bootstrap "
                 "over trials paired across variants; the published loss is on a model the post does not name")


def _bound(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:,.3g}"


def law_transfer_reading(laws: Mapping[str, dict], grids: Mapping[str, pd.DataFrame], task: str,
                         full_bits: int = 13) -> Check | None:
    """The n·2^-b law fitted on the passkey (``laws``: decoder name → kvcost.retrieval.collapse.collapse_bootstrap's
    summary on niah_single_1) read out of sample, on another RULER task's trials (``grids``: decoder name →
    kvcost.experiments.two_decoders.against_exact of ``task``'s grid). Each narrowed-register cell (``fa3`` at
    ``full_bits`` and ``fa3:frac_bits=b``) at context n has x = n·2^-b: the law says it collapses (a rate at most
    half exact's, the criterion the fit used) where x lies above the passkey's x_c interval, holds where x lies
    below it, and says nothing where x falls inside (an interval open at an end decides nothing on that side) or
    where exact attention retrieves too few for any loss to show (``detectable`` missing: a collapse there is
    the count's floor, not the register's). Holds where every cell the law decides goes its way, does not
    where one goes the other, not shown where the law decides no cell."""
    parts, calls = [], []
    for model, t in grids.items():
        d = laws.get(model)
        if not d or t.empty or d.get("contexts", 0) == 0:
            continue
        lo, hi = d["x_lo"], d["x_hi"]
        cells, undecided, blind = [], 0, 0
        for r in t.sort_values(["context", "variant"]).itertuples():
            b = collapse.frac_bits_of(r.variant, full_bits)
            if b is None:
                continue
            if "detectable" in t.columns and pd.isna(r.detectable):
                blind += 1              # exact retrieves too few for any loss to show: the cell can test nothing
                continue
            x = r.context / 2.0 ** b
            said = "collapse" if x > hi else "hold" if x < lo else None
            if said is None:
                undecided += 1
                continue
            seen = "collapse" if r.successes <= r.exact_successes / 2 else "hold"
            calls.append(said == seen)
            cells.append(f"{b} bits at {int(r.context):,} (x = {x:g}): {said}s by the law, {r.successes}/{r.trials} "
                         f"against exact's {r.exact_successes} — {'as said' if said == seen else seen + 's'}")
        head = f"{_title(model)} (the passkey's x_c in [{_bound(lo)}, {_bound(hi)}])"
        left = []
        if undecided:
            left.append(f"{undecided} cell(s) inside the interval")
        if blind:
            left.append(f"{blind} where exact attention retrieves too few to show a loss")
        if cells:
            parts.append(f"{head}: {'; '.join(cells)}" + (f"; {', '.join(left)}, undecided" if left else ""))
        else:
            parts.append(f"{head}: no cell decided" + (f" ({', '.join(left)})" if left else ""))
    if not parts:
        return None
    agrees = None if not calls else all(calls)
    return Check(READING, f"The n·2^-b law fitted on the passkey predicts which narrowed P·V registers lose RULER "
                          f"{task}'s needle, on each decoder", "the post: accumulation's error is a function of n·2^-b",
                 "; ".join(parts), agrees,
                 f"collapse: a rate at most half exact's on the same trials; x_c's 95% interval from the passkey's "
                 f"bootstrap (trials and the widths' gaps); {task}'s cells were not used in the fit")


def readings(fmt_tables: Mapping[str, pd.DataFrame], side: pd.DataFrame, context: int,
             against: Mapping[str, pd.DataFrame] | None = None, laws: Mapping[str, dict] | None = None,
             alpha: float = 0.05, permutations: int = 20_000,
             effects: Mapping[str, pd.DataFrame] | None = None, axes: pd.DataFrame | None = None,
             windows: Mapping[str, pd.DataFrame] | None = None,
             multikey: Mapping[str, Mapping[str, pd.DataFrame]] | None = None,
             margins: Mapping[str, pd.DataFrame] | None = None,
             growth: Mapping[str, pd.DataFrame] | None = None) -> list[Check]:
    """The readings on both decoders: :func:`q8_0_reading`, :func:`ranking_reading`, with the passkey grids
    against exact (``against``; ``multikey``: RULER task → decoder name → that task's grid against exact, for the
    multi-key tasks) :func:`retrieval_reading` for the kernels and for storage, with each decoder's split
    grid (``effects``) :func:`effects_reading`, with each decoder's collapse summary (``laws``)
    :func:`law_reading` (and, with the multi-key grids, :func:`law_transfer_reading`), and with the axis test
    on each decoder's extract (``axes``) :func:`k_axis_reading` (its end-to-end KL from ``windows``, decoder
    name → per-window rows), and with the passkey rows themselves
    (``margins``, decoder name → rows) :func:`kernel_cost_reading`, and with each decoder's storage loss at two
    contexts (``growth``) :func:`growth_reading`."""
    out = [q8_0_reading(fmt_tables, context), ranking_reading(side, alpha, permutations)]
    if axes is not None:
        out.append(k_axis_reading(axes, windows, context))
    if against:
        out += [retrieval_reading(against, "kernel"), retrieval_reading(against, "stored")]
    for task, grids in (multikey or {}).items():
        out += [retrieval_reading(grids, "kernel", task), retrieval_reading(grids, "stored", task)]
        if laws:
            out.append(law_transfer_reading(laws, grids, task))
    if growth:
        out.append(growth_reading(growth))
    if margins:
        out.append(kernel_cost_reading(margins))
    if effects:
        out.append(effects_reading(effects, alpha=alpha))
    if laws:
        out.append(law_reading(laws))
    return [c for c in out if c is not None]


def _span(n: pd.Series) -> str:
    """``"20"`` or ``"4–20"``: the range of a count column."""
    lo, hi = int(n.min()), int(n.max())
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def verdict(fmt_tables: Mapping[str, pd.DataFrame], windows: Mapping[str, pd.DataFrame], side: pd.DataFrame,
            context: int, against: Mapping[str, pd.DataFrame] | None = None,
            laws: Mapping[str, dict] | None = None, alpha: float = 0.05, permutations: int = 20_000,
            effects: Mapping[str, pd.DataFrame] | None = None, axes: pd.DataFrame | None = None,
            multikey: Mapping[str, Mapping[str, pd.DataFrame]] | None = None,
            margins: Mapping[str, pd.DataFrame] | None = None,
            growth: Mapping[str, pd.DataFrame] | None = None) -> Verdict:
    """Notebook 08b's verdict: :func:`readings`, then where FP4 sits on each decoder
    (kvcost.claims.real_decoder.fp4_placement, ``windows``: decoder name → its per-window rows) and the runs
    behind them. ``fmt_tables``: decoder name → the rows its engines store
    (kvcost.experiments.two_decoders.engine_rows)."""
    fp4 = [one.fp4_placement(windows[m], t.assign(engine_order=True), context, model=_title(m))
           for m, t in fmt_tables.items()]
    runs = "; ".join(f"{_title(m)}: {int(t[t['context'] == context]['windows'].max())} windows at {context:,} "
                     f"tokens, {t[t['context'] == context]['format'].nunique()} formats" for m, t in fmt_tables.items())
    grids = "" if not against else " Passkey: " + "; ".join(
        f"{_title(m)} {len(a)} variants against exact at {', '.join(f'{c:,}' for c in sorted(a['context'].unique()))}"
        f" tokens, {_span(a['trials'])} trials each"
        for m, a in against.items() if not a.empty) + "."
    extra = "\n\n".join([f for f in fp4 if f] + [f"Runs committed: {runs}.{grids}"])
    checks = readings(fmt_tables, side, context, against, laws, alpha, permutations, effects, axes, windows,
                      multikey, margins, growth)
    undecided = [c for c in checks if c.agrees is None]
    if undecided:       # a reading the grids cannot decide is said, apart from those that hold or do not
        extra = ("**Not shown** (the runs cannot decide): " + "; ".join(f"*{c.claim}* — {c.computed}"
                                                                        for c in undecided) + ".\n\n" + extra)
    return Verdict(printed=printed(), readings=[c for c in checks if c.agrees is not None], errata=errata(),
                   what="published numbers", extra=extra)
