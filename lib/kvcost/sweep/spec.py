"""A sweep as data: a YAML file naming a notebook (or a script), fixed parameters and a grid.

    notebook: 01_sizing            # number, stem or path
    description: the post's sizing table at five context lengths
    params: {budget_gib: 24.0}     # the same in every run
    product: {context: [8192, 131072]}   # every combination of these lists ...
    zip: {seed: [7, 8], trials: [10, 20]}  # ... times these lists advanced together
    seconds_per_run: 20            # optional: the estimate `list` shows before a run was measured

A sweep may run a **script** instead of a notebook, for grids whose runs need what a notebook
kernel should not hold (the real decoder's torch model, llama.cpp):

    script: scripts/real_model_ppl.py   # relative to this file or to the repository root
    table: ppl_windows.csv              # the CSV the script writes at --out (default <script>.csv)
    params: {context: 2048}             # each parameter becomes a flag: context -> --context 2048,
    product: {window: [0, 1, 2, 3]}     # a list -> several values, true -> the bare flag

Optionally ``publish: {path: data/real_model/passkey.csv, key: [context, trial, variant]}``
names the committed file the finished rows go into (``python -m kvcost.sweep publish``; rows whose
key is there already are kept as they are).

A script must live in the repository's ``scripts/`` folder; one elsewhere runs only when the
command line names it (``--script PATH``: ``load(..., scripts=[PATH])``). Listing a sweep or its
status never imports its script (``load(..., check_scripts=False)``).

The script must define ``parse_args(argv)`` (argparse: it exits with a message on a bad flag),
which the sweep calls on every run's flags before anything runs, and write its rows to the CSV
named by ``--out`` (and any provenance beside it). The README's Sweeps section shows both kinds.

Runs are numbered in grid order: the product's last key varies fastest, the zip innermost.
Every run's parameters are checked against the notebook's schema (a script's parser) when the
sweep loads. A sweep has at most :data:`MAX_RUNS` runs; YAML is read as ``python -m kvcost.run``
reads it (no aliases, no key given twice, ``017`` is 17).
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcost.params import clip, shorten
from kvcost.paths import repo_root
from kvcost.runner import check_params, load_yaml, notebook_path, run_key, script_argv, source_hash

__all__ = ["MAX_RUNS", "Run", "Sweep", "available", "describe", "expand", "load", "publish_key", "script_hash",
           "kvcost_imports", "sweeps_dir"]

#: The most runs one sweep may have (checked before the grid is built).
MAX_RUNS = 100_000

_KEYS = {"notebook", "script", "table", "description", "params", "product", "zip", "seconds_per_run", "publish"}


@dataclass(frozen=True)
class Run:
    """One point of a sweep: its number in grid order, all its parameters, its key."""

    index: int
    params: dict[str, Any]
    key: str


@dataclass
class Sweep:
    name: str
    path: Path
    nb: Path                           # the notebook file, or the script (a .py file)
    description: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    product: dict[str, list[Any]] = field(default_factory=dict)
    zip: dict[str, list[Any]] = field(default_factory=dict)
    seconds_per_run: float | None = None
    runs: list[Run] = field(default_factory=list)
    table: str = ""                    # a script's CSV (scripts only)
    publish: Path | None = None        # the committed CSV its rows go into (``publish``)
    publish_key: list[str] = field(default_factory=list)   # the columns that identify a row there

    @property
    def stem(self) -> str:
        return self.nb.stem

    @property
    def kind(self) -> str:
        """``notebook`` or ``script``."""
        return "script" if self.nb.suffix == ".py" else "notebook"

    @property
    def target(self) -> str:
        """What each run executes, as shown: the notebook's stem or the script's file name."""
        return self.nb.name if self.kind == "script" else self.stem

    @property
    def grid_names(self) -> list[str]:
        """The parameters that vary from run to run (the combined tables' ``param_`` columns)."""
        return list(self.product) + list(self.zip)

    def default_out(self) -> Path:
        return repo_root() / "results" / "sweeps" / self.name


def sweeps_dir() -> Path:
    return repo_root() / "sweeps"


def available() -> list[Path]:
    """The predefined sweeps (``sweeps/*.yaml``), by name."""
    return sorted(sweeps_dir().glob("*.yaml"))


def publish_key(table: str | Path) -> list[str] | None:
    """The key columns of the predefined sweep that publishes ``table`` (its ``publish: path``), None where no
    sweep does; ValueError where two sweeps publish it under different keys."""
    target = Path(table).resolve()
    keys = {tuple(s.publish_key) for s in (load(p, check_scripts=False) for p in available())
            if s.publish is not None and s.publish.resolve() == target}
    if len(keys) > 1:
        raise ValueError(f"table: sweeps publish {Path(table).name} under different keys {sorted(keys)}; "
                         "name one with --key")
    return list(keys.pop()) if keys else None


def describe(params: Mapping[str, Any], names: list[str] | None = None) -> str:
    """``name=value`` text for a run's (grid) parameters."""
    keys = names if names is not None else list(params)
    text = " ".join(f"{k}={json.dumps(params[k], default=str)}" for k in keys if k in params)
    return clip(text, 200) or "(fixed parameters only)"


def _mapping(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where}: '{key}' must be a mapping of parameter names to values")
    return value


def expand(fixed: Mapping[str, Any], product: Mapping[str, list[Any]], zipped: Mapping[str, list[Any]],
           where: str = "sweep") -> list[dict[str, Any]]:
    """Every run's parameters: the product's combinations times the zip's rows, plus ``fixed``."""
    for section, grid in (("product", product), ("zip", zipped)):
        for name, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{where}: {section} '{name}' must be a non-empty list of values, "
                                 f"got {shorten(values)}")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise ValueError(f"{where}: the zip lists must have the same length, got "
                         f"{shorten({k: len(v) for k, v in zipped.items()}, 200)}")
    count = math.prod(len(v) for v in product.values()) * (lengths.pop() if lengths else 1)
    if count > MAX_RUNS:
        raise ValueError(f"{where}: the grid has {count:,} runs; a sweep may have at most {MAX_RUNS:,} "
                         f"(split it into several sweeps)")
    seen: dict[str, str] = {}
    for section, names in (("params", fixed), ("product", product), ("zip", zipped)):
        for name in names:
            if name in seen:
                raise ValueError(f"{where}: parameter '{name}' is in both '{seen[name]}' and '{section}'")
            seen[name] = section
    rows = [dict(zip(zipped, row)) for row in zip(*zipped.values())] if zipped else [{}]
    combos = [dict(zip(product, combo)) for combo in itertools.product(*product.values())]
    return [{**fixed, **combo, **row} for combo in combos for row in rows]


