"""Two real decoders side by side (notebook 08b): SmolLM2-135M and Gemma 3 270M on the same measures.

Each decoder's committed runs sit in its results folder (:attr:`kvcost.models.decoders.Decoder.data`):
per-window perplexity / KL rows (``ppl_windows.csv``), llama.cpp's on the same windows
(``llamacpp_windows.csv``), the passkey grid (``passkey.csv``) and the K/V statistics (``head_stats.csv``).
Notebook 08 computes each decoder's tables (kvcost.experiments.real_decoder); the functions here join them:

- :func:`storage_side_by_side`: each storage format's KL and Δ perplexity on both, by the format's name without
  its channel-order suffix (SmolLM2's ``nvfp4@hf`` is the order vLLM stores it in; Gemma's GGUF has one order,
  so its ``nvfp4`` is that same storage), with each decoder's rank;
- :func:`rank_agreement`: whether the formats rank alike on the two (Spearman's ρ, a permutation p);
- :func:`against_exact`: every passkey variant against exact attention on the same trials (exact McNemar,
  Holm–Tarone over the family), with what loss the test could have detected where it detects none;
- :func:`margin_against`: the answer's logit margin of variants against any reference variant on the same
  trials (a mean paired shift with its bootstrap interval): what vLLM's fixes change against the kernel without one;
- :func:`storage_growth`: whether a stored format's KL grows from one context to a longer one (different
  windows, so unpaired: a Welch interval on the log ratio);
- :func:`structure`: the K/V structure per decoder and layer type (the outlier channels before and after RoPE
  and, for Gemma, after QK-norm).

numpy and pandas only.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.models import decoders
from kvcost.numerics import axis
from kvcost.provenance import checked

__all__ = ["DECODERS", "results_path", "windows_name", "load_results", "load_provenance", "run_command", "UNIT_GRID",
           "COST_KINDS", "trial_cost", "passkey_rows", "storage_name", "engine_rows", "storage_side_by_side",
           "rank_agreement", "against_exact", "margin_against", "variant_order", "verdict_grid", "KERNEL_FIXES",
           "kernel_margins", "storage_growth", "PROPAGATION", "propagation_rows", "structure", "load_extract",
           "axis_by_decoder"]

#: The decoders compared, in the order they are shown (kvcost.models.decoders.DECODERS names).
DECODERS = ("smollm2-135m", "gemma3-270m")


def results_path(model: str, name: str) -> Path:
    """Decoder ``model``'s committed results file ``name`` (in its :attr:`~kvcost.models.decoders.Decoder.data`
    folder)."""
    return decoders.decoder(model).results_file(name)


def windows_name(model: str, name: str = "ppl_windows.csv") -> str:
    """Decoder ``model``'s per-window results file ``name`` as kvcost.experiments.real_decoder.load_windows names
    it (relative to ``data/real_model``: ``ppl_windows.csv`` for SmolLM2, ``gemma3_270m/ppl_windows.csv`` for
    Gemma), from the registry's results folder."""
    return str((Path(decoders.decoder(model).data) / name).relative_to("real_model"))


def load_results(model: str, name: str, required: bool = True) -> pd.DataFrame:
    """Decoder ``model``'s committed CSV ``name``, its sha256 checked against its provenance; an empty frame when
    it is not there and not ``required`` (a grid not yet run)."""
    p = results_path(model, name)
    if not p.is_file():
        if required:
            raise ValueError(f"parameter 'name': {decoders.decoder(model).title} has no results file {name!r} "
                             f"in data/{decoders.decoder(model).data}")
        return pd.DataFrame()
    return pd.read_csv(checked(p))


def load_provenance(model: str, name: str) -> dict:
    """The JSON provenance beside decoder ``model``'s results file (``name``: the JSON's own name, e.g.
    ``ppl_windows.json``): command, versions, date, digests."""
    p = results_path(model, name)
    if not p.is_file():
        raise ValueError(f"parameter 'name': {decoders.decoder(model).title} has no provenance file {name!r}")
    return json.loads(p.read_text(encoding="utf-8"))


