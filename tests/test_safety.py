"""Issue 21: outputs never clobber, committed tables are checked, code runs only from where it should,
one runner per folder, the same bytes on any core count, and every bad input is one error line."""
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sweep_toys
from kvcost import cli, paths, provenance, run, runner, sweep
from kvcost.sweep import cli as sweep_cli
from kvcost.sweep import store

ROOT = paths.repo_root()
PASSKEY = ROOT / "data" / "real_model" / "passkey.csv"


def one_error_line(capsys, *words):
    """The captured stderr is exactly one ``error:`` line containing every word."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- 1. outputs never clobber

@pytest.mark.parametrize("out", ["data/real_model", "data", "notebooks", "lib", "lib/kvcost", "tests", "figures",
                                 ".", "/", str(ROOT.parent)])
def test_run_refuses_the_repositorys_folders_and_roots(out, capsys):
    before = PASSKEY.read_bytes()
    assert run.main(["01", "--out", out]) == 2
    line = one_error_line(capsys, "--out")
    assert any(w in line for w in ("inside the repository's", "repository root", "filesystem root"))
    assert PASSKEY.read_bytes() == before


def test_run_refuses_a_folder_that_holds_something_else_and_takes_an_earlier_run(tmp_path, capsys):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "sizing.csv").write_text("precious\n")
    assert run.main(["01", "--out", str(other)]) == 2
    one_error_line(capsys, "not empty", "no earlier run")
    assert (other / "sizing.csv").read_text() == "precious\n"
    (tmp_path / "file").write_text("x")
    assert run.main(["01", "--out", str(tmp_path / "file")]) == 2
    one_error_line(capsys, "not a folder")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "run.json").write_text(json.dumps({"notebook": "01_sizing", "key": "k", "status": "failed"}))
    assert runner.check_out(earlier) == earlier.resolve()
    assert runner.check_out(tmp_path / "new" / "deeper") == (tmp_path / "new" / "deeper").resolve()
    assert not (tmp_path / "new").exists()                         # checking creates nothing
    assert runner.check_out(tmp_path / "empty_dir_that_does_not_exist_yet").name.startswith("empty")


def test_sweep_run_refuses_committed_data_and_another_sweeps_folder(tmp_path, capsys):
    assert sweep_cli.main(["run", "sizing_contexts", "--out", "data/real_model"]) == 2
    one_error_line(capsys, "--out", "data/")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / store.SWEEP_FILE).write_text(json.dumps({"tool": "kvcost.sweep", "sweep": "axis_seeds"}))
    assert sweep_cli.main(["run", "sizing_contexts", "--out", str(theirs)]) == 2
    one_error_line(capsys, "not empty")
    assert store.is_sweep_folder(theirs, "axis_seeds") and not store.is_sweep_folder(theirs, "sizing_contexts")


def test_a_crafted_tables_json_deletes_nothing_outside_the_folder(tmp_path, toy):
    s = sweep.load(_toy_sweep(toy, "[1]"))
    out = toy / "out"
    victim = toy / "victim2.txt"
    victim.write_text("keep me")
    (out / "sub").mkdir(parents=True)
    (out / "keep.txt").write_text("not a table")
    (out / store.TABLES_FILE).write_text(json.dumps(["../victim2.txt", str(victim), "keep.txt", "sub"]))
    assert store.combine(s, out) == {}
    assert victim.read_text() == "keep me" and (out / "keep.txt").is_file() and (out / "sub").is_dir()
    with pytest.raises(ValueError, match="not a file name inside"):
        runner.inside(out, "../victim2.txt")
    assert runner.inside(out, "a.csv") == (out / "a.csv").resolve()


# ----------------------------------------------------------------------------- 2. committed tables are checked

def _committed_tables():
    """Every committed data file a reader loads: tables, arrays, the model records, the post's printed output
    and the text the real decoder reads (not the JSON provenance files and READMEs about them)."""
    listed = subprocess.run(["git", "ls-files", "data"], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = [ROOT / p for p in listed.stdout.split()]
    return [p for p in paths if p.suffix in (".csv", ".npz", ".out", ".txt")
            or (p.parent.name == "models" and p.suffix == ".json" and p.name != provenance.DIGESTS_FILE)]


def test_every_committed_table_has_a_recorded_sha256_that_holds():
    tables = _committed_tables()
    assert len(tables) >= 16 and PASSKEY in tables
    for path in tables:
        digest, meta = provenance.recorded(path)
        assert meta.parent == path.parent and digest == provenance.sha256(path), path
        assert provenance.checked(path) == path


def _tampered_passkey(tmp_path):
    """A copy of the committed passkey table and its provenance with one failed trial turned into a success."""
    for name in ("passkey.csv", "passkey.json"):
        shutil.copy(PASSKEY.with_name(name), tmp_path / name)
    lines = (tmp_path / "passkey.csv").read_text().splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if ln.split(",")[5] == "0" and float(ln.split(",")[6]) < -3)
    cells = lines[i].split(",")
    cells[5] = "1"
    lines[i] = ",".join(cells)
    (tmp_path / "passkey.csv").write_text("".join(lines))
    return tmp_path / "passkey.csv"


def test_an_edited_table_is_refused_naming_both_digests(tmp_path):
    path = _tampered_passkey(tmp_path)
    recorded, _ = provenance.recorded(path)
    with pytest.raises(ValueError) as err:
        provenance.checked(path)
    assert recorded in str(err.value) and provenance.sha256(path) in str(err.value)
    assert "passkey.json" in str(err.value)
    with pytest.raises(ValueError, match="sha256"):
        provenance.finished_keys(path, [("context", int)])         # a resuming script reads it checked too
    provenance.record(path)                                        # a deliberate edit, recorded
    assert provenance.checked(path) == path
    assert json.loads((tmp_path / "passkey.json").read_text())["sha256"]["passkey.csv"] == provenance.sha256(path)


def test_the_planner_refuses_an_edited_needle_table(tmp_path, capsys):
    folder = ROOT / "data" / "plan_needle"
    for name in ("needle.csv", "provenance.json"):
        shutil.copy(folder / name, tmp_path / name)
    csv = tmp_path / "needle.csv"
    csv.write_text(csv.read_text().replace("True", "False", 1))
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--accuracy-csv", str(csv),
                     "--json"]) == 2
    one_error_line(capsys, "sha256", "provenance.json")


def test_a_committed_file_without_a_record_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "data_dir", lambda: tmp_path / "data")   # the package data (kvcost.paths)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match="no sha256 is recorded"):
        provenance.checked(tmp_path / "data" / "t.csv")
    assert provenance.checked(tmp_path / "elsewhere.csv") == tmp_path / "elsewhere.csv"   # a user's own file
    assert provenance.main(["record", str(tmp_path / "data" / "t.csv")]) == 0
    assert provenance.main(["check", str(tmp_path / "data" / "t.csv")]) == 0


PASSKEY_HEADER = ["context", "trial", "depth", "tokens", "variant", "success", "margin", "seconds"]


@pytest.mark.parametrize("row, words", [
    (["1024", "0", "0.025", "1023", "exact", "maybe", "2.5", "3.0"], ["'success'", "0 or 1", "maybe"]),
    (["1024", "0", "0.025", "banana", "exact", "1", "2.5", "3.0"], ["'tokens'", "integer", "banana"]),
    (["-1", "0", "0.025", "1023", "exact", "1", "2.5", "3.0"], ["'context'", ">= 1"]),
    (["1024", "0", "0.025", "1023", "exact", "1", "-3.99", "3.0"], ["contradicts", "-3.99"]),
    (["1024", "0", "0.025", "1023", "exact", "1", "nan", "3.0"], ["'margin'", "finite"]),
    (["1024", "0", "1.5", "1023", "exact", "1", "2.5", "3.0"], ["'depth'", "<= 1"]),
    (["1024", "0", "0.025", "2000", "exact", "1", "2.5", "3.0"], ["'tokens' 2000 exceeds 'context' 1024"]),
])
@pytest.mark.parametrize("table", ["passkey.csv", "niah_multikey_1.csv", "niah_multikey_2.csv"])
def test_publish_schema_refuses_bad_rows(row, words, table):
    """Every RULER task's table (the multi-key ones are published by sweep gemma_multikey) has the passkey's rules."""
    store.check_rows(table, PASSKEY_HEADER, [["1024", "1", "0.075", "1023", "exact", "0", "-1.5", "2.0"]])
    with pytest.raises(ValueError) as err:
        store.check_rows(table, PASSKEY_HEADER, [row])
    for w in words:
        assert w in str(err.value)


def test_check_rows_infers_another_tables_rules_from_its_values_as_text_or_as_pandas_read_them():
    """A table without a schema takes the kinds its committed values have, whether the caller read them
    with dtype=str or let pandas parse them."""
    import pandas as pd
    old = pd.DataFrame({"n": [1, 2], "x": [0.5, 1.5], "name": ["a", "b"]})
    for existing in (old, old.astype(str)):
        store.check_rows("other.csv", ["n", "x", "name"], [["3", "2.5", "c"]], existing)
        with pytest.raises(ValueError, match=r"column 'n' must be an integer, got '2\.5'"):
            store.check_rows("other.csv", ["n", "x", "name"], [["2.5", "2.5", "c"]], existing)
        with pytest.raises(ValueError, match="column 'x' must be a number"):
            store.check_rows("other.csv", ["n", "x", "name"], [["3", "wide", "c"]], existing)


def test_every_ruler_task_table_has_a_publish_schema():
    from kvcost.experiments import real_decoder_passkey as pk
    from kvcost.retrieval import ruler
    assert pk.results_name is ruler.results_name                            # one spelling of the file names
    assert [ruler.results_name(t) for t in ruler.TASKS] == ["passkey.csv", "niah_multikey_1.csv",
                                                            "niah_multikey_2.csv"]
    assert all(ruler.results_name(task) in store.SCHEMAS for task in ruler.TASKS)


def test_publish_refuses_bad_rows_appends_nothing_and_records_the_digest(tmp_path, monkeypatch):
    dest = tmp_path / "data" / "rows.csv"
    dest.parent.mkdir()
    dest.write_text("x,scaled,loud\n2,99.0,0\n")
    monkeypatch.setattr(sweep.spec, "repo_root", lambda: tmp_path)
    sweep_toys.write_script(tmp_path)
    path = tmp_path / "toy_script_sweep.yaml"
    path.write_text("script: toy_script.py\ntable: toy_rows.csv\npublish: {path: data/rows.csv, key: [x]}\n"
                    "product:\n  x: [1, 3]\n")
    s = sweep.load(path, scripts=[tmp_path / "toy_script.py"])
    out = tmp_path / "out"
    for run_ in s.runs:                                       # finished runs, one with a wrong row
        x = run_.params["x"]
        rows = f"x,scaled,loud\n{x},{'banana' if x == 3 else x},0\n"
        store.save_run(out, run_.key, {"toy_rows.csv": rows.encode()}, {"status": "finished"})
    with pytest.raises(ValueError, match=r"run 1 .*column 'scaled' must be a number, got 'banana'"):
        store.publish(s, out)
    assert dest.read_text() == "x,scaled,loud\n2,99.0,0\n"                  # nothing appended
    store.save_run(out, s.runs[1].key, {"toy_rows.csv": b"x,scaled,loud\n3,3.0,0\n"}, {"status": "finished"})
    assert store.publish(s, out)[1:] == (2, 0)
    assert provenance.checked(dest) == dest
    assert provenance.recorded(dest)[1] == dest.parent / provenance.DIGESTS_FILE


# ----------------------------------------------------------------------------- 3. code runs only from where it should

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
{tail}
"""


