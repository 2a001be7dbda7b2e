"""Synthetic K/V caches with the post's outlier structure, on the post's random stream.

The post (Block 2) draws everything from one ``numpy.random.default_rng(seed)``: first the
axis-test cache (K, then V), then, trial by trial, a query, keys and values. Notebooks 02 and
03 both follow that stream, so any ``seed``/``n_tokens``/``head_dim`` gives the numbers the
post's own code would print.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "K_OUTLIER_SCALE",
    "K_OUTLIER_STRIDE",
    "V_OUTLIER_SCALE",
    "V_OUTLIER_STRIDE",
    "NeedleTrial",
    "post_axis_cache",
    "post_needle_trial",
    "post_stream",
]

# The structure KIVI and KVQuant describe, as the post builds it.
K_OUTLIER_STRIDE = 16    # every 16th channel of K is an outlier channel ...
K_OUTLIER_SCALE = 4.0    # ... scaled x4 on every token
V_OUTLIER_STRIDE = 64    # every 64th token of V is an outlier token ...
V_OUTLIER_SCALE = 6.0    # ... scaled x6 on every channel


def post_axis_cache(rng: np.random.Generator, n_tokens: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw the axis-test cache: K with persistent channel outliers, V with outlier tokens.

    Shapes are ``(n_tokens, head_dim)``; K is drawn before V, as in the post.
    """
    k = rng.normal(0, 1, (n_tokens, head_dim))
    k[:, ::K_OUTLIER_STRIDE] *= K_OUTLIER_SCALE
    v = rng.normal(0, 1, (n_tokens, head_dim))
    v[::V_OUTLIER_STRIDE, :] *= V_OUTLIER_SCALE
    return k, v


@dataclass(frozen=True)
class NeedleTrial:
    """One needle trial: query ``q`` (head_dim,), keys ``k`` and values ``v`` (n_tokens, head_dim)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    needle: int


def post_needle_trial(rng: np.random.Generator, n_tokens: int, head_dim: int, margin: float) -> NeedleTrial:
    """Draw one trial as the post does: K with channel outliers only, V plain Gaussian.

    The needle key (token ``n_tokens // 2``) is ``q`` scaled so that its score is exactly
    ``margin`` logits above the best haystack score (the max includes the overwritten row,
    exactly as in the post).
    """
    q = rng.normal(0, 1, head_dim)
    k = rng.normal(0, 1, (n_tokens, head_dim))
    k[:, ::K_OUTLIER_STRIDE] *= K_OUTLIER_SCALE
    v = rng.normal(0, 1, (n_tokens, head_dim))
    needle = n_tokens // 2
    k[needle] = q * ((k @ q).max() + margin) / (q @ q)
    return NeedleTrial(q, k, v, needle)


def post_stream(seed: int, n_tokens: int, head_dim: int) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """The post's stream at the start of the needle trials: (rng, K, V) after the axis cache."""
    rng = np.random.default_rng(seed)
    k, v = post_axis_cache(rng, n_tokens, head_dim)
    return rng, k, v
