"""KV-cache storage formats and the bytes they really take.

A format is how one K (or V) value is stored, *including* whatever metadata the
format needs to decode it: llama.cpp's block scales, a KIVI group's scale and
zero point, an fp8 cache's per-token scales. ``bytes_per_value`` and
``bits_per_value`` give the amortized cost exactly (a :class:`fractions.Fraction`
where it matters), so "q8_0 is 8-bit" becomes "q8_0 is 8.5 bits".

Names understood by :func:`get`:

=========================  ==========================================================
``fp32``, ``bf16``,        plain floats: 4, 2, 2 bytes (llama.cpp spellings ``f32``,
``fp16``                   ``f16``; ``float16``/``bfloat16``/``float32`` also accepted)
``fp8_e4m3``,              one byte; a per-tensor scale is negligible and not counted
``fp8_e5m2``,              (``fp8`` = ``fp8_e4m3``, vLLM's default fp8 cache). The element
``fp8_e4m3fnuz``           types are ml_dtypes' ``float8_e4m3fn`` (OCP, max 448, NaN, no inf),
                           ``float8_e5m2`` and ``float8_e4m3fnuz`` (MI300: max 240, bias 8, one
                           NaN, no -0). The bare ``e4m3`` is refused: :mod:`kvcost.floats` reads
                           it as the IEEE-style eXmY format (max 240, with inf)
``fp8_e4m3_head``          one byte plus one fp32 scale per KV head per layer (a
(and ``_e5m2_head``)       constant, not per token: counted by :func:`fixed_bytes`)
``fp8_e4m3_token``         one byte plus one fp32 scale per token per KV head, i.e.
(and ``_e5m2_token``)      4 bytes per ``head_dim`` values
``q8_0`` ``q4_0``          llama.cpp blocks of 32 values: 34, 18, 20, 22, 24, 18
``q4_1`` ``q5_0``          bytes per block (fp16 scale, fp16 min for ``_1``, high
``q5_1`` ``iq4_nl``        bits for ``q5``; ``iq4_nl`` is a 4-bit non-linear table)
``int{k}_g{g}``            KIVI-style asymmetric int-k in groups of g values, one fp16
                           scale and one fp16 zero point per group (k in 1..8)
``int{k}_token``,          the post's symmetric absmax int-k (k in 2..16): one fp32 scale
``int{k}_channel``         per token per KV head (4 bytes per ``head_dim`` values), or one
                           per channel for the whole sequence (constant, not counted)
``kivi{k}[_g{g}][_r{R}]``  int-k groups (default g=32) plus a full-precision (fp16)
                           residual window of the R most recent tokens (default 128),
                           the configuration of the KIVI paper
``nvfp4``,                 E2M1 values and a UE4M3 (e4m3fn) scale per 16 values, plus one
``nvfp4_4over6``           fp32 tensor scale (not counted): hd/2 + hd/16 bytes per head
``mxfp4``                  OCP MX v1.0: E2M1 elements, an E8M0 scale per 32 values (4.25 bits)
``mxfp8``                  SGLang's ``mxfp8``: E4M3 elements and a UE8M0 scale per 32 (8.25 bits),
                           2^ceil(log2(max/448)), elements clamped to 448 and rounded to nearest
                           even (OCP MXFP8 takes 2^(floor(log2 max) - 8) and saturates: it is
                           one binade finer where max/2^k is in (448, 512) and clips there)
``fp4_mx_block16``         SGLang's MX-style E2M1 blocks of 16 (4.5 bits): one biased exponent
                           byte per block, 2^ceil(log2(max/6)), elements rounded to nearest
                           with ties away from zero and never clipped (not the OCP rule)
``turboquant_k8v4``,       vLLM's TurboQuant presets: K as fp8 e4m3 (k8) or Lloyd-Max codes of
``turboquant_4bit_nc``,    the Hadamard-rotated unit vector plus an fp16 norm (4 / 3 bits,
``turboquant_k3v4_nc``,    ``_nc``: the codes' vector re-normalized on read), V as asymmetric
``turboquant_3bit_nc``     uniform 4 / 3-bit codes with an fp16 scale and zero per head vector; K
                           and V share one slot per token and head, whose bytes
                           (:func:`turboquant_slot`) are split evenly between K and V here
``fp8_ds_mla``,            vLLM's per-token records of DeepSeek's 576-value MLA latent (656
``nvfp4_ds_mla``           and 352 bytes, :data:`MLA_RECORDS`): MLA layers only, no round trip
=========================  ==========================================================

Engine spellings (vLLM ``--kv-cache-dtype``, llama.cpp ``-ctk``/``-ctv``, SGLang
``--kv-cache-dtype``) are each format's :attr:`Format.engines`; :func:`engine_name` and
:func:`from_engine` translate both ways, and :func:`get` accepts the unambiguous ones
(``float16``, ``fp8_per_token_head``, ``int8_per_token_head``, ...). A name an engine has (or had) that kvcost
knows but does not model (:data:`ENGINE_UNMODELLED`: SGLang's refused ``fp4_e2m1``, vLLM's ROCm-only Octave and
UltraQuant caches) is an error that says which engine's name it is, why it is not modelled and what is. Sources of
every layout: ``data/storage_formats.md`` and ``data/ggml_formats.md``.

This module imports only the standard library so ``python -m kvcost`` stays fast.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "Format", "get", "names", "all_names", "bytes_per_value", "bits_per_value", "row_bytes",
    "fixed_bytes", "describe", "describe_full", "engine_name", "from_engine", "ENGINES", "GGML_BLOCKS", "BLOCK_FLOATS",
    "NAMES_2026", "TURBOQUANT", "TurboQuantSlot", "turboquant_slot", "MLA_RECORDS", "ENGINE_UNMODELLED",
]

#: llama.cpp block formats usable for the KV cache (ggml-common.h block structs):
#: name -> (values per block, bytes per block, payload bits per value, layout).
GGML_BLOCKS: dict[str, tuple[int, int, int, str]] = {
    "q8_0": (32, 34, 8, "32 int8 + fp16 scale"),
    "q4_0": (32, 18, 4, "32 x 4-bit + fp16 scale"),
    "q4_1": (32, 20, 4, "32 x 4-bit + fp16 scale + fp16 min"),
    "q5_0": (32, 22, 5, "32 x 4-bit + 32 high bits + fp16 scale"),
    "q5_1": (32, 24, 5, "32 x 4-bit + 32 high bits + fp16 scale + fp16 min"),
    "iq4_nl": (32, 18, 4, "32 x 4-bit indices into a non-linear table + fp16 scale"),
}

#: Block-scaled float formats (data/storage_formats.md): name -> (values per block, element type,
#: element bits, block-scale type, scale bytes per block, family, recipe, description). Element and scale
#: types are ml_dtypes names; ``nvfp4`` also keeps one fp32 scale per tensor, not counted. The recipe is how
#: the quantizer (kvcost.storage.blockfloat) computes the block scale and rounds the elements: ``ocp`` (OCP MX
#: v1.0), ``sglang`` (SGLang's ceiling rule: fp4_mx_block16's ceil(log2(max/6)) exponent, ties away from zero, no
#: saturation; mxfp8's ceil(log2(max/448)) exponent, nearest even), ``""`` for NVFP4 (its own recipes). ``mxfp8``
#: is reached from engines only through SGLang's ``--kv-cache-dtype mxfp8`` (vLLM 0.33.0's CacheDType has no MX
#: name), so it is SGLang's recipe; OCP MXFP8 is ``blockfloat.mx_roundtrip(x, "float8_e4m3fn", 32)``.
BLOCK_FLOATS: dict[str, tuple[int, str, int, str, int, str, str, str]] = {
    "nvfp4": (16, "float4_e2m1fn", 4, "float8_e4m3fn", 1, "nvfp4", "",
              "NVFP4: E2M1 values, a UE4M3 scale per 16, an fp32 tensor scale (not counted)"),
    "nvfp4_4over6": (16, "float4_e2m1fn", 4, "float8_e4m3fn", 1, "nvfp4", "",
                     "NVFP4 whose block scale is max/6 or max/4, the one with the smaller squared error"),
    "mxfp4": (32, "float4_e2m1fn", 4, "float8_e8m0fnu", 1, "mx", "ocp",
              "OCP MXFP4: E2M1 values, an E8M0 scale per 32"),
    "fp4_mx_block16": (16, "float4_e2m1fn", 4, "float8_e8m0fnu", 1, "mx", "sglang",
                       "SGLang fp4_mx_block16: E2M1 values (ties away from zero, never clipped), a biased exponent "
                       "2^ceil(log2(max/6)) per 16 (E8M0 encoding)"),
    "mxfp8": (32, "float8_e4m3fn", 8, "float8_e8m0fnu", 1, "mx", "sglang",
              "SGLang mxfp8: E4M3 values (nearest even, clamped to 448), a UE8M0 scale 2^ceil(log2(max/448)) per 32 "
              "(OCP MXFP8's is 2^(floor(log2 max) - 8), saturating)"),
}

#: vLLM's TurboQuant presets (``vllm/model_executor/layers/quantization/turboquant/config.py``, ``TQ_PRESETS``;
#: data/storage_formats.md): name -> (key bits: 8 = fp8 e4m3 keys, 3 / 4 = Lloyd-Max codes; value bits;
#: norm correction).
TURBOQUANT: dict[str, tuple[int, int, bool]] = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}
_TQ_NORM_BYTES = 2        # the key's vec_norm, fp16 (vLLM >= 0.20; PR #38479 as merged reserved 2 more: res_norm)
_TQ_VALUE_META_BYTES = 4  # the value's fp16 scale and fp16 zero (its minimum)

#: The fp8 element types of the ``fp8_*`` names (ml_dtypes spellings).
_FP8_ELEMENTS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz"}

#: vLLM's per-token MLA records for DeepSeek's latent (kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, one
#: "head"), data/storage_formats.md: name -> (latent values, bytes per token and layer, the per-value format the
#: post's naive formula prices it in, layout). ``fp8_ds_mla``: vllm ``flashmla_sparse.py`` at commit 008a0c31 and
#: ``MLAAttentionSpec.real_page_size_bytes`` at 001cabc1; ``nvfp4_ds_mla`` (SM100 only): ``flashmla_sparse.py`` at
#: 008a0c31 and in the vLLM 0.33.0 release, whose ``MLAAttention.get_kv_cache_spec`` (mla_attention.py) sets
#: ``state_content_bytes`` 352. They size MLA layers only; they are records, not per-value formats, and have no
#: round trip here.
MLA_RECORDS: dict[str, tuple[int, int, str, str]] = {
    "fp8_ds_mla": (576, 656, "fp8_e4m3", "512 fp8 e4m3 NoPE values + 4 fp32 scales (one per 128) + 64 bf16 RoPE "
                                         "values = 656 bytes per token"),
    "nvfp4_ds_mla": (576, 352, "nvfp4", "512 E2M1 NoPE values (256 B) + 64 unscaled fp8 e4m3 RoPE values + 32 "
                                        "e4m3 NoPE scales (one per 16) = 352 bytes per token (SM100 only)"),
}

#: Engine spellings: engine -> {engine's name: kvcost name}. vLLM ``--kv-cache-dtype``
#: (vllm/config/cache.py ``CacheDType``), llama.cpp ``-ctk``/``-ctv`` (``kv_cache_types`` in
#: common/arg.cpp), SGLang ``--kv-cache-dtype`` (sgl-project/sglang python/sglang/srt/server_args.py at commit
#: 001067ff, ``kv_cache_dtype`` choices, the same as the SGLang 0.5.23 release's but for fp4_e2m1); sources in
#: data/storage_formats.md. Names known and not modelled: :data:`ENGINE_UNMODELLED`. ``auto`` (the model's dtype) is not
#: a format and is left to the engine models. SGLang's ``fp8_e4m3`` / ``fp8_e5m2`` are ROCm's fnuz type on HIP
#: (one name, two element types, as vLLM's ``fp8``): the CUDA meaning is listed.
ENGINES: dict[str, dict[str, str]] = {
    "vllm": {"float16": "fp16", "bfloat16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
             "fp8_e5m2": "fp8_e5m2", "fp8_per_token_head": "fp8_e4m3_token",
             "int8_per_token_head": "int8_token", "int4_per_token_head": "int4_token",
             "nvfp4": "nvfp4", "nvfp4_4over6": "nvfp4_4over6", "fp8_inc": "fp8_e4m3",
             **{n: n for n in TURBOQUANT}, **{n: n for n in MLA_RECORDS}},
    "llama.cpp": {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
                  "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"},
    "sglang": {"bf16": "bf16", "bfloat16": "bf16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
               "mxfp8": "mxfp8", "nvfp4": "nvfp4", "fp4_mx_block16": "fp4_mx_block16"},
}

#: Engine names kvcost knows but does not model, with why: engine -> {name: why}. :func:`get` and
#: :func:`from_engine` raise with the why and the engine's modelled names. Sources: data/storage_formats.md.
#: SGLang's ``fp4_e2m1``: ``configure_kv_cache_dtype`` (python/sglang/srt/mem_cache/kv_cache_dtype.py at commit
#: 10a75eae) raised on it while server_args.py at 001067ff still listed it; the SGLang 0.5.23 release drops it from
#: the choices (sglang/srt/arg_groups/fields/model.py). vLLM 0.33.0's ``CacheDType`` (vllm/config/cache.py, release
#: commit 4ba787ec9) adds the Octave and UltraQuant caches, served only by ROCm backends (vllm/platforms/rocm.py).
ENGINE_UNMODELLED: dict[str, dict[str, str]] = {
    "sglang": {"fp4_e2m1": "SGLang refused it ('--kv-cache-dtype=fp4_e2m1 is deprecated. Use "
                           "--kv-cache-dtype=fp4_mx_block16.', configure_kv_cache_dtype in "
                           "python/sglang/srt/mem_cache/kv_cache_dtype.py at sgl-project/sglang 10a75eae) and the "
                           "SGLang 0.5.23 release no longer offers it (sglang/srt/arg_groups/fields/model.py); its "
                           "replacement is kvcost's fp4_mx_block16"},
    "vllm": {
        **{n: f"vLLM 0.33.0's ROCm Octave cache ({k}, {v}-bit V, Lloyd-Max codes of sign-flipped Hadamard-rotated "
              "values with fp16 scales; ROCM_OCTAVE backend, RDNA3 / CDNA3 only, "
              "vllm/v1/attention/ops/rocm_octave.py): its slot bytes depend on the model's RoPE width and it has no "
              "quantizer here"
           for n, k, v in (("octave_k3v4", "K 4-bit on the RoPE blocks and 3-bit on the rest, in 64-wide blocks", 4),
                           ("octave_k3v3", "K 4-bit on the RoPE blocks and 3-bit on the rest, in 64-wide blocks", 3),
                           ("octave_k3v3_compact", "K 3-bit under one whole-head rotation and one scale", 3))},
        "ultraquant_4bit": "vLLM 0.33.0's ROCm UltraQuant cache (E2M1 codes and a UE8M0 scale 2^round(log2(0.156 "
                           "max)) per 32, Hadamard-rotated K; ULTRAQUANT backend, vllm/v1/attention/ops/ultraquant/"
                           "format.py): its rounding and rotation have no quantizer here",
    },
}

_PLAIN: dict[str, tuple[int, str]] = {
    "fp32": (4, "IEEE float32"),
    "bf16": (2, "bfloat16"),
    "fp16": (2, "IEEE float16"),
}

_ALIASES = {
    "f32": "fp32", "float32": "fp32", "float": "fp32",
    "f16": "fp16", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
    "float8_e4m3fnuz": "fp8_e4m3fnuz",
    # vLLM's per-token-head caches are the post's per-token layouts (one fp32 scale per token and KV head)
    "fp8_per_token_head": "fp8_e4m3_token", "int8_per_token_head": "int8_token",
    "int4_per_token_head": "int4_token",
    # the reference that stores nothing: one name ("none" in the planner's tables)
    "none": "exact",
}

#: Bare element names that mean different formats in different libraries: refused with the choices.
_AMBIGUOUS = {
    "e4m3": "'e4m3' is ambiguous: kvcost.floats reads it as the IEEE-style eXmY format (bias 7, inf, max 240); "
            "as a storage format say 'fp8_e4m3' (ml_dtypes float8_e4m3fn: OCP, max 448) or 'fp8_e4m3fnuz' "
            "(float8_e4m3fnuz: MI300, max 240, no inf, no -0)",
    "e5m2": "'e5m2' is ambiguous: kvcost.floats reads it as the eXmY format; as a storage format say 'fp8_e5m2' "
            "(ml_dtypes float8_e5m2)",
}

_SCALE_BYTES_FP8 = 4      # fp32 scales, as vLLM stores k_scale / v_scale
_GROUP_META_BYTES = 4     # KIVI: one fp16 scale + one fp16 zero point per group
_KIVI_DEFAULT_GROUP = 32
_KIVI_DEFAULT_RESIDUAL = 128


@dataclass(frozen=True)
class Format:
    """One storage format for K or V values.

    ``block`` values share ``block_bytes`` bytes (payload and metadata together).
    ``block == 0`` means the block is one head vector of ``head_dim`` values, so the
    cost depends on the head size (per-token fp8 scales). ``residual`` recent tokens
    are kept in ``residual_format`` instead (KIVI's full-precision window).
    """

    name: str
    description: str
    payload_bits: int
    block: int
    block_bytes: Fraction
    scale: str = "none"            # none | tensor | head | token | channel | block | group
    residual: int = 0
    residual_format: str = "fp16"
    per_head_meta_bytes: int = 0   # constant bytes per KV head per layer (static scales)
    #: which quantizer stores it (kvcost.storage.quant.roundtrip dispatches on it): float | fp8 | ggml | intk |
    #: kivi | mx | nvfp4 | turboquant; ``mla_record`` (vLLM's fp8_ds_mla / nvfp4_ds_mla) sizes MLA layers only and
    #: has no round trip
    family: str = "float"
    element: str = ""              # the stored element type (ml_dtypes name, or int8/uint4 codes)
    scale_format: str = ""         # the block / group / token scale's type ("" when none is stored)
    #: how the quantizer computes an ``mx`` block (kvcost.storage.blockfloat.MX_RECIPES: ``ocp`` | ``sglang``)
    recipe: str = ""

    @property
    def engines(self) -> tuple[tuple[str, str], ...]:
        """``(engine, engine's name)`` pairs that store this format (vLLM, llama.cpp, SGLang)."""
        return tuple((e, n) for e, table in ENGINES.items() for n, f in table.items() if f == self.name)

    @property
    def channel_blocks(self) -> bool:
        """True when what is stored depends on which channels are neighbours: values share a scale in
        blocks (or groups) of consecutive channels shorter than a head, or (TurboQuant) K is rotated by a
        Hadamard matrix in the channels' order. K's channel order matters for these."""
        return (self.family in ("ggml", "mx", "nvfp4", "turboquant")
                or (self.family == "intk" and self.scale == "group"))

    def bytes_per_value(self, head_dim: int | None = None) -> Fraction:
        """Exact amortized bytes per stored value (``head_dim`` only matters for per-token scales and
        TurboQuant's slots, default 128)."""
        if self.family == "turboquant":
            d = 128 if head_dim is None else _positive_int("head_dim", head_dim)
            return Fraction(turboquant_slot(self.name, d).slot_aligned, 2 * d)
        if self.block == 0:
            d = 128 if head_dim is None else _positive_int("head_dim", head_dim)
            return Fraction(self.payload_bits, 8) + Fraction(_SCALE_BYTES_FP8, d)
        return Fraction(self.block_bytes) / self.block

    def bits_per_value(self, head_dim: int | None = None) -> float:
        """Amortized bits per stored value, metadata included (a float)."""
        return float(8 * self.bytes_per_value(head_dim))

    def row_bytes(self, n_values: int, head_dim: int | None = None) -> Fraction:
        """Bytes one token's row of ``n_values`` values takes in one layer (K or V alone).

        Block formats are stored whole blocks along the row (llama.cpp quantizes the
        ``n_kv_heads * head_dim`` row), so a row that is not a multiple of the block
        is padded up. Group formats (KIVI) are amortized: groups may run along tokens.
        """
        n = _nonneg_int("n_values", n_values)
        if self.family == "turboquant":
            d = 128 if head_dim is None else _positive_int("head_dim", head_dim)
            return math.ceil(n / d) * Fraction(turboquant_slot(self.name, d).slot_aligned, 2)
        if self.block == 0:
            d = 128 if head_dim is None else _positive_int("head_dim", head_dim)
            vectors = math.ceil(n / d)
            return Fraction(n * self.payload_bits, 8) + vectors * _SCALE_BYTES_FP8
        if self.scale == "block":
            return math.ceil(n / self.block) * Fraction(self.block_bytes)
        return n * self.bytes_per_value()


@dataclass(frozen=True)
class TurboQuantSlot:
    """Bytes of one token's K and V in one KV head under a TurboQuant preset (vLLM's ``TurboQuantConfig``):
    ``key`` (``key_packed_size``), ``value`` (``value_packed_size``), ``slot`` (their sum) and
    ``slot_aligned`` (rounded up to even, what a page holds per head and token)."""

    name: str
    head_dim: int
    key_bits: int
    value_bits: int
    norm_correction: bool
    key: int
    value: int

    @property
    def slot(self) -> int:
        return self.key + self.value

    @property
    def slot_aligned(self) -> int:
        return self.slot + self.slot % 2


def turboquant_slot(name: str, head_dim: int = 128) -> TurboQuantSlot:
    """The :class:`TurboQuantSlot` of preset ``name`` at ``head_dim``: K ``head_dim`` fp8 bytes (k8) or
    ``ceil(head_dim * bits / 8)`` code bytes + a 2-byte fp16 norm; V ``ceil(head_dim * bits / 8)`` + an fp16
    scale and zero. At head_dim 128: 196, 134, 118, 102 bytes (PR #38479's table, which reserved a second
    2-byte norm for the MSE-key presets, reads 196, 136, 120, 104)."""
    if name not in TURBOQUANT:
        raise ValueError(f"parameter 'name' must be a TurboQuant preset, one of {list(TURBOQUANT)}, got {name!r}")
    d = _positive_int("head_dim", head_dim)
    kb, vb, nc = TURBOQUANT[name]
    key = d if kb == 8 else math.ceil(d * kb / 8) + _TQ_NORM_BYTES
    value = math.ceil(d * vb / 8) + _TQ_VALUE_META_BYTES
    return TurboQuantSlot(name, d, kb, vb, nc, key, value)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name!r} must be a positive integer, got {value!r}")
    return value


def _nonneg_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name!r} must be a non-negative integer, got {value!r}")
    return value


