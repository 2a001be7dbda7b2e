"""Notebook 03's tables: does a key ``margin`` logits above the haystack stay top-1 once K and V are rounded?

``post_needle_table`` is the post's Block 2 second table on the post's random stream;
``margin_sweep`` and ``error_sources`` go beyond it on fresh streams. Parameters are validated
by the notebook's schema (``kvcost.notebook_params``), not again here.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from kvcost.inputs.synthetic import NeedleTrial, post_needle_trial, post_stream
from kvcost.numerics.attention import Roundtrip, trial_errors
from kvcost.stats import wilson
from kvcost.storage.quant import SYM_BITS, intk_roundtrip

__all__ = ["MAX_BITS", "MIN_BITS", "NEEDLE_COLUMNS", "error_sources", "margin_sweep", "one_blas_thread",
           "post_needle_table", "post_roundtrips"]

#: The columns of ``needle.csv`` (docs/notebooks.md).
NEEDLE_COLUMNS = ["k_bits", "v_bits", "flips", "trials", "max_w_err", "out_rel_l2"]
MIN_BITS, MAX_BITS = SYM_BITS     # the post's symmetric int-k


def post_roundtrips(k_bits: int, v_bits: int) -> tuple[Roundtrip, Roundtrip]:
    """The post's choice: K scaled per channel, V per token, symmetric absmax int-k."""
    return (lambda k: intk_roundtrip(k, k_bits, "channel"),
            lambda v: intk_roundtrip(v, v_bits, "token"))


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run BLAS single-threaded: our own prefetch thread already uses the second core, and
    these small matrix-vector products lose more to thread hand-offs than they gain (the
    results are bit-identical either way: each output is one dot product)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _prefetched(draw: Callable[[], NeedleTrial], count: int) -> Iterator[NeedleTrial]:
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
    pairs = [(int(k), int(v)) for k, v in bit_pairs]
    rng, _, _ = post_stream(seed, n_tokens, head_dim)
    with one_blas_thread():
        draws = _prefetched(lambda: post_needle_trial(rng, n_tokens, head_dim, margin), trials * len(pairs))
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
    margin and bits. Columns: margin, k_bits, flips, trials, flip_rate and its Wilson 95%
    interval flip_rate_lo, flip_rate_hi.
    """
    rng = np.random.default_rng(seed)
    flips = np.zeros((len(margins), len(bits)), dtype=int)
    for _ in range(trials):
        base = post_needle_trial(rng, n_tokens, head_dim, 0.0)
        haystack = np.delete(base.k, base.needle, axis=0) @ base.q
        for i, m in enumerate(margins):
            k = base.k.copy()
            k[base.needle] = base.q * (haystack.max() + m) / (base.q @ base.q)
            trial = NeedleTrial(base.q, k, base.v, base.needle)
            for j, b in enumerate(bits):
                flips[i, j] += trial_errors(trial, lambda x, b=b: intk_roundtrip(x, b, "channel"), None).flipped
    rows = []
    for i, m in enumerate(margins):
        for j, b in enumerate(bits):
            lo, hi = wilson(int(flips[i, j]), trials)
            rows.append({"margin": float(m), "k_bits": int(b), "flips": int(flips[i, j]), "trials": trials,
                         "flip_rate": flips[i, j] / trials, "flip_rate_lo": lo, "flip_rate_hi": hi})
    return pd.DataFrame(rows)


@one_blas_thread()
def error_sources(seed: int, n_tokens: int, head_dim: int, trials: int, margin: float,
                  bit_pairs: Sequence[Sequence[int]]) -> pd.DataFrame:
    """Where the output error comes from: K rounded alone, V rounded alone, and both.

    The same trials (fresh stream from ``seed``) are scored three ways per bit pair, with
    the post's axes (K per channel, V per token). Columns: k_bits, v_bits, trials, then for
    each of ``k_only``, ``v_only``, ``both``: mean ``out_rel_l2`` and ``flips``.
    """
    rng = np.random.default_rng(seed)
    drawn = [post_needle_trial(rng, n_tokens, head_dim, margin) for _ in range(trials)]
    rows = []
    for kb, vb in bit_pairs:
        k_rt, v_rt = post_roundtrips(kb, vb)
        row: dict[str, float | int] = {"k_bits": int(kb), "v_bits": int(vb), "trials": trials}
        for label, kr, vr in (("k_only", k_rt, None), ("v_only", None, v_rt), ("both", k_rt, v_rt)):
            errs = [trial_errors(t, kr, vr) for t in drawn]
            row[f"out_rel_l2_{label}"] = float(np.mean([e.out_rel_l2 for e in errs]))
            row[f"flips_{label}"] = sum(e.flipped for e in errs)
        rows.append(row)
    return pd.DataFrame(rows)
