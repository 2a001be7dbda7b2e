"""kvcost: what KV-cache quantization costs at long range.

Four layers, each importing only from its own layer or below (``make lint`` checks it):

**Primitives** (``kvcost.<module>``): one concept each.

- ``floats``, ``formats``, ``units``: float formats and correct rounding; storage formats and
  their true bytes per value (the one registry of format names); KiB/MiB/GiB
- ``quant``, ``ggml``: storage quantizers (int-k, KIVI, fp8, Hadamard; llama.cpp's blocks bit for bit)
- ``accum``, ``tensorcore``, ``fa3``: accumulation in low precision (flat, two-level, pairwise,
  Kahan, a Hopper model); Hopper's FP8 tensor core; FlashAttention-3's FP8 forward pass
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