def load(name_or_path: str | Path, *, scripts: Iterable[str | Path] = (), check_scripts: bool = True) -> Sweep:
    """Load and check a sweep: a name in ``sweeps/`` or a path to a YAML file.

    Raises ValueError naming the file, and for a bad value the run and the parameter,
    before anything runs. A script sweep's script must be in the repository's ``scripts/`` or be
    one of ``scripts`` (paths the user named); its ``parse_args`` checks every run's flags, which
    imports the script, unless ``check_scripts`` is False (``list``, ``status``, ``publish``: then the
    script is neither imported nor required to be in ``scripts/``).
    """
    text = str(name_or_path)
    path = Path(text)
    if not _is_file(path):
        path = sweeps_dir() / f"{text.removesuffix('.yaml')}.yaml"
        if not _is_file(path):
            names = [p.stem for p in available()]
            raise ValueError(f"unknown sweep {shorten(text)}: not a file, and not one of {names}")
    where = f"sweep {path.stem!r} ({path})"
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: cannot read the file: {type(err).__name__}") from None
    data = load_yaml(source, where)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a YAML mapping with at least 'notebook'")
    unknown = sorted(set(data) - _KEYS, key=str)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {shorten(unknown)}; a sweep has 'notebook' or 'script' and "
                         f"optionally {sorted(_KEYS - {'notebook', 'script'})}")
    if ("notebook" in data) == ("script" in data):
        raise ValueError(f"{where}: name exactly one of 'notebook' or 'script'")
    if "script" in data:
        nb = _script_path(data["script"], path, where, scripts if check_scripts else None)
        table = data.get("table") or f"{nb.stem}.csv"
        if not isinstance(table, str) or Path(table).name != table or not table.endswith(".csv"):
            raise ValueError(f"{where}: 'table' must be a CSV file name (no folder), got {shorten(table)}")
    else:
        if "table" in data:
            raise ValueError(f"{where}: 'table' is for scripts; a notebook names its tables itself")
        name = data["notebook"]    # YAML reads `notebook: 04` as the number 4
        nb = Path(f"{name:02d}" if isinstance(name, int) and not isinstance(name, bool) else str(name))
        nb = notebook_path(path.parent / nb if (path.parent / nb).is_file() else nb)   # relative to the file
        table = ""
    seconds = data.get("seconds_per_run")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise ValueError(f"{where}: 'seconds_per_run' must be a positive number, got {shorten(seconds)}")
    sweep = Sweep(path.stem, path.resolve(), nb, str(data.get("description") or ""),
                  _mapping(data, "params", where), _mapping(data, "product", where), _mapping(data, "zip", where),
                  seconds, table=table)
    if "publish" in data:
        sweep.publish, sweep.publish_key = _publish(data["publish"], sweep, where)
    if sweep.kind == "script":
        nb_hash = script_hash(nb)
        check = _script_checker(nb, where) if check_scripts else lambda params: None
    else:
        nb_hash = source_hash(nb)
        check = lambda params: check_params(sweep.stem, params)
    first: dict[str, int] = {}          # key -> the first run with it: the repeat check is linear
    for i, params in enumerate(expand(sweep.fixed, sweep.product, sweep.zip, where)):
        try:
            check(params)
        except ValueError as err:
            raise ValueError(f"{where}, run {i} ({describe(params, sweep.grid_names)}): {err}") from None
        key = run_key(nb_hash, params)
        if key in first:
            raise ValueError(f"{where}: run {i} ({describe(params, sweep.grid_names)}) repeats run {first[key]}")
        first[key] = i
        sweep.runs.append(Run(i, params, key))
    return sweep