def _build(name: str) -> Format:
    if name == "exact":
        return Format("exact", "no storage rounding: values kept as computed (float64), the reference", 64, 1,
                      Fraction(8), family="exact", element="float64")
    if name in _PLAIN:
        nbytes, desc = _PLAIN[name]
        element = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[name]
        return Format(name, desc, 8 * nbytes, 1, Fraction(nbytes), element=element)
    if name in GGML_BLOCKS:
        block, nbytes, bits, layout = GGML_BLOCKS[name]
        return Format(name, f"llama.cpp {name}: {layout} = {nbytes} bytes per {block} values",
                      bits, block, Fraction(nbytes), scale="block", family="ggml",
                      element="int8" if name == "q8_0" else f"uint{bits}", scale_format="float16")
    if name in BLOCK_FLOATS:
        block, element, bits, scale_t, scale_bytes, family, recipe, desc = BLOCK_FLOATS[name]
        nbytes = Fraction(block * bits, 8) + scale_bytes
        return Format(name, f"{desc} = {nbytes} bytes per {block} values", bits, block, nbytes, scale="block",
                      family=family, element=element, scale_format=scale_t, recipe=recipe)
    if name in MLA_RECORDS:
        width, nbytes, _, layout = MLA_RECORDS[name]
        return Format(name, f"vLLM {name}, an MLA record of DeepSeek's {width}-value latent: {layout}",
                      4 if name.startswith("nvfp4") else 8, width, Fraction(nbytes), scale="block",
                      family="mla_record", element="float4_e2m1fn" if name.startswith("nvfp4") else "float8_e4m3fn",
                      scale_format="float8_e4m3fn" if name.startswith("nvfp4") else "float32")
    if name in TURBOQUANT:
        kb, vb, nc = TURBOQUANT[name]
        key = "fp8 e4m3 keys" if kb == 8 else (f"{kb}-bit Lloyd-Max codes of Hadamard-rotated unit keys + fp16 norm"
                                               + (" (norm-corrected)" if nc else ""))
        return Format(name, f"vLLM TurboQuant: {key}, {vb}-bit uniform values + fp16 scale and zero per head vector; "
                            f"{turboquant_slot(name).slot_aligned} bytes per token and head (K and V) at head_dim 128",
                      kb, 0, Fraction(0), scale="token", family="turboquant",
                      element="float8_e4m3fn" if kb == 8 else f"uint{kb}", scale_format="float16")
    m = re.fullmatch(r"fp8_(e4m3|e5m2|e4m3fnuz)(?:_(tensor|head|token))?", name)
    if m:
        kind, scale = m.group(1), m.group(2) or "tensor"
        element = _FP8_ELEMENTS[kind]
        base = f"fp8 {kind.upper()}"             # notebook 01's table prints these descriptions
        if scale == "tensor":
            return Format(name, f"{base}, one per-tensor scale (negligible, not counted)", 8, 1,
                          Fraction(1), scale="tensor", family="fp8", element=element)
        if scale == "head":
            return Format(name, f"{base}, one static fp32 scale per KV head per layer", 8, 1,
                          Fraction(1), scale="head", per_head_meta_bytes=_SCALE_BYTES_FP8, family="fp8",
                          element=element, scale_format="float32")
        return Format(name, f"{base}, one fp32 scale per token per KV head", 8, 0,
                      Fraction(0), scale="token", family="fp8", element=element, scale_format="float32")
    m = re.fullmatch(r"int(\d+)_(token|channel)", name)
    if m:
        bits, axis = int(m.group(1)), m.group(2)
        if not 2 <= bits <= 16:
            raise ValueError(f"format {name!r}: bits must be between 2 and 16, got {bits}")
        if axis == "token":
            return Format(name, f"int{bits} symmetric, one fp32 scale per token per KV head", bits, 0,
                          Fraction(0), scale="token", family="intk", element=f"int{bits}", scale_format="float32")
        return Format(name, f"int{bits} symmetric, one fp32 scale per channel per KV head for the whole "
                            "sequence (constant, not counted per token)", bits, 1, Fraction(bits, 8),
                      scale="channel", family="intk", element=f"int{bits}", scale_format="float32")
    m = re.fullmatch(r"int(\d+)_g(\d+)", name)
    if m:
        bits, group = int(m.group(1)), int(m.group(2))
        _check_int_k(name, bits, group)
        return Format(name, f"int{bits} asymmetric, fp16 scale + fp16 zero per {group} values",
                      bits, group, Fraction(group * bits, 8) + _GROUP_META_BYTES, scale="group", family="intk",
                      element=f"uint{bits}", scale_format="float16")
    m = re.fullmatch(r"kivi(\d+)(?:_g(\d+))?(?:_r(\d+))?", name)
    if m:
        bits = int(m.group(1))
        group = int(m.group(2)) if m.group(2) else _KIVI_DEFAULT_GROUP
        residual = int(m.group(3)) if m.group(3) else _KIVI_DEFAULT_RESIDUAL
        _check_int_k(name, bits, group)
        return Format(name, f"KIVI int{bits}, groups of {group} (fp16 scale + zero), "
                            f"last {residual} tokens in fp16",
                      bits, group, Fraction(group * bits, 8) + _GROUP_META_BYTES, scale="group",
                      residual=residual, family="kivi", element=f"uint{bits}", scale_format="float16")
    raise ValueError(f"unknown format {name!r}; known: {names()} "
                     "(plus int{k}_token, int{k}_channel, int{k}_g{g}, kivi{k}[_g{g}][_r{R}], "
                     "fp8_e4m3_head/_token, fp8_e5m2_head/_token, fp8_e4m3fnuz_head/_token)")


