"""Parameter validation shared by notebooks and library functions.

Every check raises ``ValueError`` naming the parameter and what is allowed, so a
papermill run with a bad parameter stops in its first code cell with a clear message
instead of producing a silent wrong number.
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "check_int", "check_float", "check_choice", "check_int_list", "check_pairs", "check_str_list",
]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _range_text(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return "any value"


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ValueError naming ``name`` and the allowed range."""
    if not _is_int(value):
        raise ValueError(f"parameter {name!r} must be an integer {_range_text(lo, hi)}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"parameter {name!r} must be an integer {_range_text(lo, hi)}, got {value!r}")
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
        rng = f"> {lo}" if (lo_open and hi is None) else _range_text(lo, hi)
        raise ValueError(f"parameter {name!r} must be a finite number {rng}, got {value!r}")
    return float(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"parameter {name!r} must be one of {choices}, got {value!r}")
    return value


def check_int_list(name: str, value: Any, lo: int | None = None, hi: int | None = None,
                   min_len: int = 1) -> list[int]:
    """Return ``value`` as a list of ints, each within range; a list or tuple is required."""
    if not isinstance(value, (list, tuple)) or len(value) < min_len:
        raise ValueError(f"parameter {name!r} must be a list of at least {min_len} integer(s) "
                         f"{_range_text(lo, hi)}, got {value!r}")
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
        raise ValueError(f"parameter {name!r} must be a list of at least {min_len} string(s), got {value!r}")
    if allowed is not None:
        unknown = [v for v in value if v not in allowed]
        if unknown:
            raise ValueError(f"parameter {name!r}: unknown {unknown}; allowed: {list(allowed)}")
    return list(value)


def check_pairs(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> list[tuple[int, int]]:
    """Return ``value`` (a list of 2-item lists of ints) as a list of int pairs."""
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise ValueError(f"parameter {name!r} must be a non-empty list of [k, v] integer pairs "
                         f"{_range_text(lo, hi)}, e.g. [[8, 8], [4, 4]]; got {value!r}")
    return [(check_int(f"{name}[{i}][0]", k, lo, hi), check_int(f"{name}[{i}][1]", v, lo, hi))
            for i, (k, v) in enumerate(value)]
