"""Numerics: float arithmetic in low precision, the tensor-core units of each GPU, attention kernels.

- :mod:`.instructions`: the registry of tensor-core / matrix-core instructions (MMA-Sim's names),
  their arithmetic read from ``data/tensorcore/units.csv``;
- :mod:`.accum`: running sums in any float format (flat, two-level, pairwise, Kahan);
- :mod:`.tensorcore`: ``matmul`` on any registered unit, bit for bit MMA-Sim; ``mma`` / ``dot``, the
  products-only FP8 model;
- :mod:`.fa3`, :mod:`.fa3kernel`: FlashAttention-3's FP8 forward pass on a GPU's unit;
- :mod:`.kernels`: the attention kernels as they run, their facts as data (:mod:`.kernel_facts`, standard
  library only, which the planner reads);
- ``_jit``: the compiled arithmetic they share (private to this subpackage).
"""
