"""experiments.accumulator_floor and claims.accumulator_floor: the post's Block 3 loop, notebook 04's tables and
verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcost.claims import accumulator_floor as claims
from kvcost.experiments import accumulator_floor


# ------------------------------------------------------------ the post's Block 3
@pytest.mark.parametrize("n", [1, 3, 64, 100, 256, 1000, 1024, 3000, 4097])
@pytest.mark.parametrize("kind", ["fp32", "fp16", "bf16"])
def test_post_flat_sum_equals_the_post_loop(n, kind):
    for two in (False, True):
        assert accumulator_floor.post_flat_sum(n, kind, two) == accumulator_floor.post_flat_sum_literal(n, kind, two)


def test_post_table_digits():
    want = {64: (1, 1, 1), 1024: (1, 1, 0.25), 4096: (1, 0.5, 0.0625), 131072: (1, 0.015625, 0.001953125)}
    for n, row in want.items():
        got = tuple(accumulator_floor.post_flat_sum(n, k) for k in ("fp32", "fp16", "bf16"))
        assert got == row
        assert accumulator_floor.post_flat_sum(n, "bf16", two_level=True) == 1.0


def test_post_literal_is_the_post_code():
    src = Path(accumulator_floor.__file__).read_text()
    assert "np.uint32((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)" in src


# ------------------------------------------------------------ notebook helpers
def test_flat_sum_table_and_reproduction_checks():
    t = accumulator_floor.flat_sum_table([64, 256, 1024, 4096, 16384, 65536, 131072])
    assert list(t.columns) == ["n", "fp32_flat", "fp16_flat", "bf16_flat", "bf16_two_level"]
    checks = claims.printed(t)
    assert len(checks) == 7 * 4 + 3 * 2 and all(c.agrees for c in checks)
    text = accumulator_floor.post_table_text(t)
    assert "   131072    1.000000    0.015625    0.001953      1.000000" in text
    assert accumulator_floor.post_ulp_lines()[2].startswith("  bf16: 1 ULP at a sum of 1.0 = 2^-8 = 0.003906")
    # a wrong value is caught
    bad = t.copy()
    bad.loc[2, "bf16_flat"] = 0.5
    assert sum(not c.agrees for c in claims.printed(bad)) == 1


def test_errata_verdicts():
    e = claims.errata_table(block=128)
    v = dict(zip(e["claim"].str.slice(0, 4) + e["post"], e["verdict"]))
    assert v["fp328,388,608"].startswith("wrong") and "16,777,216" in v["fp328,388,608"]
    assert v["fp161,024"].startswith("wrong") and "2,048" in v["fp161,024"]
    assert v["bf16256"] == "correct"
    assert v["bf162^-8"].startswith("wrong") and "2^-7" in v["bf162^-8"]
    checks = claims.errata(e)
    assert [c.agrees for c in checks].count(False) == 4


def test_strategy_and_stall_tables():
    s = accumulator_floor.strategy_table([1024, 1000], block=128).set_index("n")
    assert s.loc[1024, "post_two_level"] == 1.0 and s.loc[1024, "bf16_flat"] == 0.25
    assert s.loc[1000, "post_two_level"] == accumulator_floor.post_flat_sum_literal(1000, "fp32")
    st_ = accumulator_floor.stall_table(("fp16", "bf16")).set_index("format")
    assert st_.loc["fp16", "limit_n"] == 2048 and st_.loc["bf16", "sum_at_2x_limit"] == 0.5




def test_post_flat_sum_bad_input():
    with pytest.raises(ValueError, match="kind"):
        accumulator_floor.post_flat_sum(8, "fp8")
    with pytest.raises(ValueError, match="n"):
        accumulator_floor.post_flat_sum(0, "fp16")
