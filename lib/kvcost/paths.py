"""Where things are: the package data (``data/``) and the repository checkout, when there is one.

The data ship inside the package as ``kvcost/data``, and are found through ``importlib.resources``
however kvcost was installed: in a checkout ``lib/kvcost/data`` is a symlink to the repository's
``data/`` (what the editable install of ``make setup`` reads), and building a wheel (``pip install .``)
copies the files it points to into the package (``[tool.setuptools.package-data]`` in pyproject.toml).
The same files, with the sha256 digests recorded beside them (:mod:`kvcost.provenance`), either way.

The repository root is where results, figures, notebooks, sweeps and scripts live: the checkout
holding this package, or the current directory for an installed package (no checkout to write into).
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["data_dir", "data_path", "checkout", "repo_root", "repo_path"]


def _package() -> Path:
    return Path(str(files("kvcost")))


def data_dir() -> Path:
    """The package data folder, resolved: the checkout's ``data/`` (through ``lib/kvcost/data``) or the
    installed package's ``kvcost/data``."""
    folder = _package() / "data"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"kvcost's data folder {folder} is missing: a checkout needs lib/kvcost/data, the symlink to the "
            "repository's data/ (git clone with symlinks enabled: git config core.symlinks true), and a built "
            "package carries it as kvcost/data")
    return folder.resolve()


def data_path(*parts: str) -> Path:
    """A path in the package data: ``data_path("models", "Qwen3-8B.json")``."""
    return data_dir().joinpath(*parts)


def checkout() -> Path | None:
    """The repository checkout this package is imported from (the folder holding ``pyproject.toml`` and
    ``lib/kvcost``), or None for an installed package."""
    root = _package().resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "lib" / "kvcost").is_dir():
        return root
    return None


def repo_root() -> Path:
    """The repository root: the checkout, or the current directory outside one (an installed package)."""
    return checkout() or Path.cwd()


def repo_path(path: str | Path) -> Path:
    """A path as parameters give it, relative to the repository: ``data/…`` names the package data (the
    checkout's ``data/`` there, the installed copy elsewhere), another relative path lies under
    :func:`repo_root`, an absolute path is itself."""
    p = Path(path)
    if p.is_absolute():
        return p
    if p.parts[:1] == ("data",):
        return data_dir().joinpath(*p.parts[1:])
    return repo_root() / p