def _evil_sweep(tmp_path, tail=""):
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "marker"
    (outside / "evil.py").write_text(EVIL.format(marker=str(marker), tail=tail))
    path = tmp_path / "evil.yaml"
    path.write_text("script: outside/evil.py\nproduct:\n  x: [1]\n")
    return path, outside / "evil.py", marker


def test_a_script_outside_scripts_is_refused_unless_named_and_status_never_imports_it(tmp_path, capsys):
    path, script, marker = _evil_sweep(tmp_path, "def parse_args(argv):\n    return argv\n")
    assert sweep_cli.main(["status", str(path), "--out", str(tmp_path / "o")]) == 1       # nothing finished
    assert sweep_cli.main(["publish", str(path), "--out", str(tmp_path / "o")]) == 2      # names no publish file
    assert not marker.exists()                                      # neither imported the script
    capsys.readouterr()
    assert sweep_cli.main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    one_error_line(capsys, "outside the repository's scripts/", "--script")
    assert not marker.exists()
    s = sweep.load(path, scripts=[script])                           # named: imported, its parser checks
    assert marker.exists() and s.nb == script.resolve()
    assert sweep.load("real_model_ppl").nb.parent == ROOT / "scripts"


def test_a_scripts_system_exit_is_one_error_line(tmp_path, capsys):
    path, script, _ = _evil_sweep(tmp_path, "raise SystemExit(3)")
    assert sweep_cli.main(["run", str(path), "--script", str(script), "--out", str(tmp_path / "o")]) == 2
    one_error_line(capsys, "exited (code 3)")


