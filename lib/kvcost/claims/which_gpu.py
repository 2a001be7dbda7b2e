"""Notebook 10's verdict: the published figures beside the emulation, the law's constants, which kernels lose
the needle. Its findings are not checks of the post: the verdict is computed text (``Verdict.extra``)."""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import pandas as pd

from kvcost.claims.report import Check, Verdict
from kvcost.experiments import long_range_needle as lr
from kvcost.paths import data_path
from kvcost.provenance import checked

__all__ = ["HOPPER_FIXES", "beside_published", "errata", "every_head_text", "law_text", "laws_text", "load_statements",
           "printed", "readings", "verdict"]

#: The emulated Hopper FA3 kernels that correspond to the published NIAH rows (notebook 06's fix names).
HOPPER_FIXES = {"no fix": "FA3 FP8, no fix", "PR #104 every tile": "FA3 FP8, PR #104 (every tile)",
                "PR #122 every 4": "FA3 FP8, PR #122 every 4 tiles",
                "PR #122 every 64": "FA3 FP8, PR #122 every 64 tiles"}


def load_statements() -> pd.DataFrame:
    """Published statements without a number (data/which_gpu/published_statements.csv)."""
    return pd.read_csv(checked(data_path("which_gpu", "published_statements.csv")))


def beside_published(summ: pd.DataFrame, n: int) -> pd.DataFrame:
    """The published 128k NIAH accuracies (data/accumulation_published.csv) beside the emulated kept rate of
    the same Hopper kernel at context ``n``: fix, source, published accuracy, emulated kept k/n and interval.
    Not the same quantity: a model's task accuracy against one head's needle kept; only the order compares."""
    pub = lr.published_niah(pd.read_csv(checked(data_path("accumulation_published.csv"))))
    at = summ[summ["n_tokens"] == n].set_index("kernel")
    rows = []
    for _, r in pub.iterrows():
        kern = HOPPER_FIXES.get(r["fix"])
        e = at.loc[kern] if kern in at.index else None
        rows.append({"fix": r["fix"], "source": r["source"], "published": r["accuracy"],
                     "emulated_kernel": kern or "",
                     "emulated_kept": "" if e is None else f"{e['kept']}/{e['haystacks']}",
                     "emulated": "not run" if e is None else
                     f"{e['kept']}/{e['haystacks']} = {e['kept_rate']:.0%} [{e['lo']:.0%}, {e['hi']:.0%}]",
                     "emulated_rate": None if e is None else e["kept_rate"],
                     "emulated_rel_l2": None if e is None else e["rel_l2"], "lo": None if e is None else e["lo"],
                     "hi": None if e is None else e["hi"]})
    return pd.DataFrame(rows)


def law_text(fit: pd.DataFrame) -> str:
    """Whether one constant c serves F = 13, 25 and 35 (their intervals overlap) and the slopes' readings."""
    parts = [f"F = {r.frac_bits}: c = {r.c:.2g} [{r.c_lo:.2g}, {r.c_hi:.2g}], slope in n {r.slope:.2f} "
             f"[{r.slope_lo:.2f}, {r.slope_hi:.2f}]" for r in fit.itertuples()]
    overlap = fit["c_lo"].max() <= fit["c_hi"].min()
    same = "one constant fits every F (the intervals overlap)" if overlap else \
        "no single constant fits every F (the intervals do not overlap): the law in n·2^-F does not carry across units"
    slope1 = [int(r.frac_bits) for r in fit.itertuples() if r.slope_lo <= 1.0 <= r.slope_hi]
    head = "; ".join(parts) + f" — {same}; "
    text = head + (f"the slope's interval holds 1 at F = {slope1} only." if slope1 else
                   "no slope's interval holds 1 (the error grows more slowly than n at these contexts).")
    f = fit.set_index("frac_bits")
    for a, b in itertools.pairwise(f.index):
        ratio = (f.loc[b, "c"] * 2.0 ** -b) / (f.loc[a, "c"] * 2.0 ** -a)
        text += (f" From F = {a} to {b} the error changes by a factor {ratio:.2g} where the law predicts "
                 f"2^-{b - a}" + (": there the error is not the accumulator's." if ratio > 0.5 else "."))
    return text


