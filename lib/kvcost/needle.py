"""The needle experiment: does a key ``margin`` logits above the haystack stay top-1?

``post_needle_table`` is the post's Block 2 second table on the post's random stream;
``trial_errors`` scores one trial under any storage quantizer for K and V, so notebooks can
separate what K's rounding costs (the needle flips) from what V's rounding costs (drift).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from . import attention, quant, synthetic
from .params import check_float, check_int, check_pairs
from .claims.report import Check

__all__ = ["TrialErrors", "trial_errors", "post_roundtrips", "post_needle_table", "margin_sweep", "error_sources", "reading_checks",
           "NEEDLE_COLUMNS", "MIN_BITS", "MAX_BITS"]

NEEDLE_COLUMNS = ["k_bits", "v_bits", "flips", "trials", "max_w_err", "out_rel_l2"]
MIN_BITS, MAX_BITS = 2, 16

Roundtrip = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class TrialErrors:
    """What quantization did to one trial."""

    flipped: bool        # the needle is no longer the top-1 score
    max_w_err: float     # largest absolute error of any attention weight
    out_rel_l2: float    # relative L2 error of the attention output
    needle_weight: float          # exact attention weight on the needle
    needle_weight_quant: float    # the same weight after quantization


def post_roundtrips(k_bits: int, v_bits: int) -> tuple[Roundtrip, Roundtrip]:
    """The post's choice: K scaled per channel, V per token, symmetric absmax int-k."""
    return (lambda k: quant.intk_roundtrip(k, k_bits, "channel"),
            lambda v: quant.intk_roundtrip(v, v_bits, "token"))


