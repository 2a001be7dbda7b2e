"""Single-query attention in float64, written with the post's exact operations.

The post's numbers (Block 2) depend on the order of floating-point operations, so the
reference softmax here is literally ``exp(s - max(s)) / sum``: reproducing a table to its
printed digits needs the same arithmetic, not merely the same mathematics.
"""
from __future__ import annotations

import numpy as np

__all__ = ["softmax", "attend", "rel_l2"]


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
