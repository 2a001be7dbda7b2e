"""claims.report: comparisons to the digits printed, the verdict's three kinds of check and their words, and the
same four entry points in every claims module."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pandas as pd
import pytest

from kvcost import claims
from kvcost.claims import report
from kvcost.claims.report import ERRATUM, PRINTED, READING, Check, Verdict

#: The claims modules, one per notebook (report renders them).
MODULES = sorted(m.name for m in pkgutil.iter_modules(claims.__path__) if m.name != "report")
#: The entry points the modules had before they were named the same everywhere: none may come back.
OLD_NAMES = {"reproduction_checks", "reading_checks", "verdict_checks", "checks", "verdicts", "statements",
             "beyond_flat_checks", "unit_checks", "errata_checks", "axis_readings", "llamacpp_checks",
             "parameter_free_checks", "untested", "Reading", "HOLDS", "DOES_NOT_HOLD", "NOT_SHOWN"}


def test_every_notebook_has_a_claims_module():
    assert MODULES == ["accumulation_beyond_flat", "accumulator_floor", "axis_choice", "long_range_needle",
                       "needle_cliff", "plan", "real_decoder", "real_kv", "sizing", "two_decoders", "vendor_table",
                       "which_gpu"]


@pytest.mark.parametrize("name", MODULES)
def test_every_claims_module_has_the_same_entry_points(name):
    mod = importlib.import_module(f"kvcost.claims.{name}")
    for entry in report.ENTRY_POINTS:
        fn = getattr(mod, entry)
        assert inspect.isfunction(fn) and fn.__module__ == mod.__name__, (name, entry)
        assert entry in mod.__all__
    assert inspect.signature(mod.verdict).return_annotation in ("Verdict", Verdict)
    for entry in ("printed", "readings", "errata"):
        assert inspect.signature(getattr(mod, entry)).return_annotation in ("list[Check]", list[Check])
    public = {n for n in vars(mod) if not n.startswith("_")}
    assert not public & OLD_NAMES, (name, public & OLD_NAMES)
    # what a module calls public is in its __all__, and every name there is its own
    assert set(mod.__all__) <= public


@pytest.mark.parametrize("name", ["axis_choice", "needle_cliff", "real_kv", "long_range_needle", "which_gpu", "plan",
                                  "vendor_table", "accumulator_floor", "accumulation_beyond_flat"])
def test_entry_points_without_tables_give_empty_lists(name):
    mod = importlib.import_module(f"kvcost.claims.{name}")
    for entry in ("printed", "readings", "errata"):
        fn = getattr(mod, entry)
        required = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
        if not required:
            checks = fn()
            assert isinstance(checks, list) and all(isinstance(c, Check) for c in checks)


def test_a_checks_word_comes_from_its_kind():
    words = {(kind, agrees): Check(kind, "c", "p", "q", agrees).word for kind in report.KINDS
             for agrees in (True, False)}
    assert words == {(PRINTED, True): "reproduced", (PRINTED, False): "differs",
                     (READING, True): "holds", (READING, False): "does not hold",
                     (ERRATUM, True): "correct", (ERRATUM, False): "wrong"}
    assert Check(READING, "c", "p", "q", None).word == report.NOT_SHOWN
    with pytest.raises(ValueError, match="only a reading"):
        Check(ERRATUM, "c", "p", "q", None)
    with pytest.raises(ValueError, match="unknown kind"):
        Check("holds", "c", "p", "q", True)
    assert report.as_kind([Check(ERRATUM, "c", "p", "q", True)], READING)[0].word == "holds"


def test_a_verdict_holds_each_kind_in_its_place():
    with pytest.raises(ValueError, match="printed checks only"):
        Verdict(printed=[Check(READING, "c", "p", "q", True)])
    with pytest.raises(ValueError, match="erratum checks only"):
        Verdict(errata=[Check(PRINTED, "c", "p", "q", True)])
    with pytest.raises(ValueError, match="not shown"):
        Verdict(readings=[Check(READING, "c", "p", "q", None)])


def test_compare_table_and_verdict():
    printed = pd.DataFrame({"k": ["1", "2"], "v": ["1.00e-01", "2.0"]})
    computed = pd.DataFrame({"k": [1, 2], "v": [0.1, 2.04]})
    checks = report.compare_table(printed, computed, ["k"], {"v": ".2e"})
    assert [c.agrees for c in checks] == [True, False] and {c.kind for c in checks} == {PRINTED}
    text = report.verdict_markdown(Verdict(printed=checks, readings=[Check(READING, "a claim", "x", "y", True)]))
    assert "**Differs**: 1 of 2" in text and "1 of 1 hold" in text and "*a claim* — holds: y." in text
    assert report.verdict_markdown(Verdict(printed=checks[:1])).count("Reproduced") == 1


def test_rows_only_one_side_has_are_not_compared():
    printed = pd.DataFrame({"k": ["1", "2"], "v": ["1.00e-01", "2.00e+00"]})
    computed = pd.DataFrame({"k": [1, 3], "v": [0.1, 5.0]})
    checks = report.compare_table(printed, computed, ["k"], {"v": ".2e"})
    assert [c.claim for c in checks] == ["k=1 v"] and checks[0].agrees
    assert report.untested_rows(printed, computed, ["k"]) == ["k=3"]
    text = report.verdict_markdown(Verdict(printed=checks, untested=["k=3"]))
    assert "**Reproduced**: all 1" in text and "**Not tested by the post**: k=3" in text


def test_untested_run_compares_nothing():
    bad = [Check(PRINTED, "n", "1", "2", False)]
    text = report.verdict_markdown(Verdict(printed=bad, readings=[Check(READING, "a claim", "x", "y", False)],
                                           tested=False, changed=["margin"]))
    assert "Differs" not in text and "does not hold" not in text and "holds" not in text
    assert "not tested by the post" in text and "`margin`" in text and "*a claim*: y." in text


def test_errata_wording():
    text = report.verdict_markdown(Verdict(errata=[Check(ERRATUM, "c1", "2", "3", False, "wrong: it is 3"),
                                                   Check(ERRATUM, "c2", "1", "1", True, "correct")]))
    assert "**Errata**: 1 of 2" in text and "— wrong: published `2`; computed 3 (wrong: it is 3)" in text
    assert "— correct: published `1`" in text
    assert "Differs" not in text and "does not hold" not in text


def test_extra_follows_the_verdict():
    assert report.verdict_markdown(Verdict(extra="after")) == "### Verdict\n\nafter"
    text = report.verdict_markdown(Verdict(printed=[Check(PRINTED, "n", "1", "1", True)], what="numbers of X",
                                           extra="after"))
    assert text == "### Verdict\n\n**Reproduced**: all 1 numbers of X agree with kvcost's computation.\n\nafter"


def test_printed_and_value_checks():
    assert report.printed_check("x", "0.25", 0.25, ".2f").agrees
    assert not report.printed_check("x", "0.25", 0.2501, ".4f").agrees
    assert report.value_check("y", 2.0, 2.1, rel_tol=0.1).agrees
    assert not report.value_check("y", 2.0, 2.3, rel_tol=0.1).agrees
    assert report.value_check("y", 2.0, 2.0).kind == PRINTED


def test_checks_frame_keeps_its_columns():
    df = report.checks_frame([Check(ERRATUM, "c", "p", "q", True, "n")])
    assert list(df.columns) == ["claim", "published", "computed", "agrees", "note"]
