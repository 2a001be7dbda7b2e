"""Sweeps: every sweep names a notebook that exists and parameters that notebook takes."""
import json

import pytest

from kvcost import output, sweep


@pytest.mark.parametrize("name", sorted(sweep.SWEEPS))
def test_sweep_parameters_exist_in_the_notebook(name):
    spec = sweep.SWEEPS[name]
    nb = json.loads((output.repo_root() / "notebooks" / spec.notebook).read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    source = "".join(cell["source"])
    for params in spec.runs:
        for key in params:
            assert f"{key} =" in source, f"{name}: {spec.notebook} has no parameter {key!r}"


def test_collect_stacks_runs_with_parameters(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "repo_root", lambda: tmp_path)
    monkeypatch.setitem(sweep.SWEEPS, "toy", sweep.Sweep("x.ipynb", [{"a": 1}, {"a": 2}]))
    for i in range(2):
        run = tmp_path / "results" / "sweeps" / "toy" / f"run{i:02d}"
        run.mkdir(parents=True)
        (run / "t.csv").write_text(f"v\n{i}.5\n")
    written = sweep.collect("toy")
    text = written["t.csv"].read_text()
    assert text == "run,param_a,v\n0,1,0.5\n1,2,1.5\n"


def test_unknown_sweep_is_refused():
    with pytest.raises(ValueError, match="unknown sweep"):
        sweep.run_sweep("nope")
