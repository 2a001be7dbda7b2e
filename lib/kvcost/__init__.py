"""kvcost: what KV-cache quantization costs at long range.

One small module per concept; notebooks import these and stay thin.

- ``sizing``   cache bytes from model configs (GQA, MLA, sliding windows, hybrids), capacity planning
- ``formats``  storage formats and their true bytes per value (fp8, llama.cpp blocks, KIVI groups)
- ``floats``   floating-point formats (eXmY) and correctly rounded ``round_to``
- ``accum``    running-sum accumulation in low precision: flat, two-level, pairwise, Kahan, Hopper model
- ``quant``    storage quantizers as engines ship them (int-k, fp8 scales, ggml blocks, Hadamard)
- ``needle``   the needle-in-a-haystack attention experiment
- ``vendors``  published measurements and the arithmetic that checks them
- ``plotting`` one figure style, byte-reproducible files
"""

__version__ = "0.1.0"
