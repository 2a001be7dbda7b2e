"""Single-query attention in float64, written with the post's exact operations.

The post's numbers (Block 2) depend on the order of floating-point operations, so the
reference softmax here is literally ``exp(s - max(s)) / sum``: reproducing a table to its
printed digits needs the same arithmetic, not merely the same mathematics. :func:`trial_errors`
scores one needle trial under any storage round trips for K and V.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcost.inputs.synthetic import NeedleTrial

__all__ = ["Roundtrip", "TrialErrors", "attend", "rel_l2", "softmax", "trial_errors"]

Roundtrip = Callable[[np.ndarray], np.ndarray]


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, stabilised by the maximum (the post's formula)."""
    scores = np.asarray(scores, dtype=np.float64)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return w


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query against a cache: returns (scores ``k @ q``, weights, output ``w @ v``).

    No 1/sqrt(d) scaling, as in the post: the needle's margin is set in raw logits.
    """
    scores = k @ q
    w = softmax(scores)
    return scores, w, w @ v


def rel_l2(approx: np.ndarray, exact: np.ndarray) -> float:
    """Relative L2 error ``||approx - exact|| / ||exact||`` (the post's metric)."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


@dataclass(frozen=True)
class TrialErrors:
    """What quantization did to one trial."""

    flipped: bool                 # the needle is no longer the top-1 score
    max_w_err: float              # largest absolute error of any attention weight
    out_rel_l2: float             # relative L2 error of the attention output
    needle_weight: float          # exact attention weight on the needle
    needle_weight_quant: float    # the same weight after quantization


def trial_errors(trial: NeedleTrial, k_roundtrip: Roundtrip | None, v_roundtrip: Roundtrip | None) -> TrialErrors:
    """Score one trial with K and V passed through the given round trips (None: exact)."""
    _, w, out = attend(trial.q, trial.k, trial.v)
    kq = trial.k if k_roundtrip is None else k_roundtrip(trial.k)
    vq = trial.v if v_roundtrip is None else v_roundtrip(trial.v)
    sq, wq, outq = attend(trial.q, kq, vq)
    return TrialErrors(
        flipped=bool(np.argmax(sq) != trial.needle),
        max_w_err=float(np.abs(wq - w).max()),
        out_rel_l2=rel_l2(outq, out),
        needle_weight=float(w[trial.needle]),
        needle_weight_quant=float(wq[trial.needle]),
    )
