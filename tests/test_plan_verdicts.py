"""Notebook 09's verdict holds across seeds, and its accuracy column rests on the committed full-scale
needle (data/plan_needle): sha256 and parameters checked, a slice recomputed to the same values."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kvcost import floats
from kvcost.claims import plan as plan_claims
from kvcost.experiments import plan as plan_exp

SEEDS = [1, 2, 3]
POST_MODELS = ["Llama-3.1-8B", "Qwen3-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Llama-2-7B"]


@pytest.fixture(scope="module")
def committed():
    return plan_exp.committed_format_needle()


@pytest.fixture(scope="module")
def table():
    return plan_exp.plan_table(POST_MODELS, "H100-80GB", [8192], ["bf16", "fp8_e4m3", "q8_0", "q4_0"])


def _verdict(checks):
    return [(c.claim.split(":")[0], c.agrees) for c in checks]


@pytest.mark.parametrize("seed", SEEDS)
def test_plan_verdict_holds_for_every_seed(seed, committed, table):
    # reduced scale: 2,048 tokens, 24 haystacks per format, haystack seeds 1000*seed + t
    needle = plan_exp.needle_by_format([2048], ["fp8_e4m3", "q8_0", "q4_0"], trials=24, seed=1000 * seed)
    assert _verdict(plan_claims.readings(table, needle)) == _verdict(plan_claims.readings(table, committed[0]))
    reading = plan_claims.needle_reading(needle)
    assert reading.agrees and "lost" not in reading.note
    vs_q8 = plan_exp.paired_worse(needle, plan_claims.FP8, plan_claims.Q8).iloc[-1]
    assert vs_q8.lo > 0.5                                  # fp8 worse than q8_0 by its interval, not a point


def test_committed_needle_is_full_scale_and_its_verdict_holds(committed):
    needle, prov = committed
    assert prov["parameters"]["trials"] == 200 and prov["parameters"]["needle_weight"] == 0.1
    assert len(needle) == 200 * len(prov["parameters"]["contexts"]) * (len(prov["parameters"]["dtypes"]) + 1)
    summary = plan_exp.needle_summary(needle)
    assert (summary.trials == 200).all() and summary.lo.min() > 0.98          # 200/200: Wilson lower bound 98.1%
    reading = plan_claims.needle_reading(needle)
    assert reading.agrees and "200/200 = 100% [98%, 100%] in each" in reading.note
    for key in ("command", "date", "git_commit", "versions", "needle_csv_sha256", "input"):
        assert prov[key]


def test_committed_needle_refuses_a_changed_table_and_other_parameters(committed, tmp_path):
    folder = tmp_path / "plan_needle"
    shutil.copytree(plan_exp.NEEDLE_DIR, folder)
    with pytest.raises(ValueError, match="needle_weight"):
        plan_exp.committed_format_needle(folder, needle_weight=0.05)
    with pytest.raises(ValueError, match="seed"):
        plan_exp.committed_format_needle(folder, seed=3)
    csv = folder / "needle.csv"
    csv.write_text(csv.read_text().replace("True", "False", 1))
    with pytest.raises(ValueError, match="sha256"):
        plan_exp.committed_format_needle(folder)
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["needle_csv_sha256"] != "" and len(prov["needle_csv_sha256"]) == 64


def test_a_live_slice_recomputes_the_committed_rows(committed):
    needle, prov = committed
    first = min(prov["parameters"]["contexts"])
    live = plan_exp.needle_by_format([first], prov["parameters"]["dtypes"], trials=1, first_trial=3)
    same = plan_exp.check_slice(live, needle)
    assert same["rows"] == len(prov["parameters"]["dtypes"]) + 1
    assert same["retrieved_equal"] and same["max_share_diff"] < 1e-9
    moved = live.assign(share=live.share + 1e-6)
    assert plan_exp.check_slice(moved, needle)["max_share_diff"] > 9e-7
    with pytest.raises(ValueError, match="no committed counterpart"):
        plan_exp.check_slice(live.assign(trial=999), needle)


def test_paired_worse_counts_haystacks_with_wilson_intervals():
    needle = pd.DataFrame({"n_tokens": [8] * 6, "trial": [0, 0, 1, 1, 2, 2], "storage": ["a", "b"] * 3,
                           "share": [1.2, 1.1, 0.9, 0.95, 1.0, 1.3]})
    pw = plan_exp.paired_worse(needle, "a", "b")
    assert list(pw.worse) == [2, 2] and list(pw.context) == ["8", "all"]
    assert pw.rate.iloc[-1].startswith("2/3 = 67% [")
    with pytest.raises(ValueError, match="dtypes"):
        plan_exp.paired_worse(needle, "a", "c")


def test_store_as_fast_path_equals_floats_round_to():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(4000) * s for s in (1e-7, 1e-3, 1.0, 300.0, 5e4, 1e6)])
    x = np.concatenate([x, [0.0, -0.0, 448.0, 464.0, 470.0, 65520.0]]).astype(np.float32).astype(np.float64)
    for fmt in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32"):
        fast, ref = plan_exp.store_as(x, fmt), floats.round_to(x, fmt, saturate=True)
        assert np.array_equal(fast, ref) and np.array_equal(np.signbit(fast), np.signbit(ref)), fmt
    y = x + 1e-12                                            # not float32 values: the exact path
    assert np.array_equal(plan_exp.store_as(y, "bf16"), floats.round_to(y, "bf16", saturate=True))
