"""kvcost.experiments.two_decoders and kvcost.claims.two_decoders: known answers first, then the committed runs."""
import math

import pandas as pd
import pytest

from kvcost.claims import two_decoders as claims
from kvcost.experiments import real_decoder as real
from kvcost.experiments import real_decoder_passkey as pk
from kvcost.experiments import two_decoders as two
from kvcost.models import decoders


def _grid(variant_success: dict[str, list[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"context": 4096, "trial": i, "variant": v, "success": s, "margin": 1.0}
                         for v, ss in variant_success.items() for i, s in enumerate(ss)])


def test_against_exact_detects_a_lost_needle_and_says_what_no_detection_means():
    rows = _grid({"exact": [1] * 20, "same": [1] * 20, "lost": [0] * 20, "few": [1] * 18 + [0] * 2,
                  "store:q4_0": [1] * 19 + [0]})
    t = two.against_exact(rows).set_index("variant")
    assert bool(t.loc["lost", "loses_needle"]) and t.loc["lost", "verdict"] == "loss detected"
    assert (t.loc["lost", "lost"], t.loc["lost", "gained"]) == (20, 0)
    assert t.loc["lost", "p_value"] == pytest.approx(2 * 0.5 ** 20)
    for v in ("same", "few", "store:q4_0"):              # 0, 2 and 1 trials lost of 20: not detectable
        assert not t.loc[v, "loses_needle"]
        assert t.loc[v, "verdict"].startswith("no loss detected at n = 20 (a loss of ")
    # only "lost" (20 discordant) could ever reach 5% (Tarone: 2 discordant trials give p >= 0.5), so the family is
    # one and a loss of d trials with none gained is detected once 2^(1-d) < 0.05: d = 6
    assert set(t["detectable"]) == {6}
    assert t.loc["few", "successes"] == 18 and t.loc["few", "exact_successes"] == 20
    # a variant is judged only on the trials exact attention ran
    assert two.against_exact(rows[(rows["variant"] != "exact") | (rows["trial"] < 5)]).set_index("variant").loc[
        "lost", "trials"] == 5
    assert two.against_exact(pd.DataFrame()).empty


def test_a_loss_the_grid_was_not_sure_to_detect_can_still_be_detected_after_a_larger_one():
    """Gemma's niah_multikey_1 family in miniature: seven rows that could reach significance, so a first rejection
    needs p < 0.05/7 (9 of 9 lost: p 0.0039); 8 of 8 lost (p 0.0078) is not sure to be detected (``detectable``
    missing) yet is, at Holm's second step (0.05/6), once the 9-trial loss is rejected."""
    exact = {"a": 12, "b": 8, "c": 10, "d": 10, "e": 10, "f": 10, "g": 10}
    lost = {"a": 9, "b": 8, "c": 6, "d": 6, "e": 6, "f": 6, "g": 6}
    rows = pd.DataFrame([{"context": 1000 * (k + 1), "trial": i, "variant": v, "success": s}
                         for k, (ctx, e) in enumerate(exact.items())
                         for i in range(20)
                         for v, s in (("exact", int(i < e)), ("fa3:frac_bits=2", int(lost[ctx] <= i < e)))])
    t = two.against_exact(rows).set_index("context")
    assert list(t["lost"]) == [9, 8, 6, 6, 6, 6, 6] and (t["gained"] == 0).all()
    assert t.loc[1000, "loses_needle"] and t.loc[2000, "loses_needle"] and not t.loc[3000:, "loses_needle"].any()
    assert pd.isna(t.loc[2000, "detectable"]) and t.loc[1000, "detectable"] == 9
    assert t.loc[2000, "verdict"] == "loss detected"
    assert t.loc[3000, "verdict"] == "no loss detected at n = 20 (a loss of 9 trials would have been detected)"


def test_against_exact_reports_the_margin_shift_apart_and_sees_it_where_exact_never_retrieves():
    """Exact attention retrieving none: no loss is countable, but a kernel that lowers every trial's answer margin
    by 0.3 says so through the margin, and one that leaves it is centred on zero."""
    import numpy as np

    base = np.random.default_rng(0).normal(-1.5, 0.5, 20)
    rows = pd.DataFrame([{"context": 16384, "trial": i, "variant": v, "success": 0, "margin": m}
                         for v, ms in {"exact": base, "fa3": base - 0.3,
                                       "fa3:flush_every=1": base + np.random.default_rng(1).normal(0, 0.05, 20)}.items()
                         for i, m in enumerate(ms)])
    t = two.against_exact(rows).set_index("variant")
    assert list(t.columns[-4:]) == ["margin_shift", "margin_lo", "margin_hi", "verdict"]
    assert t.loc["fa3", "margin_shift"] == pytest.approx(-0.3) and t.loc["fa3", "margin_hi"] == pytest.approx(-0.3)
    assert t.loc["fa3:flush_every=1", "margin_lo"] < 0 < t.loc["fa3:flush_every=1", "margin_hi"]
    assert (t["lost"] == 0).all()
    assert t["verdict"].str.endswith("(exact retrieves too few: no loss this grid is sure to detect)").all()
    no_margin = two.against_exact(rows.drop(columns="margin"))
    assert no_margin["margin_shift"].isna().all() and len(no_margin) == 2


