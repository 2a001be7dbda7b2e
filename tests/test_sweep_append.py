"""kvcost.sweep.append: a direct script run's rows into a committed table, and ``python -m kvcost.sweep append``."""
import json

import pandas as pd
import pytest

from kvcost import provenance
from kvcost.sweep import main
from kvcost.sweep.append import append_rows

COLUMNS = ["context", "trial", "depth", "tokens", "variant", "success", "margin", "seconds", "code"]
VERSIONS = {"torch": "2.13.0+cpu", "kvcost": "0.1.0"}


def _row(trial, variant, margin, context=4096, seconds=40.0):
    return [context, trial, (trial + 0.5) / 4, context - 10, variant, int(margin > 0), margin, seconds,
            "kvcost 0.1.0 abc"]


def _table(tmp_path):
    """A committed-style table (named as the passkey schema's) with exact's four trials, its sha256 recorded."""
    table = tmp_path / "niah_multikey_1.csv"
    pd.DataFrame([_row(t, "exact", m) for t, m in enumerate([1.5, -0.5, 2.0, 0.25])], columns=COLUMNS).to_csv(
        table, index=False, lineterminator="\n")
    table.with_suffix(".json").write_text(json.dumps({"commands": ["first run"], "versions": VERSIONS,
                                                      "model": "gemma3-270m"}, indent=1, sort_keys=True) + "\n")
    provenance.record(table)
    return table


def _run(tmp_path, name, rows, versions=VERSIONS, machine=None):
    out = tmp_path / f"{name}.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(out, index=False, lineterminator="\n")
    out.with_suffix(".json").write_text(json.dumps({
        "command": f"python scripts/real_model_passkey.py --trial X --out /scratch/{name}.csv",
        "machine": machine or {"cpu": "AMD EPYC", "cpus": 2, "torch_cpu_capability": "AVX2"},
        "started": "2026-12-06", "versions": versions, "model": "gemma3-270m"}))
    return out


def test_new_cells_are_appended_whole_and_re_runs_are_compared_not_appended(tmp_path):
    table = _table(tmp_path)
    # two processes, even and odd trials, each re-running exact (a shared prefix) beside a new stored format
    even = _run(tmp_path, "even", [_row(0, "exact", 1.5 + 2e-6), _row(0, "store:q4_0", -0.1, seconds=41),
                                   _row(2, "exact", 2.0), _row(2, "store:q4_0", 1.0, seconds=45)])
    odd = _run(tmp_path, "odd", [_row(1, "exact", -0.5), _row(1, "store:q4_0", -0.2, seconds=39),
                                 _row(3, "store:q4_0", 0.5, seconds=50)])
    done = append_rows(table, [even, odd], trials=4, note="a worktree at abc")
    assert (done.added, done.rerun, done.cells) == (4, 3, (("4096", "store:q4_0"),))
    assert done.agreement == ("3 re-run rows not appended (depth identical, tokens identical, success identical, "
                              "margin within 2e-06)")
    t = pd.read_csv(provenance.checked(table))            # the new sha256 is recorded: the reader accepts it
    assert list(t["variant"]) == ["exact"] * 4 + ["store:q4_0"] * 4
    assert list(t["trial"][4:]) == [0, 1, 2, 3] and list(t["success"][4:]) == [0, 0, 1, 1]
    meta = json.loads(table.with_suffix(".json").read_text())
    assert meta["commands"][0] == "first run" and len(meta["commands"]) == 2
    entry = meta["commands"][1]
    assert entry == done.entry and "--out <scratch>" in entry and "/scratch/" not in entry
    assert "as 2 processes at once (2026-12-06; machine: AMD EPYC, 2 CPUs (AVX2))" in entry
    assert "4 rows appended here; 39-50 s a row (median 43)" in entry and entry.endswith("a worktree at abc")
    # the same files again: every row is now a re-run, nothing is appended, the table is untouched
    before = table.read_bytes()
    again = append_rows(table, [even, odd], trials=4)
    assert (again.added, again.rerun) == (0, 7) and table.read_bytes() == before


