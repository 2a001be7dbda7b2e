"""Provenance helpers: digests, versions and the commit recorded beside committed results."""
import hashlib
import platform

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