def trial_errors(trial: synthetic.NeedleTrial, k_roundtrip: Roundtrip | None,
                 v_roundtrip: Roundtrip | None) -> TrialErrors:
    """Score one trial with K and V passed through the given round trips (None: exact)."""
    _, w, out = attention.attend(trial.q, trial.k, trial.v)
    kq = trial.k if k_roundtrip is None else k_roundtrip(trial.k)
    vq = trial.v if v_roundtrip is None else v_roundtrip(trial.v)
    sq, wq, outq = attention.attend(trial.q, kq, vq)
    return TrialErrors(
        flipped=bool(np.argmax(sq) != trial.needle),
        max_w_err=float(np.abs(wq - w).max()),
        out_rel_l2=attention.rel_l2(outq, out),
        needle_weight=float(w[trial.needle]),
        needle_weight_quant=float(wq[trial.needle]),
    )


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run BLAS single-threaded: our own prefetch thread already uses the second core, and
    these small matrix-vector products lose more to thread hand-offs than they gain (the
    results are bit-identical either way: each output is one dot product)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _prefetched(draw: Callable[[], synthetic.NeedleTrial], count: int) -> Iterator[synthetic.NeedleTrial]:
    """Yield ``count`` draws in order, drawing the next one in a worker thread meanwhile.

    The random draws dominate a trial's time and numpy releases the GIL while filling
    arrays, so drawing trial i+1 while trial i is scored nearly halves the wall time. One
    worker keeps the draws sequential: the random stream is exactly the post's.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(draw) if count else None
        for i in range(count):
            trial = pending.result()
            if i + 1 < count:
                pending = pool.submit(draw)
            yield trial


def post_needle_table(seed: int = 7, n_tokens: int = 4096, head_dim: int = 128, trials: int = 200,
                      margin: float = 0.5,
                      bit_pairs: Sequence[Sequence[int]] = ((8, 8), (4, 4), (3, 3), (2, 2))) -> pd.DataFrame:
    """The post's needle table, on the post's random stream.

    The stream starts with the axis-test cache (drawn and discarded here, as the post draws
    it first), then each bit pair in turn draws ``trials`` fresh trials. Columns are
    ``k_bits, v_bits, flips, trials, max_w_err, out_rel_l2``; the two error columns are the
    means over trials (the post's "max w err" is the mean of each trial's maximum).
    """
    seed = check_int("seed", seed, 0)
    n_tokens = check_int("n_tokens", n_tokens, 2)
    head_dim = check_int("head_dim", head_dim, 1)
    trials = check_int("trials", trials, 1)
    margin = check_float("margin", margin)
    pairs = check_pairs("bit_pairs", bit_pairs, MIN_BITS, MAX_BITS)
    rng, _, _ = synthetic.post_stream(seed, n_tokens, head_dim)
    with one_blas_thread():
        return _post_needle_rows(rng, n_tokens, head_dim, trials, margin, pairs)


def _post_needle_rows(rng: np.random.Generator, n_tokens: int, head_dim: int, trials: int, margin: float,
                      pairs: list[tuple[int, int]]) -> pd.DataFrame:
    draws = _prefetched(lambda: synthetic.post_needle_trial(rng, n_tokens, head_dim, margin),
                        trials * len(pairs))
    rows = []
    for kb, vb in pairs:
        k_rt, v_rt = post_roundtrips(kb, vb)
        errs = [trial_errors(next(draws), k_rt, v_rt) for _ in range(trials)]
        rows.append({"k_bits": kb, "v_bits": vb, "flips": sum(e.flipped for e in errs), "trials": trials,
                     "max_w_err": float(np.mean([e.max_w_err for e in errs])),
                     "out_rel_l2": float(np.mean([e.out_rel_l2 for e in errs]))})
    return pd.DataFrame(rows, columns=NEEDLE_COLUMNS)


@one_blas_thread()
def margin_sweep(margins: Sequence[float], bits: Sequence[int], trials: int, seed: int = 0,
                 n_tokens: int = 4096, head_dim: int = 128) -> pd.DataFrame:
    """Needle flip rate against margin for K bit widths (V exact), on common random trials.

    Each margin re-uses the same keys and queries (the needle row is rebuilt for each
    margin, ``margin`` logits above the best haystack score), so the curves differ only by
    margin and bits. Columns: margin, k_bits, flips,
    trials, flip_rate.
    """
    trials = check_int("trials", trials, 1)
    bits = [check_int("bits", b, MIN_BITS, MAX_BITS) for b in bits]
    margins = [check_float("margins", m) for m in margins]
    rng = np.random.default_rng(check_int("seed", seed, 0))
    flips = np.zeros((len(margins), len(bits)), dtype=int)
    for _ in range(trials):
        base = synthetic.post_needle_trial(rng, n_tokens, head_dim, 0.0)
        haystack = np.delete(base.k, base.needle, axis=0) @ base.q
        for i, m in enumerate(margins):
            k = base.k.copy()
            k[base.needle] = base.q * (haystack.max() + m) / (base.q @ base.q)
            trial = synthetic.NeedleTrial(base.q, k, base.v, base.needle)
            for j, b in enumerate(bits):
                flips[i, j] += trial_errors(trial, lambda x, b=b: quant.intk_roundtrip(x, b, "channel"),
                                            None).flipped
    rows = [{"margin": m, "k_bits": b, "flips": int(flips[i, j]), "trials": trials,
             "flip_rate": flips[i, j] / trials}
            for i, m in enumerate(margins) for j, b in enumerate(bits)]
    return pd.DataFrame(rows)


@one_blas_thread()
def error_sources(seed: int, n_tokens: int, head_dim: int, trials: int, margin: float,
                  bit_pairs: Sequence[Sequence[int]]) -> pd.DataFrame:
    """Where the output error comes from: K rounded alone, V rounded alone, and both.

    The same trials (fresh stream from ``seed``) are scored three ways per bit pair, with
    the post's axes (K per channel, V per token). Columns: k_bits, v_bits, then for each of
    ``k_only``, ``v_only``, ``both``: mean ``out_rel_l2`` and ``flips``.
    """
    trials = check_int("trials", trials, 1)
    pairs = check_pairs("bit_pairs", bit_pairs, MIN_BITS, MAX_BITS)
    rng = np.random.default_rng(check_int("seed", seed, 0))
    drawn = [synthetic.post_needle_trial(rng, check_int("n_tokens", n_tokens, 2),
                                         check_int("head_dim", head_dim, 1), check_float("margin", margin))
             for _ in range(trials)]
    rows = []
    for kb, vb in pairs:
        k_rt, v_rt = post_roundtrips(kb, vb)
        row: dict[str, float | int] = {"k_bits": kb, "v_bits": vb}
        for label, kr, vr in (("k_only", k_rt, None), ("v_only", None, v_rt), ("both", k_rt, v_rt)):
            errs = [trial_errors(t, kr, vr) for t in drawn]
            row[f"out_rel_l2_{label}"] = float(np.mean([e.out_rel_l2 for e in errs]))
            row[f"flips_{label}"] = sum(e.flipped for e in errs)
        rows.append(row)
    return pd.DataFrame(rows)


def reading_checks(table: pd.DataFrame, sources: pd.DataFrame, sweep: pd.DataFrame) -> list[Check]:
    """The post's readings of its needle table, checked against computed results.

    ``table`` is :func:`post_needle_table`, ``sources`` :func:`error_sources` and ``sweep``
    :func:`margin_sweep` output. Each check states the post's words and what was computed.
    """
    checks = []
    # "The margin, not the bit count, decides": at the widest margin swept, do bits still matter?
    widest = sweep[sweep.margin == sweep.margin.max()].set_index("k_bits").flip_rate
    spread = float(widest.max() - widest.min())
    checks.append(Check(
        "The margin, not the bit count, decides whether you lose the needle",
        "margin decides",
        f"at a {sweep.margin.max():g}-logit margin the flip rate still runs from "
        f"{widest.min():.0%} to {widest.max():.0%} across K bits {sorted(widest.index.tolist())}",
        spread < 0.1,
        "both decide: the margin a needle needs grows as K's bits shrink"))
    # "the drift compounds through the value mix": compare V-only to K-only output error.
    for _, r in sources.iterrows():
        if int(r.k_bits) == 4 and int(r.v_bits) == 4:
            checks.append(Check(
                "At 4 bits the output error (0.98) is drift compounding through the value mix",
                "value-mix drift",
                f"V rounded alone: {r.out_rel_l2_v_only:.3f}; K rounded alone: {r.out_rel_l2_k_only:.3f} "
                f"({int(r.flips_k_only)} flips)",
                bool(r.out_rel_l2_v_only > r.out_rel_l2_k_only),
                "the output error is the needle lost to K's rounding; V's rounding adds little"))
    # Key takeaways: "Accumulation precision: fix the register, or lose 155/200 at 4 bits".
    four = table[(table.k_bits == 4) & (table.v_bits == 4)]
    if len(four):
        checks.append(Check(
            "Key takeaways: accumulation precision, 'or lose 155/200 at 4 bits'",
            "an accumulation loss",
            f"{int(four.flips.iloc[0])}/{int(four.trials.iloc[0])} at 4 bits with float64 arithmetic "
            "throughout: a storage loss",
            False,
            "the needle table rounds only the stored K and V; no accumulator is involved"))
    return checks
