"""The runner: one notebook, other parameters, checked first, written atomically, never into figures/."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import sweep_toys
from kvcost import paths, run, runner

ROOT = paths.repo_root()


@pytest.mark.parametrize("text, value", [
    ("1.0", 1.0), ("8", 8), ("1e-3", 0.001), ("-2.5E2", -250.0), ("[8, 3]", [8, 3]),
    ("[[4, 4], [2, 2]]", [[4, 4], [2, 2]]),
    ("post", "post"), ("true", True), ("false", False), ("''", ""), ("", ""), ("[bf16, fp32]", ["bf16", "fp32"]),
])
def test_values_are_yaml(text, value):
    assert runner.parse_value(text) == value
    assert type(runner.parse_value(text)) is type(value)


@pytest.mark.parametrize("name, stem", [
    ("03", "03_needle_cliff"), ("3", "03_needle_cliff"), ("04", "04_accumulator_floor"),
    ("04b", "04b_accumulation_beyond_flat"),
    ("03_needle_cliff", "03_needle_cliff"), ("03_needle_cliff.ipynb", "03_needle_cliff"),
    ("notebooks/01_sizing.ipynb", "01_sizing"),
])
def test_notebook_by_number_stem_or_path(name, stem, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert runner.notebook_path(name).stem == stem


def test_unknown_notebook_is_named():
    with pytest.raises(ValueError, match=r"unknown notebook '99'.*03_needle_cliff"):
        runner.notebook_path("99")


def test_unknown_parameter_stops_before_anything_runs(capsys):
    assert run.main(["03", "-p", "margn", "1.0", "-p", "trials", "5", "--out", "/nonexistent/run"]) == 2
    err = capsys.readouterr().err
    assert "unknown parameter(s) ['margn']" in err and "margin" in err
    assert not Path("/nonexistent/run").exists()


def test_bad_value_stops_naming_the_parameter(capsys):
    assert run.main(["03", "-p", "margin", "'wide'"]) == 2
    assert "'margin'" in capsys.readouterr().err
    assert run.main(["02", "-p", "bits", "[8, 99]"]) == 2
    assert "bits" in capsys.readouterr().err


def test_out_dir_is_the_runners_and_figures_is_refused(capsys):
    assert run.main(["03", "-p", "out_dir", "x"]) == 2
    assert "--out" in capsys.readouterr().err
    assert run.main(["03", "--out", "figures"]) == 2


def test_yaml_file_and_p_together(tmp_path):
    (tmp_path / "p.yaml").write_text("margin: 2.0\nbit_pairs: [[4, 4]]\n")
    nb, params, out, _ = run.parse_args(["03", "-y", str(tmp_path / "p.yaml"), "-p", "margin", "1.0"])
    assert nb.stem == "03_needle_cliff" and params == {"margin": 1.0, "bit_pairs": [[4, 4]]}
    assert out == ROOT / "results" / "runs" / "03_needle_cliff" / "margin=1.0_bit_pairs=4,4"
    assert run.parse_args(["03"])[2].name == "defaults"


def test_a_run_writes_every_file_in_its_folder(tmp_path, monkeypatch, capsys):
    sweep_toys.install(monkeypatch, tmp_path)
    out = tmp_path / "run"
    assert run.main([str(tmp_path / "toy_sweep.ipynb"), "-p", "x", "6", "--out", str(out)]) == 0
    assert "finished in" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["other.csv", "run.json", "run.log", "toy.csv", "toy.png",
                                                     "toy_sweep.ipynb"]
    assert (out / "toy.csv").read_text().startswith("x,third,label\n6,2.0,")
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "finished" and rec["params"] == {"x": 6} and rec["peak_memory_mib"] > 10
    log = (out / "run.log").read_text()
    assert "toy 6" in log and re.search(r"peak memory [\d.]+ MiB", log)
    assert "**Verdict.** toy 6" in log and "Markdown object" not in log      # the verdict's text, not its repr


def test_a_failed_run_says_why_and_leaves_no_tables(tmp_path, monkeypatch, capsys):
    sweep_toys.install(monkeypatch, tmp_path)
    out = tmp_path / "run"
    assert run.main([str(tmp_path / "toy_sweep.ipynb"), "-p", "x", "2", "-p", "fail_at", "2", "--out", str(out)]) == 1
    assert "RuntimeError: toy failure at x=2" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "run.log", "toy_sweep.failed.ipynb"]


def _readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Re-running a notebook with other parameters", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("make run ")]


def test_readme_example_runs_verbatim_and_leaves_git_clean():
    examples = _readme_examples()
    assert examples and "make run NB=03 ARGS='-p margin 1.0'" in examples
    assert any("'[" in ex for ex in examples), "the README shows how a list is passed"

    def status():
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout

    before = status()
    # the environment is already set up: make must not reinstall it in the middle of a test
    env = {**os.environ, "MAKEFLAGS": "-o .venv/.installed"}
    # side by side: each is one kernel, mostly on one core
    procs = [subprocess.Popen(["bash", "-c", ex], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for ex in examples]
    for example, proc in zip(examples, procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, example + "\n" + out + err
        assert "finished in" in out
    assert status() == before
    assert list((ROOT / "results" / "runs" / "03_needle_cliff" / "margin=1.0").glob("*.png"))


def test_ctrl_c_stops_the_run_and_its_kernel_with_one_line(tmp_path):
    nb = sweep_toys.write_notebook(tmp_path)
    nb.write_text(nb.read_text().replace('print(\\"toy\\", x)', "import time; time.sleep(120)"))
    # SIGINT's default handler restored in the child: a suite started from a shell's background job
    # inherits SIGINT ignored, and Ctrl-C could not be tested there
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import sweep_toys; "
            "from kvcost import notebook_params; notebook_params.SCHEMAS[sweep_toys.STEM] = sweep_toys.SCHEMA; "
            "from kvcost import run; sys.exit(run.main(sys.argv[1:]))")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", code, str(nb), "-p", "x", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    log = out / "run.log"
    while time.time() < deadline and not (log.exists() and "Executing Cell 2" in log.read_text(errors="replace")):
        time.sleep(0.2)
    assert time.time() < deadline
    children = psutil.Process(proc.pid).children(recursive=True)     # the run's process and its kernel
    assert len(children) >= 2
    os.killpg(proc.pid, signal.SIGINT)                                # what Ctrl-C in a terminal sends
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines() == ["interrupted: toy_sweep did not finish and wrote no table; "
                                        "run the same command again"]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    assert sorted(p.name for p in out.iterdir()) == ["run.log"]
