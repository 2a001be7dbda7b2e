"""Attention for the real decoders that scales: sliding-window layers in O(n·w), global ones causal.

transformers computes a sliding-window layer (Gemma 3's 15 of 18) as full attention under a banded mask:
O(n²) time, and at 32k tokens a mask and score matrix of 32k x 32k per head. :func:`banded_attention`
computes the same rows a block of queries at a time against only the keys their window can reach —
``block + window - 1`` of them — through torch's SDPA with the block's own small boolean mask: O(n·w)
time and memory, the same arithmetic as stock SDPA per row (float32 scores, softmax, P·V), so its
output agrees with the masked full attention to float32 rounding (``tests/test_realmodel.py``,
``make bench``). :func:`causal_attention` is the exact kernel for the global layers: SDPA's causal path
(``is_causal``, which skips the masked blocks and builds no mask) when the queries are all the keys,
an explicit bottom-right mask when a chunk follows a cache.

:func:`register` installs :class:`BandedAttention` on a loaded model under the name
:data:`NAME`; transformers then builds no masks for it (a custom attention name has none), and each
layer's call says its window (``sliding_window``, None for a global layer). ``global_attention``, when
set, takes the global layers instead (the FP8 kernel emulation, :mod:`kvcost.numerics.fa3`, in the
passkey runs).

torch is imported where used (the ``[real-model]`` extra, or the base requirements' torch).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BLOCK", "NAME", "BandedAttention", "banded_attention", "causal_attention", "masked_attention",
           "register"]

#: The name the attention function is registered under (transformers' AttentionInterface).
NAME = "kvcost_banded"
#: Query rows per block: each block reads ``BLOCK + window - 1`` keys at most — 767 at Gemma 3's window of 512,
#: a quarter fewer scores than blocks of 512 compute. Not tuned: a whole 2k forward pass with blocks of 128, 256
#: and 512 took 76, 73 and 61 s on a shared two-core machine at load average ~10, within its noise.
BLOCK = 256


def _check(query: Any, key: Any, value: Any) -> tuple[int, int, int, int]:
    if query.ndim != 4 or key.ndim != 4 or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"parameter 'query'/'key'/'value': shapes (batch, heads, tokens, head_dim) expected, got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    b, hq, nq, d = query.shape
    hk, nk = key.shape[1], key.shape[2]
    if hq % hk or nq > nk or key.shape[0] != b or key.shape[3] != d:
        raise ValueError(f"parameter 'key': {hk} KV heads of {nk} tokens must divide the {hq} query heads and hold "
                         f"at least the {nq} queries, same batch and head_dim; got {tuple(key.shape)} for "
                         f"{tuple(query.shape)}")
    return hq, hk, nq, nk


def masked_attention(query: Any, key: Any, value: Any, window: int | None, scaling: float) -> Any:
    """The reference: full attention under an explicit causal (and, with ``window``, banded) mask — what stock
    transformers computes for a sliding-window layer. Queries are the last ``nq`` of the ``nk`` key positions
    (bottom-right alignment); query at position p sees keys j with ``p - window < j <= p``. O(n²)."""
    import torch
    import torch.nn.functional as F

    hq, hk, nq, nk = _check(query, key, value)
    pos_q = torch.arange(nk - nq, nk)[:, None]
    pos_k = torch.arange(nk)[None, :]
    mask = pos_k <= pos_q
    if window is not None:
        mask &= pos_k > pos_q - window
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=hq != hk)


def banded_attention(query: Any, key: Any, value: Any, window: int, scaling: float, block: int = BLOCK) -> Any:
    """Sliding-window attention in blocks of ``block`` query rows, each against only the keys its window reaches.

    ``query`` (batch, q_heads, nq, d), ``key``/``value`` (batch, kv_heads, nk, d), queries the last ``nq`` key
    positions; query at position p attends keys ``p - window < j <= p`` (transformers'
    ``sliding_window_causal_mask_function``). Returns (batch, q_heads, nq, d), equal to
    :func:`masked_attention` to float32 rounding, in O(nq · (window + block)) time and memory."""
    import torch
    import torch.nn.functional as F

    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"parameter 'window' must be an integer >= 1, got {window!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"parameter 'block' must be an integer >= 1, got {block!r}")
    hq, hk, nq, nk = _check(query, key, value)
    off = nk - nq
    out = query.new_empty(query.shape)
    for s in range(0, nq, block):
        e = min(s + block, nq)
        k0, k1 = max(0, off + s - window + 1), off + e
        pos_q = torch.arange(off + s, off + e)[:, None]
        pos_k = torch.arange(k0, k1)[None, :]
        mask = (pos_k <= pos_q) & (pos_k > pos_q - window)
        out[:, :, s:e] = F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, k0:k1], value[:, :, k0:k1],
                                                        attn_mask=mask, scale=scaling, enable_gqa=hq != hk)
    return out


def causal_attention(query: Any, key: Any, value: Any, scaling: float) -> Any:
    """Exact causal attention (a global layer): SDPA's ``is_causal`` path when the queries are all the keys
    (no mask built, masked blocks skipped), a bottom-right boolean mask when ``nq < nk`` (a chunk after a
    cache; nq of 1 needs none)."""
    import torch.nn.functional as F

    hq, hk, nq, nk = _check(query, key, value)
    gqa = hq != hk
    if nq == nk:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    if nq == 1:
        return F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=gqa)
    return masked_attention(query, key, value, None, scaling)


class BandedAttention:
    """A transformers attention function: :func:`banded_attention` for a layer with a ``sliding_window``,
    :func:`causal_attention` (or ``global_attention``, when set) for the others.

    ``global_attention(module, query, key, value, scaling)`` returns (batch, q_heads, nq, d) like the two.
    Softcapped scores (``softcap``) are refused: Gemma 3 has none, and SDPA cannot apply it."""

    def __init__(self, block: int = BLOCK,
                 global_attention: Callable[[Any, Any, Any, Any, float], Any] | None = None) -> None:
        self.block = block
        self.global_attention = global_attention
        self.calls = {"sliding": 0, "full": 0}

    def __call__(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                 scaling: float | None = None, sliding_window: int | None = None, softcap: float | None = None,
                 **kwargs: Any) -> tuple[Any, None]:
        if softcap is not None:
            raise ValueError(f"parameter 'softcap': score softcapping ({softcap}) is not supported")
        if attention_mask is not None:
            raise ValueError("parameter 'attention_mask': the banded attention builds its own masks; got one")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if sliding_window is not None and sliding_window < key.shape[2]:
            self.calls["sliding"] += 1
            out = banded_attention(query, key, value, int(sliding_window), scaling, self.block)
        else:
            # a global layer, or a sliding one whose window holds every key (the same rows as causal)
            self.calls["full"] += 1
            glob = self.global_attention if sliding_window is None and self.global_attention else None
            out = glob(module, query, key, value, scaling) if glob else causal_attention(query, key, value, scaling)
        return out.transpose(1, 2).contiguous(), None


def register(model: Any, attention: BandedAttention | None = None) -> BandedAttention:
    """Install ``attention`` (a new :class:`BandedAttention` by default) on ``model`` under :data:`NAME`."""
    from transformers import AttentionInterface

    attention = attention or BandedAttention()
    AttentionInterface.register(NAME, attention)
    model.set_attn_implementation(NAME)
    return attention