def run_command(prov: Mapping) -> str:
    """The command a provenance record (:func:`load_provenance`) says wrote its file (the last of ``commands``
    where a file was grown in several runs), with an ``--out`` outside the repository (a scratch copy the rows
    were made in and then copied here) shown as ``--out <scratch>``."""
    cmd = prov["command"] if "command" in prov else prov["commands"][-1]
    return re.sub(r"--out /\S+", "--out <scratch>", cmd)


#: The kernel variants' grid on the MMA-Sim-exact unit, where a decoder has one beside an older grid (SmolLM2's
#: ``passkey.csv`` ran the FP8 kernel on the products-only model, notebook 08; Gemma's ran on the unit from the start).
UNIT_GRID = "passkey_unit.csv"


def passkey_rows(model: str) -> pd.DataFrame:
    """Decoder ``model``'s committed passkey rows as the current kernels give them: ``passkey.csv``, with its
    ``fa3…`` rows replaced by :data:`UNIT_GRID`'s where the decoder has that grid (the same trials: exact attention
    is in both). Empty when the decoder has no grid yet."""
    rows = load_results(model, "passkey.csv", required=False)
    unit = load_results(model, UNIT_GRID, required=False)
    if unit.empty or rows.empty:
        return rows if not rows.empty else unit
    keep = rows[~rows["variant"].str.startswith("fa3")]
    unit = unit[unit["variant"].str.startswith("fa3")]
    return pd.concat([keep, unit], ignore_index=True)


#: Each decoder's split-attention grid (the haystack's and the needle's parts of attention scaled apart,
#: kvcost.experiments.real_decoder_passkey.split_attention), in its results folder.
PROPAGATION = "propagation.csv"


def propagation_rows(model: str) -> pd.DataFrame:
    """Decoder ``model``'s committed split-attention rows (:data:`PROPAGATION`) with exact attention's rows on the
    same trials: the file's own where it has them, else its passkey grid's at the same contexts (the same prompts:
    the seed is 1000·context + trial). Empty when the decoder has no such grid."""
    rows = load_results(model, PROPAGATION, required=False)
    if rows.empty or (rows["variant"] == "exact").any():
        return rows
    passkey = load_results(model, "passkey.csv", required=False)
    if passkey.empty:
        return rows
    exact = passkey[(passkey["variant"] == "exact") & passkey["context"].isin(rows["context"].unique())]
    return pd.concat([exact, rows], ignore_index=True)


def storage_name(fmt: str) -> str:
    """A format's name without its channel-order suffix (``nvfp4@hf`` → ``nvfp4``): the storage, whichever
    decoder's channel order its blocks are cut in."""
    return fmt.removesuffix("@hf")


def engine_rows(table: pd.DataFrame, model: str) -> pd.DataFrame:
    """The rows of ``table`` (kvcost.experiments.real_decoder.format_table) measured as the engines store K: its
    ``engine_order`` rows for a decoder whose GGUF permutes K's channels (SmolLM2: llama.cpp's order for
    llama.cpp's formats, ``@hf`` for vLLM's and SGLang's), every row for one whose GGUF keeps transformers'
    order (Gemma: there is one order, every engine's)."""
    if decoders.decoder(model).k_permuted:
        return table[table["engine_order"]].reset_index(drop=True)
    return table.reset_index(drop=True)


def storage_side_by_side(tables: Mapping[str, pd.DataFrame], context: int) -> pd.DataFrame:
    """Each storage format measured on every decoder at ``context`` tokens, one row per (format, decoder):
    ``format`` (:func:`storage_name`), ``model`` (its title), ``measured_as`` (the name it was run under),
    ``windows``, ``kl`` / ``kl_lo`` / ``kl_hi`` (nats per token from the fp32 cache, 95% t interval over
    windows), ``dppl`` with its interval, ``top1`` and ``rank`` (1 = the smallest KL among the formats the
    decoders share). ``tables``: decoder name → kvcost.experiments.real_decoder.format_table, already the rows
    each decoder's engines store (:func:`engine_rows`). fp32 is left out (the reference)."""
    picked = {}
    for model, t in tables.items():
        t = t[(t["context"] == context) & (t["format"] != "fp32")]
        names = t["format"].map(storage_name)
        if names.duplicated().any():
            raise ValueError(f"parameter 'tables': {model}'s rows name {sorted(names[names.duplicated()])} twice "
                             "after dropping the channel-order suffix: pass the rows its engine stores")
        picked[model] = t.assign(measured_as=t["format"], format=names)
    if not picked:
        return pd.DataFrame()
    common = sorted(set.intersection(*(set(t["format"]) for t in picked.values())))
    rows = []
    for model, t in picked.items():
        t = t[t["format"].isin(common)].sort_values(["kl", "format"]).reset_index(drop=True)
        t = t.assign(model=decoders.decoder(model).title, rank=np.arange(1, len(t) + 1))
        rows.append(t[["format", "model", "measured_as", "windows", "kl", "kl_lo", "kl_hi", "dppl", "dppl_lo",
                       "dppl_hi", "top1", "rank"]])
    return pd.concat(rows, ignore_index=True)