def test_rank_agreement_knows_the_same_and_the_reversed_order():
    fmts = [f"f{i}" for i in range(8)]
    same = pd.DataFrame({"format": fmts * 2, "model": ["a"] * 8 + ["b"] * 8, "rank": list(range(1, 9)) * 2})
    r = two.rank_agreement(same, permutations=2000)
    assert r["rho"] == pytest.approx(1.0) and r["p"] < 0.001 and r["formats"] == 8
    rev = same.assign(rank=list(range(1, 9)) + list(range(8, 0, -1)))
    r = two.rank_agreement(rev, permutations=2000)
    assert r["rho"] == pytest.approx(-1.0) and r["p"] > 0.99
    with pytest.raises(ValueError, match="'side'"):
        two.rank_agreement(same[same["model"] == "a"])


def test_storage_side_by_side_joins_a_format_across_channel_orders():
    def table(fmts, kls):
        return pd.DataFrame({"context": 2048, "format": fmts, "windows": 4, "kl": kls, "kl_lo": kls, "kl_hi": kls,
                             "dppl": 0.0, "dppl_lo": 0.0, "dppl_hi": 0.0, "top1": 1.0, "engine_order": True})
    smol = table(["fp32", "q8_0", "nvfp4@hf", "only_here"], [0.0, 0.001, 0.1, 0.5])
    gemma = table(["fp32", "q8_0", "nvfp4"], [0.0, 0.002, 0.2])
    side = two.storage_side_by_side({"smollm2-135m": smol, "gemma3-270m": gemma}, 2048)
    assert sorted(set(side["format"])) == ["nvfp4", "q8_0"]          # shared only, fp32 (the reference) left out
    nv = side[side["format"] == "nvfp4"].set_index("model")
    assert nv.loc["SmolLM2-135M-Instruct", "measured_as"] == "nvfp4@hf" and nv.loc["Gemma 3 270M", "kl"] == 0.2
    assert list(side[side["format"] == "q8_0"]["rank"]) == [1, 1]
    twice = table(["q8_0", "q8_0@hf"], [0.1, 0.2])
    with pytest.raises(ValueError, match="twice"):
        two.storage_side_by_side({"smollm2-135m": twice}, 2048)
    # SmolLM2's GGUF permutes K: its engine rows only; Gemma's has one order: every row
    mixed = table(["q4_0", "q4_0@hf"], [0.1, 0.2]).assign(engine_order=[True, False])
    assert list(two.engine_rows(mixed, "smollm2-135m")["format"]) == ["q4_0"]
    assert len(two.engine_rows(mixed, "gemma3-270m")) == 2


def test_retrieval_readings_report_each_effect_separately():
    rows = _grid({"exact": [1] * 20, "fa3": [1] * 20, "fa3:frac_bits=4": [0] * 20, "store:kivi2": [0] * 20})
    against = {"smollm2-135m": two.against_exact(rows)}
    kernel = claims.retrieval_reading(against, "kernel")
    stored = claims.retrieval_reading(against, "stored")
    assert kernel.agrees is True and "no loss detected for 1 variants at n = 20" in kernel.computed
    assert "frac_bits" not in kernel.computed                       # the narrowed register is not the kernel
    assert stored.agrees is False and "loss detected for store:kivi2" in stored.computed
    # exact attention retrieving 3 of 20: no loss could have been detected, so "no loss" is not shown as kept
    few = _grid({"exact": [1] * 3 + [0] * 17, "fa3": [1] * 2 + [0] * 18})
    blind = claims.retrieval_reading({"gemma3-270m": two.against_exact(few)}, "kernel", "niah_multikey_2")
    assert blind.agrees is None and blind.claim.endswith("on RULER niah_multikey_2")
    assert "exact attention retrieves 3: no loss this grid is sure to detect" in blind.computed
    # one context that could detect a loss and one that could not: the blind one is named, not pooled
    mixed = pd.concat([_grid({"exact": [1] * 20, "fa3": [1] * 20}),
                       _grid({"exact": [1] * 3 + [0] * 17, "fa3": [1] * 3 + [0] * 17}).assign(context=32768)])
    part = claims.retrieval_reading({"gemma3-270m": two.against_exact(mixed)}, "kernel")
    assert part.agrees is True
    assert part.computed.endswith("no loss detected for 2 variants at n = 20 (a loss of 6 trials would have been "
                                  "detected at 4,096; at 32,768 exact attention retrieves 3: no loss this grid is sure "
                                  "to detect)")



