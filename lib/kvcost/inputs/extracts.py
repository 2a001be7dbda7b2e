"""Real K and V from a small transformer: the file format, and the statistics that test the post's assumption.

The post's axis test assumes keys with persistent outlier channels and values with outlier
tokens. ``data/real_kv/`` holds keys and values captured from a real model (written by
``scripts/extract_real_kv.py``); this module loads them and measures that structure: channel
RMS against the head's median channel (and whether a channel is large on the *typical* token),
and token norms against the head's median token. Nothing here imports torch.
"""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvcost.paths import repo_path
from kvcost.provenance import checked

__all__ = [
    "DEFAULT_PATH", "RealKV", "as4d", "channel_heatmap", "channel_mean_ratio", "channel_outlier_table",
    "channel_ratio", "channel_rms",
    "channel_typical_ratio", "load_real_kv", "save_real_kv", "structure_table", "token_norm_ratio",
    "token_outlier_share", "token_outlier_table", "top_outlier_tokens", "without_special", "write_npz",
]

DEFAULT_PATH = Path("data") / "real_kv" / "minilm_l6_kv.npz"

# The arrays a real-K/V file holds, besides the JSON metadata string ``meta``.
_ARRAYS = ("k", "v", "token_ids", "tokens", "window", "special")


@dataclass(frozen=True)
class RealKV:
    """Keys and values of every layer and head over one token stream.

    ``k`` and ``v`` are float64 ``(layers, heads, tokens, head_dim)`` (stored as float16, so
    every value is exact); ``token_ids``, ``tokens`` (word pieces), ``window`` (which
    forward pass a token came from) and ``special`` ([CLS]/[SEP]) are ``(tokens,)``.
    """

    k: np.ndarray
    v: np.ndarray
    token_ids: np.ndarray
    tokens: np.ndarray
    window: np.ndarray
    special: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(layers, heads, tokens, head_dim)``."""
        return tuple(self.k.shape)  # type: ignore[return-value]


def _check_cache(name: str, x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim < 2 or arr.ndim > 4 or arr.shape[-1] < 1 or arr.shape[-2] < 1:
        raise ValueError(f"parameter {name!r} must be an array shaped (tokens, channels), "
                         f"(heads, tokens, channels) or (layers, heads, tokens, channels), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"parameter {name!r} must hold real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"parameter {name!r} must be finite")
    return arr


def as4d(name: str, x: Any) -> np.ndarray:
    """``x`` as float64 ``(layers, heads, tokens, channels)``: missing leading axes become 1."""
    arr = _check_cache(name, x)
    while arr.ndim < 4:
        arr = arr[np.newaxis]
    return arr


def _check_threshold(threshold: float) -> float:
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not threshold > 1.0 \
            or not np.isfinite(threshold):
        raise ValueError(f"parameter 'threshold' must be a finite number > 1, got {threshold!r}")
    return float(threshold)


# ---------------------------------------------------------------------------- file format

def save_real_kv(path: str | Path, k: np.ndarray, v: np.ndarray, token_ids: np.ndarray,
                 tokens: Sequence[str], window: np.ndarray, special: np.ndarray,
                 meta: dict[str, Any]) -> Path:
    """Write a real-K/V ``.npz``: K and V as float16, byte-identical for identical input.

    ``k`` and ``v`` are ``(layers, heads, tokens, head_dim)``; the per-token arrays are
    ``(tokens,)``; ``meta`` must be JSON-serialisable. ``numpy.savez_compressed`` stamps each
    member with the current time, so the zip is written here with a fixed date instead.
    """
    k = np.asarray(k)
    v = np.asarray(v)
    if k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"parameters 'k' and 'v' must both be (layers, heads, tokens, head_dim), "
                         f"got {k.shape} and {v.shape}")
    n_tok = k.shape[2]
    arrays = {
        "k": k.astype(np.float16), "v": v.astype(np.float16),
        "token_ids": np.asarray(token_ids, dtype=np.int32),
        "tokens": np.asarray(list(tokens), dtype=np.str_),
        "window": np.asarray(window, dtype=np.int16),
        "special": np.asarray(special, dtype=bool),
        "meta": np.asarray(json.dumps(meta, sort_keys=True)),
    }
    for name in ("token_ids", "tokens", "window", "special"):
        if arrays[name].shape != (n_tok,):
            raise ValueError(f"parameter {name!r} must have shape ({n_tok},), got {arrays[name].shape}")
    return write_npz(path, arrays)


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """A deflated ``.npz`` with fixed member dates: identical arrays give identical bytes (and sha256)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arr, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)
    return path


