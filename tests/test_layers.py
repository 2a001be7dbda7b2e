"""The layer contract in pyproject.toml places every kvcost module, and the docs are current."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lib" / "kvcost"


def _layers() -> list[list[str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def _top_modules() -> set[str]:
    mods = {f"kvcost.{p.stem}" for p in PKG.glob("*.py") if p.stem != "__init__"}
    mods |= {f"kvcost.{p.parent.name}" for p in PKG.glob("*/__init__.py")}
    return mods


def test_every_module_is_in_exactly_one_layer():
    placed = [m for layer in _layers() for m in layer]
    assert sorted(placed) == sorted(set(placed)), "a module is listed twice"
    assert set(placed) == _top_modules()


def test_no_function_local_imports_of_kvcost():
    offenders = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    ours = (isinstance(node, ast.ImportFrom)
                            and (node.level > 0 or (node.module or "").startswith("kvcost"))) or (
                        isinstance(node, ast.Import) and any(a.name.startswith("kvcost") for a in node.names))
                    if ours:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_notebook_docs_are_generated_from_the_schemas():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