def test_make_lab_as_root_turns_the_terminal_off_unless_asked():
    def recipe(*extra):
        res = subprocess.run(["make", "-n", "-s", "lab", "MAKEFLAGS=-o .venv/.installed", *extra], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        return res.stdout.strip().splitlines()[-1]
    if os.getuid() == 0:
        assert "--allow-root" in recipe() and "--ServerApp.terminals_enabled=False" in recipe()
        assert "--allow-root" in recipe("LAB_TERMINALS=1") and "terminals_enabled" not in recipe("LAB_TERMINALS=1")
    else:
        assert "--allow-root" not in recipe() and "terminals_enabled" not in recipe()


def test_readme_cluster_section_says_tcp_is_unauthenticated_and_shows_loopback_ssh_and_tls():
    text = (ROOT / "README.md").read_text()
    section = text.split("**On a cluster**", 1)[1].split("**What a run costs.**", 1)[0]
    for words in ("unauthenticated", "--host 127.0.0.1", "ssh -N -L 8786:127.0.0.1:8786", "tls://",
                  "--tls-ca-file", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"):
        assert words in section, words


# ----------------------------------------------------------------------------- 4. one runner per folder

def test_a_folder_is_held_by_one_process_and_a_second_sweep_stops_at_once(tmp_path, toy):
    out = toy / "out"
    out.mkdir()
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        s = sweep.load(_toy_sweep(toy, "[1]"))
        with pytest.raises(ValueError, match="another sweep is writing there now"):
            sweep.run_sweep(s, out, progress=False)
        assert not (out / "runs").exists()                            # nothing ran
    finally:
        holder.kill()
        holder.wait()
    with runner.folder_lock(out), pytest.raises(ValueError, match="another run"), runner.folder_lock(out):
        pass


def test_leftovers_of_killed_runs_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    stale = tmp / f"{runner.TEMP_PREFIX}{dead}-test21"
    live = tmp / f"{runner.TEMP_PREFIX}{os.getpid()}-test21"
    for folder in (stale, live):
        (folder / "run" / ".partial").mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    for name in (f"{runner.STAGING}-{dead}", runner.STAGING, f"{runner.STAGING}-{os.getpid()}"):
        (out / name).mkdir(parents=True)
    try:
        removed = runner.clean_leftovers(out)
        assert stale in removed and not stale.exists() and live.exists()
        assert sorted(p.name for p in out.iterdir()) == []
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
    store.save_run(tmp_path / "sw", "k1", {"a.csv": b"a\n"}, {"status": "finished"})
    (tmp_path / "sw" / "runs" / ".k2.partial-1-2").mkdir()
    assert [p.name for p in store.clean_partial(tmp_path / "sw")] == [".k2.partial-1-2"]
    assert sorted(p.name for p in (tmp_path / "sw" / "runs").iterdir()) == ["k1"]


# ----------------------------------------------------------------------------- 5. same bytes everywhere

def test_a_notebook_gives_the_same_bytes_under_any_thread_setting(tmp_path, monkeypatch):
    """Notebook 02 (small): matrix products and Hadamard rotations through BLAS. The caller's thread
    settings differ; the runner pins them, so the tables are the same bytes (and run.json says so)."""
    nb = runner.notebook_path("02")
    params = {"n_tokens": 512, "attn_trials": 2, "outlier_strengths": [4.0]}
    tables = []
    for threads in ("1", "2"):
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            monkeypatch.setenv(name, threads)
        out = tmp_path / f"threads{threads}"
        result = runner.run_in_child(nb, params, out)
        assert result.status == "finished", result.error
        assert result.threads == runner.THREADS
        assert json.loads((out / "run.json").read_text())["threads"]["OPENBLAS_NUM_THREADS"] == "1"
        tables.append({p.name: p.read_bytes() for p in sorted(out.glob("*.csv"))})
    assert len(tables[0]) >= 5 and tables[0] == tables[1]


# ----------------------------------------------------------------------------- 6. one error line, exit 2

@pytest.mark.parametrize("text, value", [
    ("017", 17), ("1:30", "1:30"), ("2001-01-01", "2001-01-01"), ("on", "on"), ("yes", "yes"), ("0x10", "0x10"),
    ("1e-3", 0.001), ("1_000", "1_000"), ("None", None), ("null", None), ("True", True), (".5", 0.5),
    ("[8, 3]", [8, 3]), ("{a: 017}", {"a": 17}),
])
def test_values_are_read_as_papermill_reads_them(text, value):
    assert runner.parse_value(text) == value and type(runner.parse_value(text)) is type(value)
    assert math.isnan(runner.parse_value("nan")) and runner.parse_value("-.inf") == -math.inf


@pytest.mark.parametrize("argv, words", [
    (["-p", "bit_pairs", "[8, 3"], ["-p 'bit_pairs'", "not valid YAML"]),
    (["-p", "seed", "2001-01-01"], ["'seed'", "integer", "2001-01-01"]),
    (["-p", "margin", "1:30"], ["'margin'", "finite number", "1:30"]),
    (["-p", "margin", "nan"], ["'margin'", "finite number"]),
    (["-p", "margin", ".inf"], ["'margin'", "finite number"]),
    (["-p", "trials", "1", "-p", "trials", "2"], ["-p 'trials' is given twice"]),
    (["-p", "bit_pairs", "{a: 1, a: 2}"], ["given twice"]),
    (["-p", "bit_pairs", "[" * 200_000], ["-p 'bit_pairs'"]),
    (["-p", "margin", "x" * 10_000], ["'margin'", "characters)"]),
    (["-y", "missing.yaml"], ["-y 'missing.yaml'", "no such file"]),
    (["-y", "{margin: 1.0, margin: 2.0}"], ["given twice"]),
    (["-y", "[1, 2]"], ["must be a YAML mapping"]),
    (["-p", "margn", "1"], ["unknown parameter(s) ['margn']"]),
])
def test_bad_run_input_is_one_error_line(argv, words, capsys):
    assert run.main(["03", *argv]) == 2
    line = one_error_line(capsys, *words)
    assert len(line) < 600


def test_seed_017_is_seventeen():
    assert run.parse_args(["03", "-p", "seed", "017", "--out", "results/runs/t21"])[1] == {"seed": 17}


@pytest.mark.parametrize("argv, words", [
    (["size", "Llama-3.1-8B", "--budget-gib", "1e300"], ["--budget-gib", "1 PiB"]),
    (["size", "Llama-3.1-8B", "--budget-gib", "nan"], ["--budget-gib", "finite"]),
    (["plan", "Llama-3.1-8B", "--engine", "vllm", "--kv-memory-gib", "1e308"], ["--kv-memory-gib", "1 PiB"]),
    (["plan", "Llama-3.1-8B", "--engine", "vllm", "--kv-memory-gib", "inf"], ["--kv-memory-gib", "finite"]),
    (["plan", "Llama-3.1-8B", "--engine", "vllm", "--kv-memory-gib", "8", "--tp", "3"],
     ["--tp 3", "attention heads (32)", "divisible", "[1, 2, 4, 8, 16, 32]"]),
    (["plan", "Llama-3.1-8B", "--engine", "vllm", "--kv-memory-gib", "8", "--block-size", "7"],
     ["--block-size", "[1, 8, 16, 32, 64, 128, 256]"]),
    (["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--reserve-gib", "-100"],
     ["--reserve-gib", "from 0"]),
    (["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--reserve-gib", "nan"], ["--reserve-gib"]),
    (["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--gpu-memory-utilization", "1.5"],
     ["--gpu-memory-utilization", "at most 1"]),
    (["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--tp", "3", "--gpus", "3"], ["--tp 3"]),
    (["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--dtypes", "bf16,,q8_0"], ["--dtypes"]),
    (["size", "Llama-3.1-8B", "--n-seq", "9" * 200], ["--n-seq", "characters)"]),
])
def test_bad_cli_input_is_one_error_line(argv, words, capsys):
    assert cli.main(argv) == 2
    one_error_line(capsys, *words)


@pytest.mark.parametrize("cfg, words", [
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "layer_types": [{}]}, ["layer_types"]),
    ({"num_hidden_layers": 1e300, "num_attention_heads": 4, "hidden_size": 256}, ["num_hidden_layers", "below 2^31"]),
])
def test_malformed_configs_are_one_error_line(cfg, words, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert cli.main(["size", str(tmp_path / "config.json")]) == 2
    one_error_line(capsys, *words)


def test_an_accuracy_csv_without_retrieved_is_one_error_line(tmp_path, capsys):
    (tmp_path / "acc.csv").write_text("storage,n_tokens\nq8_0/q8_0,8192\n")
    assert cli.main(["plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--context", "8k", "--accuracy-csv",
                     str(tmp_path / "acc.csv")]) == 2
    one_error_line(capsys, "--accuracy-csv", "['retrieved']")


def test_alias_bombs_and_huge_grids_stop_at_once_with_a_short_line(tmp_path, capsys):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    (tmp_path / "bomb.yaml").write_text("notebook: 01\nproduct:\n  context: *i\n" + bomb)
    start = time.perf_counter()
    assert sweep_cli.main(["status", str(tmp_path / "bomb.yaml")]) == 2
    one_error_line(capsys, "aliases")
    values = ", ".join(str(1024 + i) for i in range(2000))
    grid = f"notebook: 01\nproduct:\n  context: [{values}]\n  request_tokens: [{values}]\n"
    (tmp_path / "huge.yaml").write_text(grid)
    assert sweep_cli.main(["status", str(tmp_path / "huge.yaml")]) == 2
    one_error_line(capsys, "4,000,000 runs", "at most 100,000")
    assert time.perf_counter() - start < 10


def test_the_repeat_check_is_linear(toy):
    xs = list(range(1000)) * 3          # 3,000 runs of the toy notebook, the repeats at the end
    path = toy / "many.yaml"
    path.write_text(f"notebook: toy_sweep.ipynb\nzip:\n  x: {xs}\n")
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"run 1000 \(x=0\) repeats run 0"):
        sweep.load(path)
    assert time.perf_counter() - start < 10


