"""Notebook 02's tables: which axis to scale along, at what group size, and every storage scheme's error."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvcost import floats
from kvcost.inputs.synthetic import post_needle_trial, post_stream
from kvcost.numerics.attention import rel_l2, trial_errors
from kvcost.stats import wilson
from kvcost.storage import formats
from kvcost.storage.quant import (
    AXES,
    GGML_KINDS,
    fp8_roundtrip,
    ggml_roundtrip,
    intk_roundtrip,
    kivi_roundtrip,
    rotated_roundtrip,
    roundtrip_fn,
)
from kvcost.storage.spec import llamacpp_rotation, parse_spec

__all__ = ["FORMATS_2026", "OUTLIER_FORMATS", "Scheme", "format_outlier_sweep",
           "formats_2026_schemes", "group_map", "outlier_formats", "outlier_sweep", "pareto_front",
           "scheme_attention_errors", "scheme_bits", "scheme_cache_errors", "standard_schemes"]

#: The 2026 engines' formats notebook 02 measures (kvcost.storage.formats names) and the family each is plotted under.
FORMATS_2026: dict[str, str] = {
    "nvfp4": "FP4 / MX blocks", "nvfp4_4over6": "FP4 / MX blocks", "fp4_mx_block16": "FP4 / MX blocks",
    "mxfp4": "FP4 / MX blocks", "mxfp8": "FP4 / MX blocks",
    "fp8_e4m3fnuz_token": "fp8", "int8_token": "per-token-head int (vLLM)", "int4_token": "per-token-head int (vLLM)",
    "turboquant_k8v4": "TurboQuant (vLLM)", "turboquant_4bit_nc": "TurboQuant (vLLM)",
    "turboquant_k3v4_nc": "TurboQuant (vLLM)", "turboquant_3bit_nc": "TurboQuant (vLLM)",
}

def group_map(k: np.ndarray, v: np.ndarray, bits_list: list[int], group_sizes: list[int | None],
              symmetric: bool = True) -> pd.DataFrame:
    """Reconstruction error over bits x axis x group size for K and V.

    Columns ``cache, bits, axis, group, rel_l2``; ``group`` 0 means one scale over the whole
    axis (the post's setting). A group size that does not divide the axis is skipped."""
    rows = []
    for name, x in (("K", k), ("V", v)):
        for axis in AXES:
            span = x.shape[-1] if axis == "token" else x.shape[-2]
            for g in group_sizes:
                if g is not None and span % g:
                    continue
                for b in bits_list:
                    y = intk_roundtrip(x, b, axis, symmetric=symmetric, group_size=g)
                    rows.append({"cache": name, "bits": int(b), "axis": axis, "group": int(g or 0),
                                 "rel_l2": rel_l2(y, x)})
    return pd.DataFrame(rows, columns=["cache", "bits", "axis", "group", "rel_l2"])


def outlier_sweep(rng: np.random.Generator, n_tokens: int, head_dim: int, strengths: list[float],
                  bits_list: list[int], stride: int = 16) -> pd.DataFrame:
    """Per-token vs per-channel error of K as its outlier channels grow.

    One Gaussian draw ``(n_tokens, head_dim)``; every ``stride``-th channel is scaled by each
    strength in turn (the post uses 4.0). Columns ``strength, bits, per_token, per_channel,
    winner, zeroed_token, zeroed_channel`` — ``zeroed_*`` is the fraction of values that round
    to 0 (what drives the 2-bit result: with qmax = 1 everything below half the scale vanishes,
    and a per-channel scale is the max of n_tokens values, a per-token one of head_dim)."""
    base = rng.normal(0, 1, (n_tokens, head_dim))
    rows = []
    for s in strengths:
        k = base.copy()
        k[:, ::stride] *= s
        for b in bits_list:
            yt, yc = intk_roundtrip(k, b, "token"), intk_roundtrip(k, b, "channel")
            pt, pc = rel_l2(yt, k), rel_l2(yc, k)
            rows.append({"strength": float(s), "bits": int(b), "per_token": pt, "per_channel": pc,
                         "winner": "per-token" if pt < pc else "per-channel",
                         "zeroed_token": float(np.mean(yt == 0)), "zeroed_channel": float(np.mean(yc == 0))})
    return pd.DataFrame(rows)


#: The formats the outlier sweep compares, by width class (storage specs; K is what is stored).
OUTLIER_FORMATS: dict[str, tuple[str, ...]] = {
    "about 4 bits": ("q4_0", "q4_0+hadamard", "iq4_nl", "nvfp4", "nvfp4_4over6", "fp4_mx_block16", "mxfp4",
                     "int4_token", "turboquant_4bit_nc"),
    "about 8 bits": ("q8_0", "q8_0+hadamard", "fp8_e4m3", "fp8_e4m3_token", "mxfp8", "int8_token",
                     "turboquant_k8v4"),
}


def outlier_formats(head_dim: int) -> dict[str, list[str]]:
    """:data:`OUTLIER_FORMATS` without the formats that cannot store a head of ``head_dim`` channels (and without
    rotated specs unless ``head_dim`` is a power of two)."""
    pow2 = head_dim >= 1 and not head_dim & (head_dim - 1)
    return {w: [n for n in names if _fits(parse_spec(n).k, head_dim) and (pow2 or not parse_spec(n).rotation)]
            for w, names in OUTLIER_FORMATS.items()}


def format_outlier_sweep(rng: np.random.Generator, n_tokens: int, head_dim: int, strengths: list[float],
                         names: list[str], stride: int = 16) -> pd.DataFrame:
    """K's error in each storage format as its outlier channels grow (the axis map's outlier axis, for the
    engines' formats rather than int-k's two axes). The same draw as :func:`outlier_sweep` (call it with a
    fresh ``default_rng(seed)``): every ``stride``-th channel scaled by each strength. ``names`` are storage
    specs (``q4_0``, ``nvfp4``, ``turboquant_4bit_nc``, ``q4_0+hadamard`` ...), stored as K (``role="k"``).
    Columns ``format, k_bits_per_value, strength, rel_l2`` (K's true bits)."""
    base = rng.normal(0, 1, (n_tokens, head_dim))
    fns = {n: roundtrip_fn(n, role="k") for n in names}
    bits = {n: scheme_bits(Scheme(n, "", parse_spec(n).k, fns[n], fns[n]), head_dim, "k") for n in names}
    rows = []
    for s in strengths:
        k = base.copy()
        k[:, ::stride] *= s
        for n, fn in fns.items():
            rows.append({"format": n, "k_bits_per_value": bits[n], "strength": float(s), "rel_l2": rel_l2(fn(k), k)})
    return pd.DataFrame(rows, columns=["format", "k_bits_per_value", "strength", "rel_l2"])


@dataclass(frozen=True)
class Scheme:
    """A storage scheme for a cache: round trips for K and V (shapes ``(..., tokens, head_dim)``),
    its family, and its ``kvcost.storage.formats`` name (for the true bits per value; None if it has none;
    ``v_fmt`` when V is stored in another format than K)."""

    name: str
    family: str
    fmt: str | None
    k: Callable[[np.ndarray], np.ndarray]
    v: Callable[[np.ndarray], np.ndarray]
    v_fmt: str | None = None


def _ggml_rt(kind: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: ggml_roundtrip(x, kind).astype(np.float64)


def _rot(rt: Callable[[np.ndarray], np.ndarray], block: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: rotated_roundtrip(x, rt, block=block)


def _fits(name: str, head_dim: int) -> bool:
    """Whether format ``name`` can store a head of ``head_dim`` channels (blocks divide it; TurboQuant's Hadamard
    needs a power of two)."""
    f = formats.get(name)
    if f.family == "turboquant":
        return head_dim >= 2 and not head_dim & (head_dim - 1)
    return f.scale != "block" or head_dim % f.block == 0


def formats_2026_schemes(head_dim: int = 128) -> list[Scheme]:
    """The 2026 engines' formats (:data:`FORMATS_2026`) as schemes, each through the one round trip
    (:func:`kvcost.storage.quant.roundtrip_fn`, K with ``role="k"``, V with ``"v"``); formats that cannot store a
    head of ``head_dim`` channels are left out."""
    return [Scheme(name, fam, name, roundtrip_fn(name, role="k"), roundtrip_fn(name, role="v"))
            for name, fam in FORMATS_2026.items() if _fits(name, head_dim)]


def standard_schemes(bits_list: list[int] = (8, 4, 2), group: int = 32, residual: int = 128,
                     head_dim: int = 128) -> list[Scheme]:
    """The schemes notebook 02 compares: the post's symmetric int-k (K per channel, V per token),
    KIVI-style asymmetric groups (with and without the residual window), fp8 at three scale
    granularities, llama.cpp's block formats with and without the Hadamard rotation llama.cpp applies to
    them by default (K in blocks of the largest power of two dividing ``head_dim``, V in blocks of 64:
    :func:`kvcost.storage.spec.llamacpp_rotation`; no rotated twin where llama.cpp does not rotate), bf16,
    and the 2026 formats (:func:`formats_2026_schemes`)."""
    out: list[Scheme] = [Scheme("bf16", "float", "bf16", lambda x: floats.round_to(x, "bf16"),
                                lambda x: floats.round_to(x, "bf16"))]
    for b in bits_list:
        out.append(Scheme(f"int{b} post (K/ch, V/tok)", "int-k symmetric", f"int{b}_channel",
                          lambda x, b=b: intk_roundtrip(x, b, "channel"), lambda x, b=b: intk_roundtrip(x, b, "token"),
                          v_fmt=f"int{b}_token"))
        out.append(Scheme(f"int{b} g{group} asym", "int-k groups", f"int{b}_g{group}",
                          lambda x, b=b: intk_roundtrip(x, b, "channel", symmetric=False, group_size=group),
                          lambda x, b=b: intk_roundtrip(x, b, "token", symmetric=False, group_size=group)))
        out.append(Scheme(f"kivi{b} g{group} r{residual}", "KIVI", f"kivi{b}_g{group}_r{residual}",
                          lambda x, b=b: kivi_roundtrip(x, x, b, group_size=group, residual=residual)[0],
                          lambda x, b=b: kivi_roundtrip(x, x, b, group_size=group, residual=residual)[1]))
    for f in ("e4m3", "e5m2"):
        for sc, suffix in (("tensor", ""), ("head", "_head"), ("token", "_token")):
            out.append(Scheme(f"fp8 {f} /{sc}", "fp8", f"fp8_{f}{suffix}",
                              lambda x, f=f, sc=sc: fp8_roundtrip(x, f, sc),
                              lambda x, f=f, sc=sc: fp8_roundtrip(x, f, sc)))
    for kind in GGML_KINDS:
        out.append(Scheme(kind, "llama.cpp", kind, _ggml_rt(kind), _ggml_rt(kind)))
        kb, vb = llamacpp_rotation(kind, kind, head_dim)
        if kb is not None and vb is not None:
            out.append(Scheme(f"{kind} +Hadamard", "llama.cpp +Hadamard", kind,
                              _rot(_ggml_rt(kind), kb), _rot(_ggml_rt(kind), vb)))
    return out + formats_2026_schemes(head_dim)


def scheme_bits(scheme: Scheme, head_dim: int, cache: str = "kv") -> float:
    """True bits per value of a scheme (kvcost.storage.formats, metadata amortized); NaN without a format.

    ``cache``: ``"k"`` or ``"v"`` for one cache, ``"kv"`` for their mean (K and V hold the same
    number of values). The post's int-k keeps K per channel (``int{k}_channel``: its scales are
    a constant) and V per token (``int{k}_token``: one fp32 scale per token per head).
    """
    if cache not in ("k", "v", "kv"):
        raise ValueError(f"parameter 'cache' must be 'k', 'v' or 'kv', got {cache!r}")
    if scheme.fmt is None:
        return float("nan")
    k_bits = formats.bits_per_value(scheme.fmt, head_dim)
    v_bits = formats.bits_per_value(scheme.v_fmt or scheme.fmt, head_dim)
    if formats.get(scheme.fmt).family == "turboquant":          # one slot, K's and V's bytes differ
        slot = formats.turboquant_slot(scheme.fmt, head_dim)
        k_bits, v_bits = 8 * slot.key / head_dim, 8 * slot.value / head_dim
    return {"k": k_bits, "v": v_bits, "kv": (k_bits + v_bits) / 2}[cache]


def scheme_cache_errors(k: np.ndarray, v: np.ndarray, schemes: list[Scheme]) -> pd.DataFrame:
    """Reconstruction error of K and V under each scheme. Columns ``scheme, family, format,
    bits_per_value, k_bits_per_value, v_bits_per_value, k_rel_l2, v_rel_l2`` (``bits_per_value``
    is the mean of K's and V's)."""
    rows = []
    for s in schemes:
        rows.append({"scheme": s.name, "family": s.family, "format": s.fmt or "",
                     "bits_per_value": scheme_bits(s, k.shape[-1]),
                     "k_bits_per_value": scheme_bits(s, k.shape[-1], "k"),
                     "v_bits_per_value": scheme_bits(s, k.shape[-1], "v"),
                     "k_rel_l2": rel_l2(s.k(k), k), "v_rel_l2": rel_l2(s.v(v), v)})
    return pd.DataFrame(rows)


def scheme_attention_errors(seed: int, n_tokens: int, head_dim: int, trials: int, margin: float,
                            schemes: list[Scheme]) -> pd.DataFrame:
    """Attention-level error of each scheme on the post's needle trials (the post's stream: the
    axis cache is drawn first, then the trials; every scheme sees the same trials).

    Columns ``scheme, family, bits_per_value, flips, trials, flip_rate_lo, flip_rate_hi, max_w_err,
    out_rel_l2``: the flips with their Wilson 95% interval, and the means over trials of the largest
    softmax-weight error and of the output's relative L2 error."""
    rng, _, _ = post_stream(seed, n_tokens, head_dim)
    draws = [post_needle_trial(rng, n_tokens, head_dim, margin) for _ in range(trials)]
    rows = []
    for s in schemes:
        errs = [trial_errors(t, s.k, s.v) for t in draws]
        flips = sum(e.flipped for e in errs)
        lo, hi = wilson(flips, trials)
        rows.append({"scheme": s.name, "family": s.family, "bits_per_value": scheme_bits(s, head_dim),
                     "flips": flips, "trials": trials, "flip_rate_lo": lo, "flip_rate_hi": hi,
                     "max_w_err": float(np.mean([e.max_w_err for e in errs])),
                     "out_rel_l2": float(np.mean([e.out_rel_l2 for e in errs]))})
    return pd.DataFrame(rows)


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The rows not dominated in (lower ``x``, lower ``y``), sorted by ``x``."""
    d = df.dropna(subset=[x, y]).sort_values([x, y])
    keep, best = [], np.inf
    for i, row in d.iterrows():
        if row[y] < best:
            keep.append(i)
            best = row[y]
    return d.loc[keep]