def _check_int_k(name: str, bits: int, group: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"format {name!r}: bits must be between 1 and 8, got {bits}")
    if group < 1:
        raise ValueError(f"format {name!r}: group size must be >= 1, got {group}")


_CACHE: dict[str, Format] = {}


def get(fmt: str | Format) -> Format:
    """The :class:`Format` for a name (case-insensitive, aliases accepted); ValueError if unknown."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise ValueError(f"format must be a name string, got {fmt!r}")
    key = fmt.strip().lower()
    if key in _AMBIGUOUS:
        raise ValueError(_AMBIGUOUS[key])
    key = _ALIASES.get(key, key)
    if key not in _CACHE:
        unmodelled = _unmodelled(key)
        if unmodelled:
            raise ValueError(unmodelled)
        _CACHE[key] = _build(key)
    return _CACHE[key]


_ENGINE_FLAGS = {"vllm": "vLLM --kv-cache-dtype", "sglang": "SGLang --kv-cache-dtype",
                 "llama.cpp": "llama.cpp -ctk/-ctv"}


def _unmodelled(name: str) -> str:
    """Why ``name``, an engine's cache dtype kvcost knows but does not model, is refused ("" if it is not one)."""
    for engine, table in ENGINE_UNMODELLED.items():
        if name in table:
            return (f"{_ENGINE_FLAGS[engine]} {name} is known to kvcost but not modelled: {table[name]}. "
                    f"{_ENGINE_FLAGS[engine]} values kvcost models: {', '.join(sorted(ENGINES[engine]))} (every "
                    "format: python -m kvcost formats)")
    return ""


