"""How many requests of a context one replica's KV budget holds, as an engine counts them.

- ``none`` (:func:`bytes_capacity`): every KV layer keeping each token, sliding layers their window.
- ``vllm`` (:func:`vllm_capacity`, :func:`kvcost.engines.vllm.plan`): whole blocks, hybrid groups, window - 1 +
  max_num_batched_tokens per sliding layer, skipped layers (``;skip=``) in their own dtype and page, and for
  ``turboquant_*`` the boundary layers vLLM adds to them (first and last two of a dense model, in ``auto``).
- ``llama.cpp`` (:func:`llamacpp_capacity`, :func:`kvcost.engines.llamacpp.allocate`): padded cells, the SWA
  cache, ``--swa-full``; K and V types apart (``-ctk`` / ``-ctv``).

Each returns a :class:`Capacity`: tokens, requests, the longest context one request can have, and a note
saying what the engine would be run with (or why it cannot run the format). Standard library only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvcost.engines import llamacpp, vllm
from kvcost.models.footprint import cache_bytes, kv_bytes_per_token, max_context, state_bytes
from kvcost.models.hfconfig import Geometry
from kvcost.storage import formats
from kvcost.storage.spec import CacheSpec
from kvcost.units import GIB

__all__ = ["ENGINES", "Capacity", "bytes_capacity", "llamacpp_capacity", "vllm_capacity", "vllm_cache_dtype",
           "vllm_spec"]

#: Engines whose capacity rules the plan can follow ("none": engine-independent bytes).
ENGINES = ("none", "vllm", "llama.cpp")


@dataclass(frozen=True)
class Capacity:
    """What one replica holds of one KV format: tokens, requests at the context, the longest context."""

    kv_tokens: int
    requests: int
    longest_context: int | None
    note: str = ""


def _largest(fits: Callable[[int], bool], cap: int) -> int:
    """The largest n in [0, cap] with fits(n) (fits is monotone: true up to some n, false past it)."""
    if not fits(1):
        return 0
    if fits(cap):
        return cap
    lo, hi = 1, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def bytes_capacity(g: Geometry, sp: CacheSpec, budget_gib: float, context: int) -> Capacity:
    """Engine-independent: the budget over each request's bytes (``cache_bytes`` + recurrent state)."""
    per = cache_bytes(g, context, sp) + (state_bytes(g) or 0)
    per_token = kv_bytes_per_token(g, sp)
    req = int(budget_gib * GIB // per)
    mc = max_context(g, budget_gib, sp)
    if g.max_position_embeddings is not None:
        mc = g.max_position_embeddings if mc is None else min(mc, g.max_position_embeddings)
    # every KV layer holding the token: vLLM's "GPU KV cache size" counts tokens the same way
    tokens = int(budget_gib * GIB // per_token) if per_token else 0
    return Capacity(tokens, req, mc)


def vllm_cache_dtype(name: str) -> str | None:
    """The ``--kv-cache-dtype`` vLLM stores a kvcost format as (``auto`` for bf16), or None."""
    if name == "bf16":
        return "auto"
    return formats.engine_name(name, "vllm")


def vllm_spec(g: Geometry, sp: CacheSpec) -> CacheSpec:
    """``sp`` as vLLM stores it on ``g``: a ``turboquant_*`` spec gains the boundary layers vLLM keeps in ``auto``
    (:func:`kvcost.engines.vllm.turboquant_boundary_layers`), so its bytes per token are vLLM's; else ``sp``."""
    name = vllm_cache_dtype(sp.k)
    boundary = vllm.turboquant_boundary_layers(g, name) if name and sp.k == sp.v else ()
    if not boundary or (sp.skip_layers and sp.skip_dtype != "bf16"):
        return sp
    ints = sorted({i for i in (*sp.skip_layers, *boundary) if i.isdigit()}, key=int)
    skips = (*ints, *dict.fromkeys(i for i in sp.skip_layers if not i.isdigit()))
    return CacheSpec(sp.k, sp.v, sp.rotation, sp.k_order, skips, sp.skip_dtype, sp.store)


def vllm_capacity(g: Geometry, sp: CacheSpec, budget_gib: float, tp: int, context: int, block_size: int,
                  mnbt: int) -> Capacity:
    """Tokens, requests and longest context per replica under vLLM's block pool (``budget_gib`` per GPU)."""
    name = vllm_cache_dtype(sp.k)
    skip = vllm_cache_dtype(sp.skip_dtype) if sp.skip_layers else "auto"
    if name is None or skip is None or sp.k != sp.v or sp.rotation:
        why = ("vLLM has one --kv-cache-dtype for K and V" if sp.k != sp.v else
               "vLLM does not rotate the cache" if sp.rotation else
               f"vLLM has {', '.join(sorted(vllm.CACHE_DTYPES))}")
        return Capacity(0, 0, None, f"{sp.label}: not a vLLM --kv-cache-dtype ({why})")

    def run(n: int) -> vllm.VllmPlan:
        return vllm.plan(g, budget_gib, tp, block_size, n, name, mnbt, skip_layers=sp.skip_layers, skip_dtype=skip)

    v = run(context)
    longest = _largest(lambda n: run(n).max_concurrency >= 1, g.max_position_embeddings or 2 ** 24)
    boundary = vllm.turboquant_boundary_layers(g, name)
    skip_text = (f" --kv-cache-dtype-skip-layers {','.join(sp.skip_layers)} (kept in {skip})"
                 if sp.skip_layers else "")
    if boundary:
        skip_text += (f" (vLLM keeps TurboQuant's boundary layers {','.join(boundary)} in {skip}: "
                      f"kv_cache_dtype_skip_layers {','.join(v.skip_layers)})")
    sizes = "" if len(set(v.block_sizes)) <= 1 else f" (tokens per block {'/'.join(map(str, v.block_sizes))})"
    return Capacity(v.kv_tokens, int(v.max_concurrency), longest,
                    f"vLLM --kv-cache-dtype {name}{skip_text}: {v.num_blocks:,} blocks of {block_size}, groups "
                    f"{'+'.join(v.groups)}{sizes}, {v.blocks_per_request:,} blocks per request"
                    + "".join(f"; {w}" for w in v.warnings if "pages" in w or "block size" in w))


def llamacpp_capacity(g: Geometry, sp: CacheSpec, budget_bytes: int, context: int, swa_full: bool) -> Capacity:
    """Cells, requests and longest context per replica as llama.cpp allocates: -c N x context, -np N."""
    tk, tv = formats.engine_name(sp.k, "llama.cpp"), formats.engine_name(sp.v, "llama.cpp")
    if tk is None or tv is None or sp.skip_layers or sp.rotation:
        return Capacity(0, 0, None, f"{sp.label}: not a llama.cpp cache type (-ctk/-ctv: "
                                    f"{', '.join(llamacpp.GGML_TYPES)})")

    def need(n_seq: int, ctx: int) -> int:
        a = llamacpp.allocate(g, n_seq * ctx, tk, tv, n_seq=n_seq, swa_full=swa_full)
        return a.kv_bytes + a.recurrent_bytes

    if need(1, context) > budget_bytes:
        n = 0
    else:
        lo, hi = 1, 2
        while need(hi, context) <= budget_bytes:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid, context) <= budget_bytes else (lo, mid)
        n = lo
    longest = _largest(lambda c: need(1, c) <= budget_bytes, g.max_position_embeddings or 2 ** 24)
    k = max(n, 1)
    cells = llamacpp.allocate(g, k * context, tk, tv, n_seq=k, swa_full=swa_full).cells * k
    return Capacity(cells, n, longest, f"llama.cpp -ctk {tk} -ctv {tv} -c {k * context} -np {k}"
                                       + (" --swa-full" if swa_full else ""))
