"""Rates with honest intervals: the Wilson score interval for a binomial proportion, and paired tests.

Every rate kvcost reports (needles lost, passkeys retrieved) is k successes in n trials;
its 95% interval is Wilson's (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the
normal approximation, which collapses to a point at 0 and n).

Two variants run on the same trials (the same prompts) are compared pairwise: only the trials
where they disagree carry information, and McNemar's exact test asks whether those split
evenly (:func:`mcnemar_exact`). Many such comparisons at once are held to a family-wise 5%
with Holm's step-down correction (:func:`holm`; with Tarone's refinement for discrete tests), so
that a verdict does not rest on the one comparison in twenty that a 5% test gets wrong by chance.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["Z95", "wilson", "rate_text", "intervals_overlap", "mcnemar_exact", "mcnemar_min_p", "holm",
           "paired_binary", "paired_losses", "detectable_loss", "paired_shift", "T95", "t95", "clustered_rate",
           "clustered_rate_text"]

Z95 = 1.959963984540054   # the standard normal's 97.5% quantile
#: Student t 0.975 quantiles for 1..30 degrees of freedom (scipy.stats.t.ppf(0.975, df)).
T95 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252, 2.306004135,
       2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546, 2.119905299,
       2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
       2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)


def t95(df: float) -> float:
    """Student t's 97.5% quantile at ``df`` degrees of freedom (at least 1), from :data:`T95`: a fractional ``df``
    (Welch's) is rounded down and one above 30 read as 30, each a slightly wider interval than the exact one."""
    if isinstance(df, bool) or not isinstance(df, numbers.Real) or not df >= 1:
        raise ValueError(f"parameter 'df' must be a number >= 1, got {df!r}")
    return T95[min(math.floor(df), len(T95)) - 1]


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


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value for paired trials: ``lost`` trials one variant fails where
    the other succeeds, ``gained`` the reverse. Under "no difference" each discordant trial goes
    either way with probability 1/2, so the p-value is twice the binomial tail of the smaller count
    (capped at 1); 1.0 when no trial is discordant."""
    for name, value in (("lost", lost), ("gained", gained)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"parameter {name!r} must be a non-negative integer, got {value!r}")
    b, n = min(lost, gained), lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(b + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_min_p(discordant: int) -> float:
    """The smallest p-value :func:`mcnemar_exact` can give with ``discordant`` trials (all one way):
    2·2^-n, capped at 1. A comparison with few discordant trials can never be significant."""
    if not isinstance(discordant, numbers.Integral) or isinstance(discordant, bool) or discordant < 0:
        raise ValueError(f"parameter 'discordant' must be a non-negative integer, got {discordant!r}")
    return min(1.0, 2.0 ** (1 - discordant))


def holm(pvalues: object, alpha: float = 0.05, min_pvalues: object = None) -> list[bool]:
    """Holm's step-down rejections for a family of p-values at family-wise error ``alpha``.

    Without ``min_pvalues``: the i-th smallest (from 0) is rejected while it is at most
    alpha / (m - i); the first that is not stops the procedure. With ``min_pvalues`` (the smallest
    p-value each discrete test could reach, e.g. :func:`mcnemar_min_p`), Tarone's refinement in its
    step-down form (Hommel & Krummenauer 1998): at each step the divisor is the smallest k for which
    at most k of the tests not yet rejected could reach alpha / k, so tests that can never be
    significant (a cell where the two variants agree on every trial) do not dilute the others.
    Returns one bool per p-value, in the order given."""
    if not 0 < alpha < 1:
        raise ValueError(f"parameter 'alpha' must be in (0, 1), got {alpha!r}")
    ps = [float(p) for p in pvalues]  # type: ignore[union-attr]
    mins = [0.0] * len(ps) if min_pvalues is None else [float(p) for p in min_pvalues]  # type: ignore[union-attr]
    for name, values in (("pvalues", ps), ("min_pvalues", mins)):
        if any(not 0 <= p <= 1 for p in values):
            raise ValueError(f"parameter {name!r} must hold probabilities in [0, 1], got {values!r}")
    if len(mins) != len(ps) or any(m > p for m, p in zip(mins, ps)):
        raise ValueError("parameter 'min_pvalues' must give, for each p-value, a minimum not above it")
    reject = [False] * len(ps)
    left = sorted(range(len(ps)), key=ps.__getitem__)
    while left:
        k = next(k for k in range(1, len(left) + 1) if sum(mins[i] <= alpha / k for i in left) <= k)
        if ps[left[0]] > alpha / k:
            break
        reject[left.pop(0)] = True
    return reject


def paired_binary(mine: object, ref: object) -> dict:
    """One variant's binary outcomes ``mine`` against a reference's ``ref`` on the same trials (equal-length
    sequences of bools, trial by trial): ``trials``, ``successes`` with the Wilson 95% ``lo``/``hi``,
    ``ref_successes``, the discordant trials (``lost``: the reference succeeded and the variant did not;
    ``gained``: the reverse) and the exact McNemar ``p_value``."""
    a = [bool(x) for x in mine]  # type: ignore[union-attr]
    b = [bool(x) for x in ref]  # type: ignore[union-attr]
    if len(a) != len(b):
        raise ValueError(f"parameters 'mine' and 'ref' must pair trial by trial, got {len(a)} and {len(b)} outcomes")
    lost = sum(r and not m for m, r in zip(a, b))
    gained = sum(m and not r for m, r in zip(a, b))
    k, n = sum(a), len(a)
    lo, hi = wilson(k, n)
    return {"trials": n, "successes": k, "lo": lo, "hi": hi, "ref_successes": sum(b), "lost": lost,
            "gained": gained, "p_value": mcnemar_exact(lost, gained)}


def paired_losses(lost: object, gained: object, alpha: float = 0.05) -> list[bool]:
    """Which of a family of paired comparisons (:func:`paired_binary`'s ``lost``/``gained`` per row) lose to the
    reference: rejected by Holm's correction at family-wise ``alpha`` with Tarone's refinement (rows with too few
    discordant trials to ever be significant do not count, :func:`holm`), and more trials lost than gained."""
    lo = [int(x) for x in lost]  # type: ignore[union-attr]
    ga = [int(x) for x in gained]  # type: ignore[union-attr]
    if len(lo) != len(ga):
        raise ValueError(f"parameters 'lost' and 'gained' must have one count per row, got {len(lo)} and {len(ga)}")
    reject = holm([mcnemar_exact(a, b) for a, b in zip(lo, ga)], alpha,
                  min_pvalues=[mcnemar_min_p(a + b) for a, b in zip(lo, ga)])
    return [bool(r) and a > b for r, a, b in zip(reject, lo, ga)]


def detectable_loss(ref_successes: int, discordant: object, alpha: float = 0.05) -> int | None:
    """The fewest trials lost (none gained) that :func:`paired_losses` would reject as the first of a family whose
    rows have ``discordant`` trials each (the family Holm's first step divides ``alpha`` by: the rows that could
    reach significance, Tarone, once the loss is seen in one of them), on a row whose reference succeeded
    ``ref_successes`` times; None when no loss that size could be (what "no loss detected" could have seen)."""
    m = max(1, sum(mcnemar_min_p(int(d)) < alpha for d in discordant))  # type: ignore[union-attr]
    return next((d for d in range(1, int(ref_successes) + 1) if mcnemar_exact(d, 0) < alpha / m), None)


def paired_shift(mine: object, ref: object, resamples: int = 10_000, seed: int = 0) -> dict:
    """The mean paired difference ``mine - ref`` of a continuous outcome on the same trials (equal-length
    sequences, trial by trial): ``shift``, and ``shift_lo``/``shift_hi``, the 95% percentile bootstrap interval
    over trials (``resamples`` draws of the trials with replacement, seeded: the same numbers every run)."""
    import numpy as np

    a = np.asarray(mine, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"parameters 'mine' and 'ref' must pair trial by trial, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("parameters 'mine' and 'ref' must be finite")
    if resamples < 100:
        raise ValueError(f"parameter 'resamples' must be at least 100, got {resamples!r}")
    d = a - b
    draws = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
    lo, hi = np.quantile(d[draws].mean(axis=1), [0.025, 0.975])
    return {"shift": float(d.mean()), "shift_lo": float(lo), "shift_hi": float(hi)}


def _wilson_real(k: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's interval for a (possibly fractional) count k of n."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def clustered_rate(successes: object, trials: object, z: float = Z95) -> tuple[float, float, float, float]:
    """A rate pooled over clusters (``successes[i]`` of ``trials[i]`` in cluster i) with a 95% interval
    that respects the clustering: ``(rate, lo, hi, n_eff)``.

    The pooled rate is sum(k)/sum(n). Its variance is the cluster-robust (sandwich) one,
    m/(m-1) · sum((k_i - p·n_i)²) / N², which sees only how the clusters' own rates scatter; the design
    effect deff = that variance over the binomial p(1-p)/N (at least 1), and the interval is Wilson's at
    the effective number of independent trials n_eff = N/deff (Kish's design effect). Clusters that all
    share one rate give n_eff = N (Wilson on the pooled count); clusters at 0% and 100% give n_eff about
    m - 1, one trial per cluster. When every trial agrees (rate 0 or 1) the clusters show no spread to
    measure, and the interval is taken at n_eff = m (as if each cluster were one trial): the conservative
    choice. At least two clusters with trials are needed."""
    ks = list(successes)  # type: ignore[call-overload]
    ns = list(trials)  # type: ignore[call-overload]
    if len(ks) != len(ns):
        raise ValueError(f"parameters 'successes' and 'trials' must have one entry per cluster, got {len(ks)} "
                         f"and {len(ns)}")
    pairs = [_counts(k, n) for k, n in zip(ks, ns)]
    pairs = [(k, n) for k, n in pairs if n > 0]
    m = len(pairs)
    if m < 2:
        raise ValueError(f"parameter 'trials' must give at least two clusters with trials, got {m}")
    big_k, big_n = sum(k for k, _ in pairs), sum(n for _, n in pairs)
    p = big_k / big_n
    if big_k in (0, big_n):
        n_eff = float(m)
    else:
        robust = m / (m - 1) * sum((k - p * n) ** 2 for k, n in pairs) / big_n ** 2
        n_eff = big_n / max(1.0, robust / (p * (1 - p) / big_n))
    lo, hi = _wilson_real(p * n_eff, n_eff, z)
    return p, (0.0 if big_k == 0 else lo), (1.0 if big_k == big_n else hi), n_eff


def clustered_rate_text(successes: object, trials: object, unit: str = "clusters") -> str:
    """``"37/60 = 62% [30%, 89%] (3 heads, effective n 6.1)"``: :func:`clustered_rate` as text."""
    ks, ns = list(successes), list(trials)  # type: ignore[call-overload]
    p, lo, hi, n_eff = clustered_rate(ks, ns)
    m = sum(1 for n in ns if n)
    return f"{sum(ks)}/{sum(ns)} = {p:.0%} [{lo:.0%}, {hi:.0%}] ({m} {unit}, effective n {n_eff:.2g})"