def names() -> list[str]:
    """The fixed format names of the 2024 set, in notebook 01's table order (parametrized families are
    described in the module docstring; :func:`all_names` adds the 2026 engines' formats)."""
    return [*_PLAIN, "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_head", "fp8_e5m2_head",
            "fp8_e4m3_token", "fp8_e5m2_token", *GGML_BLOCKS, "int4_g32", "int2_g32",
            "kivi4", "kivi2"]


#: The formats 2026 engines ship beyond :func:`names` (issue 23), by their kvcost names.
NAMES_2026 = ("fp8_e4m3fnuz", *BLOCK_FLOATS, "int8_token", "int4_token", *TURBOQUANT)


def all_names() -> list[str]:
    """Every fixed name: :func:`names` and then :data:`NAMES_2026` (the registry tests iterate over it)."""
    return [*names(), *(n for n in NAMES_2026 if n not in names())]


def engine_name(fmt: str | Format, engine: str) -> str | None:
    """The name ``engine`` (``"vllm"``, ``"llama.cpp"``, ``"sglang"``) gives format ``fmt``, or None."""
    table = _engine_table(engine)
    name = get(fmt).name
    return next((n for n, f in table.items() if f == name), None)


def from_engine(name: str, engine: str) -> Format:
    """The :class:`Format` an engine's cache-dtype name stands for; ValueError naming the engine's choices, or,
    for a name kvcost knows but does not model (:data:`ENGINE_UNMODELLED`), saying why."""
    table = _engine_table(engine)
    unmodelled = ENGINE_UNMODELLED.get(engine, {})
    if isinstance(name, str) and name in unmodelled:
        raise ValueError(f"parameter 'name': {engine}'s KV cache dtype {name!r} maps to no format (known, not "
                         f"modelled): {unmodelled[name]}; modelled: {', '.join(sorted(table))}")
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"parameter 'name': {engine} has no KV cache dtype {name!r}; known: {sorted(table)}")
    return get(table[name])


