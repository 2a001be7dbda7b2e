"""Rates with honest intervals: the Wilson score interval for a binomial proportion.

Every rate kvcost reports (needles lost, passkeys retrieved) is k successes in n trials;
its 95% interval is Wilson's (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the
normal approximation, which collapses to a point at 0 and n).
"""
from __future__ import annotations

import math
import numbers

__all__ = ["Z95", "wilson", "rate_text", "intervals_overlap"]

Z95 = 1.959963984540054   # the standard normal's 97.5% quantile


def _counts(successes: object, trials: object) -> tuple[int, int]:
    for name, value in (("successes", successes), ("trials", trials)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"parameter {name!r} must be a non-negative integer, got {value!r}")
    if successes > trials:
        raise ValueError(f"parameter 'successes' ({successes}) must not exceed 'trials' ({trials})")
    return int(successes), int(trials)


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(lo, hi)`` for ``successes`` out of ``trials``; (0, 1) when n = 0."""
    k, n = _counts(successes, trials)
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    # exact at the ends: 0 successes have lower bound 0, all successes upper bound 1
    return (0.0 if k == 0 else lo), (1.0 if k == n else hi)


def rate_text(successes: int, trials: int, digits: int = 0) -> str:
    """``"13/20 = 65% [43%, 82%]"``: the count, the rate and its Wilson 95% interval."""
    k, n = _counts(successes, trials)
    lo, hi = wilson(k, n)
    rate = k / n if n else float("nan")
    return f"{k}/{n} = {rate:.{digits}%} [{lo:.{digits}%}, {hi:.{digits}%}]"


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two intervals share a point (a conservative 'not distinguishable')."""
    return a[0] <= b[1] and b[0] <= a[1]