# The niah_multikey_1 family as committed on 2026-12-06 (0dcc0ef): 57 (context, variant) cells. Rows are only ever
# appended, so this family's verdicts are fixed; the grid that grows past it is read by the invariants below.
_KERNEL = ["fa3", "fa3:arch=Blackwell", "fa3:flush_every=1", "fa3:flush_every=4", "fa3:frac_bits=2",
           "fa3:frac_bits=3", "fa3:frac_bits=4", "fa3:frac_bits=5", "fa3:frac_bits=7"]
_STORED_FIRST = ["store:fp8_e4m3", "store:q4_0", "store:q8_0", "store:q8_0/q4_0"]
_STORED_NEWER = ["store:fp4_mx_block16", "store:fp8_e4m3_token", "store:fp8_e4m3fnuz", "store:int4_token",
                 "store:int8_token", "store:mxfp4", "store:mxfp8", "store:nvfp4", "store:nvfp4_4over6",
                 "store:turboquant_3bit_nc", "store:turboquant_4bit_nc", "store:turboquant_k3v4_nc",
                 "store:turboquant_k8v4"]
MULTIKEY_1_FAMILY_57 = {4096: _KERNEL + _STORED_FIRST + _STORED_NEWER, 8192: _KERNEL + _STORED_FIRST,
                        16384: _KERNEL + _STORED_FIRST,
                        32768: ["fa3", "fa3:arch=Blackwell", "fa3:flush_every=1", "fa3:frac_bits=2", "fa3:frac_bits=5"]}


def _multikey_1(model: str, family: dict[int, list[str]] | None = None) -> pd.DataFrame:
    rows = two.load_results(model, pk.results_name("niah_multikey_1"))
    if family is not None:
        keep = [v == "exact" or v in family.get(c, ()) for c, v in zip(rows["context"], rows["variant"])]
        rows = rows[keep]
    return two.against_exact(rows, min_trials=20)


def test_committed_multikey_1_grids_say_which_losses_a_count_can_see():
    """RULER niah_multikey_1 (four keys in an essay haystack) is within both small models' reach, unlike
    niah_multikey_2: the committed grids can detect a loss, and on SmolLM2 they do. Read on the family of 57
    Gemma cells committed on 2026-12-06, whose verdicts later cells cannot change."""
    grids = {"gemma3-270m": _multikey_1("gemma3-270m", MULTIKEY_1_FAMILY_57),
             "smollm2-135m": _multikey_1("smollm2-135m")}
    g = grids["gemma3-270m"]
    assert len(g) == 57 and (g["trials"] == 20).all()
    assert (g.loc[g["context"] == 4096, "exact_successes"] == 10).all()
    assert (g.loc[g["context"] <= 8192, "detectable"] == 10).all()          # a loss of 10 trials would show
    assert g.loc[g["context"] >= 16384, "detectable"].isna().all()          # exact's 9 and 8: none is sure to
    lost_4k = ["store:int4_token", "store:fp4_mx_block16", "store:turboquant_k3v4_nc", "store:turboquant_3bit_nc"]
    four = g[(g["context"] == 4096) & g["variant"].isin(lost_4k)]
    assert len(four) == 4 and four["loses_needle"].all() and list(four["lost"]) == [10, 9, 10, 10]
    full = g[~g["variant"].str.contains("frac_bits") & ~g["variant"].isin(["store:q4_0", *lost_4k])]
    assert len(full) >= 30 and not full["loses_needle"].any()               # FP8 at full register width, storage
    q4 = g[g["variant"] == "store:q4_0"].set_index("context")
    assert list(q4["loses_needle"]) == [False, True, False] and q4.loc[8192, "lost"] == 10   # q4_0 loses it at 8k
    two_bit = g[g["variant"] == "fa3:frac_bits=2"].set_index("context")
    assert list(two_bit["lost"]) == [5, 9, 6, 8] and (two_bit["gained"] <= 1).all()
    # lost at 8k (9 of 12) and 32k (all 8: at Holm's second step), not resolved at 4k or 16k
    assert list(two_bit["loses_needle"]) == [False, True, False, True]
    s = grids["smollm2-135m"].set_index("variant")
    assert set(s["context"]) == {2048}
    assert s.loc["fa3:frac_bits=2", "loses_needle"] and s.loc["store:q4_0", "loses_needle"]
    assert not s.loc[["fa3", "fa3:arch=Blackwell", "store:q8_0", "store:fp8_e4m3"], "loses_needle"].any()
    kernel = claims.retrieval_reading(grids, "kernel", "niah_multikey_1")
    stored = claims.retrieval_reading(grids, "stored", "niah_multikey_1")
    assert kernel.agrees is True and kernel.claim.endswith("on RULER niah_multikey_1")
    assert stored.agrees is False and "loss detected for store:q4_0" in stored.computed
    gemma = ("Gemma 3 270M at 4,096, 8,192, 16,384 tokens: loss detected for store:q4_0 at 8,192, store:int4_token "
             "at 4,096, store:fp4_mx_block16 at 4,096, store:turboquant_k3v4_nc at 4,096, store:turboquant_3bit_nc at "
             "4,096 (of ")
    assert gemma in stored.computed


