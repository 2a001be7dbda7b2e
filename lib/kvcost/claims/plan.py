"""Notebook 09's readings: what the post says about bytes and requests, against the fleet plan and the needle."""
from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kvcost.claims.report import READING, Check, Verdict
from kvcost.experiments.plan import needle_summary, paired_worse
from kvcost.inputs import post
from kvcost.models import weights
from kvcost.models.registry import load_model
from kvcost.planning import decode, gpus
from kvcost.provenance import checked

__all__ = ["FP8", "Q4", "Q8", "decode_checks", "errata", "needle_reading", "printed", "readings", "verdict"]

FP8, Q8, Q4 = "fp8_e4m3/fp8_e4m3", "q8_0/q8_0", "q4_0/q4_0"


def _ratio(table: pd.DataFrame, fmt: str, base: str = "bf16/bf16") -> pd.Series:
    t = table.drop_duplicates(["model", "kv_format"]).set_index(["model", "kv_format"]).kv_tokens
    return (t.xs(fmt, level="kv_format") / t.xs(base, level="kv_format")).dropna()


def needle_reading(needle: pd.DataFrame) -> Check:
    """'Whether the half you keep still answers the question is not arithmetic', against the needle grid.

    Holds when bytes per value fail to rank the damage: fp8_e4m3 (8 bits) moves the needle's recovered
    weight further than q8_0 (8.5 bits) on the same haystack in more than half of the haystacks (the
    Wilson 95% interval above 50%). Without both formats in the grid, only retrieval is reported.
    """
    exact = needle[needle["accumulator"] == "exact"] if "accumulator" in needle else needle
    summ = needle_summary(exact)
    quant = summ[summ.storage != "none/none"]
    worst = quant.sort_values(["lo", "n_tokens"]).iloc[0] if len(quant) else summ.iloc[0]
    lost = quant[quant.retrieved < quant.trials]
    same = quant.rate.nunique() == 1
    retrieval = ("retrieved within 2x of its weight in every format and context, " +
                 (f"{worst.rate} in each" if same else f"lowest {worst.rate} ({worst.storage} at {worst.n_tokens:,} "
                                                      f"tokens)") if lost.empty else
                 "lost in " + ", ".join(f"{r.storage} at {r.n_tokens:,} tokens ({r.rate})" for r in lost.itertuples()))
    claim = "whether the half you keep still answers the question is not arithmetic"
    formats_there = set(exact.storage)
    if not {FP8, Q8} <= formats_there:
        return Check(READING, claim, "not arithmetic", "the needle was " + retrieval, True,
                     "the grid has no fp8_e4m3 and q8_0 pair to test whether bytes rank the damage")
    vs_q8 = paired_worse(exact, FP8, Q8).iloc[-1]
    computed = f"fp8_e4m3 (8 bits) moved the needle's weight further than q8_0 (8.5 bits) in {vs_q8.rate} of haystacks"
    if Q4 in formats_there:
        vs_q4 = paired_worse(exact, FP8, Q4).iloc[-1]
        computed += f", and further than q4_0 (4.5 bits) in {vs_q4.rate}"
    return Check(READING, claim, "not arithmetic", computed, bool(vs_q8.lo > 0.5),
                 "bytes per value do not rank the damage: fp8 at per-tensor scale 1.0 (vLLM's uncalibrated cache) "
                 "rounds every value to 3 mantissa bits, q8_0 keeps 8 bits under a per-block scale; the needle was "
                 + retrieval)


def readings(table: pd.DataFrame, needle: pd.DataFrame, post_request_tokens: int = 8192) -> list[Check]:
    """The post's readings on bytes and requests, checked against notebook 09's tables.

    ``table`` is :func:`kvcost.experiments.plan.plan_table`'s output, ``needle`` the needle grid.
    """
    out = []
    fmts = set(table.kv_format)
    if {"bf16/bf16", "fp8_e4m3/fp8_e4m3"} <= fmts:
        r = _ratio(table, "fp8_e4m3/fp8_e4m3")
        out.append(Check(READING, "halving it [the cache] with one byte per value is arithmetic", "2x",
                         f"fp8 holds {r.min():.3f}x to {r.max():.3f}x the tokens of bf16 over {len(r)} models",
                         bool((r.round(3) == 2.0).all())))
    if len(needle):
        out.append(needle_reading(needle))
    printed = post.sizing_table().set_index("model")
    for name in printed.index:
        g = load_model(name)
        if g.max_position_embeddings is not None and post_request_tokens > g.max_position_embeddings:
            out.append(Check(READING, f"{name}: {printed.loc[name, 'requests_at_budget']} requests of "
                             f"{post_request_tokens:,} tokens in 24 GiB (the post's table)",
                             printed.loc[name, "requests_at_budget"],
                             f"{post_request_tokens:,} tokens exceed {name}'s max_position_embeddings "
                             f"{g.max_position_embeddings:,}: the row counts requests the model is not trained "
                             f"to serve", False))
    return out


def printed() -> list[Check]:
    """None here: nothing in notebook 09 re-prints the post's numbers (notebook 01 reproduces its table)."""
    return []


def errata() -> list[Check]:
    """None here: the post's words on bytes and requests are read against the plan (:func:`readings`)."""
    return []


