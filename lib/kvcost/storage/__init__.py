"""Storage formats as a KV cache keeps them: the one spec parser (:mod:`kvcost.storage.spec`) and the
block-scaled float quantizers of 2026 engines (:mod:`kvcost.storage.blockfloat`).

The registry of format names, their bytes and engine spellings is :mod:`kvcost.storage.formats`; the one
``roundtrip(x, fmt)`` for every name is :func:`kvcost.storage.quant.roundtrip`. This ``__init__`` imports only
the standard-library parser, so ``python -m kvcost`` stays light.
"""
from kvcost.storage.spec import CacheSpec, parse_spec

__all__ = ["CacheSpec", "parse_spec"]
