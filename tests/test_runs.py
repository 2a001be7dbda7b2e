"""The data-producing jobs live in ``kvcost.runs``; ``scripts/*.py`` are thin entry points to them, and every
job writes its provenance through ``kvcost.provenance.write_run``."""
import ast
import gzip
import hashlib
import importlib
import importlib.util
import json
import struct
import subprocess
import sys
import zlib

import pandas as pd
import pytest

from kvcost import provenance
from kvcost.paths import repo_root
from kvcost.runs import plan_readme_table, tables
from kvcost.runs.extract_real_kv import NOVELS, read_novel
from kvcost.sweep import spec as sweep_spec

ROOT = repo_root()
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
MAX_LINES = 20


def _entry(script):
    """The kvcost module a thin script imports ``main`` from, and the names it imports."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    found = [node for node in tree.body
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvcost")]
    assert len(found) == 1, f"{script.name}: one import from kvcost, got {len(found)}"
    return found[0].module, [a.name for a in found[0].names]


def _jobs():
    return [script.stem for script in SCRIPTS if _entry(script)[0].startswith("kvcost.runs.")]


def test_the_jobs_are_all_there():
    assert set(_jobs()) == {
        "extract_real_kv", "llamacpp_reference", "long_range_needle", "long_range_retrieval", "plan_needle",
        "real_model_extract", "real_model_passkey", "real_model_ppl", "real_model_text", "tensorcore_validation",
        "which_gpu_grid", "gen_docs", "plan_readme_table", "retrieval_readme_table"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_is_a_thin_entry_point(script):
    """A docstring, the sys.path line for a checkout without `make setup`, one import of ``main`` from the
    kvcost module of the same name, and ``main()`` under ``__name__ == "__main__"``: no logic, no importlib."""
    text = script.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{script.name}: more than {MAX_LINES} lines"
    tree = ast.parse(text)
    module, names = _entry(script)
    assert "main" in names
    assert module.rsplit(".", 1)[-1] == script.stem
    assert "importlib" not in text
    for node in tree.body:
        assert not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)), \
            f"{script.name}:{node.lineno}: a definition in an entry point (it belongs in {module})"
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= {"sys"}
        if isinstance(node, ast.ImportFrom) and node.module != module:
            assert node.module == "pathlib"
    assert isinstance(tree.body[-1], ast.If) and "__main__" in ast.unparse(tree.body[-1].test)


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.stem in _jobs()], ids=lambda p: p.name)
def test_a_script_hands_its_job_the_same_names(script):
    """Imported as a sweep imports it (by file), a script gives the job's own ``parse_args`` and ``main``."""
    spec = importlib.util.spec_from_file_location(f"kvcost_test_script_{script.stem}", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    job = importlib.import_module(f"kvcost.runs.{script.stem}")
    assert mod.main is job.main and mod.parse_args is job.parse_args


@pytest.mark.parametrize("name", _jobs())
def test_python_m_kvcost_runs_job_help(name):
    r = subprocess.run([sys.executable, "-m", f"kvcost.runs.{name}", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {name}.py"), r.stdout[:200]


def test_write_run_writes_the_provenance_layout_checked_reads(tmp_path):
    table = tmp_path / "rows.csv"
    table.write_text("a,b\n1,2\n", encoding="utf-8")
    given = tmp_path / "input.bin"
    given.write_bytes(b"\x00\x01")
    meta = provenance.write_run(tmp_path / "rows.json", command="python scripts/job.py --x 1", outputs=[table],
                                inputs={"data/input.bin": given}, versions={"python": "3"}, git=True, cpus=True,
                                note={"parameters": {"x": 1}, "date": "stale", "sha256": {"old": "0"}})
    data = json.loads(meta.read_text(encoding="utf-8"))
    assert set(data) == {"command", "date", "versions", "git_commit", "cpus", "inputs", "sha256", "parameters"}
    assert data["sha256"] == {"rows.csv": provenance.sha256(table)}          # explicit entries replace note's
    assert data["inputs"] == {"data/input.bin": provenance.sha256(given)}
    assert len(data["date"]) == 10 and data["date"] != "stale"
    assert meta.read_text(encoding="utf-8") == json.dumps(data, indent=1, sort_keys=True) + "\n"
    assert provenance.checked(table) == table
    provenance.record(table)                                    # record() keeps the same layout
    assert json.loads(meta.read_text(encoding="utf-8")) == data


def test_write_run_started_is_written_once(tmp_path):
    """A resumable run's record: the first run's command and date stay; the table's digest is recorded in it
    (as :func:`kvcost.provenance.appending` does row by row for a committed table)."""
    meta = tmp_path / "rows.json"
    provenance.write_run(meta, command="first", started=True, note={"model": "m"})
    first = json.loads(meta.read_text(encoding="utf-8"))
    assert set(first) == {"command", "started", "model"} and first["command"] == "first"
    provenance.write_run(meta, command="second", started=True)
    assert json.loads(meta.read_text(encoding="utf-8")) == first
    (tmp_path / "rows.csv").write_text("a\n1\n", encoding="utf-8")
    assert provenance.record(tmp_path / "rows.csv") == meta
    assert set(json.loads(meta.read_text(encoding="utf-8"))) == {"command", "started", "model", "sha256"}


def _xdr(body: bytes) -> bytes:
    return b"X\n" + struct.pack(">iii", 2, 0x040000, 0x020300) + body


def _ints(values):
    return struct.pack(">ii", 13, len(values)) + struct.pack(f">{len(values)}i", *values)


def _strings(lines):
    out = struct.pack(">ii", 16, len(lines))
    for line in lines:
        raw = line.encode("utf-8")
        out += struct.pack(">ii", 9 | (1 << 15), len(raw)) + raw       # CHARSXP, UTF-8 marked
    return out


def _list(items):
    return struct.pack(">ii", 19, len(items)) + b"".join(items)


def test_the_shared_r_reader_reads_a_lazy_load_data_base(tmp_path):
    """janeaustenr's data base as R writes it (an index of (offset, length) per novel, each novel a compressed
    character vector): read_novel, which real_model_text and extract_real_kv share, gives the lines back."""
    novels = {name: [f"{name} line {i}" for i in range(3)] for name in NOVELS}
    novels["prideprejudice"] = ["PRIDE AND PREJUDICE", "", "By Jane Austen", "Chapter 1", "It is a truth…"]
    rdb, index, offset = b"", [], 0
    for name in NOVELS:
        blob = struct.pack(">i", 0) + zlib.compress(_xdr(_strings(novels[name])))
        index.append(_ints([offset, len(blob)]))
        rdb, offset = rdb + blob, offset + len(blob)
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_xdr(_list([_list(index)]))))
    for name in ("prideprejudice", "emma"):
        assert read_novel(tmp_path / "Rdata", name) == novels[name]


def test_a_script_sweeps_key_follows_its_job_module_and_what_that_imports(tmp_path):
    """A thin script's text does not change when its job's logic does, nor when the code the job calls does:
    the run key hashes the script and every kvcost module it reaches."""
    script = ROOT / "scripts" / "plan_needle.py"
    lib = ROOT / "lib" / "kvcost"
    files = sweep_spec.kvcost_imports(script)
    for reached in (lib / "runs" / "plan_needle.py", lib / "runs" / "tables.py",      # the job, its helper,
                    lib / "experiments" / "plan.py", lib / "retrieval" / "haystacks.py"):  # what it computes with
        assert reached.resolve() in [f.resolve() for f in files]
    assert lib / "cli.py" not in files and len(files) == len(set(files))
    expect = hashlib.sha256(script.read_bytes())
    for f in files:
        expect.update(f.read_bytes())
    assert sweep_spec.script_hash(script) == expect.hexdigest()
    assert sweep_spec.script_hash(script) != hashlib.sha256(script.read_bytes()).hexdigest()
    odd = tmp_path / "odd.py"
    odd.write_text("from kvcost.runs.no_such_job import main\n")
    with pytest.raises(ValueError, match="no_such_job"):
        sweep_spec.script_hash(odd)
    plain = tmp_path / "plain.py"
    plain.write_text("import json\nfrom kvcost import paths\n")
    assert sweep_spec.kvcost_imports(plain) == [lib / "__init__.py", lib / "paths.py"]


def test_append_in_chunks_resumes_where_a_run_stopped(tmp_path, capsys):
    """The keys a run finished are not computed again; rows are appended under one header, chunk by chunk."""
    partial = tmp_path / "rows.partial.csv"
    pd.DataFrame({"trial": [0, 1, 3], "value": [0.0, 1.0, 3.0]}).to_csv(partial, index=False)
    asked = []

    def compute(todo):
        asked.append(todo)
        assert partial.read_text().count("trial") == 1            # the chunks before are appended already
        return pd.DataFrame({"trial": todo, "value": [t * 1.0 for t in todo]})

    rows = tables.append_in_chunks(partial, [range(0, 2), range(2, 4), range(4, 5)], compute, key="trial",
                                   say=lambda todo, s: f"trials {todo} done")
    assert asked == [[2], [4]]                                        # not 0, 1 (done) nor 3 (done, in chunk 2)
    assert capsys.readouterr().out == "trials [2] done\ntrials [4] done\n"
    assert rows["trial"].tolist() == [0, 1, 3, 2, 4]
    assert partial.read_text().count("trial") == 1
    again = tables.append_in_chunks(partial, [range(0, 5)], compute, key="trial", say=str)
    assert asked == [[2], [4]] and again.equals(rows)                 # all done: nothing computed


def test_append_in_chunks_whole_redoes_an_unfinished_chunk_by_two_columns(tmp_path):
    """With ``whole``, a chunk with any key left is computed whole (its finished rows come twice); a chunk of
    finished keys is skipped. Keys of two columns are tuples."""
    partial = tmp_path / "rows.partial.csv"
    pd.DataFrame({"n_tokens": [8, 8, 8], "trial": [0, 1, 2]}).to_csv(partial, index=False)
    asked = []

    def compute(todo):
        asked.append(todo)
        return pd.DataFrame(todo, columns=["n_tokens", "trial"])

    chunks = [[(n, t) for t in range(first, first + 2)] for n in (8, 16) for first in (0, 2)]
    rows = tables.append_in_chunks(partial, chunks, compute, key=("n_tokens", "trial"), say=lambda todo, s: "",
                                   whole=True)
    assert asked == [[(8, 2), (8, 3)], [(16, 0), (16, 1)], [(16, 2), (16, 3)]]
    assert len(rows) == 3 + 6 and len(rows.drop_duplicates()) == 8


def test_write_table_writes_the_table_its_provenance_and_removes_the_partial(tmp_path, capsys):
    partial, csv, meta = tmp_path / "t.partial.csv", tmp_path / "t.csv", tmp_path / "t.json"
    partial.write_text("a\n1\n", encoding="utf-8")
    given = tmp_path / "in.bin"
    given.write_bytes(b"\x00")
    tables.write_table(pd.DataFrame({"a": [1, 2]}), csv, meta, partial, command="python scripts/t.py",
                       packages=("pandas",), note={"parameters": {"x": 1}}, started=0.0,
                       inputs={"data/in.bin": given}, digest="t_csv_sha256")
    assert csv.read_bytes() == b"a\n1\n2\n" and not partial.exists()
    data = json.loads(meta.read_text(encoding="utf-8"))
    assert data["rows"] == 2 and data["run_seconds_this_session"] > 0 and data["parameters"] == {"x": 1}
    assert data["t_csv_sha256"] == data["sha256"]["t.csv"] == provenance.sha256(csv)
    assert data["inputs"] == {"data/in.bin": provenance.sha256(given)} and set(data["versions"]) == {
        "python", "pandas"}
    assert provenance.checked(csv) == csv
    assert capsys.readouterr().out == f"wrote {csv} (2 rows) and t.json\n"


@pytest.mark.parametrize("job, flag", [("long_range_needle", "--trials"), ("long_range_needle", "--chunk"),
                                       ("long_range_retrieval", "--trials"), ("plan_needle", "--trials"),
                                       ("plan_needle", "--chunk")])
def test_a_chunked_job_refuses_a_count_below_one_naming_the_flag(job, flag, capsys):
    parse = importlib.import_module(f"kvcost.runs.{job}").parse_args
    assert getattr(parse([flag, "1"]), flag[2:]) == 1
    with pytest.raises(SystemExit) as stop:
        parse([flag, "0"])
    assert stop.value.code == 2
    assert f"error: argument {flag}: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_write_or_check_says_which_file_is_stale_and_what_rewrites_it(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("old\n", encoding="utf-8")
    assert tables.write_or_check(doc, str.upper, check=True, command="python scripts/doc.py") == 1
    assert doc.read_text(encoding="utf-8") == "old\n"                 # --check writes nothing
    assert capsys.readouterr().out == f"{doc} is out of date (not what its generator writes now); run python " \
                                      "scripts/doc.py\n"
    assert tables.write_or_check(doc, str.upper, check=False, command="python scripts/doc.py") == 0
    assert doc.read_text(encoding="utf-8") == "OLD\n"
    assert tables.write_or_check(doc, str.upper, check=True, command="python scripts/doc.py") == 0
    assert capsys.readouterr().out == ""


def test_plan_readme_table_check_fails_on_a_stale_table_with_the_message(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{plan_readme_table.START}\n| stale |\n{plan_readme_table.END}\nend\n", encoding="utf-8")
    monkeypatch.setattr(plan_readme_table, "README", readme)
    assert plan_readme_table.main(["--check"]) == 1
    assert "README.md is out of date" in capsys.readouterr().out
    assert plan_readme_table.main([]) == 0 and plan_readme_table.main(["--check"]) == 0
    assert "| stale |" not in readme.read_text(encoding="utf-8")