def _accumulators(fit: pd.DataFrame) -> list[int]:
    """The F of one decoder's fit where the error is the accumulator's: it falls by at least half from this F to
    the next F fitted (with more kept bits the accumulator's share shrinks; an error that does not is another's)."""
    f = fit.set_index("frac_bits")
    return [int(a) for a, b in itertools.pairwise(f.index)
            if f.loc[b, "c"] * 2.0 ** -b <= 0.5 * f.loc[a, "c"] * 2.0 ** -a]


def _and(items: list) -> str:
    items = [str(x) for x in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def laws_text(fit: pd.DataFrame) -> str:
    """:func:`law_text` per decoder (``fit``: :func:`kvcost.experiments.which_gpu.law_fits`'s table, a ``model``
    column; without one, a single decoder's), then the decoders' constants compared at each F where the error
    is the accumulator's on every decoder (:func:`_accumulators`): overlapping intervals, one constant serves
    them; apart, the constant is the model's. At an F where it is not, a shared constant would mean nothing."""
    if "model" not in fit.columns:
        return "The n·2^-F law: " + law_text(fit)
    by = {m: g.reset_index(drop=True) for m, g in fit.groupby("model", sort=False)}
    parts = [f"The n·2^-F law on {m}'s heads ({int(g['heads'].iloc[0])} heads, {int(g['haystacks'].iloc[0])} "
             f"haystacks): " + law_text(g) for m, g in by.items()]
    if len(by) >= 2:
        common = sorted(set.intersection(*(set(_accumulators(g)) for g in by.values())))
        said = []
        for f in common:
            g = fit[fit["frac_bits"] == f]
            cs = ", ".join(f"{r.model} {r.c:.2g} [{r.c_lo:.2g}, {r.c_hi:.2g}]" for r in g.itertuples())
            said.append(f"at F = {f} ({cs}) " + ("one constant serves them (the intervals overlap)"
                                                  if g["c_lo"].max() <= g["c_hi"].min() else
                                                  "the constant is the model's (the intervals do not overlap)"))
        rest = sorted(set(fit["frac_bits"].astype(int)) - set(common))
        if rest:
            said.append(f"at F = {_and(rest)} the error is not shown to be the accumulator's on every decoder (it does "
                        f"not fall by half at the next F run, or no larger F was run), so no constant is compared")
        parts.append("Across the decoders: " + "; ".join(said) + ".")
    return "\n\n".join(parts)


def printed() -> list[Check]:
    """None here: the notebook goes beyond the post; the published figures are set beside the emulation
    (:func:`beside_published`), not compared as the same quantity."""
    return []


def readings() -> list[Check]:
    """None here: the findings are the verdict's computed text (:func:`verdict`)."""
    return []


def errata() -> list[Check]:
    """None here."""
    return []


def verdict(summ: pd.DataFrame, loss: pd.DataFrame, fit: pd.DataFrame, beside: pd.DataFrame,
            n_pub: int, spread: pd.DataFrame | None = None,
            other_heads: Mapping[str, pd.DataFrame] | None = None) -> Verdict:
    """Notebook 10's verdict: no checks (:func:`printed`, :func:`readings` and :func:`errata` are empty), and
    its findings as computed text (``extra``, :func:`_findings`; with ``spread``,
    :func:`kvcost.experiments.which_gpu.head_spread`'s table, what every head of SmolLM2 shows, and with
    ``other_heads`` (decoder name → its head_spread) what every head of another decoder shows)."""
    text = _findings(summ, loss, fit, beside, n_pub)
    if spread is not None and len(spread):
        text += "\n\n" + every_head_text(spread)
    for model, other in (other_heads or {}).items():
        if len(other):
            text += "\n\n" + every_head_text(other, model)
    return Verdict(printed=printed(), readings=readings(), errata=errata(), extra=text)


def _layers_text(lossy: str, every: str) -> str:
    """"in layers 0, 3" for a few; "in 27 of 30 layers (all but 1, 10, 11)" when most lose."""
    got, all_ = [int(x) for x in lossy.split()], [int(x) for x in every.split()]
    if len(got) <= 8:
        return "in layers " + ", ".join(map(str, got))
    rest = [x for x in all_ if x not in got]
    return f"in {len(got)} of {len(all_)} layers" + (f" (all but {', '.join(map(str, rest))})" if rest else "")


def every_head_text(spread: pd.DataFrame, model: str = "SmolLM2-135M") -> str:
    """What the every-head grid of decoder ``model`` shows, per context: the kernels that lost a haystack on some
    head (pooled rate with its interval clustered by head, how many heads lost any and in which layers) and the
    ones that kept every haystack (with the loss rate the clustered interval excludes)."""
    parts = []
    for n, g in spread.groupby("n_tokens", sort=True):
        heads = int(g["heads"].max())
        per = int(g["haystacks"].max()) // max(heads, 1)
        lossy = g[g["kept"] < g["haystacks"]]
        clean = g[g["kept"] == g["haystacks"]]
        line = f"**Per head** ({model}: {heads} query heads, {per} haystacks each, at {int(n):,} tokens): "
        if len(lossy):
            line += "; ".join(f"{r.kernel} on {r.gpu} kept {r.kept}/{r.haystacks} = {r.kept_rate:.0%} "
                              f"[{r.lo:.0%}, {r.hi:.0%}] (clustered by head, effective n {r.n_eff:.0f}); "
                              f"{r.heads - r.heads_all_kept} heads lost at least one haystack, "
                              f"{r.heads_none_kept} lost every one, {_layers_text(r.lossy_layers, r.all_layers)}"
                              for r in lossy.itertuples()) + ". "
        if len(clean):
            lo = float(clean["lo"].min())
            line += (f"No loss detected for the other {len(clean)} kernels: every haystack kept on every head "
                     f"(a loss rate above {1 - lo:.1%} would have been seen).")
        parts.append(line.strip())
    return "\n\n".join(parts)


def _findings(summ: pd.DataFrame, loss: pd.DataFrame, fit: pd.DataFrame, beside: pd.DataFrame,
              n_pub: int) -> str:
    """The findings, computed: which GPU x kernel loses the needle and from which context, which show no loss
    up to the longest context run (with the loss rate they could detect), the published order beside the
    emulated one, and the law's constants."""
    lost = loss[loss["loses_at"].notna()]
    kept = loss[loss["loses_at"].isna()]
    lines = []
    if len(lost):
        lines.append("**Loses the needle** (kept rate's 95% upper bound below 95%): " + "; ".join(
            f"{r.kernel} on {r.gpu} from {int(r.loses_at):,} tokens ({r.kept}, [{r.lo:.0%}, {r.hi:.0%}])"
            for r in lost.itertuples()) + ".")
    if len(kept):
        lines.append("**No loss detected** up to the longest context run: " + "; ".join(
            f"{r.kernel} on {r.gpu} at {int(r.checked_to):,} ({r.kept}; a loss rate above {r.detectable_loss:.0%} "
            f"would have been seen)" for r in kept.itertuples()) + ".")
    gain = summ.groupby("kernel", sort=False).apply(lambda g: g.sort_values("n_tokens")["gain"].iloc[-1],
                                                     include_groups=False)
    shrunk = [k for k, v in gain.items() if v < 0.99]
    if shrunk:
        lines.append("Haystack shrinkage, a separate effect (median gain below 0.99 at the longest context): "
                     + ", ".join(f"{k} ({gain[k]:.2f})" for k in shrunk) + ".")
    b = beside.dropna(subset=["emulated_rate"]).drop_duplicates("fix").sort_values("published", kind="stable")
    if len(b) >= 2:
        def order(vals: list[float]) -> str:
            steps = [y - x for x, y in itertools.pairwise(vals)]
            if all(d > 0 for d in steps):
                return "the same order"
            if all(d >= 0 for d in steps):
                return "ties where the published figures differ"
            return "not the same order"

        lines.append(f"Published 128k NIAH beside the emulation at {n_pub:,} tokens (different quantities: only the "
                     f"order compares): " + "; ".join(f"{r.fix} {r.published:.0%} vs kept {r.emulated_kept}, error "
                                                     f"{r.emulated_rel_l2:.2g}" for r in b.itertuples())
                     + f" — kept rates: {order(list(b['emulated_rate']))}; the output's error (lower for higher "
                       f"accuracy): {order([-x for x in b['emulated_rel_l2']])}.")
    lines.append(laws_text(fit))
    return "\n\n".join(lines)

