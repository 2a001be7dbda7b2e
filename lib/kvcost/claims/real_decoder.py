"""Notebook 08's readings: published claims about KV formats set beside SmolLM2-135M's results.

Each reading is a :class:`kvcost.claims.report.Check` whose ``agrees`` is computed from the
tables of :mod:`kvcost.experiments.real_decoder`; the printed numbers are llama.cpp's own (its
perplexity and KL output on the same windows), against the simulated formats'; the published numbers come from
``data/real_model/published_claims.csv`` (first-hand citations there), never from code.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from kvcost.claims.report import PRINTED, READING, Check, Verdict
from kvcost.experiments import real_decoder as tables
from kvcost.paths import data_dir, data_path
from kvcost.provenance import checked
from kvcost.retrieval import collapse

__all__ = ["FP4_REFERENCES", "MATCH_REL", "ROTATION_MOST", "fp4_placement",
           "errata", "layout_check", "load_claims", "printed", "published_register_loss",
           "readings", "register_failure", "storage_symptom", "verdict"]

#: "matches f16 perplexity" is read as: the mean Δ perplexity from the fp16 cache is within
#: 0.5% of the fp16 perplexity (the published example, llama.cpp issue #20977, is 0.006%).
MATCH_REL = 0.005
#: "removes most of the loss" is read as: the rotation takes more than half of the format's Δ perplexity away.
ROTATION_MOST = 0.5


def load_claims(root: Path | None = None) -> pd.DataFrame:
    """The published claims, indexed by ``claim``."""
    folder = root / tables.DATA if root else data_path("real_model")
    return pd.read_csv(checked(folder / "published_claims.csv")).set_index("claim")


def _row(table: pd.DataFrame, context: int, fmt: str) -> pd.Series | None:
    sel = table[(table["context"] == context) & (table["format"] == fmt)]
    return None if sel.empty else sel.iloc[0]


def _interval(r: pd.Series, col: str, digits: int = 3) -> str:
    if math.isnan(r[f"{col}_lo"]):
        return f"{r[col]:.{digits}f} (1 window, no interval)"
    return f"{r[col]:.{digits}f} [{r[f'{col}_lo']:.{digits}f}, {r[f'{col}_hi']:.{digits}f}] over {r['windows']} windows"


def _storage_readings(fmt_table: pd.DataFrame, claims: pd.DataFrame, context: int) -> list[Check]:
    """The published storage claims, read on SmolLM2-135M at ``context`` tokens."""
    out = []
    q8, f16 = _row(fmt_table, context, "q8_0"), _row(fmt_table, context, "fp16")
    if q8 is not None and f16 is not None:
        d = float(q8["dppl16"])
        rel = abs(d) / float(f16["ppl"])
        pub = claims.loc["llamacpp_issue_20977_q8_0_ppl", "value"] - claims.loc["llamacpp_issue_20977_f16_ppl", "value"]
        out.append(Check(READING, "llama.cpp: q8_0 K/V matches f16 perplexity", f"matches (issue #20977: Δ {pub:+.3f})",
                         f"q8_0 − fp16 perplexity, same windows: {_interval(q8, 'dppl16', 4)} on "
                         f"{f16['ppl']:.3f} ({rel:.3%})", rel <= MATCH_REL,
                         f"'matches' read as within {MATCH_REL:.1%} of the fp16 perplexity"))
    bound = float(claims.loc["kvquant_3bit_ppl_delta", "value"])
    low = fmt_table[(fmt_table["context"] == context)
                    & fmt_table["format"].str.match(r"^(q4_|iq4_nl|kivi[24])")].sort_values("dppl")
    if not low.empty:
        best = low.iloc[0]
        out.append(Check(READING, f"KVQuant: under {bound:g} perplexity degradation at 3 bits",
                         f"< {bound:g} (LLaMA-family, Wikitext-2 / C4)",
                         f"best 4-bit-or-lower format here: {best['format']} Δ {_interval(best, 'dppl')}; "
                         f"2-bit KIVI Δ {low[low['format'] == 'kivi2']['dppl'].min():.2f}",
                         bool(best["dppl"] < bound),
                         "KVQuant's own method (pre-RoPE non-uniform, dense-and-sparse) is not simulated; "
                         "the nearest formats shipped by engines are"))
    plain, rot = _row(fmt_table, context, "q5_1"), _row(fmt_table, context, "q5_1+hadamard")
    if plain is not None and rot is not None:
        out.append(_post_rotation(fmt_table, claims, context, plain, rot))
    plain, rot = _row(fmt_table, context, "q4_0"), _row(fmt_table, context, "q4_0+hadamard")
    if plain is not None and rot is not None and "llamacpp_pr_21551_q4_0_rot_ppl" in claims.index:
        f16, before, after = (float(claims.loc[f"llamacpp_pr_21551_{k}_ppl", "value"])
                              for k in ("f16", "q4_0", "q4_0_rot"))
        theirs = (before - after) / (before - f16)
        ours = (plain["dppl16"] - rot["dppl16"]) / plain["dppl16"]          # from the fp16 cache, as theirs
        out.append(Check(READING, "llama.cpp #21551: its rotation (PR #21038) removes most of q4_0 K/V's "
                         "perplexity loss",
                         f"{before:.4f} → {after:.4f}, f16 {f16:.4f}: {theirs:.0%} of the loss removed (Llama-2-7B, "
                         "512 tokens)",
                         f"q4_0 Δ from fp16 {_interval(plain, 'dppl16')} → {_interval(rot, 'dppl16')} with the "
                         f"rotation: {ours:.0%} removed", bool(ours > ROTATION_MOST),
                         f"'most' read as more than {ROTATION_MOST:.0%}; a first-hand measurement of the kind the "
                         "post's q5_1 anecdote reports, on another model"))
    return out


def _post_rotation(fmt_table: pd.DataFrame, claims: pd.DataFrame, context: int, plain: pd.Series,
                   rot: pd.Series) -> Check:
    """The post's q5_1 rotation anecdote, traced to llama.cpp PR #21038's table where the claims file has
    it, read on SmolLM2: holds when the rotation lowers q5_1's loss (and q4_1's, which the PR also reports)."""
    before = float(claims.loc["post_hadamard_q5_1_before", "value"])
    after = float(claims.loc["post_hadamard_q5_1_after", "value"])
    published = f"{before:.2f} → {after:.2f} on a 0.6B model (× {before / after:.1f})"
    measured = (f"q5_1 {plain['ppl']:.3f} → {rot['ppl']:.3f} with the rotation (fp32 cache "
                f"{plain['ppl'] - plain['dppl']:.3f}; Δ {plain['dppl']:.3f} → {rot['dppl']:.3f})")
    holds = bool(rot["dppl"] < plain["dppl"])
    note = "holds when the rotation lowers q5_1's loss"
    pr = [f"llamacpp_pr_21038_{k}_ppl" for k in ("q5_1", "q5_1_rot", "q4_1", "q4_1_rot")]
    if all(k in claims.index for k in pr):
        b5, a5, b4, a4 = (float(claims.loc[k, "value"]) for k in pr)
        traced = round(b5, 2) == before and round(a5, 2) == after
        published += f"; PR #21038's table, {claims.loc[pr[0], 'model']}: q5_1 {b5:g} → {a5:g}, q4_1 {b4:g} → {a4:g}"
        p4, r4 = _row(fmt_table, context, "q4_1"), _row(fmt_table, context, "q4_1+hadamard")
        if p4 is not None and r4 is not None:
            measured += f"; q4_1 Δ {p4['dppl']:.3f} → {r4['dppl']:.3f}"
            holds = holds and bool(r4["dppl"] < p4["dppl"])
            note += " and q4_1's"
        note += (f"; the post's numbers {'are' if traced else 'are not'} the PR's rounded. The size is the model's: "
                 f"there q5_1 alone multiplied perplexity (× {b5 / a5:.1f} over the rotated cache), here it adds "
                 f"{plain['dppl']:.3f} to {plain['ppl'] - plain['dppl']:.3f}, so no rotation can divide SmolLM2's "
                 "perplexity several-fold")
    return Check(READING, f"The post: a Hadamard rotation takes q5_1 K/V perplexity from {before:.2f} to {after:.2f}",
                 published, measured, holds, note)


def _mode_bias(modes: pd.DataFrame | None) -> str:
    """How the fast mode departs from the faithful mode at a lowered register, from the trials run both ways."""
    if modes is None or modes.empty:
        return "; fast mode not checked against the faithful mode"
    low = modes[(modes["kernel"].str.startswith("fa3:frac_bits=")) & (modes["trials"] > 0)]
    if low.empty:
        return "; fast mode checked against the faithful mode only at the full register"
    r = low.iloc[0]
    n, fast, faithful = int(r["trials"]), int(r["fast_successes"]), int(r["faithful_successes"])
    if fast < faithful:
        way = "overstates the damage, so the predicted context is a lower estimate"
    elif fast > faithful:
        way = "understates the damage, so the predicted context is an upper estimate"
    else:
        way = "matches it on these trials"
    return (f"; at {r['kernel'].split(':')[1]} the fast mode retrieved {fast}/{n}, the faithful mode {faithful}/{n} "
            f"on the same trials: the fast mode {way}")


def printed(comparison: pd.DataFrame) -> list[Check]:
    """llama.cpp's printed numbers against the simulated formats', per format: our KL agrees with llama.cpp's
    excess KL (``kl_agrees``), and, with at least two windows, our Δ perplexity from fp16 with llama.cpp's
    (``agrees``; see :func:`kvcost.experiments.real_decoder.agreement`). Untestable rows are left out."""
    out = []
    for r in comparison.itertuples():
        if r.kl_agrees is not None:
            out.append(Check(PRINTED, f"{r.format} at {r.context} tokens: our KL matches llama.cpp's above its floor",
                             f"llama.cpp KL {r.llamacpp_kl:.4f} − floor {r.llamacpp_kl_floor:.4f}",
                             f"ours {r.ours_kl:.4f} (ratio {r.kl_ratio:.2f}, {r.windows} window(s))",
                             bool(r.kl_agrees), f"tolerance ratio within {tables.KL_REL_TOL:.0%} of 1"))
        if r.agrees is not None:
            out.append(Check(PRINTED, f"{r.format} at {r.context} tokens: our Δ perplexity agrees with llama.cpp's",
                             f"llama.cpp Δ {r.llamacpp_dppl:+.4f}", f"ours Δ {r.ours_dppl:+.4f} over {r.windows} "
                             f"windows", bool(r.agrees), f"tolerance: intervals + engine gap {r.floor:.4f}"))
    return out


def layout_check(comparison: pd.DataFrame) -> Check | None:
    """Whether K's channel order decides the llama.cpp comparison: with K's blocks in llama.cpp's order
    (the GGUF file's) every measurable format's excess-KL ratio is within the tolerance, and the ratios
    sit closer to 1 on average (mean |ratio − 1|) than with the blocks in transformers' order (``@hf``).
    None when no format was run both ways."""
    both = comparison[comparison["kl_agrees"].notna() & comparison["kl_ratio_hf"].notna()]
    if both.empty:
        return None
    tol = tables.KL_REL_TOL
    dist, dist_hf = float((both["kl_ratio"] - 1).abs().mean()), float((both["kl_ratio_hf"] - 1).abs().mean())
    worst = both.loc[(both["kl_ratio_hf"] - 1).abs().idxmax()]
    return Check(READING, "llama.cpp keeps K in the GGUF file's channel order (RoPE pairs side by side): a block "
                 "format's loss depends on which channels share a block",
                 "our KL nearer llama.cpp's with K's blocks in its order than in transformers'",
                 f"llama.cpp / ours KL ratio {both['kl_ratio'].min():.2f}–{both['kl_ratio'].max():.2f} in its "
                 f"order (mean |ratio − 1| {dist:.2f}), {both['kl_ratio_hf'].min():.2f}–"
                 f"{both['kl_ratio_hf'].max():.2f} in transformers' ({dist_hf:.2f}; farthest {worst['format']} at "
                 f"{int(worst['context'])} tokens), {len(both)} formats run both ways on the same windows",
                 bool(both["kl_agrees"].all()) and dist < dist_hf,
                 f"agrees when every ratio in llama.cpp's order is within {tol:.0%} of 1 and they are nearer 1 "
                 "than in transformers' order")


def published_register_loss(root: Path | None = None) -> dict:
    """vLLM's published loss to FP8 attention's 13-bit register (``data/accumulation_published.csv``): the BF16 and
    FP8 NIAH accuracies (``bf16``, ``fp8``) and the prompt length they were measured at (``context``, tokens, the
    CSV's ``context_tokens``: the blog's "128k" read as 2^17, data/attention_kernels.md says why)."""
    pub = pd.read_csv(checked((root / "data" if root else data_dir()) / "accumulation_published.csv"))
    pub = pub.set_index("quantity")
    return {"bf16": float(pub.loc["niah_bf16", "value"]),
            "fp8": float(pub.loc["niah_fp8_tensor_core_accumulation", "value"]),
            "context": int(pub.loc["niah_fp8_tensor_core_accumulation", "context_tokens"])}


def _published_register(root: Path | None) -> str:
    pub = published_register_loss(root)
    return (f"{pub['bf16']:.0%} → {pub['fp8']:.0%} at 128k "
            f"(x = {pub['context']}·2^-13 = {pub['context'] / 2 ** 13:g})")


def _register_failure_bootstrap(rows: pd.DataFrame, full_bits: int, root: Path | None, boot: int) -> Check | None:
    """:func:`register_failure` on raw passkey rows of the MMA-Sim-exact unit, P·V narrowed alone, with the
    collapse point's uncertainty carried through (:func:`kvcost.retrieval.collapse.collapse_bootstrap`)."""
    per, fit = collapse.collapse_bootstrap(rows, full_bits, boot=boot)
    if per.empty:
        return None
    claim = "vLLM: FP8 attention's 13-bit register loses the needle at 128k"

    def xtext(x: float) -> str:
        return "none" if math.isinf(x) else f"{x:g}"

    ctx = "; ".join(f"{int(r.context):,} tokens ({r.trials} trials): x_c {xtext(r.x_c)} [{xtext(r.x_lo)}, "
                    f"{xtext(r.x_hi)}]" for r in per.itertuples())
    law = ("the contexts' intervals overlap: the law n·2^-b is not contradicted" if fit["law_holds"] else
           "the contexts' intervals do not overlap: the law n·2^-b is not seen to hold, so no context is predicted")
    if fit["law_holds"]:
        def sig2(x: float) -> str:
            return f"{float(format(x, '.2g')):,.0f}"

        hi = "no upper bound" if math.isinf(fit["n_hi"]) else sig2(fit["n_hi"])
        near = ("no finite context as run (a context without a collapse)" if math.isinf(fit["n_fail"])
                else f"{sig2(fit['n_fail'])} tokens")
        pred = (f"by the law a {full_bits}-bit register fails near {near}, 95% interval [{sig2(fit['n_lo'])}, {hi}] "
                f"tokens (two significant figures)")
        ok = fit["n_lo"] <= published_register_loss(root)["context"]
    else:
        pred, ok = "the data cannot predict where a 13-bit register fails", False
    return Check(READING, claim, _published_register(root),
                 f"x_c = n·2^-b at the collapse (rate at most half exact's), 95% bootstrap intervals over trials "
                 f"({fit['boot']} resamples; 'none': no b tried collapses): {ctx}; {law}; {pred}",
                 ok, "holds when the interval reaches 128k or below; SmolLM2-135M (30 layers, 3 KV heads) on Hopper's "
                     "MMA-Sim-exact unit with P·V's register narrowed alone (data/real_model/passkey_unit.csv), "
                     "RULER passkey, against an 8B model at 128k with every row in FP8")


def register_failure(passkey: pd.DataFrame, context: int | None = None, full_bits: int = 13,
                     root: Path | None = None, modes: pd.DataFrame | None = None, rows: pd.DataFrame | None = None,
                     boot: int = 2000) -> Check | None:
    """Where a ``full_bits`` tensor-core register would lose SmolLM2's passkey, by the scaling law.

    The FA3 emulation's accumulation error is a function of x = n·2^-b (notebook 06). At each
    context with a ``frac_bits`` sweep (``context``: only that one), the collapse is the largest b
    whose success rate is at most half the exact rate, x_c = n·2^-b
    (:func:`kvcost.retrieval.collapse.collapse_table`); the same x at ``full_bits`` is the context
    n·2^(full_bits - b). The prediction comes from the longest context with a collapse (the
    nearest to the published setting), and the other contexts' x_c show whether the law holds
    here. Set beside vLLM's published 91% → 13% at 128k (FA3 FP8 on Hopper; Llama-3.1-8B per the
    post). The sweep runs in fast mode (the prefix rows exact); ``modes``, the fast-vs-faithful
    summary (:func:`kvcost.experiments.real_decoder.fast_vs_faithful_summary`), says which way the fast
    mode errs at a lowered register, and so whether the predicted context is a lower or an upper
    estimate. None when no sweep is present. With ``rows`` (raw passkey rows of the MMA-Sim-exact unit, P·V
    narrowed alone: ``data/real_model/passkey_unit.csv``) the reading rests on them instead, each collapse
    point with a bootstrap interval over trials and the predicted context's interval carried through
    (:func:`kvcost.retrieval.collapse.collapse_bootstrap`, ``boot`` resamples).
    """
    if rows is not None and not rows.empty:
        return _register_failure_bootstrap(rows, full_bits, root, boot)
    table = passkey if context is None else passkey[passkey["context"] == context]
    col = collapse.collapse_table(table, full_bits)
    if col.empty:
        return None
    published = _published_register(root)
    claim = "vLLM: FP8 attention's 13-bit register loses the needle at 128k"
    setting = ("SmolLM2-135M (30 layers, 3 KV heads), fast mode (prefix rows exact), RULER passkey, against an 8B "
               "model at 128k with every row in FP8") + _mode_bias(modes)
    hit = col[col["collapse_bits"].notna()]
    if hit.empty:
        r = col.iloc[-1]
        b_min = int(r["bits_tried"].split()[0])
        return Check(READING, claim, published,
                     f"no collapse down to frac_bits {b_min} at {int(r['context'])} tokens (exact "
                     f"{r['exact_rate']:.0%}): a {full_bits}-bit register would hold past "
                     f"{int(r['context']) * 2 ** (full_bits - b_min):,} tokens on SmolLM2 in fast mode",
                     False, f"{setting}: not the published setting")
    last = hit.iloc[-1]
    n_fail = int(last["n_fail_full"])
    per = "; ".join(f"{int(r.context)} tokens: frac_bits {int(r.collapse_bits)}, x_c = {r.x_c:g}"
                    for r in hit.itertuples())
    spread = float(hit["x_c"].max() / hit["x_c"].min())
    law = (f"x_c within a factor {spread:g} across {len(hit)} contexts (the b grid resolves a factor 2)"
           if len(hit) > 1 else "one context: the law is assumed, not tested")
    return Check(READING, claim, published,
                 f"retrieval collapses at {per}; {law}; by the scaling law a {full_bits}-bit register fails "
                 f"near {n_fail:,} tokens",
                 n_fail <= published_register_loss(root)["context"],
                 f"holds when the predicted failing context is at or below 128k; {setting}")


def storage_symptom(retrieval: pd.DataFrame, claims: pd.DataFrame, alpha: float = 0.05) -> Check | None:
    """The post's division of symptoms — storage quantization shows as drift and perplexity, a lost needle
    is accumulation's — read on the passkey grid: it holds when no stored format loses the passkey against
    exact attention on the same trials (``retrieval``,
    :func:`kvcost.experiments.real_decoder.storage_retrieval`, Holm-corrected at family-wise ``alpha``). The
    measured side names the cells that do, and the KL divergence that separates the formats that keep the
    passkey from those that lose it. None without stored-format cells."""
    if retrieval.empty:
        return None
    lost = retrieval[retrieval["loses_needle"]]
    kept = retrieval[~retrieval["loses_needle"]]
    cells = "; ".join(f"{r.format} at {r.context} ({r.successes}/{r.trials} vs exact {r.exact_successes}/{r.trials})"
                      for r in lost.itertuples())
    measured = (f"{len(lost)} of {len(retrieval)} stored-format cells lose the passkey against exact attention"
                + (f": {cells}" if len(lost) else ""))
    if len(lost) and len(kept):
        hi_kept, lo_lost = float(kept["kl"].max()), float(lost["kl"].min())
        measured += (f"; KL (nats/token from the fp32 cache) separates them: kept ≤ {hi_kept:.3f}, lost ≥ {lo_lost:.3f}"
                     if hi_kept < lo_lost else
                     f"; the KL ranges overlap (kept up to {hi_kept:.3f}, lost from {lo_lost:.3f} nats/token): "
                     "KL alone does not decide whether the passkey is kept")
    return Check(READING, "The post: storage quantization's symptom is drift and higher perplexity; losing the "
                 "needle is accumulation's", str(claims.loc["post_storage_symptom", "where"]), measured, lost.empty,
                 f"exact McNemar test on the same trials, Holm-corrected (Tarone) over {len(retrieval)} cells "
                 f"at family-wise {alpha:.0%}; SmolLM2-135M, RULER passkey, 1k–8k tokens")


def _unit_readings(table: pd.DataFrame, alpha: float = 0.05) -> list[Check]:
    """The FP8 kernel's passkey cells re-run on Hopper's unit bit for bit MMA-Sim against the committed grid
    (``table``: experiments.real_decoder.unit_rederivation). Non-rejection is reported as such: with n trials
    a change needs at least the discordant trials that can reach ``alpha``."""
    if table.empty:
        return []
    plain = table[~table["variant"].str.contains("frac_bits") & (table["variant"] != "exact")]
    narrowed = table[table["variant"].str.contains("frac_bits")]
    need = next(k for k in range(1, 64) if 2.0 ** (1 - k) < alpha)
    out = []
    if len(plain):
        sig = plain[plain["p"] < alpha]
        n = int(plain["trials"].min())
        out.append(Check(
            READING, "The kernel and vLLM's fixes retrieve as on the products-only model (MMA-Sim-exact unit)",
            "no change", "; ".join(f"{r.variant} at {r.context:,}: {r.successes_old}/{r.trials} → "
                                   f"{r.successes_new}/{r.trials}" for r in plain.itertuples()) +
            (f"; no change detected at n = {n} per cell (a change needs {need} discordant trials one way)"
             if sig.empty else f"; changed: {list(sig['variant'])}"), sig.empty,
            "margins move (median change "
            + ", ".join(f"{r.variant} {r.margin_change:+.2g}" for r in plain.itertuples()) + "), successes do not"))
    if len(narrowed):
        worse = narrowed[narrowed["lost"] > narrowed["gained"]]
        out.append(Check(
            READING,
            "Narrowing the P·V register alone loses no more than narrowing QKᵀ with it (the old grid's frac_bits)",
            "P·V alone >= both",
            "; ".join(f"{r.variant.split('=')[1]} bits at {r.context:,}: {r.successes_old} → "
                      f"{r.successes_new}/{r.trials} (p {r.p:.2g})" for r in narrowed.itertuples()),
            worse.empty, "the committed grid narrowed QKᵀ too: its collapse points rest on both registers"))
    return out


def readings(fmt_table: pd.DataFrame, claims: pd.DataFrame, context: int, passkey: pd.DataFrame | None = None,
             modes: pd.DataFrame | None = None, storage: pd.DataFrame | None = None,
             unit: pd.DataFrame | None = None, comparison: pd.DataFrame | None = None,
             unit_rows: pd.DataFrame | None = None) -> list[Check]:
    """The published claims read on SmolLM2-135M: the storage claims at ``context`` tokens (``fmt_table``:
    :func:`kvcost.experiments.real_decoder.format_table`, ``claims``: :func:`load_claims`); with a passkey
    grid (``passkey``, ``modes``), where a 13-bit register would fail (:func:`register_failure`) and the
    post's division of symptoms on the stored formats' retrieval (``storage``: :func:`storage_symptom`); with
    ``unit`` (experiments.real_decoder.unit_rederivation), the passkey cells re-run bit for bit on Hopper's
    unit; with ``comparison`` (experiments.real_decoder.llamacpp_comparison), whether K's channel order
    decides the comparison (:func:`layout_check`); with ``unit_rows`` (the unit's raw passkey rows), where a
    13-bit register would fail rests on them (:func:`register_failure`)."""
    out = _storage_readings(fmt_table, claims, context)
    if passkey is not None and not passkey.empty:
        out += [c for c in (register_failure(passkey, modes=modes, rows=unit_rows),
                            None if storage is None else storage_symptom(storage, claims)) if c is not None]
    if unit is not None:
        out += _unit_readings(unit)
    order = None if comparison is None else layout_check(comparison)
    return out + ([order] if order is not None else [])


def errata() -> list[Check]:
    """None here: the published claims are read on SmolLM2 (:func:`readings`), not recomputed."""
    return []


#: Where FP4 is placed: against the 4-bit block format llama.cpp ships and the FP8 cache engines ship.
FP4_REFERENCES = ("q4_0", "fp8_e4m3")


def fp4_placement(windows: pd.DataFrame, fmt_table: pd.DataFrame, context: int, passkey: pd.DataFrame | None = None,
                  refs: tuple[str, str] = FP4_REFERENCES, model: str = "SmolLM2-135M") -> str:
    """Where each FP4 format (E2M1 elements: NVFP4 with its E4M3 scale per 16, the MX ones with a power-of-two
    E8M0 scale per 16 or 32) sits between ``refs`` (q4_0 and fp8_e4m3) on the real decoder: its KL to the fp32
    cache as a ratio to each reference's on the same windows (:func:`kvcost.experiments.real_decoder.
    paired_ratio`: geometric mean, 95% t interval over windows), in the channel order its engine uses, and its
    passkey beside theirs where ``passkey`` (:func:`kvcost.experiments.real_decoder.passkey_table`) has them all,
    at the longest such context. "Between" needs both intervals to exclude 1 (below q4_0's, above fp8's).
    ``model``: the decoder's name, as the text says it."""
    rows = fmt_table[(fmt_table["context"] == context) & fmt_table["engine_order"]]
    fp4 = [f for f in rows["format"] if tables.element_of(f) == "float4_e2m1fn"]
    lo_ref, hi_ref = refs
    parts, where = [], {}
    for f in sorted(fp4, key=lambda x: float(rows.set_index("format").loc[x, "kl"])):
        a, b = tables.paired_ratio(windows, context, f, lo_ref), tables.paired_ratio(windows, context, f, hi_ref)
        if a is None or b is None:
            continue
        place = ("between them" if a["hi"] < 1 and b["lo"] > 1 else f"worse than {lo_ref}" if a["lo"] > 1
                 else f"better than {hi_ref}" if b["hi"] < 1 else "not separated from one of them")
        where[f] = place
        parts.append(f"{f} {a['ratio']:.2f} [{a['lo']:.2f}, {a['hi']:.2f}] x {lo_ref}'s and {b['ratio']:.1f} "
                     f"[{b['lo']:.1f}, {b['hi']:.1f}] x {hi_ref}'s ({place})")
    if not parts:
        return ""
    n = tables.paired_ratio(windows, context, next(iter(where)), lo_ref)["windows"]
    text = (f"**Where FP4 sits** ({model}, {context:,} tokens, {n} windows): KL to the fp32 cache against "
            f"{lo_ref}'s and {hi_ref}'s on the same windows (geometric mean of the per-window ratio, 95% interval): "
            + "; ".join(parts) + ".")
    if passkey is not None and not passkey.empty:
        pk = passkey.set_index(["context", "variant"])
        ctx = [c for c in sorted(passkey["context"].unique())
               if all((c, v) in pk.index for v in [f"store:{x}" for x in (*where, *refs)])]
        if ctx:
            c = ctx[-1]
            text += (f" Passkey at {int(c):,} tokens: " + ", ".join(
                f"{x} {int(pk.loc[(c, f'store:{x}'), 'successes'])}/{int(pk.loc[(c, f'store:{x}'), 'trials'])}"
                for x in (*where, *refs)) + ".")
    return text


def verdict(fmt_table: pd.DataFrame, claims: pd.DataFrame, context: int, comparison: pd.DataFrame,
            passkey: pd.DataFrame, modes: pd.DataFrame | None, storage: pd.DataFrame, unit: pd.DataFrame,
            windows: pd.DataFrame | None = None, unit_rows: pd.DataFrame | None = None) -> Verdict:
    """Notebook 08's verdict: llama.cpp's numbers against the simulated formats (:func:`printed`), the
    readings (:func:`readings`, same arguments), the runs committed behind them, and with the per-window rows
    (``windows``) where FP4 sits between q4_0 and fp8 (:func:`fp4_placement`)."""
    engine = printed(comparison)
    done = fmt_table.groupby("context")["windows"].agg(["min", "max"])
    extra = ("Runs committed: " + "; ".join(f"{c} tokens: {r['min']}-{r['max']} windows per format"
                                            for c, r in done.iterrows())
             + f". llama.cpp: {len(comparison)} formats compared, {sum(c.agrees for c in engine)} of {len(engine)} "
             "checks agree within the stated tolerances."
             + (f" Passkey cells: {len(passkey)}." if not passkey.empty else " Passkey: no committed grid."))
    fp4 = "" if windows is None else fp4_placement(windows, fmt_table, context, passkey)
    extra = f"{fp4}\n\n{extra}" if fp4 else extra
    return Verdict(printed=engine, readings=readings(fmt_table, claims, context, passkey, modes, storage, unit,
                                                     comparison, unit_rows),
                   errata=errata(), what="checks of simulated formats against llama.cpp", extra=extra)
