"""Shared helpers: parameter validation, output paths, figure bytes, verdicts, the post's text."""
import hashlib
import subprocess

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvcost import output, params, paths, plotting
from kvcost.inputs import post


@pytest.mark.parametrize("call,msg", [
    (lambda: params.check_int("trials", 0, 1), "'trials' must be an integer >= 1, got 0"),
    (lambda: params.check_int("trials", True, 1), "'trials'"),
    (lambda: params.check_int("n", 2.0, 1), "'n'"),
    (lambda: params.check_int_list("bits", [8, 1], 2, 16), "'bits'"),
    (lambda: params.check_int_list("bits", 8, 2, 16), "'bits' must be a list"),
    (lambda: params.check_float("margin", float("nan")), "'margin'"),
    (lambda: params.check_float("budget_gib", 0.0, 0.0, lo_open=True), "'budget_gib' must be a finite number > 0"),
    (lambda: params.check_pairs("bit_pairs", [[8, 8], [4]], 2, 16), "'bit_pairs'"),
    (lambda: params.check_choice("fmt", "fp7", ["fp8"]), "'fmt' must be one of"),
    (lambda: params.check_str_list("models", ["x"], ["a", "b"]), "unknown \\['x'\\]"),
])
def test_checks_raise_valueerror_naming_the_parameter(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_checks_return_clean_values():
    assert params.check_int_list("bits", (8, 4), 2, 16) == [8, 4]
    assert params.check_pairs("p", [[8, 4]], 2, 16) == [(8, 4)]
    assert params.check_float("m", 1, 0.0) == 1.0


def test_out_dir_is_relative_to_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = output.resolve_out_dir("", "99_test")
    assert path == paths.repo_root() / "results" / "99_test"
    assert output.resolve_out_dir(str(tmp_path / "abs"), "x") == tmp_path / "abs"
    with pytest.raises(ValueError, match="out_dir"):
        output.resolve_out_dir(3, "x")


def test_write_table_keeps_full_precision(tmp_path):
    df = pd.DataFrame({"x": [0.1 + 0.2, 1 / 3]})
    back = pd.read_csv(output.write_table(df, tmp_path, "t.csv"))
    assert back.x.tolist() == [0.1 + 0.2, 1 / 3]


@pytest.mark.parametrize("target", ["figures", "notebooks"])
def test_the_targets_that_write_figures_run_one_thread_per_notebook(target):
    """A figure's bytes follow the plotted values' last bits, so the summation order, so the BLAS / numba thread
    count: notebook 02's Pareto figure differs between one and two threads. The targets that write figures/ must
    pin one thread, or `make figures` on a machine with other cores dirties the checkout."""
    res = subprocess.run(["make", "-n", "-s", target, "MAKEFLAGS=-o .venv/.installed"], cwd=paths.repo_root(),
                         capture_output=True, text=True, check=True)
    papermill = [line for line in res.stdout.replace("\\\n", " ").splitlines() if "papermill" in line]
    assert papermill, res.stdout
    for line in papermill:
        for var in ("OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "NUMBA_NUM_THREADS=1"):
            assert var in line, (var, line)


def test_saved_figures_are_byte_identical(tmp_path):
    plotting.use_style()
    digests = []
    for run in range(2):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2], label="x")
        ax.legend()
        paths = plotting.save(fig, f"f{run}", ("png", "svg"), folder=tmp_path)
        plt.close(fig)
        digests.append([hashlib.sha256(p.read_bytes()).hexdigest() for p in paths])
    assert digests[0] == digests[1]
    assert b"Software" not in (tmp_path / "f0.png").read_bytes()
    with pytest.raises(ValueError, match="formats"):
        plotting.save(plt.figure(), "x", ("jpg",), folder=tmp_path)
    assert matplotlib.rcParams["svg.hashsalt"] == "kvcost"


def test_post_tables_parse_every_printed_row():
    assert post.sizing_table().model.tolist()[0] == "Llama-3.1-8B"
    assert len(post.sizing_table()) == 5 and len(post.sizing_listing()) == 5
    assert post.axis_table().shape == (6, 5)
    assert post.needle_table().flips.tolist() == ["1", "155", "198", "200"]
    assert post.flat_sum_table().bf16_flat.iloc[-1] == "0.001953"
    assert post.ulp_lines().tokens.tolist() == ["8,388,608", "1,024", "256"]
    with pytest.raises(ValueError, match="block"):
        post.block_text(4)


def test_figure_dir_can_be_redirected(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCOST_FIGURE_DIR", str(tmp_path / "elsewhere"))
    fig = plt.figure()
    paths = plotting.save(fig, "redirected")
    plt.close(fig)
    assert paths == [tmp_path / "elsewhere" / "redirected.png", tmp_path / "elsewhere" / "redirected.svg"]
    assert all(p.is_file() for p in paths)
