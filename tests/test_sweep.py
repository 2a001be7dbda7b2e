"""Sweeps: YAML files checked against the notebooks' schemas; resumable, atomic, local or on Dask."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sweep_toys
from kvcost import provenance, sweep
from kvcost import runner as sweep_runner
from kvcost.sweep import cli, store


def write_sweep(folder: Path, text: str, name: str = "toy") -> Path:
    path = Path(folder) / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def toy(tmp_path, monkeypatch):
    sweep_toys.install(monkeypatch, tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------- files and checks

@pytest.mark.parametrize("path", sweep.available(), ids=lambda p: p.stem)
def test_predefined_sweeps_are_valid(path):
    s = sweep.load(path.stem)
    assert s.runs and s.description
    assert len({r.key for r in s.runs}) == len(s.runs)


def test_predefined_sweeps_include_the_long_ones():
    names = {p.stem for p in sweep.available()}
    assert {"sizing_contexts", "accumulator_long", "long_range_1m"} <= names


def test_grid_is_product_times_zip_plus_fixed():
    runs = sweep.expand({"f": 1}, {"a": [1, 2], "b": ["x", "y"]}, {"c": [5, 6], "d": [7, 8]})
    assert len(runs) == 8
    assert runs[0] == {"f": 1, "a": 1, "b": "x", "c": 5, "d": 7}
    assert runs[1] == {"f": 1, "a": 1, "b": "x", "c": 6, "d": 8}
    assert runs[2]["b"] == "y" and runs[-1] == {"f": 1, "a": 2, "b": "y", "c": 6, "d": 8}
    assert sweep.expand({"f": 1}, {}, {}) == [{"f": 1}]


@pytest.mark.parametrize("text, words", [
    ("product: {a: [1, 2]}\nzip: {a: [3, 4]}", ["'a'", "product", "zip"]),
    ("zip: {a: [1, 2], b: [1]}", ["same length"]),
    ("product: {a: 3}", ["product 'a'", "non-empty list"]),
])
def test_bad_grid_shapes_are_refused(text, words):
    with pytest.raises(ValueError) as err:
        _expand_text(text)
    for w in words:
        assert w in str(err.value)


def _expand_text(text):
    import yaml
    data = yaml.safe_load(text)
    return sweep.expand(data.get("params", {}), data.get("product", {}), data.get("zip", {}))


def test_bad_grid_value_fails_at_once_naming_run_and_parameter(tmp_path):
    path = write_sweep(tmp_path, "notebook: 01_sizing\nproduct:\n  context: [8192, -5, 1024]\n")
    with pytest.raises(ValueError, match=r"run 1 \(context=-5\).*'context'"):
        sweep.load(path)
    assert not (tmp_path / "results").exists()


def test_unknown_parameter_in_a_sweep_is_named(tmp_path):
    path = write_sweep(tmp_path, "notebook: 04\nparams: {n_token: [64]}\n")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['n_token'\]"):
        sweep.load(path)


def test_a_sweep_may_not_choose_out_dir(tmp_path):
    path = write_sweep(tmp_path, "notebook: 04\nparams: {out_dir: elsewhere}\n")
    with pytest.raises(ValueError, match="out_dir"):
        sweep.load(path)


def test_unknown_sweep_and_unknown_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown sweep 'nope'"):
        sweep.load("nope")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['grid'\]"):
        sweep.load(write_sweep(tmp_path, "notebook: 04\ngrid: {n_tokens: [[64]]}\n"))
    assert cli.main(["run", "nope"]) == 2


def test_keys_change_with_parameters_and_notebook_code(toy):
    s = sweep.load(write_sweep(toy, "notebook: toy_sweep.ipynb\nproduct: {x: [1, 2]}\n"))
    assert s.runs[0].key != s.runs[1].key
    nb = toy / "toy_sweep.ipynb"
    nb.write_text(nb.read_text().replace("print(\\\"toy\\\", x)", "print(\\\"toy!\\\", x)"))
    assert sweep.load(s.path).runs[0].key != s.runs[0].key


# ----------------------------------------------------------------------------- combined tables

def test_combined_tables_name_the_missing_runs(toy):
    s = sweep.load(write_sweep(toy, "notebook: toy_sweep.ipynb\nproduct: {x: [1, 2, 3]}\n"))
    out = toy / "out"
    for run in s.runs[:2]:
        status = "finished" if run.index == 0 else "failed"
        store.save_run(out, run.key, {"toy.csv": f"v,w\n{run.index}.5,\"a, b\"\n".encode()}, {"status": status})
    tables = store.combine(s, out)
    assert tables["toy.csv"].read_text() == 'run,param_x,v,w,missing_runs\n0,1,0.5,"a, b",1 2\n'
    assert json.loads((out / store.TABLES_FILE).read_text()) == ["toy.csv"]
    # once nothing that wrote a table is finished, the stale combined table goes
    store.save_run(out, s.runs[0].key, {}, {"status": "failed"})
    assert store.combine(s, out) == {} and not (out / "toy.csv").exists()


# ----------------------------------------------------------------------------- running

def toy_sweep(folder, xs, extra=""):
    return sweep.load(write_sweep(folder, f"notebook: toy_sweep.ipynb\n{extra}product:\n  x: {xs}\n"))


def table_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.csv"))}


def test_four_point_sweep_on_a_local_cluster_matches_a_local_run(toy):
    s = toy_sweep(toy, [1, 2, 3, 4])
    on_cluster = sweep.run_sweep(s, toy / "cluster", jobs=2, scheduler="local", progress=False)
    assert on_cluster.complete and on_cluster.finished_now == 4, on_cluster.failed
    here = sweep.run_sweep(s, toy / "here", jobs=2, progress=False)     # threads on this machine
    assert here.complete
    assert table_bytes(toy / "cluster") == table_bytes(toy / "here")
    text = (toy / "here" / "toy.csv").read_text().splitlines()
    assert text[0] == "run,param_x,x,third,label,missing_runs"
    assert text[1] == '0,1,1,0.3333333333333333,"a, b",' and len(text) == 9
    run = sweep.run_dir(toy / "cluster", s.runs[2].key)
    assert sorted(p.name for p in run.iterdir()) == ["other.csv", "run.json", "run.log", "toy.csv",
                                                     "toy.png", "toy_sweep.ipynb"]
    rec = json.loads((run / "run.json").read_text())
    assert rec["status"] == "finished" and rec["params"] == {"x": 3} and rec["peak_memory_mib"] > 10
    assert "peak memory" in (run / "run.log").read_text()


def test_interrupted_sweep_resumes_without_rerunning_finished_runs(toy):
    counter = toy / "counter.txt"
    s = toy_sweep(toy, [1, 2, 3], extra=f"params: {{counter: '{counter}'}}\n")
    out = toy / "out"

    def stop_after_first(run, result):
        raise KeyboardInterrupt

    first = sweep.run_sweep(s, out, progress=False, on_result=stop_after_first)
    assert first.interrupted and first.finished == 1
    assert counter.read_text().split() == ["1"]
    assert (out / "toy.csv").read_text().splitlines()[-1].endswith(",1 2")   # rebuilt, missing runs named
    done = sweep.run_dir(out, s.runs[0].key) / "run.json"
    stamp = done.stat().st_mtime_ns
    second = sweep.run_sweep(s, out, progress=False)
    assert second.complete and second.finished_before == 1 and second.finished_now == 2
    assert counter.read_text().split() == ["1", "2", "3"]          # run 0 was not executed again
    assert done.stat().st_mtime_ns == stamp
    assert not list((out / "runs").glob(".*"))                     # no partial folders left


def test_failed_run_is_recorded_the_others_finish_and_retry_is_explicit(toy):
    s = toy_sweep(toy, [1, 2, 3], extra="params: {fail_at: 2}\n")
    out = toy / "out"
    outcome = sweep.run_sweep(s, out, jobs=2, progress=False)
    assert outcome.finished_now == 2 and not outcome.complete
    [(run, error)] = outcome.failed
    assert run.index == 1 and "RuntimeError: toy failure at x=2" in error
    assert sweep.state(out, run.key) == "failed"
    assert "toy failure" in (sweep.run_dir(out, run.key) / "run.log").read_text()
    assert (out / "toy.csv").read_text().splitlines()[1].endswith(",1")
    again = sweep.run_sweep(s, out, progress=False)
    assert again.finished_now == 0 and [r.index for r in again.failed_skipped] == [1]
    retried = sweep.run_sweep(s, out, progress=False, retry_failed=True)
    assert len(retried.failed) == 1 and retried.failed_skipped == []


def test_cli_exit_codes_status_and_ctrl_c(toy):
    counter = toy / "counter.txt"
    path = write_sweep(toy, f"notebook: toy_sweep.ipynb\nparams: {{counter: '{counter}'}}\n"
                            "product:\n  x: [1, 2, 3]\n")
    out = toy / "out"
    # a child process: the toy schema is registered by a tiny wrapper around the CLI
    # SIGINT's default handler restored in the child: a suite started from a shell's background job
    # inherits SIGINT ignored, and Ctrl-C could not be tested there
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import sweep_toys; "
            "from kvcost import notebook_params; notebook_params.SCHEMAS[sweep_toys.STEM] = sweep_toys.SCHEMA; "
            "from kvcost.sweep import cli; sys.exit(cli.main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", code, "run", str(path), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not list((out / "runs").glob("*/run.json")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)            # what Ctrl-C in a terminal sends
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip() and "\r" not in ln and "it/s" not in ln
             and "run/s" not in ln and "s/run" not in ln]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("interrupted: ")
    resume = shlex.split(lines[0].split("resume with: ", 1)[1])
    # the interpreter that has kvcost, not a bare `python` (outside the venv there is none)
    assert Path(resume[0]).resolve() == Path(sys.executable).resolve() and resume[1:4] == ["-m", "kvcost.sweep", "run"]
    finished_first = len(counter.read_text().split())
    status = subprocess.run([*cmd[:3], "status", str(path), "--out", str(out)], capture_output=True, text=True)
    assert status.returncode == 1 and "not run" in status.stdout
    done = subprocess.run([*cmd, "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "3 of 3 runs finished" in done.stdout
    assert f"{finished_first} finished earlier, skipped (resuming)" in done.stdout.splitlines()[0]
    assert f"{finished_first} finished earlier and skipped" in done.stdout
    assert len(counter.read_text().split()) <= finished_first + 3 - 1   # finished runs were skipped
    status = subprocess.run([*cmd[:3], "status", str(path), "--out", str(out)], capture_output=True, text=True)
    assert status.returncode == 0 and "3 finished, 0 failed, 0 not run" in status.stdout


def test_real_notebook_sweep_two_at_a_time(tmp_path):
    path = write_sweep(tmp_path, "notebook: 04_accumulator_floor\ndescription: tiny\n"
                                 "params: {compare_n: [156]}\nproduct:\n  n_tokens: [[64], [256]]\n")
    outcome = sweep.run_sweep(sweep.load(path), tmp_path / "out", jobs=2, progress=False)
    assert outcome.complete, outcome.failed
    text = (tmp_path / "out" / "flat_sum.csv").read_text().splitlines()
    assert text[0].startswith("run,param_n_tokens,") and text[0].endswith(",missing_runs")
    assert [ln.split(",")[:3] for ln in text[1:]] == [["0", "[64]", "64"], ["1", "[256]", "256"]]
    assert not list(Path(tmp_path / "out").glob("**/figures"))


def test_list_shows_runs_and_estimates(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "sizing_contexts" in out and "estimated time" in out
    assert cli.duration(30) == "30 s" and cli.duration(600) == "10 min" and cli.duration(7200) == "2.0 h"


# ----------------------------------------------------------------------------- script sweeps

def script_sweep(folder, grid, extra="", name="toy_script_sweep"):
    sweep_toys.write_script(folder)
    return load_trusting(write_sweep(folder, f"script: toy_script.py\ntable: toy_rows.csv\n{extra}{grid}\n", name=name))


def load_trusting(path):
    """A sweep whose script lies next to it (outside scripts/): named, as --script PATH names it."""
    folder = Path(path).parent
    return sweep.load(path, scripts=[folder / "toy_script.py", folder / "no_parser.py"])


def test_script_sweep_flags_are_checked_by_the_scripts_parser_before_anything_runs(tmp_path):
    s = script_sweep(tmp_path, "product:\n  x: [1, [2, 3]]", extra="params: {loud: true, scale: 0.5}\n")
    assert s.kind == "script" and s.target == "toy_script.py" and s.table == "toy_rows.csv"
    assert [r.params for r in s.runs] == [{"loud": True, "scale": 0.5, "x": 1},
                                          {"loud": True, "scale": 0.5, "x": [2, 3]}]
    with pytest.raises(ValueError) as err:
        script_sweep(tmp_path, "product:\n  x: [1, 1001]", name="bad")
    assert "run 1 (x=1001)" in str(err.value) and "argument --x: must be in [0, 1000], got 1001" in str(err.value)
    with pytest.raises(ValueError, match="unrecognized arguments: --colour"):
        script_sweep(tmp_path, "product:\n  x: [1]", extra="params: {colour: red}\n", name="bad")
    with pytest.raises(ValueError, match="'out' is chosen by the runner"):
        script_sweep(tmp_path, "product:\n  x: [1]", extra="params: {out: here.csv}\n", name="bad")
    with pytest.raises(ValueError, match="exactly one of 'notebook' or 'script'"):
        sweep.load(write_sweep(tmp_path, "script: toy_script.py\nnotebook: 01\n"))
    with pytest.raises(ValueError, match="'table' must be a CSV file name"):
        load_trusting(write_sweep(tmp_path, "script: toy_script.py\ntable: a/b.csv\n"))
    (tmp_path / "no_parser.py").write_text("print('hi')\n")
    with pytest.raises(ValueError, match="defines no parse_args"):
        load_trusting(write_sweep(tmp_path, "script: no_parser.py\n"))
    key = s.runs[0].key
    (tmp_path / "toy_script.py").write_text(sweep_toys.SCRIPT.replace("toy script", "toy script!"))
    assert load_trusting(s.path).runs[0].key != key                     # the script's text is in the key


def test_script_sweep_runs_resumes_records_failures_and_gathers_tables(tmp_path):
    counter = tmp_path / "counter.txt"
    s = script_sweep(tmp_path, "product:\n  x: [1, 2, 3]", extra=f"params: {{counter: '{counter}', fail_at: 2}}\n")
    out = tmp_path / "out"

    def stop_after_first(run, result):
        raise KeyboardInterrupt

    first = sweep.run_sweep(s, out, progress=False, on_result=stop_after_first)
    assert first.interrupted and first.finished == 1
    second = sweep.run_sweep(s, out, jobs=2, progress=False)
    assert second.finished_before == 1 and second.finished_now == 1 and not second.complete
    [(run, error)] = second.failed
    assert run.index == 1 and error == "exit code 3: toy script failing at 2"
    assert sorted(counter.read_text().split()) == ["1", "2", "3"]     # run 0 was not executed again
    assert (out / "toy_rows.csv").read_text() == ("run,param_x,x,scaled,loud,missing_runs\n"
                                                  "0,1,1,1.0,0,1\n2,3,3,3.0,0,1\n")
    folder = sweep.run_dir(out, s.runs[2].key)
    assert sorted(p.name for p in folder.iterdir()) == ["run.json", "run.log", "toy_rows.csv", "toy_rows.json"]
    rec = json.loads((folder / "run.json").read_text())
    assert rec["status"] == "finished" and rec["key"] == s.runs[2].key and rec["peak_memory_mib"] > 1
    log = (folder / "run.log").read_text()
    assert "toy script [3]" in log and "--fail-at 2 --x 3 --out" in log and "peak memory" in log
    assert json.loads((folder / "toy_rows.json").read_text())["argv"][:2] == ["--counter", str(counter)]


def test_script_sweep_on_a_local_cluster_gives_the_same_table(tmp_path):
    s = script_sweep(tmp_path, "product:\n  x: [4, 5]", extra="params: {scale: 0.25}\n")
    on_cluster = sweep.run_sweep(s, tmp_path / "cluster", jobs=2, scheduler="local", progress=False)
    here = sweep.run_sweep(s, tmp_path / "here", progress=False)
    assert on_cluster.complete and here.complete, on_cluster.failed
    assert table_bytes(tmp_path / "cluster") == table_bytes(tmp_path / "here")
    assert (tmp_path / "here" / "toy_rows.csv").read_text().splitlines()[1:] == ["0,4,4,1.0,0,", "1,5,5,1.25,0,"]


@pytest.mark.parametrize("name, flag", [("real_model_ppl", "--window"), ("real_model_passkey", "--trial"),
                                        ("llamacpp_reference", "--window")])
def test_real_decoder_grids_are_script_sweeps_one_cell_per_run(name, flag):
    s = sweep.load(name)
    assert s.kind == "script" and s.table.endswith(".csv")
    argv = sweep_runner.script_argv(s.runs[0].params)
    assert flag in argv and "--out" not in argv


def test_publish_appends_new_rows_to_the_committed_file_and_keeps_existing_ones(tmp_path, monkeypatch):
    dest = tmp_path / "data" / "rows.csv"
    dest.parent.mkdir()
    dest.write_text("x,scaled,loud\n2,99.0,0\n")                     # x=2 is there already, with another value
    monkeypatch.setattr(sweep.spec, "repo_root", lambda: tmp_path)
    s = script_sweep(tmp_path, "product:\n  x: [1, 2, 3]",
                     extra="publish: {path: data/rows.csv, key: [x]}\nparams: {fail_at: 3}\n")
    assert s.publish == dest and s.publish_key == ["x"]
    out = tmp_path / "out"
    sweep.run_sweep(s, out, progress=False)
    with provenance.appending(dest, ["x", "scaled", "loud"]) as write:   # a script still appending to the file
        assert store.publish(s, out)[1:] == (1, 1)                # run 2 failed: not published
        write({"x": 7, "scaled": 7.0, "loud": 0})
    assert dest.read_text() == "x,scaled,loud\n2,99.0,0\n1,1.0,0\n7,7.0,0\n"    # nothing lost
    assert provenance.checked(dest) == dest                       # the digest recorded after each append
    assert store.publish(s, out)[1:] == (0, 2)                    # again: nothing new
    dest.unlink()
    assert store.publish(s, out)[1:] == (2, 0) and dest.read_text() == "x,scaled,loud\n1,1.0,0\n2,2.0,0\n"
    assert cli.main(["publish", str(s.path), "--out", str(out)]) == 0     # publish never imports the script
    with pytest.raises(ValueError, match="'publish' is for script sweeps"):
        sweep.load(write_sweep(tmp_path, "notebook: 01\npublish: {path: a.csv, key: [x]}\n", name="nb"))
    with pytest.raises(ValueError, match="inside the repository"):
        script_sweep(tmp_path, "product:\n  x: [1]", extra="publish: {path: ../a.csv, key: [x]}\n", name="bad")


def test_coverage_reads_the_grid_against_the_committed_file_and_skip_committed_runs_only_the_rest(
        tmp_path, monkeypatch, capsys):
    """A run is committed when every row it writes is in the publish file: x=1 is, x=[2, 3] half, x=4 not;
    --skip-committed runs the other two, and a key column no parameter names is refused by name."""
    from kvcost.sweep import coverage

    dest = tmp_path / "data" / "rows.csv"
    dest.parent.mkdir()
    dest.write_text("x,scaled,loud\n1,1.0,0\n2,2.0,0\n")
    monkeypatch.setattr(sweep.spec, "repo_root", lambda: tmp_path)
    counter = tmp_path / "ran.txt"
    s = script_sweep(tmp_path, "product:\n  x: [1, [2, 3], 4]",
                     extra=f"publish: {{path: data/rows.csv, key: [x]}}\nparams: {{counter: {counter}}}\n")
    assert coverage.run_cells(s, s.runs[1]) == {("2",), ("3",)}
    assert list(coverage.run_coverage(s).values()) == [(1, 1), (1, 2), (0, 1)]
    out = tmp_path / "out"
    assert cli.main(["status", str(s.path), "--out", str(out)]) == 1
    shown = capsys.readouterr().out
    assert "committed 1/1" in shown and "committed 1/2" in shown and "committed 0/1" in shown
    assert "committed: 2 of the grid's 4 rows; 1 of 3 runs have every row" in shown
    argv = ["run", str(s.path), "--out", str(out), "--no-progress", "--script", str(tmp_path / "toy_script.py")]
    assert cli.main([*argv, "--skip-committed"]) == 0
    assert counter.read_text().splitlines() == ["2 3", "4"]            # run 0 left out
    assert "1 run(s) left out: every row they write is committed already" in capsys.readouterr().err
    plain = script_sweep(tmp_path, "product:\n  x: [1]", name="no_publish")
    assert cli.main(["run", str(plain.path), "--out", str(tmp_path / "o2"), "--skip-committed",
                     "--script", str(tmp_path / "toy_script.py")]) == 2
    assert "--skip-committed needs a sweep that publishes" in capsys.readouterr().err
    odd = script_sweep(tmp_path, "product:\n  x: [1]", extra="publish: {path: data/rows.csv, key: [loud]}\n",
                       name="odd_key")
    with pytest.raises(ValueError, match="publish key column 'loud' is not a parameter of its runs"):
        coverage.run_coverage(odd)


def test_script_argument_types_name_what_is_allowed():
    import argparse

    from kvcost import script_args
    from kvcost.models import decoders

    even = script_args.int_at_least(64, even=True)
    assert even("128") == 128
    for bad, words in (("63", "even number >= 64, got 63"), ("65", "even number >= 64"), ("x", "integer, got 'x'")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            even(bad)
    fmt = script_args.checked(decoders.parse_format)
    assert fmt("q4_0+hadamard") == "q4_0+hadamard"
    with pytest.raises(argparse.ArgumentTypeError, match="parameter 'fmt' must be one of"):
        fmt("q9")


def test_gemma_sweeps_cover_every_committed_cell():
    """Gemma 3 270M's grids are sweeps (issue 24): every committed passkey cell (context, trial, variant) and
    every perplexity row (context, window, format; fp32 and fp16 are each run's references) is a point of
    gemma_passkey's or gemma_ppl's grid, and both publish into the decoder's folder."""
    import pandas as pd

    from kvcost import provenance
    from kvcost.models import decoder_registry

    gemma = decoder_registry.DECODERS["gemma3-270m"]
    pk, ppl = sweep.load("gemma_passkey"), sweep.load("gemma_ppl")
    assert pk.publish == gemma.results_file("passkey.csv") and ppl.publish == gemma.results_file("ppl_windows.csv")
    grid = {(r.params["context"], r.params["trial"], v) for r in pk.runs for v in r.params["variants"]}
    rows = pd.read_csv(provenance.checked(gemma.results_file("passkey.csv")))
    cells = set(zip(rows.context, rows.trial, rows.variant))
    assert cells <= grid and len(cells) > 1000
    windows = {(r.params["context"], r.params["window"], f) for r in ppl.runs
               for f in ["fp32", "fp16", *r.params["formats"]]}
    rows = pd.read_csv(provenance.checked(gemma.results_file("ppl_windows.csv")))
    assert set(zip(rows.context, rows.window, rows.format)) <= windows
    assert {r.params["context"] for r in ppl.runs} == {2048, 8192, 32768}