def test_committed_multikey_1_grid_as_it_grows_keeps_holms_order():
    """Whatever cells have landed since: a larger family can only take rejections away (Holm–Tarone's threshold for
    a cell is alpha over one plus the cells with larger p-values, and cells are only added), each rejection is a
    net loss with a raw p-value under alpha, and every cell of the fixed family is still there, whole."""
    now = _multikey_1("gemma3-270m").set_index(["context", "variant"])
    pinned = _multikey_1("gemma3-270m", MULTIKEY_1_FAMILY_57).set_index(["context", "variant"])
    assert set(pinned.index) <= set(now.index) and len(now) >= 57 and (now["trials"] == 20).all()
    old = now.loc[pinned.index]
    assert (old[["lost", "gained", "successes"]] == pinned[["lost", "gained", "successes"]]).all().all()
    assert not (old["loses_needle"] & ~pinned["loses_needle"]).any()       # nothing newly rejected among old cells
    rejected = now[now["loses_needle"]]
    assert ((rejected["lost"] > rejected["gained"]) & (rejected["p_value"] < 0.05)).all()
    was = pinned["detectable"].astype("float64")
    is_ = old["detectable"].astype("float64")
    assert ((is_ >= was) | is_.isna()).all()                               # a larger family detects no smaller loss
    stored = claims.retrieval_reading({"gemma3-270m": now.reset_index()}, "stored", "niah_multikey_1")
    named = {f"{v} at {c:,}" for c, v in rejected.index if v.startswith("store:")}
    assert all(cell in stored.computed for cell in named) and (stored.agrees is False) == bool(named)


def test_committed_runs_side_by_side():
    windows = {m: real.load_windows(two.windows_name(m)) for m in two.DECODERS}
    assert two.windows_name("gemma3-270m") == "gemma3_270m/ppl_windows.csv"
    tables = {m: two.engine_rows(real.format_table(w), m) for m, w in windows.items()}
    side = two.storage_side_by_side(tables, 2048)
    r = two.rank_agreement(side)
    assert r["formats"] >= 15 and r["rho"] > 0.8 and r["p"] < 0.01
    q8 = claims.q8_0_reading(tables, 2048)
    assert q8.agrees is True and "Gemma 3 270M" in q8.computed
    heads = {m: two.load_results(m, "head_stats.csv") for m in two.DECODERS}
    kv = two.structure(heads).set_index(["model", "layer_type"])
    assert math.isnan(kv.loc[("SmolLM2-135M-Instruct", "full"), "k_norm"])
    assert kv.loc[("Gemma 3 270M", "full"), "layers"] == 3 and kv.loc[("Gemma 3 270M", "sliding"), "layers"] == 15
    assert two.run_command({"command": "python x.py --out /tmp/a/b.csv --k 1"}) == "python x.py --out <scratch> --k 1"
    with pytest.raises(ValueError, match="no results file"):
        two.load_results("gemma3-270m", "nothing.csv")
    assert two.load_results("gemma3-270m", "nothing.csv", required=False).empty


def test_law_reading_says_when_a_decoder_cannot_predict():
    smol = {"contexts": 2, "x_c": 90.5, "x_lo": 90.5, "x_hi": 128.0, "full_bits": 13, "n_fail": 741455.0,
            "n_lo": 741455.0, "n_hi": 1048576.0}
    none = {"contexts": 0, "x_c": math.inf, "x_lo": 0.5, "x_hi": math.inf, "full_bits": 13, "n_fail": math.inf,
            "n_lo": 4096.0, "n_hi": math.inf}
    both = claims.law_reading({"smollm2-135m": smol, "gemma3-270m": none})
    assert both.agrees is False                       # SmolLM2's interval lies above 128k
    assert "fails near 741,455 tokens [741,455, 1,048,576]" in both.computed and "no prediction" in both.computed
    assert claims.law_reading({"gemma3-270m": none}).agrees is None
    near = dict(smol, n_lo=100_000.0)
    assert claims.law_reading({"smollm2-135m": near}).agrees is True
    # an interval that holds 128k only by being open at one end places nothing: not shown, and it says why
    for open_end in (dict(smol, n_lo=100_000.0, n_hi=math.inf), dict(smol, n_lo=0.0)):
        c = claims.law_reading({"smollm2-135m": open_end})
        assert c.agrees is None and "open at one end" in c.computed
    # ...but an interval lying wholly above 128k says no even when it has no upper bound
    assert claims.law_reading({"smollm2-135m": dict(smol, n_hi=math.inf)}).agrees is False
    assert claims.law_reading({}) is None


