"""Parameter validation: the checks, and the schema each notebook declares its parameters in.

Every check raises ``ValueError`` naming the parameter and what is allowed, so a papermill
run with a bad parameter stops in its first code cell with a clear message instead of
producing a silent wrong number. A :class:`Schema` lists one notebook's parameters (name,
default, the post's value, range); the notebook, the runner and sweeps all validate with it.
"""
from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvcost.output import FIGURE_DIR, FIGURE_DIR_ENV, resolve_out_dir
from kvcost.paths import repo_root

__all__ = [
    "check_int", "check_float", "check_choice", "check_int_list", "check_pairs", "check_str_list",
    "Int", "Float", "Bool", "Str", "PathStr", "IntList", "FloatList", "StrList", "Pairs", "Custom",
    "Schema", "Params", "clip", "shorten",
]

#: The longest value an error message quotes in full (a 500 MB value must not make a 500 MB message).
SHORT = 80


def shorten(value: Any, limit: int = SHORT) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters with the length said."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<a {type(value).__name__} nested too deeply>"
    return clip(text, limit)


def clip(text: str, limit: int = SHORT) -> str:
    """``text`` for a message, cut to about ``limit`` characters with its length said."""
    if len(text) <= limit:
        return text
    return f"{text[:max(limit - 24, 8)]}… ({len(text):,} characters)"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _range_text(lo: float | None, hi: float | None) -> str:
    """The allowed range for a message, with its leading space ("" when any value is allowed)."""
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ValueError naming ``name`` and the allowed range."""
    if not _is_int(value):
        raise ValueError(f"parameter {name!r} must be an integer{_range_text(lo, hi)}, got {shorten(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"parameter {name!r} must be an integer{_range_text(lo, hi)}, got {shorten(value)}")
    return int(value)


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> float:
    """Return ``value`` as a finite float in range (``lo`` excluded when ``lo_open``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = v == v and abs(v) != float("inf")
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v <= hi
    if not ok:
        rng = f" > {lo}" if (lo_open and hi is None) else _range_text(lo, hi)
        raise ValueError(f"parameter {name!r} must be a finite number{rng}, got {shorten(value)}")
    return float(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"parameter {name!r} must be one of {choices}, got {shorten(value)}")
    return value


def check_int_list(name: str, value: Any, lo: int | None = None, hi: int | None = None,
                   min_len: int = 1) -> list[int]:
    """Return ``value`` as a list of ints, each within range; a list or tuple is required."""
    if not isinstance(value, (list, tuple)) or len(value) < min_len:
        raise ValueError(f"parameter {name!r} must be a list of at least {min_len} integer(s)"
                         f"{_range_text(lo, hi)}, got {shorten(value)}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(check_int(f"{name}[{i}]", item, lo, hi))
        except ValueError as err:
            raise ValueError(f"parameter {name!r}: {err}") from None
    return out


def check_str_list(name: str, value: Any, allowed: Sequence[str] | None = None,
                   min_len: int = 1) -> list[str]:
    """Return ``value`` as a list of strings, each in ``allowed`` when given."""
    if not isinstance(value, (list, tuple)) or len(value) < min_len or not all(isinstance(v, str) for v in value):
        raise ValueError(f"parameter {name!r} must be a list of at least {min_len} string(s), got {shorten(value)}")
    if allowed is not None:
        unknown = [v for v in value if v not in allowed]
        if unknown:
            raise ValueError(f"parameter {name!r}: unknown {shorten(unknown)}; allowed: {list(allowed)}")
    return list(value)


def check_pairs(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> list[tuple[int, int]]:
    """Return ``value`` (a list of 2-item lists of ints) as a list of int pairs."""
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise ValueError(f"parameter {name!r} must be a non-empty list of [k, v] integer pairs"
                         f"{_range_text(lo, hi)}, e.g. [[8, 8], [4, 4]]; got {shorten(value)}")
    return [(check_int(f"{name}[{i}][0]", k, lo, hi), check_int(f"{name}[{i}][1]", v, lo, hi))
            for i, (k, v) in enumerate(value)]


# ---------------------------------------------------------------------------------------------
# Schemas: each notebook's parameters declared once (kvcost.notebook_params), checked the same
# way by the notebook's first cell, the command line and sweeps.
# ---------------------------------------------------------------------------------------------

_MISSING = object()


class _Param:
    """One parameter: its name, default, the value the post used (if any) and a checker."""

    kind = "value"

    def __init__(self, name: str, default: Any, *, post: Any = _MISSING, doc: str = "") -> None:
        self.name, self.default, self.post, self.doc = name, default, post, doc

    def check(self, value: Any) -> Any:   # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def used_by_post(self) -> bool:
        return self.post is not _MISSING

    def allowed(self) -> str:
        return self.kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.default!r})"


def _open_range_text(lo: float | None, hi: float | None, lo_open: bool) -> str:
    if lo is None and hi is None:
        return ""
    if lo_open and lo is not None:
        return f" > {lo}" + (f" and <= {hi}" if hi is not None else "")
    return _range_text(lo, hi)


def _choices(choices: Any) -> list[Any] | None:
    if choices is None:
        return None
    return list(choices() if callable(choices) else choices)


class Int(_Param):
    def __init__(self, name: str, default: int, lo: int | None = None, hi: int | None = None, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.lo, self.hi = lo, hi

    def check(self, value: Any) -> int:
        return check_int(self.name, value, self.lo, self.hi)

    def allowed(self) -> str:
        return f"integer{_range_text(self.lo, self.hi)}"


class Float(_Param):
    def __init__(self, name: str, default: float, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def check(self, value: Any) -> float:
        return check_float(self.name, value, self.lo, self.hi, lo_open=self.lo_open)

    def allowed(self) -> str:
        return f"number{_open_range_text(self.lo, self.hi, self.lo_open)}".rstrip()


class Bool(_Param):
    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"parameter {self.name!r} must be True or False, got {shorten(value)}")
        return value

    def allowed(self) -> str:
        return "True or False"


class Str(_Param):
    def __init__(self, name: str, default: str, choices: Any = None, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.choices = choices

    def check(self, value: Any) -> str:
        allowed = _choices(self.choices)
        if allowed is not None:
            return check_choice(self.name, value, allowed)
        if not isinstance(value, str):
            raise ValueError(f"parameter {self.name!r} must be a string, got {shorten(value)}")
        return value

    def allowed(self) -> str:
        allowed = _choices(self.choices)
        return f"one of {allowed}" if allowed is not None else "string"


class PathStr(Str):
    """A path as a string ('' for the parameter's own default location)."""

    def allowed(self) -> str:
        return "path string"


class IntList(_Param):
    def __init__(self, name: str, default: list[int], lo: int | None = None, hi: int | None = None, *,
                 min_len: int = 1, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.lo, self.hi, self.min_len = lo, hi, min_len

    def check(self, value: Any) -> list[int]:
        return check_int_list(self.name, value, self.lo, self.hi, min_len=self.min_len)

    def allowed(self) -> str:
        return f"list of integers{_range_text(self.lo, self.hi)}"


class FloatList(_Param):
    def __init__(self, name: str, default: list[float], lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, min_len: int = 1, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.lo, self.hi, self.lo_open, self.min_len = lo, hi, lo_open, min_len

    def check(self, value: Any) -> list[float]:
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len:
            raise ValueError(f"parameter {self.name!r} must be a list of at least {self.min_len} number(s), "
                             f"got {shorten(value)}")
        return [check_float(f"{self.name}[{i}]", v, self.lo, self.hi, lo_open=self.lo_open)
                for i, v in enumerate(value)]

    def allowed(self) -> str:
        return f"list of numbers{_open_range_text(self.lo, self.hi, self.lo_open)}".rstrip()


class StrList(_Param):
    def __init__(self, name: str, default: list[str], choices: Any = None, *, min_len: int = 1,
                 item: Callable[[str, str], Any] | None = None, **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.choices, self.min_len, self.item = choices, min_len, item

    def check(self, value: Any) -> list[Any]:
        out = check_str_list(self.name, value, _choices(self.choices), min_len=self.min_len)
        return [self.item(f"{self.name}[{i}]", v) for i, v in enumerate(out)] if self.item else out

    def allowed(self) -> str:
        allowed = _choices(self.choices)
        return f"list of {allowed}" if allowed is not None else "list of strings"


class Pairs(_Param):
    def __init__(self, name: str, default: list[list[int]], lo: int | None = None, hi: int | None = None,
                 **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self.lo, self.hi = lo, hi

    def check(self, value: Any) -> list[tuple[int, int]]:
        return check_pairs(self.name, value, self.lo, self.hi)

    def allowed(self) -> str:
        return f"list of [k, v] integer pairs{_range_text(self.lo, self.hi)}"


class Custom(_Param):
    """A parameter checked by ``check(name, value) -> value`` (e.g. a format or model registry)."""

    def __init__(self, name: str, default: Any, check: Callable[[str, Any], Any], *, allowed: str = "",
                 **kw: Any) -> None:
        super().__init__(name, default, **kw)
        self._check, self._allowed = check, allowed

    def check(self, value: Any) -> Any:
        return self._check(self.name, value)

    def allowed(self) -> str:
        return self._allowed or "see the notebook"


class Params(Mapping[str, Any]):
    """Validated parameters of one notebook run: ``p.seed``, ``p["seed"]``, ``p.out`` …"""

    def __init__(self, schema: Schema, values: dict[str, Any]) -> None:
        self._schema, self._values = schema, values
        self.out: Path = resolve_out_dir(values.get("out_dir"), schema.stem)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_values"][key]
        except KeyError:
            raise AttributeError(f"notebook {self.__dict__['_schema'].stem!r} has no parameter {key!r}") from None

    @property
    def changed(self) -> list[str]:
        """Names of the parameters whose value differs from the notebook's default."""
        defaults = self._schema.checked_defaults()
        return [n for n, v in self._values.items() if v != defaults[n]]

    @property
    def is_default(self) -> bool:
        return not self.changed

    @property
    def post_defaults(self) -> bool:
        """True when every parameter the post used has the post's value."""
        return all(self._values[p.name] == p.check(p.post) for p in self._schema.params if p.used_by_post)

    @property
    def figure_dir(self) -> Path:
        """Where figures go: ``$KVCOST_FIGURE_DIR`` if set, ``figures/`` for the default run, else ``out``."""
        env = os.environ.get(FIGURE_DIR_ENV)
        if env:
            return Path(env)
        return repo_root() / FIGURE_DIR if self.is_default else self.out

    def __repr__(self) -> str:
        return f"Params({self._schema.stem!r}, {self._values!r})"


class Schema:
    """The parameters of one notebook, in the order of its ``parameters`` cell."""

    def __init__(self, stem: str, params: Sequence[_Param],
                 checks: Sequence[Callable[[dict[str, Any]], None]] = (), doc: str = "") -> None:
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"schema {stem!r} declares a parameter twice: {names}")
        params = list(params)
        if "out_dir" not in names:
            params.append(PathStr("out_dir", f"results/{stem}", doc="where the tables go (relative to the repo root)"))
        self.stem, self.params, self.checks, self.doc = stem, params, list(checks), doc

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def __getitem__(self, name: str) -> _Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def checked_defaults(self) -> dict[str, Any]:
        return {p.name: p.check(p.default) for p in self.params}

    def check_unknown(self, names: Iterable[str]) -> None:
        """Raise ValueError naming any parameter this notebook does not declare."""
        unknown = sorted({n for n in names if n not in self.names}, key=str)
        if unknown:
            raise ValueError(f"unknown parameter(s) {shorten(unknown, 200)} for notebook {self.stem!r}; "
                             f"its parameters are {self.names}")

    def validate(self, values: Mapping[str, Any]) -> Params:
        """Check every declared parameter found in ``values`` (others take their default).

        ``values`` may be a notebook's ``globals()``: names the schema does not declare are
        ignored here (the runner and sweeps reject them before a run starts).
        """
        checked = {p.name: p.check(values.get(p.name, p.default)) for p in self.params}
        for rule in self.checks:
            rule(checked)
        return Params(self, checked)

    def table(self) -> list[dict[str, str]]:
        """One row per parameter (for docs): name, default, the post's value, what is allowed."""
        return [{"name": p.name, "default": repr(p.default),
                 "post": repr(p.post) if p.used_by_post else "", "allowed": p.allowed(), "doc": p.doc}
                for p in self.params]
