"""Notebook 04's verdict: the post's Block 3 table to the digits printed, and its claims about the accumulator."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvcost.claims.report import ERRATUM, Check, Verdict, compare_table, printed_check, untested_rows
from kvcost.experiments.accumulator_floor import FLAT_SUM_COLUMNS, POST_ULP_MANTISSA, post_flat_sum
from kvcost.floats import parse_format
from kvcost.inputs import post
from kvcost.numerics.accum import equal_terms_sum, flat_sum_limit, hopper_sum, running_sum

__all__ = ["COMPANION", "errata", "errata_table", "post_n_tokens", "printed", "readings", "verdict"]

#: Said under the errata's verdict.
COMPANION = "The companion notebook `04b_accumulation_beyond_flat.ipynb` goes past flat weights."


def post_n_tokens() -> list[int]:
    """The context lengths the post's Block 3 printed."""
    return [int(n) for n in post.flat_sum_table()["n"]]


def _stall_text(fmt: str) -> tuple[int, str]:
    lim = flat_sum_limit(fmt)
    runs = {k: equal_terms_sum(k, fmt) for k in (lim // 2, lim, 2 * lim)}
    return lim, ", ".join(f"n={k:,}: {v:.6g}" for k, v in runs.items())


def errata_table(block: int = 128) -> pd.DataFrame:
    """The post's claims about Block 3 against measured runs: claim, post, measured, verdict.

    Every measured value comes from running sums (fp32 at n = 2^23, 2^24, 2^25 included); the
    claims about the post's table are checked at the context lengths it printed. ``block`` is
    the block of the true two-level accumulation shown beside the post's "2-level" column.
    """
    n_tokens = post_n_tokens()
    rows = []
    for r in post.ulp_lines().itertuples(index=False):
        post_tokens = int(r.tokens.replace(",", ""))
        lim, txt = _stall_text(r.fmt)
        rows.append({"claim": f"{r.fmt}: a flat distribution longer than {post_tokens:,} tokens stops accumulating",
                     "post": f"{post_tokens:,}", "measured": f"{lim:,} (last n with sum 1.0; {txt})",
                     "verdict": "correct" if lim == post_tokens else
                     f"wrong: the sum stays exactly 1.0 up to {lim:,} = 2^(p+1) tokens"})
    for kind, mant in POST_ULP_MANTISSA.items():
        ulp = parse_format(kind).ulp(1.0)
        true_exp = -int(math.log2(ulp))
        rows.append({"claim": f"{kind}: 1 ULP at a sum of 1.0 = 2^-{mant}", "post": f"2^-{mant}",
                     "measured": f"2^-{true_exp} = {ulp:.6g}",
                     "verdict": "correct" if true_exp == mant else
                     f"wrong: {kind} stores {true_exp} fraction bits, so its ULP at 1.0 is 2^-{true_exp}"})
    fb = parse_format("fp16")
    n1, n2 = 2 ** (fb.man_bits + 1), 2 ** (fb.man_bits + 2)
    v1, v2 = equal_terms_sum(n1, fb), equal_terms_sum(n2, fb)
    rows.append({"claim": "The floor is 2^-mantissa: an increment is lost once it falls below one ULP of the sum",
                 "post": "n > 2^mantissa stalls",
                 "measured": f"fp16: n={n1}: {v1:g}, n={n2}: {v2:g} (the sum stalls at 1/2, where 1/{n2} is half "
                             f"an ULP: a tie, rounded to the even 1/2)",
                 "verdict": "correct" if v2 == 1.0 or v1 != 1.0 else
                            "wrong by 2x: the stall starts at n > 2^(p+1), p = stored fraction bits; the sum stops "
                            "at 1/2, where the ULP is half the ULP at 1.0"})
    # "two-level returns 1.000000 at every context length tested"
    post_tl = [post_flat_sum(n, "bf16", two_level=True) for n in n_tokens]
    true_tl = [float(running_sum(np.full(n, 1.0 / n), "bf16", block=block)) for n in n_tokens]
    post_ones = all(f"{v:.6f}" == "1.000000" for v in post_tl)
    true_text = sorted(set(f"{v:.6f}" for v in true_tl))
    rows.append({"claim": "two-level returns 1.000000 at every context length tested",
                 "post": f"1.000000 x {len(n_tokens)}",
                 "measured": f"post's column (float32 running sum): {sorted(set(f'{v:.6f}' for v in post_tl))}; "
                             f"true two-level (bf16 blocks of {block}, fp32 partials): {true_text}",
                 "verdict": (f"correct, but the post's column is a float32 running sum, not two-level; true "
                             f"two-level with block {block} prints {', '.join(true_text)}") if post_ones else
                            "wrong: the post's own column does not print 1.000000 at every n"})
    # "the truth sits between the flat and two-level columns"
    between = []
    for n in n_tokens:
        x = np.full(n, 1.0 / n)
        h = float(hopper_sum(x))
        between.append(float(running_sum(x, "bf16")) <= h <= post_flat_sum(n, "bf16", two_level=True))
    rows.append({"claim": "real tensor cores: the truth sits between the flat and two-level columns",
                 "post": "between", "measured": f"Hopper FP8 model (14 bits, groups of 32, no promotion) between "
                                                f"bf16 flat and two-level at {sum(between)} of {len(between)} n",
                 "verdict": "correct in the model" if all(between) else "wrong in the model at some n"})
    return pd.DataFrame(rows, columns=["claim", "post", "measured", "verdict"])


def printed(table: pd.DataFrame) -> list[Check]:
    """Checks of ``table`` (from :func:`kvcost.experiments.accumulator_floor.flat_sum_table`) against the
    post's printed Block 3 output, to the digits printed, for every n both have; and of the ULP lines."""
    checks = compare_table(post.flat_sum_table(), table, ["n"], {c: ".6f" for c in FLAT_SUM_COLUMNS[1:]})
    for r in post.ulp_lines().itertuples(index=False):
        mant = POST_ULP_MANTISSA[r.fmt]
        checks.append(printed_check(f"{r.fmt} ULP line: 2^-{r.mantissa}", r.ulp, 2.0 ** -mant, ".6f"))
        checks.append(printed_check(f"{r.fmt} ULP line: tokens", r.tokens, int(2 ** mant), ","))
    return checks


def readings() -> list[Check]:
    """None here: the post's claims about Block 3 are errata (:func:`errata`)."""
    return []


def errata(rows: pd.DataFrame) -> list[Check]:
    """The rows of :func:`errata_table` as errata (correct when the measured verdict upholds the claim)."""
    out = []
    for r in rows.itertuples(index=False):
        ok = r.verdict.startswith("correct")
        note = r.verdict.removeprefix("correct" if ok else "wrong").lstrip(",:").strip()
        out.append(Check(ERRATUM, r.claim, r.post, r.measured, ok, note))
    return out


def verdict(table: pd.DataFrame | None = None, errata_rows: pd.DataFrame | None = None) -> Verdict:
    """Notebook 04's two Verdict cells: with ``table`` (:func:`kvcost.experiments.accumulator_floor.flat_sum_table`)
    the printed numbers of Block 3 and the rows the post did not print; with ``errata_rows``
    (:func:`errata_table`) the errata."""
    return Verdict(
        printed=printed(table) if table is not None else [],
        readings=readings(),
        errata=errata(errata_rows) if errata_rows is not None else [],
        untested=untested_rows(post.flat_sum_table(), table, ["n"]) if table is not None else [],
        what="printed numbers of Block 3",
        extra=COMPANION if errata_rows is not None else "")