def test_effects_reading_knows_which_effect_loses_the_passkey():
    from kvcost.experiments import real_decoder_passkey as pk

    # decoder A: the haystack at half weight loses the answer, the needle at half weight does not (SmolLM2's
    # pattern); decoder B the reverse. The needle removed loses it on both: the measure means retrieval.
    a = pk.propagation_table(_grid({"exact": [1] * 20, "split:haystack=0.5": [0] * 18 + [1] * 2,
                                    "split:needle=0.5": [1] * 20, "split:needle=0": [0] * 20}))
    b = pk.propagation_table(_grid({"exact": [1] * 20, "split:haystack=0.5": [1] * 20,
                                    "split:needle=0.5": [0] * 20, "split:needle=0": [0] * 20}))
    only_a = claims.effects_reading({"smollm2-135m": a})
    assert only_a.agrees is True and "the haystack at ×0.5 2/20 (−18 +0" in only_a.computed
    both = claims.effects_reading({"smollm2-135m": a, "gemma3-270m": b})
    assert both.agrees is False and "Gemma 3 270M at 4,096 tokens (exact 20/20)" in both.computed
    assert "the needle at ×0.5 0/20 (−20 +0, p 1.9e-06, answer changed)" in both.computed
    # a needle removed that is still retrieved: the split does not measure retrieval, so nothing is shown
    c = pk.propagation_table(_grid({"exact": [1] * 20, "split:haystack=0.5": [0] * 20, "split:needle=0.5": [1] * 20,
                                    "split:needle=0": [1] * 20}))
    assert claims.effects_reading({"smollm2-135m": c}).agrees is None
    assert claims.effects_reading({"smollm2-135m": a.iloc[0:0]}) is None


def test_propagation_rows_pair_with_exact():
    smol = two.propagation_rows("smollm2-135m")
    assert (smol["variant"] == "exact").sum() == 20 and smol["context"].unique().tolist() == [1024]


def test_k_axis_reading_on_both_extracts():
    from kvcost.models import decoders

    assert decoders.decoder("gemma3-270m").extract_file() == "gemma3_270m_kv.npz"
    assert decoders.decoder("smollm2-135m").extract_file(heads=True) == "smollm2_heads.npz"
    axes = two.axis_by_decoder((8, 4, 2)).set_index(["model", "cache", "bits"])
    gemma = axes.loc[("Gemma 3 270M", "K", 4)]
    assert (gemma["heads"], gemma["layers"], gemma["per_channel_wins"]) == (4, 4, 4)
    assert 0.5 < gemma["ratio"] < 0.6 and gemma["lo"] == pytest.approx(0.51, abs=0.01)
    assert axes.loc[("SmolLM2-135M-Instruct", "V", 2), "per_channel_wins"] == 0   # V per token, as the post says
    c = claims.k_axis_reading(axes.reset_index())
    assert c.agrees is True and c.published == "K: per-channel at 8 and 4 bits"
    assert "Gemma 3 270M (4 layers of its extract): 8-bit: per-channel in 4/4 heads" in c.computed
    # the same heads read the other way round (per-token better everywhere): does not hold
    flipped = axes.reset_index().assign(per_channel_wins=0, share=0.0, lo=0.0, hi=0.3)
    assert claims.k_axis_reading(flipped).agrees is False
    assert claims.k_axis_reading(axes.reset_index().iloc[0:0]) is None


def test_the_published_register_loss_comes_from_the_data_file():
    from kvcost.claims import real_decoder as one

    pub = one.published_register_loss()
    assert pub == {"bf16": 0.91, "fp8": 0.13, "context": 131072}
    # the law reading defaults to that context: an interval reaching 131,072 holds, one above it does not
    d = {"contexts": 1, "x_c": 16.0, "x_lo": 15.0, "x_hi": 17.0, "full_bits": 13, "n_fail": 131072.0,
         "n_lo": 122880.0, "n_hi": 139264.0}
    assert claims.law_reading({"smollm2-135m": d}).agrees is True
    assert claims.law_reading({"smollm2-135m": dict(d, n_lo=140000.0, n_hi=150000.0)}).agrees is False


def _margins(context: int, cost: float, restored: float, n: int = 20, seed: int = 0) -> pd.DataFrame:
    """A grid whose FA3 lowers every trial's margin by ``cost`` and whose fixes give back ``restored`` of it."""
    import numpy as np

    base = np.random.default_rng(seed).normal(0.5, 0.5, n)
    jitter = np.random.default_rng(seed + 1).normal(0, 0.01, n)
    margins = {"exact": base, "fa3": base - cost + jitter}
    margins |= {v: base - cost * (1 - restored) + jitter for v in two.KERNEL_FIXES}
    return pd.DataFrame([{"context": context, "trial": i, "variant": v, "success": int(m > 0), "margin": m}
                         for v, ms in margins.items() for i, m in enumerate(ms)])