def rank_agreement(side: pd.DataFrame, permutations: int = 20_000, seed: int = 0) -> dict:
    """Do the formats rank alike on the two decoders? ``side``: :func:`storage_side_by_side`. Spearman's ρ of
    the two KL rankings over the shared formats, and the one-sided permutation p of a ρ at least as large
    (``permutations`` random orders, seeded; its floor is 1 / (permutations + 1)). Returns ``{"rho", "p",
    "formats", "models"}``."""
    models = list(dict.fromkeys(side["model"]))
    if len(models) != 2:
        raise ValueError(f"parameter 'side' must hold exactly two decoders, got {models}")
    wide = side.pivot(index="format", columns="model", values="rank").dropna()
    a, b = wide[models[0]].to_numpy(float), wide[models[1]].to_numpy(float)
    n = len(a)
    if n < 3:
        return {"rho": math.nan, "p": math.nan, "formats": n, "models": models}

    def rho(x: np.ndarray, y: np.ndarray) -> float:
        x, y = x - x.mean(), y - y.mean()
        return float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))

    r = rho(a, b)
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((permutations, n)), axis=1)
    bc = b - b.mean()
    null = ((a - a.mean())[None, :] * bc[perms]).sum(axis=1) / math.sqrt(((a - a.mean()) ** 2).sum() * (bc ** 2).sum())
    p = (1 + int((null >= r - 1e-12).sum())) / (permutations + 1)
    return {"rho": r, "p": p, "formats": n, "models": models}


