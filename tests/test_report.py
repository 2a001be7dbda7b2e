"""claims.report: comparisons to the digits printed, and the verdict's three kinds of wording."""
from __future__ import annotations

import pandas as pd

from kvcost.claims import report


def test_compare_table_and_verdict():
    printed = pd.DataFrame({"k": ["1", "2"], "v": ["1.00e-01", "2.0"]})
    computed = pd.DataFrame({"k": [1, 2], "v": [0.1, 2.04]})
    checks = report.compare_table(printed, computed, ["k"], {"v": ".2e"})
    assert [c.agrees for c in checks] == [True, False]
    text = report.verdict_markdown(checks, readings=[report.Check("a claim", "x", "y", True)])
    assert "**Differs**: 1 of 2" in text and "1 of 1 hold" in text
    assert report.verdict_markdown(checks[:1]).count("Reproduced") == 1


def test_rows_only_one_side_has_are_not_compared():
    printed = pd.DataFrame({"k": ["1", "2"], "v": ["1.00e-01", "2.00e+00"]})
    computed = pd.DataFrame({"k": [1, 3], "v": [0.1, 5.0]})
    checks = report.compare_table(printed, computed, ["k"], {"v": ".2e"})
    assert [c.claim for c in checks] == ["k=1 v"] and checks[0].agrees
    assert report.untested_rows(printed, computed, ["k"]) == ["k=3"]
    text = report.verdict_markdown(checks, untested=["k=3"])
    assert "**Reproduced**: all 1" in text and "**Not tested by the post**: k=3" in text


def test_untested_run_compares_nothing():
    bad = [report.Check("n", "1", "2", False)]
    text = report.verdict_markdown(bad, readings=[report.Check("a claim", "x", "y", False)], tested=False,
                                   changed=["margin"])
    assert "Differs" not in text and "does not hold" not in text and "holds" not in text
    assert "not tested by the post" in text and "`margin`" in text and "*a claim*: y." in text


def test_errata_wording():
    text = report.verdict_markdown(errata=[report.Check("c1", "2", "3", False, "wrong: it is 3"),
                                           report.Check("c2", "1", "1", True, "correct")])
    assert "**Errata**: 1 of 2" in text and "— wrong: published `2`; computed 3 (wrong: it is 3)" in text
    assert "— correct: published `1`" in text
    assert "Differs" not in text and "does not hold" not in text


def test_printed_and_value_checks():
    assert report.printed_check("x", "0.25", 0.25, ".2f").agrees
    assert not report.printed_check("x", "0.25", 0.2501, ".4f").agrees
    assert report.value_check("y", 2.0, 2.1, rel_tol=0.1).agrees
    assert not report.value_check("y", 2.0, 2.3, rel_tol=0.1).agrees