def script_hash(script: Path) -> str:
    """SHA-256 of a sweep's script and of every kvcost module it imports, directly or through another kvcost
    module (the ``kvcost.runs`` job, the experiment and the primitives it calls), each file once in module-name
    order: ``scripts/`` are thin entry points, so a change to what a run computes is a change to one of those
    modules, and must change the run's key (a finished run is redone) as a change to the script does."""
    h = hashlib.sha256(script.read_bytes())
    for origin in kvcost_imports(script):
        h.update(origin.read_bytes())
    return h.hexdigest()


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def kvcost_imports(source: Path) -> list[Path]:
    """The files of the kvcost modules ``source`` imports, and those they import in turn (``import kvcost.x``,
    ``from kvcost.x import y``, ``from kvcost import x`` where ``x`` is a module; an import inside a function
    counts), in module-name order. A ``kvcost.runs`` job a script names that does not exist is a ValueError."""
    seen: dict[str, Path] = {}
    todo = [source]
    while todo:
        tree = ast.parse(todo.pop().read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] != "kvcost" or name in seen:
                    continue
                try:
                    origin = _module_file(name)
                except (ImportError, ValueError):              # a name imported from a module, not a module
                    origin = None
                if origin is None:
                    if name.startswith("kvcost.runs.") and name.count(".") == 2 and isinstance(node, ast.ImportFrom) \
                            and name == node.module:
                        raise ValueError(f"script {source.name} imports {name}, which is not a module of this kvcost")
                    continue
                seen[name] = origin
                todo.append(origin)
    return [seen[n] for n in sorted(seen)]


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):     # a name too long for the system, a NUL byte: not a file
        return False