def test_sweep_flags_are_one_error_line(capsys):
    assert sweep_cli.main(["run", "sizing_contexts", "--jobs", "0"]) == 2
    one_error_line(capsys, "--jobs")
    assert sweep_cli.main(["run", "sizing_contexts", "--scheduler", "http://x"]) == 2
    one_error_line(capsys, "--scheduler", "tls://")
    assert sweep_cli.main(["run", "sizing_contexts", "--jobs", "two"]) == 2
    one_error_line(capsys, "--jobs")
    assert sweep_cli.main(["run", "no_such_sweep" * 50]) == 2
    one_error_line(capsys, "unknown sweep", "characters)")


_TEXT = st.one_of(st.sampled_from(["0", "-1", "1e300", "1e308", "nan", "inf", "-100", "3", "7", "17", "128k", "1M",
                                   "", "x", "0.5", "1.5", "99999999999999999999", "q4_0", "bf16", "fp8"]),
                  st.text(max_size=12))
_FLAGS = {"size": ["--context", "--dtype", "--v-dtype", "--budget-gib", "--request-tokens", "--n-seq", "--n-ubatch"],
          "plan": ["--kv-memory-gib", "--tp", "--block-size", "--max-model-len", "--gpus", "--reserve-gib",
                   "--gpu-memory-utilization", "--context", "--dtypes", "--concurrency"]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["size", "plan"]), data=st.data())