def test_margin_against_pairs_any_reference_and_the_kernel_cost_reading_knows_both_answers():
    rows = _margins(4096, 0.4, 0.0)
    fixes = two.margin_against(rows, "fa3", two.KERNEL_FIXES)
    assert list(fixes["variant"]) == sorted(two.KERNEL_FIXES) and (fixes["ref"] == "fa3").all()
    assert fixes["shift"].abs().max() < 1e-12                         # the fixes are FA3, trial by trial
    cost = two.margin_against(rows, "exact", ["fa3"]).iloc[0]
    assert cost["shift"] == pytest.approx(-0.4, abs=0.01) and cost["hi"] < -0.39
    assert two.margin_against(rows, "exact", ["fa3"], min_trials=21).empty
    assert two.margin_against(rows.drop(columns="margin"), "exact", ["fa3"]).empty
    # the fixes restore nothing: the cost is not accumulation's; they restore 90%: it is
    none = claims.kernel_cost_reading({"gemma3-270m": rows})
    assert none.agrees is False and "FA3 -0.40" in none.computed and "0% of the cost" in none.computed
    most = claims.kernel_cost_reading({"gemma3-270m": _margins(16384, 0.4, 0.9)})
    assert most.agrees is True and "90% of the cost" in most.computed
    # one context each way: the runs do not decide; no cost at all: nothing to read
    mixed = pd.concat([rows, _margins(16384, 0.4, 0.9)])
    assert claims.kernel_cost_reading({"gemma3-270m": mixed}).agrees is None
    assert claims.kernel_cost_reading({"gemma3-270m": _margins(4096, 0.0, 0.0)}) is None


def _windows(kl: dict[int, list[float]], fmt: str = "q4_0") -> pd.DataFrame:
    n = 1000
    return pd.DataFrame([{"context": c, "window": w, "format": f, "n": n, "kl_fp32_sum": (k if f == fmt else 0.0) * n}
                         for c, ks in kl.items() for w, k in enumerate(ks) for f in ("fp32", fmt)])


def test_storage_growth_is_a_welch_ratio_and_the_reading_knows_kept_grown_and_undecided():
    flat = two.storage_growth(_windows({2048: [0.10, 0.11, 0.09, 0.10], 8192: [0.10, 0.105, 0.095]}), 2048, 8192)
    assert list(flat["format"]) == ["q4_0"] and flat.loc[0, "windows_base"] == 4 and flat.loc[0, "windows_longer"] == 3
    assert flat.loc[0, "ratio"] == pytest.approx(1.0, abs=0.02) and flat.loc[0, "lo"] < 1 < flat.loc[0, "hi"] < 1.5
    assert claims.growth_reading({"gemma3-270m": flat}).agrees is True
    grown = two.storage_growth(_windows({2048: [0.10, 0.11, 0.09, 0.10], 8192: [0.30, 0.31, 0.29]}), 2048, 8192)
    assert grown.loc[0, "ratio"] == pytest.approx(3.0, rel=0.05) and grown.loc[0, "lo"] > 1.5
    r = claims.growth_reading({"gemma3-270m": grown})
    assert r.agrees is False and "growth detected for q4_0 ×3.0" in r.computed
    noisy = two.storage_growth(_windows({2048: [0.10, 0.11, 0.09, 0.10], 8192: [0.05, 0.30]}), 2048, 8192)
    assert noisy.loc[0, "hi"] > 1.5 and claims.growth_reading({"gemma3-270m": noisy}).agrees is None
    # one window at the longer context: no interval, no row; the references are not judged
    assert two.storage_growth(_windows({2048: [0.1, 0.1], 8192: [0.1]}), 2048, 8192).empty
    assert claims.growth_reading({"gemma3-270m": two.storage_growth(
        _windows({2048: [0.1, 0.11], 8192: [0.1, 0.11]}, fmt="fp16"), 2048, 8192)}) is None
    # two pairs of contexts in one decoder's rows: each read on its own, a grown pair decides
    w = _windows({2048: [0.10, 0.11, 0.09, 0.10], 8192: [0.10, 0.105, 0.095], 32768: [0.30, 0.31]})
    both = pd.concat([two.storage_growth(w, 2048, 8192), two.storage_growth(w, 8192, 32768)], ignore_index=True)
    r = claims.growth_reading({"gemma3-270m": both})
    assert r.agrees is False and "8,192 against 2,048 tokens" in r.computed and "32,768 against 8,192" in r.computed


