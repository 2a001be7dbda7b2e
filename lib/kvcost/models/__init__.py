"""Models as the cache sees them: Hugging Face configs read into a geometry (:mod:`.hfconfig`), the
registry of cited model records (:mod:`.registry`), a replica's weight bytes (:mod:`.weights`), KV-cache
bytes of a geometry and the budget arithmetic on them (:mod:`.footprint`, also reachable as
``kvcost.sizing``), and the real decoders run on the CPU: their registry (:mod:`.decoder_registry`), the
loader and cache hook (:mod:`.decoders`), the sliding-window attention that scales (:mod:`.sliding_window`)
and a text window's perplexity, KL and top-1 (:mod:`.window_metrics`).
"""
