"""The parameter schemas: every notebook's defaults validate, bad values name the parameter."""
import pandas as pd
import pytest

from kvcost import notebook_params, output, params


@pytest.mark.parametrize("stem", notebook_params.stems())
def test_defaults_validate_and_are_default(stem):
    p = notebook_params.validate(stem, {})
    assert p.is_default and p.post_defaults and p.changed == []
    assert p.figure_dir.name == "figures"
    assert "out_dir" in notebook_params.get(stem).names


def test_changed_parameter_moves_figures_to_out_dir(tmp_path):
    p = notebook_params.validate("03_needle_cliff", {"margin": 1.0, "out_dir": str(tmp_path)})
    assert p.changed == ["margin", "out_dir"]
    assert not p.post_defaults
    assert p.figure_dir == tmp_path == p.out


def test_parameter_the_post_did_not_use_keeps_post_defaults(tmp_path):
    p = notebook_params.validate("03_needle_cliff", {"sweep_trials": 5, "out_dir": str(tmp_path)})
    assert p.post_defaults and not p.is_default


def test_figure_dir_env_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCOST_FIGURE_DIR", str(tmp_path / "figs"))
    assert notebook_params.validate("04", {}).figure_dir == tmp_path / "figs"


def test_prefix_lookup_and_unknown_notebook():
    assert notebook_params.get("04b").stem == "04b_accumulation_beyond_flat"
    with pytest.raises(ValueError, match="unknown notebook '99'"):
        notebook_params.get("99")


def test_unknown_parameter_is_named():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['margn'\]"):
        notebook_params.get("03").check_unknown(["margn", "seed"])


@pytest.mark.parametrize("stem, name, value, match", [
    ("03_needle_cliff", "trials", 0, "'trials' must be an integer >= 1"),
    ("03_needle_cliff", "bit_pairs", [[8, 1]], "bit_pairs"),
    ("02_axis_choice", "outlier_strengths", [1.0, -2.0], r"'outlier_strengths\[1\]'"),
    ("04b_accumulation_beyond_flat", "formats", ["fp32", "fp7"], "'formats\\[1\\]'"),
    ("04b_accumulation_beyond_flat", "n_max_log2", 4, "'n_max_log2' must be >= n_min_log2"),
    ("07_real_kv", "include_special", 1, "'include_special' must be True or False"),
    ("01_sizing", "models", ["NoSuchModel"], "'models'"),
])
def test_bad_values_name_the_parameter(stem, name, value, match):
    with pytest.raises(ValueError, match=match):
        notebook_params.validate(stem, {name: value})


def test_schema_rejects_duplicate_names():
    with pytest.raises(ValueError, match="declares a parameter twice"):
        params.Schema("x", [params.Int("a", 1), params.Int("a", 2)])


def test_schema_table_lists_post_values():
    rows = {r["name"]: r for r in notebook_params.get("03").table()}
    assert rows["margin"]["post"] == "0.5" and rows["sweep_trials"]["post"] == ""


def test_validating_parameters_creates_no_folder(tmp_path):
    out = tmp_path / "not" / "yet"
    p = notebook_params.get("01_sizing").validate({"out_dir": str(out)})
    assert p.out == out and not out.exists()            # validating writes nothing
    output.write_table(pd.DataFrame({"a": [1]}), p.out, "t.csv")
    assert (out / "t.csv").read_text() == "a\n1\n"      # the first table creates the folder
