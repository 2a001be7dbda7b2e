"""Provenance helpers: digests, versions and the commit recorded beside committed results."""
import hashlib
import os
import platform

import pytest

from kvcost import provenance
from kvcost.models import decoders


def test_sha256_matches_hashlib_on_a_multi_chunk_file(tmp_path):
    data = bytes(range(256)) * 5000          # 1.28 MB: more than one 1 MiB chunk
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert provenance.sha256(path) == hashlib.sha256(data).hexdigest()
    assert decoders.sha256 is provenance.sha256


def test_versions_names_python_and_marks_missing_packages():
    v = provenance.versions(("numpy", "no-such-distribution-kvcost"))
    assert v["python"] == platform.python_version()
    assert v["numpy"].count(".") >= 1
    assert v["no-such-distribution-kvcost"] == "not installed"


def test_git_commit_is_a_sha_in_the_checkout_and_unknown_elsewhere(tmp_path):
    sha = provenance.git_commit()
    assert len(sha) == 40 and int(sha, 16) >= 0
    assert provenance.git_commit(tmp_path) == "unknown"


def test_appending_and_finished_keys_resume_a_run(tmp_path):
    path = tmp_path / "runs" / "rows.csv"
    key = [("context", int), ("format", str)]
    assert provenance.finished_keys(path, key) == set()
    with provenance.appending(path, ["context", "format", "nll"]) as write:
        write({"context": 2048, "format": "q8_0", "nll": 1.5})
        assert provenance.finished_keys(path, key) == {(2048, "q8_0")}     # flushed row by row
    with provenance.appending(path, ["context", "format", "nll"]) as write:
        write({"context": 4096, "format": "q4_0", "nll": 2.0})
    assert path.read_text().splitlines() == ["context,format,nll", "2048,q8_0,1.5", "4096,q4_0,2.0"]
    assert provenance.finished_keys(path, key) == {(2048, "q8_0"), (4096, "q4_0")}


def test_appending_names_the_code_of_each_row_and_refuses_another_header(tmp_path):
    """A table with the code column gets the version and commit of the code in each row (a row that names its
    own keeps it); a file written under other columns is refused, naming both headers, before any row lands."""
    import re

    code = provenance.code_version()
    assert re.fullmatch(r"kvcost \S+ [0-9a-f]{12}(\+dirty)?", code)
    assert provenance.code_version(tmp_path).endswith(" unknown")
    path = tmp_path / "rows.csv"
    fields = ["context", "format", provenance.CODE_COLUMN]
    with provenance.appending(path, fields) as write:
        write({"context": 2048, "format": "q8_0"})
        write({"context": 4096, "format": "q4_0", "code": "kvcost 0.1.0 0123456789ab"})
    assert path.read_bytes().decode().split("\n") == [
        "context,format,code", f"2048,q8_0,{code}", "4096,q4_0,kvcost 0.1.0 0123456789ab", ""]
    before = path.read_bytes()
    with (pytest.raises(ValueError, match=r"has the columns \['context', 'format', 'code'\]; this run writes"),
          provenance.appending(path, ["context", "format"]) as write):
        write({"context": 1, "format": "x"})
    assert path.read_bytes() == before


def test_committed_real_decoder_tables_name_the_code_of_every_row():
    """Every table the real-decoder runs append to names, per row, the code that wrote it: for Gemma 3 270M's
    (issue 24's) a kvcost version and a commit of this repository's history; SmolLM2's older rows say
    'unrecorded'."""
    import csv
    import subprocess

    from kvcost.paths import data_path

    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True,
                             cwd=data_path()).stdout.strip() == "true"
    commits: set[str] = set()
    for dec in decoders.DECODERS.values():
        for name in ("passkey.csv", "ppl_windows.csv", "llamacpp_windows.csv", "propagation.csv",
                     "niah_multikey_1.csv", "niah_multikey_2.csv"):
            path = dec.results_file(name)
            with open(provenance.checked(path), newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
            assert rows and all(r[provenance.CODE_COLUMN] for r in rows), path
            for r in rows:
                kv, version, *commit = [*r[provenance.CODE_COLUMN].split(" "), ""]
                if r[provenance.CODE_COLUMN] == "unrecorded":
                    assert dec.name == "smollm2-135m", path
                    continue
                assert (kv, version) == ("kvcost", "0.1.0") and len(commit[0]) == 12, r
                commits.add(commit[0])
    assert len(commits) >= 8
    if not shallow:
        for c in commits:
            assert subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=data_path()).returncode == 0, c


def test_write_run_records_the_machine_when_asked(tmp_path):
    """A real-decoder run's record names its CPU: a coarse format's row moves with it."""
    import json

    rec = provenance.machine_record()
    assert set(rec) >= {"cpu", "arch", "cpus"} and rec["cpus"] == os.cpu_count() and rec["cpu"]
    out = provenance.write_run(tmp_path / "run.json", command="x", machine=True)
    assert json.loads(out.read_text())["machine"] == rec
    assert "machine" not in json.loads(provenance.write_run(tmp_path / "b.json", command="x").read_text())