def test_the_margin_measure_gives_the_known_answer_on_the_committed_split_rows():
    """The needle removed from attention (split:needle=0) is the case whose answer is known: the answer's margin
    must fall far below exact's, and less as more of the needle is kept."""
    for m in two.DECODERS:
        r = two.propagation_rows(m)
        shifts = two.margin_against(r, "exact", ["split:needle=0", "split:needle=0.25", "split:needle=0.5"], 20)
        s = shifts.set_index("variant")
        assert s.loc["split:needle=0", "hi"] < -3.0, m
        assert s.loc["split:needle=0", "shift"] < s.loc["split:needle=0.25", "shift"] < s.loc["split:needle=0.5",
                                                                                                 "shift"] < 0, m


def test_law_transfer_reading_tests_the_passkey_law_on_another_task():
    """x_c in [16, 64] from the passkey: at 2k a 2-bit register (x = 512) must collapse and the 13-bit one
    (x = 0.25) hold; 5 bits (x = 64) falls inside the interval and is left undecided."""
    law = {"contexts": 2, "x_c": 32.0, "x_lo": 16.0, "x_hi": 64.0}

    def grid(two_bit: int, full: int) -> pd.DataFrame:
        return pd.DataFrame({"context": 2048, "variant": ["fa3", "fa3:frac_bits=5", "fa3:frac_bits=2", "store:q4_0"],
                             "successes": [full, 3, two_bit, 0], "trials": 20, "exact_successes": 14})

    ok = claims.law_transfer_reading({"smollm2-135m": law}, {"smollm2-135m": grid(2, 12)}, "niah_multikey_1")
    assert ok.agrees is True and "RULER niah_multikey_1" in ok.claim
    assert "2 bits at 2,048 (x = 512): collapses by the law, 2/20 against exact's 14 — as said" in ok.computed
    assert "13 bits at 2,048 (x = 0.25): holds by the law" in ok.computed
    assert "1 cell(s) inside the interval, undecided" in ok.computed and "store" not in ok.computed
    # a 2-bit register that keeps the needle (8 of exact's 14: above half) goes against the law
    bad = claims.law_transfer_reading({"smollm2-135m": law}, {"smollm2-135m": grid(8, 12)}, "niah_multikey_1")
    assert bad.agrees is False and "— holds" in bad.computed
    # a full register that collapses (7 <= 14 / 2) goes against it too
    assert claims.law_transfer_reading({"smollm2-135m": law}, {"smollm2-135m": grid(2, 7)}, "t").agrees is False
    # an interval open at both ends decides nothing: not shown
    wide = dict(law, x_lo=0.0, x_hi=math.inf)
    none = claims.law_transfer_reading({"gemma3-270m": wide}, {"gemma3-270m": grid(2, 12)}, "t")
    assert none.agrees is None and "no cell decided (3 cell(s) inside the interval)" in none.computed
    # a grid where exact retrieves too few to show any loss (detectable missing) tests nothing
    blind = grid(0, 0).assign(exact_successes=2, detectable=float("nan"))
    b = claims.law_transfer_reading({"smollm2-135m": law}, {"smollm2-135m": blind}, "niah_multikey_2")
    assert b.agrees is None and "3 where exact attention retrieves too few to show a loss" in b.computed
    # a decoder with no passkey collapse has no law to transfer
    assert claims.law_transfer_reading({"gemma3-270m": {"contexts": 0}}, {"gemma3-270m": grid(2, 12)}, "t") is None


def test_verdict_grid_shows_each_cell_its_verdict_and_what_the_family_could_see():
    rows = _grid({"exact": [1] * 20, "store:q4_0": [0] * 20, "fa3:frac_bits=2": [1] * 19 + [0], "fa3": [1] * 20,
                  "fa3:frac_bits=7": [1] * 20})
    rows.loc[rows["variant"] == "store:q4_0", "margin"] = -1.0
    a = two.against_exact(rows)
    g = two.verdict_grid(a)
    # exact first, the kernel, its registers wide to narrow, the stored formats; the family's reach last
    assert list(g.index) == ["exact", "fa3", "fa3:frac_bits=7", "fa3:frac_bits=2", "store:q4_0",
                             "a loss sure to be detected"]
    assert list(g.columns) == ["4,096"]
    assert list(g["4,096"]) == ["20/20", "20/20 −0 +0", "20/20 −0 +0", "19/20 −1 +0", "0/20 −20 +0 loss detected",
                                "6 trials"]
    m = two.verdict_grid(a, "margin")
    assert m.loc["store:q4_0", "4,096"] == "-2.00 [-2.00, -2.00]" and m.loc["fa3", "4,096"].startswith("+0.00")
    assert "exact" not in m.index
    with pytest.raises(ValueError, match="parameter 'value' must be 'count' or 'margin'"):
        two.verdict_grid(a, "p")
    assert two.verdict_grid(a.iloc[:0]).empty


