"""A sweep as data: a YAML file naming a notebook, fixed parameters and a grid.

    notebook: 01_sizing            # number, stem or path
    description: the post's sizing table at five context lengths
    params: {budget_gib: 24.0}     # the same in every run
    product: {context: [8192, 131072]}   # every combination of these lists ...
    zip: {seed: [7, 8], trials: [10, 20]}  # ... times these lists advanced together
    seconds_per_run: 20            # optional: the estimate `list` shows before a run was measured

Runs are numbered in grid order: the product's last key varies fastest, the zip innermost.
Every run's parameters are checked against the notebook's schema when the sweep loads.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..output import repo_root
from ..runner import check_params, notebook_path, run_key, source_hash

__all__ = ["Run", "Sweep", "available", "describe", "expand", "load", "sweeps_dir"]

_KEYS = {"notebook", "description", "params", "product", "zip", "seconds_per_run"}


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
    nb: Path                           # the notebook file
    description: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    product: dict[str, list[Any]] = field(default_factory=dict)
    zip: dict[str, list[Any]] = field(default_factory=dict)
    seconds_per_run: float | None = None
    runs: list[Run] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return self.nb.stem

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


def describe(params: Mapping[str, Any], names: list[str] | None = None) -> str:
    """``name=value`` text for a run's (grid) parameters."""
    keys = names if names is not None else list(params)
    return " ".join(f"{k}={json.dumps(params[k])}" for k in keys if k in params) or "(fixed parameters only)"


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
                raise ValueError(f"{where}: {section} '{name}' must be a non-empty list of values, got {values!r}")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise ValueError(f"{where}: the zip lists must have the same length, got "
                         f"{ {k: len(v) for k, v in zipped.items()} }")
    seen: dict[str, str] = {}
    for section, names in (("params", fixed), ("product", product), ("zip", zipped)):
        for name in names:
            if name in seen:
                raise ValueError(f"{where}: parameter '{name}' is in both '{seen[name]}' and '{section}'")
            seen[name] = section
    rows = [dict(zip(zipped, row)) for row in zip(*zipped.values())] if zipped else [{}]
    combos = [dict(zip(product, combo)) for combo in itertools.product(*product.values())]
    return [{**fixed, **combo, **row} for combo in combos for row in rows]


def load(name_or_path: str | Path) -> Sweep:
    """Load and check a sweep: a name in ``sweeps/`` or a path to a YAML file.

    Raises ValueError naming the file, and for a bad value the run and the parameter,
    before anything runs.
    """
    text = str(name_or_path)
    path = Path(text)
    if not path.is_file():
        path = sweeps_dir() / f"{text.removesuffix('.yaml')}.yaml"
        if not path.is_file():
            names = [p.stem for p in available()]
            raise ValueError(f"unknown sweep {text!r}: not a file, and not one of {names}")
    where = f"sweep {path.stem!r} ({path})"
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{where}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a YAML mapping with at least 'notebook'")
    unknown = sorted(set(data) - _KEYS)
    if unknown or "notebook" not in data:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a sweep has 'notebook' and optionally "
                         f"{sorted(_KEYS - {'notebook'})}" if unknown else f"{where}: 'notebook' is missing")
    name = data["notebook"]    # YAML reads `notebook: 04` as the number 4
    nb = Path(f"{name:02d}" if isinstance(name, int) and not isinstance(name, bool) else str(name))
    nb = notebook_path(path.parent / nb if (path.parent / nb).is_file() else nb)   # a path may be relative to the file
    seconds = data.get("seconds_per_run")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise ValueError(f"{where}: 'seconds_per_run' must be a positive number, got {seconds!r}")
    sweep = Sweep(path.stem, path.resolve(), nb, str(data.get("description") or ""),
                  _mapping(data, "params", where), _mapping(data, "product", where), _mapping(data, "zip", where),
                  seconds)
    nb_hash = source_hash(nb)
    for i, params in enumerate(expand(sweep.fixed, sweep.product, sweep.zip, where)):
        try:
            check_params(sweep.stem, params)
        except ValueError as err:
            raise ValueError(f"{where}, run {i} ({describe(params, sweep.grid_names)}): {err}") from None
        key = run_key(nb_hash, params)
        same = [run.index for run in sweep.runs if run.key == key]
        if same:
            raise ValueError(f"{where}: run {i} ({describe(params, sweep.grid_names)}) repeats run {same[0]}")
        sweep.runs.append(Run(i, params, key))
    return sweep