def against_exact(rows: pd.DataFrame, context: int | None = None, alpha: float = 0.05,
                  min_trials: int = 1) -> pd.DataFrame:
    """Every passkey variant against exact attention on the same trials (the same prompts), per (context, variant):
    ``trials`` paired, ``successes`` with the Wilson 95% ``lo``/``hi``, ``exact_successes``, the discordant trials
    (``lost``: exact retrieved and the variant did not; ``gained``: the reverse), the exact McNemar ``p_value``,
    ``loses_needle`` — rejected by Holm's correction over the family at ``alpha`` with Tarone's refinement (a row
    with too few discordant trials to ever reach significance does not count) and more trials lost than gained — and
    ``detectable``: the fewest trials lost (none gained) that would have been rejected as the first of that family
    (``None`` when no loss of n trials could be: a loss may then still be rejected at a later step of Holm's, after
    larger ones, so it is what the grid is sure to detect, not all it can). ``verdict`` says "loss detected" or "no
    loss detected at n = …". Where the grid has the answer's logit ``margin`` (its value token's logit over the best
    other token's, the least over the answer's tokens: positive when retrieved), the separate continuous effect:
    ``margin_shift``, the mean paired change against exact, with the 95% bootstrap interval
    ``margin_lo``/``margin_hi`` (:func:`kvcost.stats.paired_shift`) — what moves the answer where exact attention
    retrieves too few for a loss to be countable. ``rows``: a passkey grid (``context, trial, variant, success`` [,
    ``margin``]); ``context`` restricts it to one context."""
    cols = ["context", "variant", "trials", "successes", "lo", "hi", "exact_successes", "lost", "gained", "p_value",
            "loses_needle", "detectable", "margin_shift", "margin_lo", "margin_hi", "verdict"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    if context is not None:
        rows = rows[rows["context"] == context]
    exact = rows[rows["variant"] == "exact"].set_index(["context", "trial"])["success"]
    out = []
    for (c, v), g in rows[rows["variant"] != "exact"].groupby(["context", "variant"], sort=False):
        g = g[[(c, t) in exact.index for t in g["trial"]]]
        if len(g) < min_trials:
            continue
        ref = exact.loc[[(c, t) for t in g["trial"]]].to_numpy()
        one = stats.paired_binary(g["success"].to_numpy(), ref)
        out.append({"context": int(c), "variant": v} | one | {"exact_successes": one["ref_successes"]})
    t = pd.DataFrame(out, columns=cols[:10])
    if t.empty:
        return pd.DataFrame(columns=cols)
    margins = margin_against(rows, "exact", list(t["variant"].unique()), min_trials).rename(
        columns={"shift": "margin_shift", "lo": "margin_lo", "hi": "margin_hi"})
    t = t.merge(margins[["context", "variant", "margin_shift", "margin_lo", "margin_hi"]], on=["context", "variant"],
                how="left")
    t["loses_needle"] = stats.paired_losses(t["lost"], t["gained"], alpha)
    discordant = (t["lost"] + t["gained"]).tolist()
    t["detectable"] = pd.array([stats.detectable_loss(e, discordant, alpha) for e in t["exact_successes"]],
                               dtype="Int64")
    t = t[cols[:-1]]
    blind = " (exact retrieves too few: no loss this grid is sure to detect)"
    t["verdict"] = [("loss detected" if r.loses_needle else
                     f"no loss detected at n = {r.trials}" + (f" (a loss of {int(r.detectable)} trials would have "
                                                              "been detected)" if pd.notna(r.detectable) else blind))
                    for r in t.itertuples()]
    return t


def variant_order(variant: str) -> tuple:
    """A sort key that shows a retrieval grid's variants as the notebooks do: exact, the FP8 kernel without a
    fix, its fixes (PR #104, PR #122, Blackwell's unit), the P·V register from wide to narrow, the stored
    formats by name, anything else last."""
    fixed = ["exact", "fa3", *KERNEL_FIXES]
    if variant in fixed:
        return (0, fixed.index(variant))
    if (m := re.fullmatch(r"fa3:frac_bits=(\d+)", variant)):
        return (1, -int(m.group(1)))
    return (2, variant) if decoders.stored_format(variant) is not None else (3, variant)


def verdict_grid(against: pd.DataFrame, value: str = "count") -> pd.DataFrame:
    """One decoder's :func:`against_exact` as a variants × contexts grid of text, exact's row first: with
    ``value="count"`` each cell ``successes/trials −lost +gained`` (exact's own count in its row), marked
    ``loss detected`` where the family rejects it, and a last row with the loss the family is sure to detect at
    each context (``none`` where exact retrieves too few); with ``value="margin"`` the answer's mean margin shift
    against exact with its 95% interval. A cell not run is empty."""
    if value not in ("count", "margin"):
        raise ValueError(f"parameter 'value' must be 'count' or 'margin', got {value!r}")
    if against.empty:
        return pd.DataFrame()
    contexts = sorted(int(c) for c in against["context"].unique())
    rows: dict[str, dict[int, str]] = {}
    if value == "count":
        exact = against.groupby("context")[["exact_successes", "trials"]].max()
        rows["exact"] = {c: f"{exact.loc[c, 'exact_successes']}/{exact.loc[c, 'trials']}" for c in contexts}
    for r in against.itertuples():
        if value == "count":
            cell = f"{r.successes}/{r.trials} −{r.lost} +{r.gained}" + (" loss detected" if r.loses_needle else "")
        else:
            cell = ("" if pd.isna(r.margin_shift) else
                    f"{r.margin_shift:+.2f} [{r.margin_lo:+.2f}, {r.margin_hi:+.2f}]")
        rows.setdefault(r.variant, {})[int(r.context)] = cell
    order = sorted(rows, key=variant_order)
    grid = pd.DataFrame([[rows[v].get(c, "") for c in contexts] for v in order], index=pd.Index(order, name="variant"),
                        columns=[f"{c:,}" for c in contexts])
    if value == "count":
        sure = against.groupby("context")["detectable"].first()
        grid.loc["a loss sure to be detected"] = [("none" if pd.isna(sure.loc[c]) else f"{int(sure.loc[c])} trials")
                                                  for c in contexts]
    return grid


#: The kinds of variant whose trials cost alike, as :func:`trial_cost` groups them.
COST_KINDS = ("exact attention (the prompt's prefill)", "each FP8 kernel or register (after exact's prefix)",
              "each stored format (a prefill of its own)", "each faithful-mode kernel (every row emulated)")
#: Each of :data:`kvcost.models.decoders.VARIANT_KINDS` as its index in :data:`COST_KINDS`.
_COST_OF_KIND = {"exact": 0, "fa3": 1, "split": 1, "store": 2, "fa3full": 3}
if set(_COST_OF_KIND) != set(decoders.VARIANT_KINDS):        # a new kind must say what its trials cost
    raise ImportError(f"two_decoders._COST_OF_KIND covers {sorted(_COST_OF_KIND)}, "
                      f"not the variant kinds {sorted(decoders.VARIANT_KINDS)}")


def _cost_kind(variants: pd.Series) -> np.ndarray:
    """Each variant's index in :data:`COST_KINDS`, by its kind (:func:`kvcost.models.decoders.variant_kind`)."""
    kinds = {}
    for v in pd.unique(variants):
        try:
            kinds[v] = decoders.variant_kind(v)
        except ValueError as err:
            raise ValueError(f"parameter 'rows': {err}") from None
    return np.array([_COST_OF_KIND[kinds[v]] for v in variants], dtype=int)


def trial_cost(rows: pd.DataFrame, todo: pd.DataFrame | None = None,
               medians_from: pd.DataFrame | None = None) -> pd.DataFrame:
    """What a retrieval grid's cells cost, from the ``seconds`` each run timed: per kind of variant
    (:data:`COST_KINDS`: exact, whose prefill the kernel variants share; a kernel variant, which runs only the
    tail after it; a stored format, whose cache changes every layer's input and so needs a prefill of its own) ×
    context, ``median s [min–max]`` over the committed trials, and a row with the CPU time of all the context's
    committed cells. Seconds are as each run measured them, on the machine and beside whatever load it had (the
    provenance JSON's commands name the machines): a guide for planning, not a benchmark.

    ``todo`` (``context``, ``variant``: one row per trial not yet run, e.g. a sweep's cells missing from the
    committed file) adds a last row: how many trials are left per context and their CPU time at the medians of
    ``medians_from`` (default ``rows``; e.g. every task's rows of the same decoder, whose trials cost alike) for
    each trial's kind at its context — "?" where no trial of that kind at that context has been timed."""
    if rows.empty or "seconds" not in rows:
        return pd.DataFrame()
    rows = rows.assign(kind=_cost_kind(rows["variant"]))
    left = None if todo is None or todo.empty else todo.assign(kind=_cost_kind(todo["variant"]))
    planned = rows["context"] if left is None else pd.concat([rows["context"], left["context"]])
    contexts = sorted({int(c) for c in planned})
    cols = [f"{c:,}" for c in contexts]
    grid = pd.DataFrame("", index=pd.Index(COST_KINDS, name="variant"), columns=cols)
    for (k, c), g in rows.groupby(["kind", "context"]):
        sec = g["seconds"]
        grid.loc[COST_KINDS[k], f"{int(c):,}"] = f"{sec.median():.0f} s [{sec.min():.0f}–{sec.max():.0f}]"
    shown = set(rows["kind"]) | (set() if left is None else set(left["kind"]))
    grid = grid.loc[[COST_KINDS[k] for k in sorted(shown)]]                  # only the kinds the grid has
    hours = rows.groupby("context")["seconds"].sum() / 3600
    grid.loc["all committed cells, CPU time"] = [f"{hours.loc[c]:.1f} h" if c in hours.index else "" for c in contexts]
    if left is not None:
        ref = rows if medians_from is None else medians_from.assign(kind=_cost_kind(medians_from["variant"]))
        median = ref.groupby(["context", "kind"])["seconds"].median()
        cells = []
        for c in contexts:
            mine = left[left["context"] == c]
            if mine.empty:
                cells.append("none")
                continue
            counts = mine.groupby("kind").size()
            known = all((c, k) in median.index for k in counts.index)
            h = sum(n * median.get((c, k), 0.0) for k, n in counts.items()) / 3600
            cells.append(f"{len(mine)} trials, " + (f"{h:.1f} h" if known else "? h"))
        grid.loc["still to run, CPU time at the medians"] = cells
    return grid


#: The variants that change only the FP8 kernel's accumulation, each against the kernel without a fix (``fa3``):
#: vLLM's PR #104 (flush the P·V register every tile), PR #122 (every 4 tiles), and Blackwell's 25-bit unit.
KERNEL_FIXES = ("fa3:flush_every=1", "fa3:flush_every=4", "fa3:arch=Blackwell")


def margin_against(rows: pd.DataFrame, ref: str, variants: tuple[str, ...] | list[str],
                   min_trials: int = 1) -> pd.DataFrame:
    """Each of ``variants`` against variant ``ref`` on the same trials, per context, by the answer's logit margin:
    ``trials`` paired, ``shift`` (the mean of variant − ``ref``) and its 95% bootstrap interval ``lo``/``hi``
    (:func:`kvcost.stats.paired_shift`). A cell with fewer than ``min_trials`` paired trials is left out.
    ``rows``: a passkey grid with a ``margin`` column."""
    cols = ["context", "variant", "ref", "trials", "shift", "lo", "hi"]
    if rows.empty or "margin" not in rows:
        return pd.DataFrame(columns=cols)
    base = rows[rows["variant"] == ref].set_index(["context", "trial"])["margin"]
    out = []
    for (c, v), g in rows[rows["variant"].isin(list(variants))].groupby(["context", "variant"], sort=False):
        g = g[[(c, t) in base.index for t in g["trial"]]]
        if len(g) < max(1, min_trials):
            continue
        m = stats.paired_shift(g["margin"].to_numpy(), base.loc[[(c, t) for t in g["trial"]]].to_numpy())
        out.append({"context": int(c), "variant": v, "ref": ref, "trials": len(g), "shift": m["shift"],
                    "lo": m["shift_lo"], "hi": m["shift_hi"]})
    return pd.DataFrame(out, columns=cols).sort_values(["context", "variant"], ignore_index=True)


def kernel_margins(rows: pd.DataFrame, min_trials: int = 1) -> pd.DataFrame:
    """What the FP8 kernel and its fixes cost the answer's margin, per context (:func:`margin_against`): the kernel
    without a fix, each of :data:`KERNEL_FIXES` and K/V stored in fp8 e4m3 (the kernel's operand format, no kernel)
    against ``exact``; then each fix against ``fa3`` — the part of the kernel's cost that is accumulation's."""
    against = margin_against(rows, "exact", ["fa3", *KERNEL_FIXES, "store:fp8_e4m3"], min_trials)
    return pd.concat([against, margin_against(rows, "fa3", KERNEL_FIXES, min_trials)], ignore_index=True)


def storage_growth(windows: pd.DataFrame, base: int, longer: int, formats: list[str] | None = None) -> pd.DataFrame:
    """Whether a stored format's loss grows with the context: per format run at both ``base`` and ``longer``
    tokens (at least two windows each), the ratio of its KL to the fp32 cache per scored token at ``longer`` to
    that at ``base`` — the geometric mean over each context's windows — with a 95% Welch interval on the log
    scale (the windows of the two contexts are different text, so unpaired). ``windows``: per-window rows
    (``context, window, format, n, kl_fp32_sum``), as kvcost.experiments.real_decoder.load_windows gives them."""
    cols = ["format", "base", "longer", "windows_base", "windows_longer", "kl_base", "kl_longer", "ratio", "lo",
            "hi"]
    w = windows[windows["format"].ne("fp32") & (windows["n"] > 0)]
    w = w.assign(kl=w["kl_fp32_sum"] / w["n"])
    out = []
    for fmt in formats or sorted(set(w.loc[w["context"] == base, "format"]) & set(w.loc[w["context"] == longer,
                                                                                           "format"])):
        a = np.log(w.loc[(w["context"] == base) & (w["format"] == fmt), "kl"].to_numpy(dtype=float))
        b = np.log(w.loc[(w["context"] == longer) & (w["format"] == fmt), "kl"].to_numpy(dtype=float))
        if len(a) < 2 or len(b) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
            continue
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se > 0 else float("inf")
        t = stats.t95(df)
        d = b.mean() - a.mean()
        out.append({"format": fmt, "base": base, "longer": longer, "windows_base": len(a), "windows_longer": len(b),
                    "kl_base": math.exp(a.mean()), "kl_longer": math.exp(b.mean()), "ratio": math.exp(d),
                    "lo": math.exp(d - t * se), "hi": math.exp(d + t * se)})
    return pd.DataFrame(out, columns=cols)


def structure(heads: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """K/V structure per decoder and layer type: ``layers``, the median over layers of K's largest
    channel-RMS ratio before RoPE (``k_pre``), after QK-norm where the decoder has one (``k_norm``, NaN
    otherwise) and after RoPE (``k_post``: what the cache stores), and of V's largest token-norm ratio.
    ``heads``: decoder name → its ``head_stats.csv`` (kvcost.runs.real_model_extract)."""
    rows = []
    for model, h in heads.items():
        kinds = h["layer_type"] if "layer_type" in h else pd.Series("full", index=h.index)
        for kind, g in h.groupby(kinds, sort=True):
            rows.append({"model": decoders.decoder(model).title, "layer_type": kind, "layers": g["layer"].nunique(),
                         "k_pre": float(g["k_pre_max_channel_ratio"].median()),
                         "k_norm": float(g["k_norm_max_channel_ratio"].median())
                         if "k_norm_max_channel_ratio" in g else math.nan,
                         "k_post": float(g["k_post_max_channel_ratio"].median()),
                         "v_token": float(g["v_max_token_ratio"].median())})
    return pd.DataFrame(rows)


def load_extract(model: str) -> dict:
    """Decoder ``model``'s committed K/V extract (``Decoder.extract_file``, its sha256 checked): ``k`` (after RoPE,
    what the cache stores) and ``v`` as float64 (layers, kv_heads, tokens, head_dim), and ``layers``, the decoder's
    layer index of each (the file's ``meta``; 0, 1, … where it does not say)."""
    path = results_path(model, decoders.decoder(model).extract_file())
    with np.load(checked(path)) as z:
        k, v = z["k"].astype(np.float64), z["v"].astype(np.float64)
        meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    return {"k": k, "v": v, "layers": list(meta.get("layers", range(k.shape[0])))}


def axis_by_decoder(bits: tuple[int, ...] = (8, 4, 2)) -> pd.DataFrame:
    """The post's axis test (one absmax int-b scale per token or per channel, relative L2 error;
    kvcost.numerics.axis.axis_by_head) on each decoder's extract, per (model, cache, bits): ``heads`` and
    ``layers`` tested, ``per_channel_wins`` (heads where per-channel's error is the smaller), their ``share``
    with ``lo``/``hi``, a 95% interval clustered by layer (kvcost.stats.clustered_rate: a layer's heads share
    its input), and the median, smallest and largest per-head error ratio per-channel / per-token (below 1:
    per-channel better)."""
    rows = []
    for model in DECODERS:
        ex = load_extract(model)
        t = axis.axis_by_head(ex["k"], ex["v"], list(bits))
        for (cache, b), g in t.groupby(["cache", "bits"], sort=False):
            wins = g.assign(w=g["winner"] == "per-channel").groupby("layer")["w"].agg(["sum", "size"])
            _p, lo, hi, _n = stats.clustered_rate(wins["sum"].tolist(), wins["size"].tolist())
            ratio = g["per_channel"] / g["per_token"]
            rows.append({"model": decoders.decoder(model).title, "cache": cache, "bits": int(b), "heads": len(g),
                         "layers": len(wins), "per_channel_wins": int(wins["sum"].sum()),
                         "share": float(wins["sum"].sum() / len(g)), "lo": lo, "hi": hi,
                         "ratio": float(ratio.median()), "ratio_min": float(ratio.min()),
                         "ratio_max": float(ratio.max())})
    return pd.DataFrame(rows)