def test_fuzzed_size_and_plan_give_a_result_or_one_error_line(command, data, capsys):
    flags = data.draw(st.lists(st.sampled_from(_FLAGS[command]), max_size=3, unique=True))
    argv = [command, data.draw(st.sampled_from(["Llama-3.1-8B", "gpt-oss-20b", "DeepSeek-V3", "Qwen3-Next-80B-A3B"]))]
    for flag in flags:
        argv += [flag, data.draw(_TEXT)]
    if command == "plan":
        argv += data.draw(st.sampled_from([["--engine", "vllm", "--kv-memory-gib", "8"],
                                           ["--gpu", "H100-80GB", "--context", "8k"], []]))
    code = cli.main([*argv, "--json"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning: ")]
    assert code in (0, 2), argv
    assert (code == 0 and not lines) or (code == 2 and len(lines) == 1 and lines[0].startswith("error: ")), (argv, err)


# ----------------------------------------------------------------------------- helpers

@pytest.fixture
def toy(tmp_path, monkeypatch):
    sweep_toys.install(monkeypatch, tmp_path)
    return tmp_path


def _toy_sweep(folder, xs):
    path = Path(folder) / "toy.yaml"
    path.write_text(f"notebook: toy_sweep.ipynb\nproduct:\n  x: {xs}\n")
    return path