def verdict(table: pd.DataFrame, needle: pd.DataFrame, changed: Sequence[str] = ()) -> Verdict:
    """Notebook 09's verdict: the readings (:func:`readings`) in the default run; a run that ``changed``
    parameters checks none of them, and says so."""
    if changed:
        return Verdict(extra=f"Run with other parameters ({', '.join(changed)}): the post's readings are checked "
                             "in the default run only.")
    return Verdict(printed=printed(), readings=readings(table, needle), errata=errata(),
                   extra="Nothing here re-prints the post's numbers; notebook 01 reproduces its table.")


def decode_checks(path: str | Path | None = None, efficiency: float = decode.DEFAULT_EFFICIENCY) -> pd.DataFrame:
    """The decode estimate (:func:`kvcost.planning.decode.estimate`) against each published measurement of
    ``data/decode_published.csv``: one row per measurement with the estimate at ``efficiency`` (KV reads
    slowed by the kernel's published factor, :func:`kvcost.planning.decode.kernel_factors`) and on bytes alone, the
    bandwidth share the measurement implies (the bytes-only estimate at full bandwidth over the measured
    time), and for each fp8 slope the measured and estimated ratio to bf16's. ``role`` says which rows
    calibrate the kernel factors (:data:`kvcost.planning.decode.CALIBRATION_MODEL`'s slopes: they agree by
    construction) and which are held out (every other row: where they disagree, bytes and one factor per
    kernel are too simple).

    ``itl_slope``: ms per context token at concurrency 1, the growth bytes of every non-windowed layer;
    ``itl_intercept``: ms at an empty context, the weights read once (MoE: the experts one token reaches);
    ``median_itl_c8_20k``: 8 requests at 21,000 tokens each (the ~20k input plus half the ~2k output).
    """
    if path is None:
        rows = decode.published()
    else:
        with open(checked(path), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    slopes: dict[tuple[str, str, str], float] = {}
    est: dict[tuple[str, str, str], tuple[float, float]] = {}
    out = []
    for r in rows:
        card, g = gpus.gpu(r["gpu"]), load_model(r["model"])
        w = weights.model_weights(r["model"])
        value = float(r["value"])
        q = r["quantity"]
        bw = card.bandwidth_tbs
        assert bw is not None
        if q == "itl_slope":
            full = decode.estimate(g, w, r["kv"], 1, 1, bw, efficiency=1.0, card=card).slope_ms_per_token
            plain = decode.estimate(g, w, r["kv"], 1, 1, bw, efficiency=1.0).slope_ms_per_token
            slopes[r["gpu"], r["model"], r["kv"]] = value
            est[r["gpu"], r["model"], r["kv"]] = (full, plain)
        elif q == "itl_intercept":
            d = decode.estimate(g, w, r["kv"], 1, 1, bw, efficiency=1.0)
            full = plain = d.weights_read_bytes / (bw * 1e12) * 1e3
        elif q == "median_itl_c8_20k":
            full = decode.estimate(g, w, r["kv"], 21000, 8, bw, efficiency=1.0, card=card).itl_ms
            plain = decode.estimate(g, w, r["kv"], 21000, 8, bw, efficiency=1.0).itl_ms
        else:
            continue
        calib = q == "itl_slope" and r["model"] == decode.CALIBRATION_MODEL
        out.append({"gpu": r["gpu"], "model": r["model"], "kv": r["kv"], "quantity": q, "published": value,
                    "estimate": full / efficiency, "estimate_bytes_only": plain / efficiency,
                    "implied_efficiency": plain / value, "estimate_over_published": full / efficiency / value,
                    "role": "calibration" if calib else "held out", "setting": r["setting"],
                    "citation": r["citation"]})
    table = pd.DataFrame(out)
    ratios = []

    def ratio_row(gpu_name: str, model: str, kv: str, quantity: str, published: float, setting: str,
                  citation: str) -> dict[str, object]:
        (f, p), (f0, p0) = est[gpu_name, model, kv], est[gpu_name, model, "bf16"]
        calib = model == decode.CALIBRATION_MODEL and quantity == "slope_ratio_to_bf16"
        return {"gpu": gpu_name, "model": model, "kv": kv, "quantity": quantity, "published": published,
                "estimate": f / f0, "estimate_bytes_only": p / p0, "implied_efficiency": float("nan"),
                "role": "calibration" if calib else "held out", "setting": setting, "citation": citation}

    for (gpu_name, model, kv), value in slopes.items():
        base = slopes.get((gpu_name, model, "bf16"))
        if kv == "bf16" or base is None:
            continue
        ratios.append(ratio_row(gpu_name, model, kv, "slope_ratio_to_bf16", value / base,
                                "fitted ITL slopes, concurrency 1", "ratio of the two slopes above"))
    for r in rows:
        if r["quantity"] == "slope_ratio_before":
            ratios.append(ratio_row(r["gpu"], r["model"], r["kv"], "slope_ratio_before_fixes", float(r["value"]),
                                    r["setting"], r["citation"]))
    if ratios:
        rt = pd.DataFrame(ratios)
        rt["estimate_over_published"] = rt.estimate / rt.published
        table = pd.concat([table, rt], ignore_index=True)
    return table
