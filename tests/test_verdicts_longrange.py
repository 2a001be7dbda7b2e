"""Notebooks 06 and 04b: their verdicts hold across seeds. Each notebook's verdict functions, re-run at
reduced scale under three seeds, reach the same verdicts (holds / does not hold / not shown) every time,
and the same as the committed default run.

Notebook 06 at reduced scale: head_dim 64, contexts to 16,384, and the needle's retrieval counted at
8,192 tokens on a tensor core keeping 9 fraction bits, which by the notebook's scaling law (the error is
a function of n·2^-b) stands for 131,072 tokens at Hopper's 13: n·2^-b = 16 in both."""
from __future__ import annotations

import pandas as pd
import pytest

from kvcost.claims import accumulation_beyond_flat as beyond_flat_claims
from kvcost.claims import long_range_needle as claims
from kvcost.claims.report import READING, WORDS
from kvcost.experiments import accumulation_beyond_flat
from kvcost.experiments import long_range_needle as lr
from kvcost.retrieval import haystacks

SEEDS = [1, 2, 3]

HOLDS, DOES_NOT_HOLD = WORDS[READING]
#: The committed default run's verdicts (notebook 06) by the old share: every reading holds.
LONGRANGE_VERDICTS = [HOLDS] * 7
#: With the carried-weight retrieval run (issue 22): the needle is not dropped (the reading does not hold),
#: the output shrinks (a reading of its own, after it), the rest as before.
RETRIEVAL_VERDICTS = [HOLDS, HOLDS, DOES_NOT_HOLD] + [HOLDS] * 5
#: Notebook 04b's committed verdicts, row by row: the probabilistic sqrt(n)*u rule fails, and
#: DeepSeek-V3's "nearly 2%" is matched only by the mean-1 inputs.
BEYOND_FLAT_AGREES = [True, True, True, True, True, False, True, True, False, False, True, False, True, True]


@pytest.fixture(scope="module")
def picked():
    return haystacks.pick_profiles(haystacks.load_profiles("smollm2"), 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_long_range_verdicts_hold_for_every_seed(picked, seed):
    kw = dict(d=64, needle_weight=0.05, seed=seed, block_n=96)
    context = lr.context_grid(picked, [512, 16384], trials=1, **kw)
    needle = lr.context_grid(picked, [8192], trials=8, fixes=["no fix", "PR #104 every tile"], frac_bits=9, **kw)
    where = lr.where_grid(picked, 16384, trials=1, **kw)
    knobs = lr.knob_grid(picked[:1], 16384, trials=1, splits=[1, 2, 8], block_sizes=[], **kw)
    heads = [min(picked, key=lambda h: h.sink), max(picked, key=lambda h: h.sink)]
    scaling = pd.concat([lr.scaling_grid(h, [512, 1024, 2048, 4096, 8192], [8, 10], trials=1, **kw) for h in heads])
    readings = claims.readings(context, where, knobs, scaling, beyond_flat_claims.load_published(), frac_bits=10,
                               needle=needle)
    assert [c.word for c in readings] == LONGRANGE_VERDICTS
    # the needle reading rests on separated intervals: the no-fix rate's upper bound is below the reference's lower
    rates = lr.rate_table(needle, ["fix"]).set_index("fix")
    assert rates.loc["no fix", "hi"] < rates.loc["bf16 P, fp32 acc", "lo"]
    assert rates.loc["PR #104 every tile", "k"] == rates.loc["PR #104 every tile", "n"] == 24
    # the carried weight on real query heads at the same n·2^-b: six heads spread over the extract's layers
    qh = haystacks.query_heads()
    ret = lr.retrieval_grid([qh[i] for i in (0, 9, 18, 27, 36, 44)], 8192, 1, 0.05, seed,
                            [("Hopper", "no fix"), ("Hopper", "PR #104 every tile"), ("Hopper", lr.REFERENCE)],
                            frac_bits=9)
    readings = claims.readings(context, where, knobs, scaling, beyond_flat_claims.load_published(), frac_bits=10,
                               needle=needle, retrieval=ret)
    assert [c.word for c in readings] == RETRIEVAL_VERDICTS
    lv = claims.loss_verdicts(ret).set_index(["arch", "fix"])
    assert lv.loc[("Hopper", "no fix"), "verdict"] == "haystack shrinkage, no needle loss detected"


@pytest.mark.parametrize("seed", SEEDS)
def test_beyond_flat_verdicts_hold_for_every_seed(seed):
    sweep = accumulation_beyond_flat.error_sweep([256, 4096, 6144, 65536, 98304], ["fp32", "bf16"],
                                    ["flat", "two_level", "pairwise", "hopper", "hopper_promoted"], d=2, seed=seed)
    flush = accumulation_beyond_flat.flush_sweep([1, 4, 64], 131072, d=2, seed=seed)
    deepseek = accumulation_beyond_flat.deepseek_check(K=4096, trials=50, frac_bits=(13,), seed=seed)
    checks = beyond_flat_claims.printed(sweep, flush, deepseek, beyond_flat_claims.load_published())
    assert [c.agrees for c in checks] == BEYOND_FLAT_AGREES
    assert "100% [" in checks[2].computed            # rates carry their Wilson interval
