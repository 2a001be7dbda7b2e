"""``python -m kvcost.run NB [-p NAME VALUE ...] [-y YAML] [--out DIR]`` (``make run``).

Runs one notebook with other parameters and creates what it needs. ``NB`` is a notebook's
number (``03``), stem (``03_needle_cliff``) or path. Values are YAML: ``-p margin 1.0``,
``-p bits '[8, 3]'``, ``-p include_special false``. ``-y`` takes a YAML file (or a YAML
mapping as text) of parameters; ``-p`` wins over it. Every parameter is checked against
the notebook's schema before the run starts. Tables, figures, the executed notebook,
``run.log`` and ``run.json`` go to ``--out`` (default ``results/runs/<stem>/<name=value>``):
a new or empty folder, or one holding an earlier run (its ``run.json``), never inside the
repository's own folders (``data/``, ``notebooks/``, ``figures/`` …); one run at a time per folder.
Values are read as papermill reads them (``017`` is 17, ``2001-01-01`` is text); a key given twice
is refused. Bad input: one ``error:`` line, exit 2.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcost.params import shorten
from kvcost.paths import repo_root
from kvcost.runner import (
    LOG_FILE,
    check_out,
    check_params,
    clean_leftovers,
    default_out,
    folder_lock,
    load_yaml,
    notebook_path,
    parse_value,
    run_in_child,
    terminate_children,
)

__all__ = ["main", "parse_args"]


def _load_yaml(text: str) -> dict[str, Any]:
    """``-y``: a YAML file, or a YAML mapping given as text."""
    path = Path(text)
    shown = shorten(text)
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError):          # far too long for a file name: YAML text
        is_file = is_dir = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"-y {shown}: cannot read the file: {type(err).__name__}: {err}") from None
    elif path.suffix in (".yaml", ".yml", ".json") or is_dir or ("\n" not in text and "/" in text
                                                                           and ":" not in text):
        raise ValueError(f"-y {shown}: no such file (give a YAML file, or a mapping as text: -y '{{margin: 1.0}}')")
    data = load_yaml(text, f"-y {shown}")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"-y {shown} must be a YAML mapping of parameter names to values, e.g. -y '{{margin: 1.0}}'")
    return data


def parse_args(argv: Sequence[str] | None = None) -> tuple[Path, dict[str, Any], Path, str]:
    """Parse and check the command line: (notebook, parameters, out folder, kernel).
    Raises ValueError naming a bad notebook, parameter or value before anything runs."""
    parser = argparse.ArgumentParser(prog="python -m kvcost.run", description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m kvcost.run 03 -p margin 1.0 -p bit_pairs '[[4, 4]]'")
    parser.add_argument("notebook", help="number (03), stem (03_needle_cliff) or path of a notebook")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a parameter; VALUE is YAML, so lists work: -p bits '[8, 3]'")
    parser.add_argument("-y", "--yaml", action="append", default=[], metavar="YAML",
                        help="a YAML file (or YAML text) of parameters")
    parser.add_argument("--out", help="folder for the run's files (default results/runs/<stem>/<name=value>)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel (default python3)")
    args = parser.parse_args(argv)
    nb = notebook_path(args.notebook)
    params: dict[str, Any] = {}
    for text in args.yaml:
        params.update(_load_yaml(text))
    given: set[str] = set()
    for name, value in args.parameter:
        if name in given:
            raise ValueError(f"-p {shorten(name)} is given twice; give each parameter once")
        given.add(name)
        try:
            params[name] = parse_value(value)
        except ValueError as err:
            raise ValueError(f"-p {shorten(name)}: {err} (lists are written [8, 3], text 'like this')") from None
    check_params(nb.stem, params)
    out = check_out(args.out if args.out else default_out(nb.stem, params))
    return nb, params, out, args.kernel


def main(argv: Sequence[str] | None = None) -> int:
    try:
        nb, params, out, kernel = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    shown = " ".join(f"{k}={v}" for k, v in params.items()) or "default parameters"
    where = out.relative_to(repo_root()) if out.is_relative_to(repo_root()) else out
    try:
        with folder_lock(out, "python -m kvcost.run"):
            clean_leftovers(out)
            print(f"{nb.stem} ({shown}) -> {where}/  (log: {where}/{LOG_FILE})", flush=True)
            result = run_in_child(nb, params, out, kernel=kernel)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        terminate_children()
        print(f"interrupted: {nb.stem} did not finish and wrote no table; run the same command again",
              file=sys.stderr)
        return 130
    if result.status != "finished":
        print(f"failed after {result.seconds:g} s: {result.error}\n  see {where}/{LOG_FILE}", file=sys.stderr)
        return 1
    print(f"finished in {result.seconds:g} s, peak memory {result.peak_memory_mib:g} MiB: "
          f"{', '.join(result.files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
