"""The committed notebooks: clean metadata, a parameters cell, and bad parameters refused early.

Each bad-parameter run executes the notebook with papermill from ``notebooks/`` and must stop
in the validation cell right after the parameters (execution count 3: parameters, papermill's
injected parameters, validation) with a ValueError naming the parameter.
"""
import json
import re

import papermill as pm
import pytest

from kvcost.output import repo_root

NOTEBOOK_DIR = repo_root() / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))
CONTRACT = ["01_sizing", "02_axis_choice", "03_needle_cliff", "04_accumulator_floor", "05_vendor_table"]


def test_the_contract_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS if p.stem in CONTRACT] == CONTRACT


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_clean(path):
    text = path.read_text()
    nb = json.loads(text)
    assert "papermill" not in nb["metadata"]
    assert "version" not in nb["metadata"].get("language_info", {}), "machine's Python version recorded"
    assert not re.search(r"/(?:work|root|tmp|home)/", text), "machine path in the notebook"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), "first code cell must be the parameters"
    assert 'out_dir = "results/' in "".join(code[0]["source"])
    for c in nb["cells"]:
        assert "papermill" not in c["metadata"] and "execution" not in c["metadata"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "notebook must be executed top to bottom"
    assert "Verdict" in text


BAD = [
    ("01_sizing", {"context": -5}, "context"),
    ("01_sizing", {"models": ["No-Such-Model"]}, "models"),
    ("02_axis_choice", {"bits": [1, 4]}, "bits"),
    ("02_axis_choice", {"bits": [17]}, "bits"),
    ("03_needle_cliff", {"trials": 0}, "trials"),
    ("03_needle_cliff", {"bit_pairs": 8}, "bit_pairs"),
    ("03_needle_cliff", {"n_tokens": -5}, "n_tokens"),
    ("04_accumulator_floor", {"n_tokens": [64, -5]}, "n_tokens"),
    ("05_vendor_table", {"weights_gib": 0}, "weights_gib"),
    ("06_long_range_needle", {"n_tokens": [4096, -5]}, "n_tokens"),
]


@pytest.mark.parametrize("stem,params,name", BAD, ids=[f"{s}-{n}" for s, _, n in BAD])
def test_bad_parameter_stops_in_the_first_code_cell(stem, params, name, tmp_path):
    with pytest.raises(pm.PapermillExecutionError) as info:
        pm.execute_notebook(str(NOTEBOOK_DIR / f"{stem}.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={**params, "out_dir": str(tmp_path / "results")},
                            cwd=str(NOTEBOOK_DIR), kernel_name="python3", progress_bar=False)
    err = info.value
    assert err.ename == "ValueError"
    assert f"'{name}" in err.evalue
    assert err.exec_count == 3


def test_readme_indexes_every_notebook_with_an_existing_figure():
    readme = (repo_root() / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README does not index {path.name}"
    for figure in re.findall(r'src="(figures/[^"]+)"', readme):
        assert (repo_root() / figure).is_file(), f"README shows a missing figure {figure}"


def test_nbclean_strips_volatile_metadata_and_refuses_machine_paths(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("nbclean", repo_root() / "scripts" / "nbclean.py")
    nbclean = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbclean)
    nb = {"metadata": {"papermill": {"start_time": "x"}, "language_info": {"name": "python", "version": "3.11.7"}},
          "cells": [{"cell_type": "code", "metadata": {"papermill": {}, "execution": {"t": 1},
                                                       "tags": ["injected-parameters"]},
                     "outputs": [], "execution_count": 1, "source": ""}],
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert nbclean.main([str(path)]) == 0
    clean = json.loads(path.read_text())
    assert clean["metadata"] == {"language_info": {"name": "python"}}
    assert clean["cells"][0]["metadata"] == {} and clean["cells"][0]["execution_count"] == 1
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "/work/main/x\n"}]
    path.write_text(json.dumps(nb))
    assert nbclean.main([str(path)]) == 1
