"""The built wheel is a working ``kvcost`` command outside the checkout, with its data as package data.

The wheel is built from a copy of the tracked sources (not the shared checkout, which the build would
write into), installed with no index into a fresh virtual environment that sees nothing else, and run
from another folder: the same output as the checkout's, from the data inside the installed package,
whose sha256 digests are still checked on read.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcost import paths

ROOT = paths.repo_root()
COMMANDS = [["models"], ["size", "Llama-3.1-8B"], ["plan", "Llama-3.1-8B", "--gpu", "H100", "--context", "32k"]]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return env | {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"}


def _run(cmd: list, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"{shlex.join(map(str, cmd))} exited {proc.returncode}:\n"
                    f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def _copy_sources(dest: Path) -> None:
    """The tracked files a build reads (pyproject, README, lib/, data/), symlinks kept as links."""
    names = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "README.md", "lib", "data"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src, out = ROOT / name, dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        elif src.is_file():                       # a tracked file deleted in the working tree is skipped
            shutil.copy2(src, out)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's bin folder, a folder outside any checkout) with the built wheel installed."""
    tmp = tmp_path_factory.mktemp("package")
    _copy_sources(tmp / "src")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
          "-w", tmp / "dist", tmp / "src"], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("kvcost-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], cwd=tmp)   # this pip installs into it
    bin_ = tmp / "venv" / "bin"
    _run([sys.executable, "-m", "pip", "--python", bin_ / "python", "install", "--quiet", "--no-index", wheel],
         cwd=tmp)                                                         # no index: the wheel needs nothing else
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return bin_, elsewhere


def test_the_installed_package_is_the_wheel_with_its_data_and_no_dependencies(installed):
    bin_, elsewhere = installed
    venv = bin_.parent.resolve()
    info = json.loads(_run([bin_ / "python", "-c",
                            "import json, kvcost, kvcost.paths as p; from importlib import metadata as m; "
                            "print(json.dumps({'file': kvcost.__file__, 'data': str(p.data_dir()), "
                            "'checkout': str(p.checkout()), 'requires': m.requires('kvcost') or [], "
                            "'dists': sorted(d.metadata['Name'] for d in m.distributions())}))"],
                           cwd=elsewhere).stdout)
    assert Path(info["file"]).resolve().is_relative_to(venv), info["file"]       # not the checkout's lib/
    assert Path(info["data"]).is_relative_to(venv) and Path(info["data"]).name == "data"
    assert info["checkout"] == "None"
    assert all("extra ==" in r for r in info["requires"]), info["requires"]      # every dependency is an extra
    assert {"numpy", "pandas", "numba", "dask", "papermill"}.isdisjoint(info["dists"])
    shipped = {p.relative_to(Path(info["data"])).as_posix() for p in Path(info["data"]).rglob("*") if p.is_file()}
    tracked = set(filter(None, subprocess.run(["git", "ls-files", "-z", "data"], cwd=ROOT, capture_output=True,
                                              check=True).stdout.decode().split("\0")))
    assert {t.removeprefix("data/") for t in tracked if (ROOT / t).is_file()} <= shipped


def test_the_installed_cli_prints_what_the_checkout_prints(installed):
    bin_, elsewhere = installed
    out = {}
    for args in COMMANDS:
        got = _run([bin_ / "kvcost", *args], cwd=elsewhere).stdout
        assert got == _run([sys.executable, "-m", "kvcost", *args], cwd=ROOT).stdout, args
        out[args[0]] = got
    names = [line.split()[0] for line in out["models"].splitlines()]
    assert {"Llama-3.1-8B", "Qwen3-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Llama-2-7B"} <= set(names)
    assert len(names) >= 20
    assert "cache at 131,072 tokens     16.000 GiB" in out["size"]              # 32 layers x 8 heads x 128 x 2 x 2 B
    rows = {line.split()[0]: line.split() for line in out["plan"].splitlines() if line[:1].isalnum()}
    assert rows["bf16"][4] == "13" and rows["fp8_e4m3"][4] == "27"             # requests at 32k (README table)
    assert "weights 14.96 GiB" in out["plan"]                                    # data/models: its cited count
    assert "needle 200/200" in out["plan"] and "passkey 5/20" in out["plan"]     # data/plan_needle, data/real_model


def test_the_installed_data_are_still_sha256_checked(installed):
    bin_, elsewhere = installed
    data = Path(_run([bin_ / "python", "-c", "import kvcost.paths as p; print(p.data_dir())"], cwd=elsewhere)
                .stdout.strip())
    gpus = data / "gpus.csv"
    gpus.write_bytes(gpus.read_bytes() + b"\n")
    proc = _run([bin_ / "kvcost", "gpus"], cwd=elsewhere, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: data/gpus.csv: sha256 ") and "data/provenance.json" in line, line


def test_a_checkout_finds_its_data_the_same_way():
    assert paths.checkout() == ROOT and (ROOT / "pyproject.toml").is_file()
    assert paths.data_dir() == (ROOT / "lib" / "kvcost" / "data").resolve() == (ROOT / "data").resolve()
    assert paths.data_path("models", "qwen3-8b.json").is_file()
    # a parameter's path relative to the repository: data/… is the package data, the rest the checkout
    assert paths.repo_path("data/real_kv/minilm_l6_kv.npz") == paths.data_path("real_kv", "minilm_l6_kv.npz")
    assert paths.repo_path("results/x") == ROOT / "results" / "x"
    assert paths.repo_path(Path("/elsewhere/x")) == Path("/elsewhere/x")


def test_the_makefiles_inline_python_imports_names_that_exist():
    """A ``$(PY) -c "…"`` line runs only in its optional target (``make real-model``): its imports are checked here,
    where CI sees them (a module moved in a refactor once broke that target after it had installed the wheels)."""
    import ast
    import importlib
    import importlib.util

    snippets = [line.split('-c "', 1)[1].rsplit('"', 1)[0]
                for line in (ROOT / "Makefile").read_text().splitlines() if "$(PY) -c \"" in line]
    assert snippets, "the Makefile has no inline python to check"
    for code in snippets:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)
                           and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
                assert not missing, f"Makefile: {code!r} imports {missing} from {node.module}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    importlib.import_module(a.name)
