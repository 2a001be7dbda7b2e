"""KV-cache bytes from a :class:`~kvcost.models.hfconfig.Geometry`, and the budget arithmetic built on it.

The post's formula, ``2 x layers x KV heads x head_dim x bytes``, is exact for a plain
GQA/MHA transformer and wrong for most models shipped since: sliding-window layers keep
at most ``window`` tokens, MLA layers keep one compressed latent instead of K and V,
and linear-attention / state-space layers keep a constant state instead of a cache.
:func:`cache_bytes` sizes one sequence's cache in any :mod:`kvcost.storage.formats` format;
:func:`requests_in_budget`, :func:`max_context` and :func:`plan` answer capacity questions
(engine-independent: what llama.cpp and vLLM actually allocate is in :mod:`kvcost.engines.llamacpp`
and :mod:`kvcost.engines.vllm`). ``from_hf_config`` and ``load_model`` are re-exported from
:mod:`kvcost.models.hfconfig` and :mod:`kvcost.models.registry`. Standard library only (fast CLI).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from kvcost.models.hfconfig import FULL, KV_KINDS, MLA, SLIDING, Geometry, StateSpec, from_hf_config
from kvcost.models.registry import POST_MODELS, load_model, naive_geometry
from kvcost.storage import formats
from kvcost.storage.spec import CacheSpec, parse_spec
from kvcost.units import GIB

__all__ = [
    "MLA_LAYOUTS",
    "POST_MODELS",
    "Geometry",
    "Plan",
    "StateSpec",
    "cache_bytes",
    "check_context",
    "check_layers",
    "context_warnings",
    "from_hf_config",
    "growth_bytes_per_token",
    "kv_bytes_per_token",
    "kv_formats",
    "kv_spec",
    "layer_breakdown",
    "load_model",
    "max_context",
    "naive_bytes_per_token",
    "naive_cache_bytes",
    "naive_geometry",
    "plan",
    "requests_in_budget",
    "shared_bytes",
    "state_bytes",
]

#: Engine-specific MLA cache layouts that are not "latent x one format": bytes per token per layer, vLLM's
#: records of DeepSeek's 576-value latent (kvcost.storage.formats.MLA_RECORDS, sources in data/storage_formats.md):
#: fp8_ds_mla 656 (512 fp8 NoPE + 4 fp32 scales + 64 bf16 RoPE), nvfp4_ds_mla 352 (512 E2M1 NoPE + 64 fp8 RoPE +
#: 32 fp8 scales; SM100 only). They are registry names (``formats.get("nvfp4_ds_mla")``) of family
#: ``mla_record``, refused for layers that are not MLA (:func:`check_layers`).
MLA_LAYOUTS: dict[str, int] = {name: rec[1] for name, rec in formats.MLA_RECORDS.items()}


def check_context(context: Any, name: str = "context", lo: int = 0) -> int:
    """``context`` as an int >= ``lo``; ValueError naming ``name`` otherwise."""
    if isinstance(context, bool) or not isinstance(context, int) or context < lo:
        what = "a positive" if lo == 1 else ("a non-negative" if lo == 0 else f"an integer >= {lo}, a")
        raise ValueError(f"parameter {name!r} must be {what} integer number of tokens, got {context!r}")
    return context


def kv_spec(dtype: str | CacheSpec, v_dtype: str | None = None) -> CacheSpec:
    """``dtype`` (a storage spec: ``K``, ``K/V``, ``+hadamard``, ``;skip=sliding_window``, ...; see
    :mod:`kvcost.storage.spec`) and ``v_dtype`` parsed once; errors name the parameter."""
    return parse_spec(dtype, v_dtype, param="dtype")


def kv_formats(dtype: str | CacheSpec, v_dtype: str | None) -> tuple[formats.Format, formats.Format]:
    """The K and V storage formats (V defaults to K's); errors name the parameter."""
    spec = kv_spec(dtype, v_dtype)
    return spec.k_format, spec.v_format


def _tokens_bytes(fmt: formats.Format, tokens: int, n_values: int, head_dim: int) -> Fraction:
    """Bytes of ``tokens`` rows of ``n_values`` in ``fmt``, with KIVI's fp16 residual window."""
    if tokens == 0 or n_values == 0:
        return Fraction(0)
    if fmt.residual:
        recent = min(tokens, fmt.residual)
        old = tokens - recent
        resid = formats.get(fmt.residual_format)
        return old * fmt.row_bytes(n_values, head_dim) + recent * resid.row_bytes(n_values, head_dim)
    return tokens * fmt.row_bytes(n_values, head_dim)


def check_layers(g: Geometry, dtype: str | CacheSpec, v_dtype: str | None = None, *,
                 param: str = "dtype") -> CacheSpec:
    """``dtype`` parsed (:func:`kv_spec`), refused where a format cannot store ``g``'s layers: an MLA record
    (``fp8_ds_mla``, ``nvfp4_ds_mla``) stores MLA latents of its own width only. ValueError naming ``param``."""
    spec = parse_spec(dtype, v_dtype, param=param)
    for name in dict.fromkeys((spec.k, spec.v, spec.skip_dtype if spec.skip_layers else spec.k)):
        f = formats.get(name)
        if f.family != "mla_record":
            continue
        what = (f"{name} is vLLM's per-token record of DeepSeek's MLA latent ({formats.MLA_RECORDS[name][1]} bytes "
                f"for kv_lora_rank 512 + qk_rope_head_dim 64)")
        if not g.count(MLA):
            raise ValueError(f"parameter {param!r}: {what}; {g.name} has no MLA layers")
        if g.kv_layers != g.count(MLA):
            raise ValueError(f"parameter {param!r}: {what}; {g.name} has KV layers that are not MLA")
        if g.mla_latent != f.block:
            raise ValueError(f"parameter {param!r}: {what}; {g.name}'s latent has {g.mla_latent} values, "
                             f"not {f.block}")
    return spec


def _layer_groups(g: Geometry, spec: CacheSpec, kinds: tuple[str, ...]) -> list[tuple[str, int, str, str]]:
    """``(kind, layers, K format, V format)`` per kind of KV layer, the layers the spec skips apart."""
    out = []
    for kind in kinds:
        idx = [i for i, k in enumerate(g.layer_kinds) if k == kind]
        skipped = sum(1 for i in idx if spec.skips(i, kind))
        if len(idx) - skipped:
            out.append((kind, len(idx) - skipped, spec.k, spec.v))
        if skipped:
            out.append((kind, skipped, spec.skip_dtype, spec.skip_dtype))
    return out


def layer_breakdown(g: Geometry, context: int, dtype: str | CacheSpec = "bf16",
                    v_dtype: str | None = None) -> list[dict[str, Any]]:
    """One row per kind of KV-holding layer: layers, tokens held, K, V and latent bytes (exact Fractions),
    and the K and V formats (layers a spec skips, e.g. ``nvfp4;skip=sliding_window``, are a row of
    their own, in the skip format).

    MLA layers keep one latent per token shared by K and V: it is reported as ``latent_bytes``
    (``k_bytes`` and ``v_bytes`` are 0 there), never as a K with an empty V.
    """
    context = check_context(context)
    spec = check_layers(g, dtype, v_dtype)
    rows = []
    for kind, n, kname, vname in _layer_groups(g, spec, KV_KINDS):
        kf, vf = formats.get(kname), formats.get(vname)
        tokens = min(context, g.window) if kind == SLIDING and g.window is not None else context
        k_b = v_b = lat = Fraction(0)
        if kind == MLA:
            assert g.mla_latent is not None
            lat = _tokens_bytes(kf, tokens, g.mla_latent, g.mla_latent)
        else:
            k_b = _tokens_bytes(kf, tokens, g.kv_heads * g.head_dim, g.head_dim)
            v_b = _tokens_bytes(vf, tokens, g.kv_heads * g.v_head_dim, g.v_head_dim)
        rows.append({"kind": kind, "layers": n, "tokens": tokens,
                     "k_bytes": n * k_b, "v_bytes": n * v_b, "latent_bytes": n * lat,
                     "k_format": kname, "v_format": kname if kind == MLA else vname})
    return rows


def cache_bytes(g: Geometry, context: int, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None) -> int:
    """Bytes of KV cache one sequence of ``context`` tokens holds, over all layers.

    Sliding-window layers hold ``min(context, window)`` tokens; MLA layers hold their
    latent (in ``dtype``; ``v_dtype`` does not apply; ``fp8_ds_mla`` / ``nvfp4_ds_mla`` are vLLM's 656- and
    352-byte records per token, :data:`MLA_LAYOUTS`, refused for other models); linear-attention / SSM
    layers hold no KV (see :func:`state_bytes`).
    ``dtype`` / ``v_dtype`` are :mod:`kvcost.storage.formats` names (``dtype`` may be a compound spec,
    :mod:`kvcost.storage.spec`: ``q8_0/q4_0``, ``nvfp4;skip=sliding_window``); block formats
    are counted in whole blocks per row, the total rounded up to a whole byte. Unknown format or
    negative context: ``ValueError``.
    """
    rows = layer_breakdown(g, context, dtype, v_dtype)
    total = sum((r["k_bytes"] + r["v_bytes"] + r["latent_bytes"] for r in rows), Fraction(0))
    return math.ceil(total)


def _per_token(g: Geometry, kinds: tuple[str, ...], dtype: str | CacheSpec, v_dtype: str | None) -> Fraction:
    spec = check_layers(g, dtype, v_dtype)
    total = Fraction(0)
    for kind, n, kname, vname in _layer_groups(g, spec, kinds):
        kf, vf = formats.get(kname), formats.get(vname)
        if kind == MLA:
            assert g.mla_latent is not None
            total += n * kf.row_bytes(g.mla_latent, g.mla_latent)
        else:
            total += n * (kf.row_bytes(g.kv_heads * g.head_dim, g.head_dim)
                          + vf.row_bytes(g.kv_heads * g.v_head_dim, g.v_head_dim))
    return total


def kv_bytes_per_token(g: Geometry, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None) -> float:
    """Bytes one token costs while every KV layer still holds it (context within every window).

    The short-context slope of :func:`cache_bytes`; past the sliding windows only full and
    MLA layers keep growing (:func:`growth_bytes_per_token`). KIVI's fp16 residual window is
    not included (a per-sequence cost).
    """
    return float(_per_token(g, KV_KINDS, dtype, v_dtype))


def growth_bytes_per_token(g: Geometry, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None) -> float:
    """Bytes each further token adds once the context is past every sliding window (full + MLA layers).

    0 for a model whose every KV layer slides: its cache stops growing at the window.
    """
    return float(_per_token(g, (FULL, MLA), dtype, v_dtype))


def state_bytes(g: Geometry, dtype: str | None = None) -> int | None:
    """Constant recurrent-state bytes one sequence keeps in linear-attention / SSM layers.

    ``dtype`` defaults to the config's ``mamba_ssm_cache_dtype`` when it has one, else
    bf16. 0 for a model without such layers; ``None`` when the config does not say
    enough to size the state.
    """
    if g.state_layers == 0:
        return 0
    if g.state is None:
        return None
    fmt = formats.get(dtype or g.state_dtype or "bf16")
    return math.ceil(g.state_layers * g.state.values * fmt.bytes_per_value())


def shared_bytes(g: Geometry, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None) -> int:
    """Context-independent cache metadata shared by all sequences (static per-head scales)."""
    spec = check_layers(g, dtype, v_dtype)
    heads = 1 if g.count(MLA) else g.kv_heads
    total = 0
    for _, n, kname, vname in _layer_groups(g, spec, KV_KINDS):
        per_layer = formats.fixed_bytes(kname, heads) + (0 if g.count(MLA) else formats.fixed_bytes(vname, heads))
        total += n * per_layer
    return total


def _budget_bytes(budget_gib: Any) -> int:
    if isinstance(budget_gib, bool) or not isinstance(budget_gib, (int, float)) or not (
            budget_gib > 0 and math.isfinite(budget_gib)):
        raise ValueError(f"parameter 'budget_gib' must be a positive number of GiB, got {budget_gib!r}")
    return int(budget_gib * GIB)


def requests_in_budget(g: Geometry, budget_gib: float, context: int, dtype: str | CacheSpec = "bf16",
                       v_dtype: str | None = None, include_state: bool = True,
                       state_dtype: str | None = None) -> int:
    """How many concurrent sequences of ``context`` tokens fit in ``budget_gib`` GiB of cache.

    Each sequence costs :func:`cache_bytes` plus (``include_state``) its recurrent state;
    static per-head scales are taken from the budget once.
    """
    arg = check_layers(g, dtype, v_dtype)
    budget = _budget_bytes(budget_gib) - shared_bytes(g, arg)
    per = cache_bytes(g, context, arg)
    if include_state:
        per += state_bytes(g, state_dtype) or 0
    if per <= 0:
        raise ValueError(f"parameter 'context': {context} tokens give an empty cache: no request size to divide by")
    return max(0, budget // per)


def max_context(g: Geometry, budget_gib: float, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None,
                requests: int = 1, include_state: bool = True,
                state_dtype: str | None = None) -> int | None:
    """The longest context ``requests`` concurrent sequences can each hold in ``budget_gib`` GiB.

    ``None`` when memory sets no limit (every KV layer is windowed and the windows fit);
    0 when not even an empty sequence's state fits.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ValueError(f"parameter 'requests' must be a positive integer, got {requests!r}")
    arg = check_layers(g, dtype, v_dtype)
    budget = _budget_bytes(budget_gib) - shared_bytes(g, arg)
    fixed = (state_bytes(g, state_dtype) or 0) if include_state else 0

    def fits(ctx: int) -> bool:
        return requests * (cache_bytes(g, ctx, arg) + fixed) <= budget

    if not fits(0):
        return 0
    if g.count(FULL) + g.count(MLA) == 0:
        # Only windowed layers: the cache stops growing at the largest window.
        return None if fits((g.window or 0) + 1) else _bisect(fits, 0, (g.window or 0) + 1)
    hi = 1
    while fits(hi):
        hi *= 2
    return _bisect(fits, hi // 2, hi)


def _bisect(fits: Any, lo: int, hi: int) -> int:
    """Largest x in [lo, hi) with fits(x), given fits(lo) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def context_warnings(g: Geometry, context: int) -> list[str]:
    """Warnings for a planned context: beyond ``max_position_embeddings``, or past every window."""
    context = check_context(context)
    out = []
    if g.max_position_embeddings is not None and context > g.max_position_embeddings:
        extra = " (the config's rope_scaling may extend it)" if g.rope_scaling else ""
        out.append(f"context {context} exceeds max_position_embeddings "
                   f"{g.max_position_embeddings} of {g.name}{extra}")
    if g.kv_layers and g.count(SLIDING) == g.kv_layers and g.window is not None and context > g.window:
        out.append(f"every attention layer of {g.name} sees only the last {g.window} tokens: "
                   f"the cache stops growing there, and so does what the model attends to")
    return out


@dataclass(frozen=True)
class Plan:
    """A capacity plan for one model, context and format (see :func:`plan`)."""

    model: str
    summary: str
    context: int
    dtype: str
    v_dtype: str
    bytes_per_token: float
    bytes_per_token_past_windows: float
    cache_bytes: int
    naive_cache_bytes: int
    state_bytes: int | None
    state_dtype: str
    shared_bytes: int
    budget_gib: float | None
    request_tokens: int | None
    requests: int | None
    max_context: int | None
    max_context_memory: int | None
    max_context_unbounded: bool
    max_position_embeddings: int | None
    breakdown: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    skip_layers: tuple[str, ...] = ()    # layers kept in skip_dtype (vLLM kv_cache_dtype_skip_layers)
    skip_dtype: str = "bf16"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (Fractions as floats)."""
        d = asdict(self)
        d["breakdown"] = [{k: (float(v) if isinstance(v, Fraction) else v) for k, v in row.items()}
                          for row in self.breakdown]
        d["warnings"] = list(self.warnings)
        d["notes"] = list(self.notes)
        d["skip_layers"] = list(self.skip_layers)
        d["cache_gib"] = self.cache_bytes / GIB
        d["naive_cache_gib"] = self.naive_cache_bytes / GIB
        return d


def naive_cache_bytes(g: Geometry, context: int, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None) -> int:
    """The post's formula on the config's own numbers (every layer, K and V of every KV head), in K/V formats
    (skipped layers are the post's blind spot too: every layer in K's and V's format)."""
    context = check_context(context)
    kf, vf = (formats.get(formats.MLA_RECORDS[f.name][2]) if f.family == "mla_record" else f
              for f in kv_formats(dtype, v_dtype))     # an MLA record: priced in its NoPE values' format
    layers, kvh, hd = g.naive
    return math.ceil(layers * kvh * hd * context * (kf.bytes_per_value(hd) + vf.bytes_per_value(hd)))


def plan(g: Geometry, context: int, dtype: str | CacheSpec = "bf16", v_dtype: str | None = None,
         budget_gib: float | None = None, request_tokens: int | None = None,
         state_dtype: str | None = None) -> Plan:
    """Everything a capacity planner asks, for one model at one context and format.

    ``requests`` is how many sequences of ``request_tokens`` (default: ``context``) fit in
    ``budget_gib``; ``max_context`` the longest single sequence that fits, capped at the
    model's ``max_position_embeddings`` (``max_context_memory`` is the memory limit alone).
    ``context`` and ``request_tokens`` must be at least 1; ``request_tokens`` needs a budget.
    Warnings: context beyond the model's maximum, every layer windowed, and a request that
    does not fit the budget.
    """
    context = check_context(context, lo=1)
    if request_tokens is not None and budget_gib is None:
        raise ValueError("parameter 'request_tokens' needs 'budget_gib': requests are counted in a budget")
    spec = check_layers(g, dtype, v_dtype)                               # parsed once, passed on as a CacheSpec
    kname = spec.k
    vname = spec.v
    arg: CacheSpec = spec
    rt = context if request_tokens is None else check_context(request_tokens, "request_tokens", lo=1)
    sdt = state_dtype or g.state_dtype or "bf16"
    try:
        formats.get(sdt)
    except ValueError as err:
        raise ValueError(f"parameter 'state_dtype': {err}") from None
    warnings = context_warnings(g, context)
    requests = mc = mc_mem = None
    unbounded = False
    maxpos = g.max_position_embeddings
    if budget_gib is not None:
        requests = requests_in_budget(g, budget_gib, rt, arg, state_dtype=sdt)
        mc_mem = max_context(g, budget_gib, arg, state_dtype=sdt)
        unbounded = mc_mem is None
        mc = mc_mem if maxpos is None else (maxpos if mc_mem is None else min(mc_mem, maxpos))
        if requests == 0:
            need = cache_bytes(g, rt, arg) + (state_bytes(g, sdt) or 0)
            warnings.append(f"does not fit: one request of {rt:,} tokens needs {need / GIB:.3f} GiB of KV cache, "
                            f"the budget is {budget_gib:g} GiB")
        if maxpos is not None and (mc_mem is None or mc_mem > maxpos):
            mem = "no limit (every KV layer is windowed)" if mc_mem is None else f"{mc_mem:,} tokens"
            warnings.append(f"memory alone would allow {mem}, but {g.name} is trained to "
                            f"max_position_embeddings {maxpos:,}: longest context reported as {maxpos:,}")
    return Plan(
        model=g.name, summary=g.summary(), context=context, dtype=kname, v_dtype=vname,
        bytes_per_token=kv_bytes_per_token(g, arg),
        bytes_per_token_past_windows=growth_bytes_per_token(g, arg),
        cache_bytes=cache_bytes(g, context, arg),
        naive_cache_bytes=naive_cache_bytes(g, context, arg),
        state_bytes=state_bytes(g, sdt), state_dtype=sdt,
        shared_bytes=shared_bytes(g, arg),
        budget_gib=budget_gib, request_tokens=rt if budget_gib is not None else None, requests=requests,
        max_context=mc, max_context_memory=mc_mem, max_context_unbounded=unbounded, max_position_embeddings=maxpos,
        breakdown=tuple(layer_breakdown(g, context, arg)),
        warnings=tuple(warnings), notes=g.notes, skip_layers=spec.skip_layers, skip_dtype=spec.skip_dtype,
    )


def naive_bytes_per_token(layers: int, kv_heads: int, head_dim: int, item_bytes: float = 2) -> float:
    """The post's formula: ``2 x layers x kv_heads x head_dim x item_bytes`` (K and V, every layer)."""
    return 2 * layers * kv_heads * head_dim * item_bytes