def _script_path(value: Any, sweep_file: Path, where: str, allowed: Iterable[str | Path] | None = ()) -> Path:
    """A sweep's script: relative to the sweep file, else to the repository root; it must be in the
    repository's ``scripts/`` or be one of ``allowed`` (what the user named on the command line), unless
    ``allowed`` is None (the script is not going to be imported or run)."""
    if not isinstance(value, str) or not value.endswith(".py"):
        raise ValueError(f"{where}: 'script' must be the path of a Python file, got {shorten(value)}")
    for base in (sweep_file.parent, repo_root()):
        candidate = base / value
        if candidate.is_file():
            script = candidate.resolve()
            break
    else:
        raise ValueError(f"{where}: script {shorten(value)} not found next to the sweep file or in the repository")
    if allowed is None:
        return script
    trusted = {Path(a).expanduser().resolve() for a in allowed}
    if script.is_relative_to((repo_root() / "scripts").resolve()) or script in trusted:
        return script
    raise ValueError(f"{where}: script {shorten(value)} is {script}, outside the repository's scripts/; a sweep "
                     f"runs a script from elsewhere only when the command line names it (--script {script})")


def _script_checker(script: Path, where: str) -> Any:
    """``check(params)``: the script's own ``parse_args`` on the run's flags (ValueError with its message)."""
    name = "kvcost_sweep_script_" + hashlib.sha256(str(script).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(module)
    except SystemExit as err:          # a script that exits when imported: one line, not the CLI's exit code
        raise ValueError(f"{where}: script {script.name} exited (code {shorten(err.code)}) when imported to check "
                         f"its flags; its top level must only define things (main under __name__ == '__main__')"
                         ) from None
    except Exception as err:
        raise ValueError(f"{where}: script {script.name} does not import: {type(err).__name__}: "
                         f"{shorten(str(err), 200)}") from None
    parse = getattr(module, "parse_args", None)
    if not callable(parse):
        raise ValueError(f"{where}: script {script.name} defines no parse_args(argv) to check the runs' flags with")

    def check(params: dict[str, Any]) -> None:
        if "out" in params:
            raise ValueError("parameter 'out' is chosen by the runner (use --out)")
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                parse([*script_argv(params), "--out", "run.csv"])
        except SystemExit:
            lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
            raise ValueError(clip(lines[-1], 300) if lines else "the script's parse_args refused the flags"
                             ) from None
        except Exception as err:       # a parse_args that raises instead of exiting
            raise ValueError(f"the script's parse_args raised {type(err).__name__}: {shorten(str(err), 200)}"
                             ) from None

    return check


def _publish(value: Any, sweep: Sweep, where: str) -> tuple[Path, list[str]]:
    """A script sweep's ``publish: {path, key}``: the repository CSV and its key columns."""
    if sweep.kind != "script":
        raise ValueError(f"{where}: 'publish' is for script sweeps (a notebook writes its own tables)")
    if not isinstance(value, dict) or set(value) != {"path", "key"}:
        raise ValueError(f"{where}: 'publish' must be a mapping with 'path' (a CSV in the repository) and 'key' "
                         f"(the columns that identify a row), got {shorten(value)}")
    key = value["key"]
    if not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key):
        raise ValueError(f"{where}: publish 'key' must be a non-empty list of column names, got {shorten(key)}")
    path = Path(str(value["path"]))
    if (path.is_absolute() or path.suffix != ".csv" or ".." in path.parts
            or not (repo_root() / path).resolve().is_relative_to(repo_root().resolve())):
        raise ValueError(f"{where}: publish 'path' must be a CSV path inside the repository, "
                         f"got {shorten(value['path'])}")
    return repo_root() / path, key