def _engine_table(engine: str) -> dict[str, str]:
    if engine not in ENGINES:
        raise ValueError(f"parameter 'engine' must be one of {sorted(ENGINES)}, got {engine!r}")
    return ENGINES[engine]


def bytes_per_value(fmt: str | Format, head_dim: int | None = None) -> Fraction:
    """Exact amortized bytes per value of ``fmt`` (e.g. ``q8_0`` -> 17/16, ``bf16`` -> 2)."""
    return get(fmt).bytes_per_value(head_dim)


def bits_per_value(fmt: str | Format, head_dim: int | None = None) -> float:
    """True bits per value of ``fmt`` with all metadata amortized (``q4_0`` -> 4.5, ``kivi2`` -> 3.0).

    ``head_dim`` matters only for per-token-scaled fp8 (default 128). KIVI's fp16 residual
    window is a per-sequence cost, not a per-value one; :func:`kvcost.models.footprint.cache_bytes`
    counts it.
    """
    return get(fmt).bits_per_value(head_dim)


def row_bytes(fmt: str | Format, n_values: int, head_dim: int | None = None) -> Fraction:
    """Bytes of one token's K (or V) row of ``n_values`` values in one layer."""
    return get(fmt).row_bytes(n_values, head_dim)


def fixed_bytes(fmt: str | Format, kv_heads: int) -> int:
    """Constant (context-independent) metadata bytes per layer for K or V: static per-head scales."""
    return get(fmt).per_head_meta_bytes * _positive_int("kv_heads", kv_heads)


def describe(fmt: str | Format) -> dict[str, object]:
    """Name, description, exact bytes per value (as text) and bits per value, for tables."""
    f = get(fmt)
    bpv = f.bytes_per_value()
    return {"format": f.name, "description": f.description, "bytes_per_value": str(bpv),
            "bits_per_value": float(8 * bpv), "residual_tokens": f.residual}


def describe_full(fmt: str | Format, head_dim: int | None = None) -> dict[str, object]:
    """:func:`describe` plus the element and scale types, the quantizer family and the engine names."""
    f = get(fmt)
    d = describe(f)
    d.update(bits_per_value=f.bits_per_value(head_dim), element=f.element, scale_format=f.scale_format,
             family=f.family, block=f.block, engines={e: n for e, n in f.engines})
    return d
