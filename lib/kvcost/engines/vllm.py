"""The KV cache vLLM (v1 engine) builds from a memory budget: blocks, tokens, and maximum concurrency.

Rules (vLLM ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/kv_cache_interface.py``; sources in
``data/engine_logs/README.md``):

- A page is one block of one layer: ``2 x block_size x kv_heads_per_rank x head_size x dtype bytes``
  (``nvfp4``: ``head_size // 2 + head_size // 16`` bytes per head and token, fp4 data and fp8 block
  scales packed; ``*_per_token_head``: data plus one fp32 scale per token and head for K and for V,
  ``int4_per_token_head`` packing two values a byte; vllm/v1/kv_cache_interface.py, sources in
  data/storage_formats.md)
  (MLA: ``block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes``, no factor 2; vLLM's
  ``fp8_ds_mla`` / ``nvfp4_ds_mla`` records: ``block_size x 656`` / ``block_size x 352`` bytes).
  ``kv_heads_per_rank = max(1, kv_heads // tp)``:
  KV heads split over tensor parallelism, replicated when there are fewer than ranks.
- One group of all layers when they share a spec: ``num_blocks = memory // page // layers``.
  Full plus sliding-window layers (hybrid manager): layers are split into groups of equal size
  (the smaller count, or the larger when it is under 1.5x the smaller), ``num_blocks = memory //
  page // group_size`` shared by all groups.
- Logged: ``GPU KV cache size: num_blocks // groups x block_size tokens`` and ``Maximum
  concurrency for max_model_len tokens per request: num_blocks / blocks one request needs``, a
  full group needing ``cdiv(max_model_len, block_size)`` blocks and a sliding group
  ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1``.
- Recurrent-state layers (Mamba, Gated DeltaNet) of a hybrid model are a group of their own whose page
  holds one layer's state (conv window in bf16, SSM state in ``mamba_ssm_cache_dtype``): the attention
  block grows to ``16 x cdiv(state page, 16 x attention page of one token)`` tokens and the state's page
  is padded to the attention page (``HybridAttentionMambaModelConfig``, vllm/model_executor/models/config.py
  at commit 0144dd5b0d2d9ef9ac2651a3ab6efa83d0497ea9); a request needs one state block per group.
- Layers kept in another dtype (``--kv-cache-dtype-skip-layers``, e.g. sliding-window layers in bf16
  while the rest are fp8) have pages of another size (:func:`plan`): one attention type makes one group
  whose block holds every layer's page; a hybrid model's smaller pages get proportionally more tokens
  per block, or are padded to the largest page when the sizes do not divide. vLLM has one
  ``--kv-cache-dtype`` for K and V (K != V pairs are llama.cpp's, or a TurboQuant name such as
  ``turboquant_k3v4_nc``).
- ``turboquant_*``: vLLM keeps the first and last two layers of a dense model in ``auto``
  (:func:`turboquant_boundary_layers`), so those layers have bf16 pages of their own.

Standard library only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvcost.models.hfconfig import FULL, MLA, SLIDING, Geometry
from kvcost.storage import formats
from kvcost.units import GIB

__all__ = ["CACHE_DTYPES", "MAMBA_GROUP", "TQ_BOUNDARY_LAYERS", "VllmPlan", "check_tp", "page_bytes", "plan",
           "turboquant_boundary_layers"]

#: --kv-cache-dtype -> the kvcost format it stores (``auto``: the model dtype, taken as bf16; ``fp8_ds_mla`` and
#: ``nvfp4_ds_mla``: vLLM's MLA records, formats.MLA_RECORDS). The names are kvcost.storage.formats.ENGINES["vllm"]'s.
CACHE_DTYPES: dict[str, str] = {"auto": "bf16", **formats.ENGINES["vllm"]}
FP8_DS_MLA_BYTES = formats.MLA_RECORDS["fp8_ds_mla"][1]        # 656 bytes per token per layer
NVFP4_DS_MLA_BYTES = formats.MLA_RECORDS["nvfp4_ds_mla"][1]    # 352 bytes per token per layer (SM100 only)
#: How many attention layers at each end of a dense model vLLM keeps out of TurboQuant
#: (``TurboQuantConfig.get_boundary_skip_layers(model_config, n=2)``, data/storage_formats.md).
TQ_BOUNDARY_LAYERS = 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def page_bytes(g: Geometry, block_size: int = 16, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
    """Bytes of one block of one attention layer on one tensor-parallel rank."""
    if kv_cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype must be one of {', '.join(CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    f = formats.get(CACHE_DTYPES[kv_cache_dtype])
    if g.count(MLA):
        assert g.mla_latent is not None
        if f.family == "mla_record":
            if g.mla_latent != f.block:
                raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} is vLLM's record of a {f.block}-value MLA latent "
                                 f"(kv_lora_rank 512 + qk_rope_head_dim 64); {g.name}'s has {g.mla_latent}")
            return block_size * int(f.block_bytes)
        if f.family not in ("float", "fp8") or f.scale not in ("none", "tensor"):
            raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} is not a cache layout for MLA latents in this model "
                             f"(plain or per-tensor fp8 types, or {' / '.join(formats.MLA_RECORDS)})")
        return block_size * g.mla_latent * int(f.bytes_per_value())
    if f.family == "mla_record":
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} is vLLM's layout for MLA models (DeepSeek); {g.name} has "
                         f"no MLA layers")
    heads = max(1, g.kv_heads // tp)
    per_head = f.row_bytes(g.head_dim, g.head_dim) + f.row_bytes(g.v_head_dim, g.v_head_dim)
    if per_head.denominator != 1:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} packs head_size {g.head_dim} into a fraction of a byte")
    return block_size * heads * int(per_head)


@dataclass(frozen=True)
class VllmPlan:
    """What vLLM logs for a KV budget (see :func:`plan`)."""

    model: str
    kv_memory_gib: float
    tp: int
    block_size: int
    kv_cache_dtype: str
    max_model_len: int
    max_num_batched_tokens: int
    kv_heads_per_rank: int
    page_bytes: int
    groups: tuple[str, ...]
    group_size: int
    num_blocks: int
    kv_tokens: int
    blocks_per_request: int
    max_concurrency: float
    warnings: tuple[str, ...]
    skip_layers: tuple[str, ...] = ()
    skip_dtype: str = "auto"
    block_sizes: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(groups=list(self.groups), warnings=list(self.warnings), skip_layers=list(self.skip_layers),
                 block_sizes=list(self.block_sizes), engine="vllm",
                 log_lines=[f"GPU KV cache size: {self.kv_tokens:,} tokens",
                            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
                            f"{self.max_concurrency:.2f}x"])
        return d


def check_tp(g: Geometry, tp: int) -> None:
    """vLLM's rule (ModelConfig.verify_with_parallel_config, vllm/config/model.py): the attention heads split
    evenly over the tensor-parallel ranks; KV heads are split, or replicated when fewer (MLA: one latent)."""
    heads = g.num_attention_heads
    if heads and heads % tp:
        raise ValueError(f"--tp {tp}: vLLM requires the total number of attention heads ({heads}) to be "
                         f"divisible by the tensor-parallel size; use one of "
                         f"{[d for d in range(1, heads + 1) if heads % d == 0]}")
    if not g.count(MLA) and tp > 1 and g.kv_heads % tp and tp % g.kv_heads:
        raise ValueError(f"--tp {tp}: the {g.kv_heads} KV heads of {g.name} can be neither split nor replicated "
                         f"evenly over {tp} ranks (vLLM needs {g.kv_heads} % tp == 0 or tp % {g.kv_heads} == 0)")


#: The group kind of recurrent-state (Mamba / linear-attention) layers in vLLM's hybrid allocator.
MAMBA_GROUP = "mamba"


def _state_page(g: Geometry, tp: int) -> int | None:
    """Bytes of one layer's recurrent state on one rank, as vLLM's ``MambaSpec`` pages it: the conv window in
    the model dtype (bf16), the SSM / delta-rule state in ``mamba_ssm_cache_dtype`` (bf16 by default), heads
    and channels split over ``tp``; 0 without state layers, None when the config does not size them."""
    if not g.state_layers:
        return 0
    if g.state is None:
        return None
    ssm = formats.get(g.state_dtype or "bf16").bytes_per_value()
    return int(_cdiv(int(g.state.conv_values * 2 + g.state.ssm_values * ssm), tp))


def turboquant_boundary_layers(g: Geometry, kv_cache_dtype: str) -> tuple[str, ...]:
    """The layers vLLM keeps out of a ``turboquant_*`` cache, as ``kv_cache_dtype_skip_layers`` entries: for a
    dense model the first and last ``min(2, L // 2)`` of its ``L`` layers (0, 1, L-2, L-1 for L >= 4), for a
    hybrid (recurrent-state layers beside attention) none; none for other dtypes.

    vllm-project/vllm ``TurboQuantConfig.get_boundary_skip_layers`` (turboquant/config.py at commit 1471680b),
    unioned into ``kv_cache_dtype_skip_layers`` whenever the dtype starts with ``turboquant_`` (an indexed
    ``vllm/engine/arg_utils.py``), those layers then kept in ``auto`` (``Attention.__init__``, attention.py at
    0014ca6b): data/storage_formats.md."""
    if not kv_cache_dtype.startswith("turboquant_") or g.state_layers:
        return ()
    n_layers = g.num_layers
    n = min(TQ_BOUNDARY_LAYERS, n_layers // 2)
    return tuple(str(i) for i in sorted({*range(n), *range(n_layers - n, n_layers)}))


def _layer_specs(g: Geometry, kv_cache_dtype: str, skip_layers: tuple[str, ...],
                 skip_dtype: str) -> list[tuple[str, str]]:
    """(attention kind, --kv-cache-dtype) of every KV layer, the skipped ones in ``skip_dtype``."""
    out = []
    for i, kind in enumerate(g.layer_kinds):
        if kind not in (FULL, MLA, SLIDING):
            continue
        skipped = str(i) in skip_layers or (kind == SLIDING and "sliding_window" in skip_layers)
        out.append((kind, skip_dtype if skipped else kv_cache_dtype))
    return out


def plan(g: Geometry, kv_memory_gib: float, tp: int = 1, block_size: int = 16, max_model_len: int | None = None,
         kv_cache_dtype: str = "auto", max_num_batched_tokens: int = 2048,
         kv_memory_bytes: int | None = None, skip_layers: tuple[str, ...] = (),
         skip_dtype: str = "auto") -> VllmPlan:
    """Blocks, tokens and concurrency vLLM reports for ``kv_memory_gib`` GiB of KV cache per GPU.

    ``max_model_len`` defaults to the config's ``max_position_embeddings``. ``kv_memory_bytes``
    overrides the GiB figure with an exact byte count (vLLM logs the budget rounded to 0.01 GiB).
    ``skip_layers`` (``--kv-cache-dtype-skip-layers``: layer indices as text, or ``sliding_window``) keep
    their cache in ``skip_dtype`` (``auto``: the model's bf16). Layers then differ in page size, and vLLM
    (``get_kv_cache_groups``, vllm/v1/core/kv_cache_utils.py at commit 001cabc1be16a59a70d720ed61a13b678c060a18)
    either keeps one group whose page is the sum of every layer's page (all layers of one attention type,
    ``UniformTypeKVCacheSpecs``), or unifies the pages of a hybrid model (``unify_kv_cache_spec_page_size``):
    a layer whose page divides the largest gets ``largest / page`` x the block size (more tokens per block,
    the same bytes); one that does not is refused there (NotImplementedError) — newer vLLM pads it to the
    largest page for backends that index pages by their stride (``indexes_kv_by_block_stride``, read only in
    a third-party annotated copy of a newer kv_cache_utils.py; vLLM PR #42345's "LCM page padding" was not
    read first-hand), modelled here as that padding, with a warning.

    A ``turboquant_*`` dtype adds vLLM's boundary layers (:func:`turboquant_boundary_layers`: the first and last
    two layers of a dense model) to ``skip_layers``, as vLLM's engine arguments do; the plan's ``skip_layers``
    is the union, sorted by index. For 32 layers of 8 KV heads at head size 128 under ``turboquant_4bit_nc``
    a token costs 28 x 8 x 134 + 4 x 8 x 512 = 46,400 bytes, not 32 x 8 x 134 = 34,304.
    """
    for name, value in (("--tp", tp), ("--block-size", block_size),
                        ("--max-num-batched-tokens", max_num_batched_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if kv_memory_bytes is None:
        if isinstance(kv_memory_gib, bool) or not isinstance(kv_memory_gib, (int, float)) or not kv_memory_gib > 0:
            raise ValueError(f"--kv-memory-gib must be a positive number, got {kv_memory_gib!r}")
        kv_memory_bytes = int(kv_memory_gib * GIB)
    if max_model_len is None:
        if g.max_position_embeddings is None:
            raise ValueError("--max-model-len is needed: the config has no max_position_embeddings")
        max_model_len = g.max_position_embeddings
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"--max-model-len must be a positive integer, got {max_model_len!r}")
    if skip_dtype not in CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype-skip-layers keeps layers in one of {', '.join(CACHE_DTYPES)}, "
                         f"got {skip_dtype!r}")
    warnings = []
    boundary = turboquant_boundary_layers(g, kv_cache_dtype)
    if boundary:
        asked = tuple(skip_layers)
        ints = sorted({i for i in (*asked, *boundary) if i.isdigit()}, key=int)
        skip_layers = (*ints, *dict.fromkeys(i for i in asked if not i.isdigit()))
        warnings.append(f"vLLM keeps TurboQuant's boundary layers {', '.join(boundary)} of {g.name} out of "
                        f"{kv_cache_dtype} (kv_cache_dtype_skip_layers, in {skip_dtype}; "
                        f"TurboQuantConfig.get_boundary_skip_layers)")
    if g.max_position_embeddings is not None and max_model_len > g.max_position_embeddings:
        warnings.append(f"--max-model-len {max_model_len:,} exceeds max_position_embeddings "
                        f"{g.max_position_embeddings:,} of {g.name} (vLLM refuses it unless allowed explicitly)")
    if g.kv_heads < tp and not g.count(MLA):
        warnings.append(f"{g.kv_heads} KV heads over TP {tp}: each rank keeps a replica of one KV head")
    layers = _layer_specs(g, kv_cache_dtype, tuple(skip_layers), skip_dtype)
    if not layers:
        raise ValueError(f"{g.name} has no attention layers: vLLM keeps no KV cache for it")
    mamba_page = _state_page(g, tp)
    if g.state_layers and mamba_page is None:
        warnings.append(f"{g.name} has {g.state_layers} Mamba / linear-attention layers whose state the config does "
                        f"not size: vLLM's page alignment to it is not modelled (tokens are an upper bound)")
    elif mamba_page:
        # HybridAttentionMambaModelConfig: the attention block grows (in steps of 16 tokens) until a page holds
        # one layer's recurrent state; the state's page is then padded to the attention page
        per_token = page_bytes(g, 1, tp, kv_cache_dtype)
        need = 16 * _cdiv(mamba_page, 16 * per_token)
        if block_size < need:
            pad = 100 * (need * per_token - mamba_page) / mamba_page
            warnings.append(f"vLLM sets the attention block size to {need} tokens so that a page holds one of the "
                            f"{g.state_layers} recurrent-state layers' {mamba_page:,}-byte state (asked: "
                            f"{block_size}), padding the state's page by {pad:.2f}%")
            block_size = need
    specs: dict[tuple[str, str], int] = {}
    for spec in sorted(layers, key=lambda ks: (FULL, MLA, SLIDING).index(ks[0])):   # full groups first
        specs[spec] = specs.get(spec, 0) + 1
    pages = {spec: page_bytes(g, block_size, tp, spec[1]) for spec in specs}
    if mamba_page:
        specs[MAMBA_GROUP, "state"] = g.state_layers
        pages[MAMBA_GROUP, "state"] = max(pages.values())              # padded to the attention page
    mixed = len({dt for kind, dt in specs if kind != MAMBA_GROUP}) > 1

    def label(spec: tuple[str, str]) -> str:
        return f"{spec[0]}:{spec[1]}" if mixed and spec[0] != MAMBA_GROUP else spec[0]

    def blocks_needed(kind: str, bs: int) -> int:
        if kind == MAMBA_GROUP:
            return 1                            # one state per request (no prefix caching of states)
        if kind == SLIDING:
            assert g.window is not None
            return _cdiv(min(g.window - 1 + max_num_batched_tokens, max_model_len), bs) + 1
        return _cdiv(max_model_len, bs)

    kinds = {kind for kind, _ in specs}
    if len(specs) > 1 and len(kinds) == 1:
        # one attention type, pages of several sizes: one group, a block holds every layer's page
        page = sum(pages[spec] * n for spec, n in specs.items())
        kind = next(iter(kinds))
        group_size, groups, block_sizes = 1, [kind], [block_size]
        num_blocks = max(0, kv_memory_bytes // page)
        per_request = blocks_needed(kind, block_size)
        kv_tokens = num_blocks * block_size
    else:
        page = max(pages.values())
        bs_of: dict[tuple[str, str], int] = {}
        for spec, pg in pages.items():
            if spec[0] == MAMBA_GROUP:
                bs_of[spec] = max_model_len     # MambaSpec's block_size: the state covers the whole request
            elif page % pg == 0:
                bs_of[spec] = block_size * (page // pg)
            else:
                bs_of[spec] = block_size
                warnings.append(f"{label(spec)} pages ({pg:,} bytes) do not divide the largest ({page:,}): vLLM at "
                                f"commit 001cabc refuses the model (NotImplementedError); newer vLLM pads them to "
                                f"{page:,} bytes where the backend indexes pages by their stride (second-hand: "
                                f"an annotated copy of newer vLLM), as counted here")
        lo, hi = min(specs.values()), max(specs.values())
        group_size = hi if len(specs) == 1 or hi < 1.5 * lo else lo
        groups, block_sizes = [], []
        for spec, n in specs.items():
            for _ in range(_cdiv(n, group_size)):
                groups.append(label(spec))
                block_sizes.append(bs_of[spec])
        num_blocks = max(0, kv_memory_bytes // page // group_size)
        kv_tokens = num_blocks // len(groups) * min(block_sizes)   # _report_kv_cache_config: the smallest block
        per_request = sum(blocks_needed(grp.split(":")[0], bs) for grp, bs in zip(groups, block_sizes))
    concurrency = num_blocks / per_request
    if concurrency < 1:
        warnings.append(f"does not fit: one request of {max_model_len:,} tokens needs {per_request:,} blocks, "
                        f"the budget holds {num_blocks:,} (vLLM refuses to start)")
    return VllmPlan(g.name, kv_memory_bytes / GIB, tp, block_size, kv_cache_dtype, max_model_len,
                    max_num_batched_tokens, 1 if g.count(MLA) else max(1, g.kv_heads // tp), page, tuple(groups),
                    group_size, num_blocks, kv_tokens, per_request, concurrency, tuple(warnings),
                    tuple(skip_layers), skip_dtype, tuple(block_sizes))