def load_real_kv(path: str | Path | None = None) -> RealKV:
    """Load the committed real K/V (``data/real_kv/minilm_l6_kv.npz`` by default).

    A relative ``path`` is taken relative to the repository root. K and V come back as
    float64 ``(layers, heads, tokens, head_dim)``; ``meta`` is the provenance dictionary the
    extraction script recorded (model, text, versions, windowing).
    """
    if path is not None and not isinstance(path, (str, Path)):
        raise ValueError(f"parameter 'path' must be a path string or None, got {path!r}")
    p = Path(path) if path else DEFAULT_PATH
    p = repo_path(p)
    if not p.is_file():
        raise ValueError(f"parameter 'path': no real-K/V file at {p.name!r} "
                         "(regenerate it with `make real-kv`)")
    with np.load(checked(p), allow_pickle=False) as z:
        missing = [n for n in (*_ARRAYS, "meta") if n not in z.files]
        if missing:
            raise ValueError(f"parameter 'path': {p.name!r} lacks arrays {missing}")
        data = {n: z[n] for n in (*_ARRAYS, "meta")}
    return RealKV(k=data["k"].astype(np.float64), v=data["v"].astype(np.float64),
                  token_ids=data["token_ids"], tokens=data["tokens"], window=data["window"],
                  special=data["special"], meta=json.loads(str(data["meta"])))


def without_special(kv: RealKV) -> RealKV:
    """The same cache with the [CLS]/[SEP] tokens removed (text tokens only)."""
    keep = ~np.asarray(kv.special, dtype=bool)
    return RealKV(k=kv.k[:, :, keep], v=kv.v[:, :, keep], token_ids=kv.token_ids[keep],
                  tokens=kv.tokens[keep], window=kv.window[keep], special=kv.special[keep],
                  meta=dict(kv.meta))


# ---------------------------------------------------------------------------- channels

def channel_mean_ratio(v: np.ndarray) -> float:
    """ρ of one head's values ``v`` (tokens, head_dim): the RMS of V's channel means over the RMS of its
    channel spreads (standard deviations over tokens). Large ρ: the values share a mean that a low-precision
    sum of many of them must carry (notebook 06's haystacks hold it as the real head's)."""
    mu, sd = v.mean(axis=0), v.std(axis=0)
    return float(np.sqrt(np.mean(mu ** 2)) / np.sqrt(np.mean(sd ** 2)))


def channel_rms(x: np.ndarray) -> np.ndarray:
    """Each channel's RMS over tokens: ``(..., tokens, channels)`` -> ``(..., channels)``."""
    arr = _check_cache("x", x)
    return np.sqrt(np.mean(arr * arr, axis=-2))


def channel_ratio(x: np.ndarray) -> np.ndarray:
    """Each channel's RMS over tokens divided by the median channel RMS of its head.

    The post's synthetic K gives 4 on its outlier channels and 1 elsewhere (in expectation).
    """
    rms = channel_rms(x)
    med = np.median(rms, axis=-1, keepdims=True)
    return rms / np.where(med == 0, 1.0, med)


def channel_typical_ratio(x: np.ndarray) -> np.ndarray:
    """Each channel's *median* |x| over tokens divided by the head's median of those medians.

    A persistent outlier channel is large on the typical token, so this ratio stays high;
    a channel made large by a few tokens has a high RMS ratio but a typical ratio near 1.
    """
    arr = _check_cache("x", x)
    typ = np.median(np.abs(arr), axis=-2)
    med = np.median(typ, axis=-1, keepdims=True)
    return typ / np.where(med == 0, 1.0, med)


def channel_outlier_table(x: np.ndarray, threshold: float) -> pd.DataFrame:
    """Outlier channels per layer and head of a cache ``(..., tokens, channels)``.

    Columns: ``layer, head``; ``outlier_channels`` (RMS ratio >= ``threshold``);
    ``persistent_channels`` (RMS ratio *and* typical ratio >= ``threshold``); ``max_ratio`` and
    ``top_channel`` (the channel of largest RMS ratio); ``top_typical_ratio`` (that channel's
    typical ratio); ``top1_share`` (fraction of tokens whose largest-|x| channel is
    ``top_channel``: 1 for a channel that dominates every token).
    """
    threshold = _check_threshold(threshold)
    arr = as4d("x", x)
    ratio = channel_ratio(arr)
    typical = channel_typical_ratio(arr)
    argmax_tok = np.argmax(np.abs(arr), axis=-1)           # (L, H, T): each token's largest channel
    rows = []
    for layer in range(arr.shape[0]):
        for head in range(arr.shape[1]):
            r, t = ratio[layer, head], typical[layer, head]
            top = int(np.argmax(r))
            rows.append({
                "layer": layer, "head": head,
                "outlier_channels": int(np.sum(r >= threshold)),
                "persistent_channels": int(np.sum((r >= threshold) & (t >= threshold))),
                "max_ratio": float(r[top]), "top_channel": top,
                "top_typical_ratio": float(t[top]),
                "top1_share": float(np.mean(argmax_tok[layer, head] == top)),
            })
    return pd.DataFrame(rows)


def channel_heatmap(x: np.ndarray) -> np.ndarray:
    """Channel RMS ratios as an image: ``(layers * heads, channels)``, row ``layer * heads + head``."""
    ratio = channel_ratio(as4d("x", x))
    return ratio.reshape(-1, ratio.shape[-1])


