"""Notebook 09 with other parameters: the needle measured live (no committed data needed), no comparison
with the post, tables and figures written next to each other, the committed figures left alone."""
from __future__ import annotations

import papermill as pm

from kvcost.paths import repo_root

NOTEBOOK = repo_root() / "notebooks" / "09_plan.ipynb"


def _figures():
    return {p.name: p.stat().st_mtime_ns for p in sorted((repo_root() / "figures").glob("09_*"))}


def test_09_runs_live_with_other_parameters(tmp_path, monkeypatch):
    monkeypatch.delenv("KVCOST_FIGURE_DIR", raising=False)
    before = _figures()
    out_dir = tmp_path / "results"
    pm.execute_notebook(str(NOTEBOOK), str(tmp_path / "out.ipynb"), cwd=str(NOTEBOOK.parent), kernel_name="python3",
                        progress_bar=False,
                        parameters={"needle_source": "live", "contexts": [2048, 4096], "needle_trials": 2,
                                    "models": ["Llama-3.1-8B", "gpt-oss-20b"], "out_dir": str(out_dir)})
    text = (tmp_path / "out.ipynb").read_text()
    assert "Differs" not in text and "does not hold" not in text and "### Verdict" in text
    assert "measured live: 2 haystacks per context and format" in text
    assert "2/2 = 100% [" in text                                        # rates carry k/n and an interval
    assert _figures() == before, "a run with other parameters wrote into figures/"
    for name in ("needle.csv", "needle_summary.csv", "needle_paired.csv", "plan.csv", "vllm.csv",
                 "09_requests_by_dtype.png", "09_needle_share_error.svg"):
        assert (out_dir / name).is_file(), name