def test_the_gemma_readme_shows_the_committed_verdicts(tmp_path, monkeypatch, capsys):
    from kvcost.runs import retrieval_readme_table as job

    assert job.main(["--check"]) == 0                       # the README's tables are the committed rows'
    block = job.README.read_text(encoding="utf-8").split(job.START)[1].split(job.END)[0]
    assert "**RULER niah_multikey_1** (`niah_multikey_1.csv`;" in block
    # the smallest p twenty trials allow (10 lost, none gained): bold in any family of fewer than 26 testable cells,
    # and in larger ones once Holm's step-down has rejected the cells with smaller p (8k's 12-lost formats)
    assert "| `store:mxfp4` | 4/20 −7 +1 | **2/20 −10 +0 loss detected** |" in block
    assert "| exact attention (the prompt's prefill) | 25 s [11–54] | 74 s [40–110] |" in block   # passkey's cost
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{job.START}\n| stale |\n{job.END}\nend\n", encoding="utf-8")
    monkeypatch.setattr(job, "README", readme)
    assert job.main(["--check"]) == 1
    said = capsys.readouterr().out
    assert "is out of date" in said and "run .venv/bin/python scripts/retrieval_readme_table.py" in said
    assert job.main([]) == 0 and job.main(["--check"]) == 0 and readme.read_text().endswith(f"{job.END}\nend\n")


def test_trial_cost_groups_the_seconds_by_what_a_variant_recomputes():
    rows = pd.DataFrame({"context": [4096] * 6 + [8192] * 2,
                         "variant": ["exact", "fa3", "fa3:frac_bits=2", "store:q4_0", "store:q8_0", "exact",
                                     "exact", "store:nvfp4"],
                         "seconds": [30.0, 4.0, 6.0, 40.0, 50.0, 20.0, 3600.0, 3600.0]})
    grid = two.trial_cost(rows)
    assert list(grid.columns) == ["4,096", "8,192"]
    assert list(grid.index) == [*two.COST_KINDS[:3], "all committed cells, CPU time"]   # no faithful-mode rows
    assert grid.loc[two.COST_KINDS[0]].tolist() == ["25 s [20–30]", "3600 s [3600–3600]"]
    assert grid.loc[two.COST_KINDS[1]].tolist() == ["5 s [4–6]", ""]           # a kernel variant: the tail only
    assert grid.loc[two.COST_KINDS[2]].tolist() == ["45 s [40–50]", "3600 s [3600–3600]"]
    assert grid.iloc[-1].tolist() == ["0.0 h", "2.0 h"]
    assert two.trial_cost(rows.drop(columns="seconds")).empty
    full = two.trial_cost(rows.assign(variant=rows["variant"].replace({"fa3": "fa3full"})))
    assert full.loc[two.COST_KINDS[3], "4,096"] == "4 s [4–4]"          # a full emulated pass is not a tail
    with pytest.raises(ValueError, match=r"parameter 'rows'.*unknown variant 'bogus:1'"):
        two.trial_cost(rows.assign(variant="bogus:1"))
    todo = pd.DataFrame({"context": [4096, 4096, 4096, 16384],
                         "variant": ["store:nvfp4", "store:mxfp4", "fa3", "exact"]})
    left = two.trial_cost(rows, todo)
    assert list(left.columns) == ["4,096", "8,192", "16,384"]          # a context with nothing run yet is shown
    assert left.iloc[-1].tolist() == ["3 trials, 0.0 h", "none", "1 trials, ? h"]   # 2 x 45 s + 5 s; none timed
    assert left.loc["all committed cells, CPU time", "16,384"] == ""
    slow = rows.assign(seconds=rows["seconds"] * 100)                  # the medians may come from other rows
    assert two.trial_cost(rows, todo, medians_from=slow).iloc[-1, 0] == "3 trials, 2.6 h"


def test_a_generated_block_needs_both_markers():
    from kvcost.runs import tables

    assert tables.replace_between("a\n<s>\nold\n<e>\nb", "<s>", "<e>", "new", "X.md") == "a\n<s>\nnew\n<e>\nb"
    with pytest.raises(SystemExit, match=r"X\.md lacks the markers <s> and <e>"):
        tables.replace_between("a\n<s>\nold\nb", "<s>", "<e>", "new", "X.md")


def test_a_variant_has_one_kind_from_the_one_list_the_runner_and_the_cost_table_read():
    names = ("exact", "store:q4_0", "store:q8_0/q4_0", "fa3:frac_bits=5", "fa3full", "split:haystack=0")
    assert [decoders.variant_kind(v) for v in names] == ["exact", "store", "store", "fa3", "fa3full", "split"]
    assert {decoders.variant_kind(v) for v in names} == set(decoders.VARIANT_KINDS)
    for bad in ("exact:x", "store:q3", "store", "fa2", "bogus:1"):
        with pytest.raises(ValueError, match=r"parameter 'variant': unknown variant .*allowed: exact, store:<format>, "
                                             r"fa3\[:k=v,\.\.\.\], fa3full\[:k=v,\.\.\.\], split\[:k=v,\.\.\.\]$"):
            decoders.variant_kind(bad)