# ---------------------------------------------------------------------------- tokens

def token_norm_ratio(x: np.ndarray) -> np.ndarray:
    """Each token's L2 norm over channels divided by the head's median token norm.

    ``(..., tokens, channels)`` -> ``(..., tokens)``; the post's synthetic V gives 6 on its
    outlier tokens.
    """
    arr = _check_cache("x", x)
    norm = np.sqrt(np.sum(arr * arr, axis=-1))
    med = np.median(norm, axis=-1, keepdims=True)
    return norm / np.where(med == 0, 1.0, med)


def token_outlier_table(x: np.ndarray, threshold: float,
                        special: np.ndarray | None = None) -> pd.DataFrame:
    """Outlier tokens per layer and head: tokens whose norm ratio is >= ``threshold``.

    Columns: ``layer, head, outlier_tokens, outlier_fraction, max_ratio, top_token`` (position
    of the largest ratio) and, when the ``special`` mask ``(tokens,)`` is given,
    ``outlier_special`` (how many of the outlier tokens are special tokens).
    """
    threshold = _check_threshold(threshold)
    arr = as4d("x", x)
    ratio = token_norm_ratio(arr)
    if special is not None:
        special = np.asarray(special, dtype=bool)
        if special.shape != (arr.shape[2],):
            raise ValueError(f"parameter 'special' must have shape ({arr.shape[2]},), got {special.shape}")
    rows = []
    for layer in range(arr.shape[0]):
        for head in range(arr.shape[1]):
            r = ratio[layer, head]
            out = r >= threshold
            row = {"layer": layer, "head": head, "outlier_tokens": int(out.sum()),
                   "outlier_fraction": float(out.mean()), "max_ratio": float(r.max()),
                   "top_token": int(np.argmax(r))}
            if special is not None:
                row["outlier_special"] = int(np.sum(out & special))
            rows.append(row)
    return pd.DataFrame(rows)


def token_outlier_share(x: np.ndarray, threshold: float) -> np.ndarray:
    """For each token, the fraction of (layer, head) pairs in which it is an outlier token."""
    threshold = _check_threshold(threshold)
    ratio = token_norm_ratio(as4d("x", x))
    return np.mean(ratio >= threshold, axis=(0, 1))


def top_outlier_tokens(kv: RealKV, cache: str, threshold: float, n: int = 10) -> pd.DataFrame:
    """The ``n`` tokens that are outliers in the most heads of ``cache`` ("K" or "V").

    Columns: ``position, token, window, special, share`` (fraction of layer-head pairs where
    the token's norm ratio is >= ``threshold``) and ``median_ratio`` (its median norm ratio
    over layers and heads). Sorted by share, then median ratio (both descending), then position.
    """
    if cache not in ("K", "V"):
        raise ValueError(f"parameter 'cache' must be 'K' or 'V', got {cache!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"parameter 'n' must be an integer >= 1, got {n!r}")
    x = kv.k if cache == "K" else kv.v
    share = token_outlier_share(x, threshold)
    med = np.median(token_norm_ratio(as4d("x", x)), axis=(0, 1))
    order = np.lexsort((np.arange(share.size), -med, -share))[:n]
    return pd.DataFrame({"position": order.astype(int), "token": [str(kv.tokens[i]) for i in order],
                         "window": kv.window[order].astype(int), "special": kv.special[order].astype(bool),
                         "share": share[order], "median_ratio": med[order]})


def structure_table(caches: dict[str, np.ndarray], threshold: float) -> pd.DataFrame:
    """The outlier structure of several caches side by side, one row per named cache.

    Columns: ``cache, heads``; ``heads_outlier_channels`` / ``heads_persistent_channels`` (heads
    with at least one such channel), ``max_channel_ratio`` and ``median_head_channel_ratio``
    (the largest channel RMS ratio: over all heads, and the median over heads of each head's
    largest); ``heads_outlier_tokens``, ``max_token_ratio``, ``median_head_token_ratio``
    likewise for token norms. Use it to set a real cache beside the post's synthetic one.
    """
    threshold = _check_threshold(threshold)
    if not isinstance(caches, dict) or not caches:
        raise ValueError("parameter 'caches' must be a non-empty dict of name -> array")
    rows = []
    for name, x in caches.items():
        ch = channel_outlier_table(x, threshold)
        tk = token_outlier_table(x, threshold)
        rows.append({
            "cache": name, "heads": len(ch),
            "heads_outlier_channels": int(np.sum(ch["outlier_channels"] > 0)),
            "heads_persistent_channels": int(np.sum(ch["persistent_channels"] > 0)),
            "max_channel_ratio": float(ch["max_ratio"].max()),
            "median_head_channel_ratio": float(ch["max_ratio"].median()),
            "heads_outlier_tokens": int(np.sum(tk["outlier_tokens"] > 0)),
            "max_token_ratio": float(tk["max_ratio"].max()),
            "median_head_token_ratio": float(tk["max_ratio"].median()),
        })
    return pd.DataFrame(rows)
