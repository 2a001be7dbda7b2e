"""kvcost: what KV-cache quantization costs at long range.

Four layers, each importing only from its own layer or below (``make lint`` checks it):

**Primitives** (``kvcost.<module>``): one concept each.

- ``floats``, ``formats``, ``units``: float formats and correct rounding; storage formats and
  their true bytes per value (the one registry of format names); KiB/MiB/GiB
- ``quant``, ``ggml``: storage quantizers (int-k, KIVI, fp8, Hadamard; llama.cpp's blocks bit for bit)
- ``numerics``: ``accum``, ``tensorcore``, ``instructions``, ``fa3``: accumulation in low precision
  (flat, two-level, pairwise, Kahan, a Hopper model); every GPU's tensor-core units (bit for bit
  MMA-Sim); FlashAttention-3's FP8 forward pass on them. ``from kvcost import accum`` (and
  ``tensorcore``, ``fa3``, ``fa3kernel``, ``instructions``) reaches them through this package
- ``attention``, ``synthetic``: single-query attention in the post's arithmetic; the post's caches
- ``hfconfig``, ``models``, ``sizing``, ``llamacpp``, ``vllm``, ``fleet``: model configs, the
  model registry, cache bytes, what the engines allocate, fleet plans
- ``realkv``, ``realmodel``: real keys and values, a real decoder
- ``post``, ``stats``, ``params``, ``output``: the post's printed output, Wilson intervals,
  parameter checks, result folders

**Experiments** (``kvcost.experiments.<topic>``): what each notebook computes, its tables.

**Claims** (``kvcost.claims.<topic>``): each notebook's checks against the post's printed
output, its errata and its verdict text; ``claims.report`` renders them.

**Interfaces**: the notebooks, ``cli``, ``run``/``runner``, ``sweep``, ``bench``, ``plotting``,
``notebook_params`` (each notebook's parameters, declared once). docs/architecture.md has the map.
"""

__version__ = "0.1.0"

from importlib import import_module as _import_module

# The numerics modules, reachable as kvcost.<name> (``from kvcost import tensorcore``), loaded on first
# use so that ``import kvcost`` stays light (numba compiles nothing until a kernel is called).
_NUMERICS = ("accum", "fa3", "fa3kernel", "instructions", "tensorcore")


def __getattr__(name: str):
    if name in _NUMERICS:
        return _import_module(f"kvcost.numerics.{name}")
    raise AttributeError(f"module 'kvcost' has no attribute {name!r}")