def test_a_run_that_does_not_belong_is_refused_and_nothing_changes(tmp_path):
    table = _table(tmp_path)
    before = (table.read_bytes(), table.with_suffix(".json").read_bytes())
    part = _run(tmp_path, "part", [_row(0, "store:q8_0", 1.0), _row(2, "store:q8_0", 1.0)])
    with pytest.raises(ValueError, match=r"trials: cell \{'context': '4096', 'variant': 'store:q8_0'\} holds 2 of "
                                         r"trials 0-3 \(lacking \[1, 3\]\)"):
        append_rows(table, [part], trials=4)
    twice = _run(tmp_path, "twice", [_row(0, "store:q8_0", 1.0), _row(0, "store:q8_0", 0.9)])
    with pytest.raises(ValueError, match="appears 2 times among the new rows"):
        append_rows(table, [twice])
    other = _run(tmp_path, "other", [_row(0, "store:q8_0", 1.0)], versions={"torch": "2.12.0+cpu"})
    with pytest.raises(ValueError, match=r"versions differ from the table's: torch 2.12.0\+cpu here, 2.13.0\+cpu"):
        append_rows(table, [other])
    wrong = _run(tmp_path, "wrong", [])
    wrong.write_text("context,trial,variant\n4096,0,exact\n")
    with pytest.raises(ValueError, match=r"columns .* are not niah_multikey_1\.csv's"):
        append_rows(table, [wrong])
    bad = _run(tmp_path, "bad", [_row(0, "store:q8_0", 1.0)])
    bad.write_text(bad.read_text().replace(",1,1.0,", ",0,1.0,"))          # success 0 with a positive margin
    with pytest.raises(ValueError, match=r"'success' 0 contradicts 'margin' 1\.0"):
        append_rows(table, [bad])
    (tmp_path / "lonely.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(ValueError, match="no provenance JSON beside it"):
        append_rows(table, [tmp_path / "lonely.csv"])
    assert (table.read_bytes(), table.with_suffix(".json").read_bytes()) == before
    table.write_text(table.read_text() + "4096,9,0.5,4000,exact,1,1.0,1.0,hand\n")      # edited after it was recorded
    with pytest.raises(ValueError, match="the file changed after it was recorded"):
        append_rows(table, [bad])


def test_the_command_line_appends_or_says_what_is_wrong(tmp_path, capsys):
    table = _table(tmp_path)
    run = _run(tmp_path, "run", [_row(t, "store:fp8_e4m3", 1.0) for t in range(4)])
    assert main(["append", str(table), str(run), "--trials", "4", "--dry-run"]) == 0
    assert "would add 4 row(s) in 1 cell(s) (4096/store:fp8_e4m3)" in capsys.readouterr().out
    assert len(pd.read_csv(table)) == 4                                   # a dry run changes nothing
    assert main(["append", str(table), str(run), "--trials", "4"]) == 0
    assert "added 4 row(s)" in capsys.readouterr().out and len(pd.read_csv(table)) == 8
    assert main(["append", str(table), str(run), "--key", "context,step"]) == 2
    assert "error: key: niah_multikey_1.csv has no column(s) ['step']" in capsys.readouterr().err
    assert main(["append", str(table), str(run), "--key", ","]) == 2
    assert "--key must name at least one column" in capsys.readouterr().err


def test_a_table_recorded_with_one_command_gains_a_list_of_them(tmp_path):
    table = _table(tmp_path)
    meta = table.with_suffix(".json")
    data = json.loads(meta.read_text())
    data["command"] = data.pop("commands")[0]
    meta.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    run = _run(tmp_path, "run", [_row(t, "fa3", 1.0) for t in range(4)])
    done = append_rows(table, [run], trials=4)
    data = json.loads(meta.read_text())
    assert "command" not in data and data["commands"] == ["first run", done.entry]
    assert "machine: AMD EPYC, 2 CPUs (AVX2)): 4 rows appended here; 40-40 s a row (median 40)" in done.entry


def test_append_takes_the_key_of_the_sweep_that_publishes_the_table(tmp_path, monkeypatch):
    from kvcost.paths import repo_root
    from kvcost.sweep import spec
    llama = repo_root() / "data" / "real_model" / "gemma3_270m" / "llamacpp_windows.csv"
    assert spec.publish_key(llama) == ["context", "window", "format"]            # sweeps/gemma_llamacpp.yaml
    assert spec.publish_key(repo_root() / "data" / "real_model" / "gemma3_270m" / "niah_multikey_1.csv") == [
        "context", "trial", "variant"]
    assert spec.publish_key(tmp_path / "niah_multikey_1.csv") is None           # no sweep publishes this file
    for name, key in (("a", ["context", "window"]), ("b", ["context", "format"])):
        (tmp_path / f"{name}.yaml").write_text(
            "script: scripts/llamacpp_reference.py\ntable: t.csv\nproduct:\n  window: [0]\n"
            f"publish:\n  path: data/real_model/gemma3_270m/llamacpp_windows.csv\n  key: {key}\n")
    monkeypatch.setattr(spec, "available", lambda: sorted(tmp_path.glob("*.yaml")))
    with pytest.raises(ValueError, match="under different keys"):
        spec.publish_key(llama)
