"""Hugging Face ``config.json`` -> :class:`Geometry`: what a model's KV cache depends on.

Reads MHA / GQA / MQA heads, an explicit ``head_dim``, sliding windows (every layer or
interleaved), MLA latents, and hybrids whose other layers keep a constant recurrent state
(linear attention, Mamba) or nothing. Errors name the config key (and the file).
Standard library only: the CLI must answer in well under a second.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FULL",
    "KV_KINDS",
    "LINEAR",
    "MAMBA",
    "MLA",
    "NONE",
    "SLIDING",
    "STATE_KINDS",
    "Geometry",
    "StateSpec",
    "from_hf_config",
    "load_config",
    "parameter_counts",
]

# Layer kinds in Geometry.layer_kinds.
FULL, SLIDING, MLA, LINEAR, MAMBA, NONE = "full", "sliding", "mla", "linear", "mamba", "none"
KV_KINDS = (FULL, SLIDING, MLA)
STATE_KINDS = (LINEAR, MAMBA)

_LAYER_TYPE_NAMES = {
    "full_attention": FULL, "attention": FULL, "global_attention": FULL, "global": FULL,
    "sliding_attention": SLIDING, "sliding_window_attention": SLIDING, "local_attention": SLIDING,
    "local": SLIDING,
    "linear_attention": LINEAR,
    "mamba": MAMBA, "mamba2": MAMBA,
}
_NEMOTRON_PATTERN = {"*": FULL, "M": MAMBA, "-": NONE, "E": NONE}
# Interleave period of sliding / full layers for configs that do not spell it out
# (transformers' defaults: Gemma-2 alternates starting with a sliding layer, Gemma-3 and
# Cohere-2 put a full layer at every 6th / 4th position).
_DEFAULT_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
_STATE_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class StateSpec:
    """Constant recurrent state one linear-attention / SSM layer keeps per sequence (in values)."""

    kind: str            # "mamba2", "mamba1" or "gated_deltanet"
    ssm_values: int      # the recurrent state matrix
    conv_values: int     # the causal-convolution window (kernel - 1 past inputs per channel)
    detail: str

    @property
    def values(self) -> int:
        """Values of state per layer per sequence."""
        return self.ssm_values + self.conv_values


@dataclass(frozen=True)
class Geometry:
    """What the KV cache of a model depends on, read from its config.

    ``layer_kinds`` has one entry per decoder layer: ``full`` (keeps every token),
    ``sliding`` (keeps the last ``window`` tokens), ``mla`` (keeps a ``mla_latent``-value
    latent per token), ``linear`` / ``mamba`` (keep a constant state, no KV) or ``none``
    (an MLP-only block). ``naive`` is what the post's formula reads from the same
    config: (num_hidden_layers, KV heads, head_dim).
    """

    name: str
    model_type: str
    layer_kinds: tuple[str, ...]
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    window: int | None = None
    mla_latent: int | None = None
    max_position_embeddings: int | None = None
    rope_scaling: bool = False
    state: StateSpec | None = None
    state_dtype: str | None = None
    naive: tuple[int, int, int] = (0, 0, 0)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def num_layers(self) -> int:
        """All decoder layers (the post's ``layers``)."""
        return len(self.layer_kinds)

    def count(self, kind: str) -> int:
        """How many layers are of ``kind``."""
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def kv_layers(self) -> int:
        """Layers that keep a KV cache (full, sliding or MLA)."""
        return sum(1 for k in self.layer_kinds if k in KV_KINDS)

    @property
    def state_layers(self) -> int:
        """Layers that keep a constant recurrent state instead (linear attention, SSM)."""
        return sum(1 for k in self.layer_kinds if k in STATE_KINDS)

    def summary(self) -> str:
        """One line: the layer mix and the attention geometry."""
        parts = []
        for kind, label in ((FULL, "full"), (SLIDING, f"sliding({self.window})"), (MLA, "MLA"),
                            (LINEAR, "linear-attn"), (MAMBA, "SSM"), (NONE, "MLP-only")):
            n = self.count(kind)
            if n:
                parts.append(f"{n} {label}")
        if self.count(MLA):
            geo = f"latent {self.mla_latent}"
        else:
            geo = f"{self.kv_heads} KV heads x {self.head_dim}"
            if self.v_head_dim != self.head_dim:
                geo += f" (V {self.v_head_dim})"
        return f"{self.num_layers} layers: " + ", ".join(parts) + f"; {geo}"


# ----------------------------------------------------------------------------- config reading

_MISSING = object()


def _first(d: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, Any]:
    """The first of ``keys`` present in ``d`` with a non-null value, as (key, value)."""
    for k in keys:
        if k in d and d[k] is not None:
            return k, d[k]
    return keys[0], _MISSING


#: No count or size in a model config comes near this (layers, heads, dims, positions): larger is an error.
_INT_MAX = 2**31 - 1


def _as_pos_int(key: str, value: Any, prefix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if isinstance(value, float) and value.is_integer() and value > 0:
            value = int(value)
        else:
            raise ValueError(f"config key {prefix}{key!r} must be a positive integer, got {value!r}")
    if value > _INT_MAX:
        raise ValueError(f"config key {prefix}{key!r} must be a positive integer below 2^31, got {value:.3g}")
    return value


def _req_int(d: Mapping[str, Any], keys: Sequence[str], prefix: str) -> int:
    key, value = _first(d, keys)
    if value is _MISSING:
        alts = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
        raise ValueError(f"config key {prefix}{keys[0]!r}{alts} is missing")
    return _as_pos_int(key, value, prefix)


def _opt_int(d: Mapping[str, Any], keys: Sequence[str], prefix: str) -> int | None:
    key, value = _first(d, keys)
    return None if value is _MISSING else _as_pos_int(key, value, prefix)


def load_config(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The config as a dict: ``cfg`` itself, or the JSON file at a path (a folder means its config.json).

    A kvcost model record (``data/models/*.json``) is unwrapped to its ``config``. A missing
    file, a file that is not UTF-8 or not JSON raises ``ValueError`` naming the file.
    """
    if isinstance(cfg, (str, os.PathLike)):
        path = Path(cfg)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"file not found: {str(path)!r} (a config.json, or a folder holding one)")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"config file {str(path)!r} is not UTF-8 text ({err.reason} at byte "
                             f"{err.start})") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"config file {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(cfg, Mapping):
        raise ValueError(f"config must be a dict or a path to config.json, got {type(cfg).__name__}")
    cfg = dict(cfg)
    # A kvcost model record (data/models/*.json) wraps the config with its sources.
    if "config" in cfg and isinstance(cfg["config"], Mapping) and "sources" in cfg:
        cfg = dict(cfg["config"])
    return cfg


def _text_part(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The language-model part of a (possibly multimodal) config, and its key prefix."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, Mapping):
            text = dict(sub)
            # Multimodal wrappers keep a few language-model facts at the top level.
            for k in ("max_position_embeddings", "mamba_ssm_cache_dtype"):
                if k not in text and k in cfg:
                    text[k] = cfg[k]
            return text, f"{key}."
    return cfg, ""


def _kv_heads(text: Mapping[str, Any], heads: int, prefix: str) -> tuple[int, str]:
    """KV heads and the config key they came from (MHA when nothing says otherwise)."""
    if text.get("new_decoder_architecture"):               # Falcon-40B/180B: grouped KV
        return _req_int(text, ["num_kv_heads", "num_key_value_heads"], prefix), "num_kv_heads"
    if text.get("multi_query") is True:                     # Falcon-7B: one shared KV head
        return 1, "multi_query"
    if text.get("multi_query_attention") is True and text.get("multi_query_group_num") is not None:
        return _as_pos_int("multi_query_group_num", text["multi_query_group_num"], prefix), \
            "multi_query_group_num"
    key, value = _first(text, ["num_key_value_heads", "num_kv_heads", "n_head_kv"])
    if value is _MISSING:
        return heads, "num_key_value_heads"                 # absent: multi-head attention
    return _as_pos_int(key, value, prefix), key


def _head_dim(text: Mapping[str, Any], heads: int, prefix: str) -> int:
    key, value = _first(text, ["head_dim", "attention_head_dim", "kv_channels"])
    if value is not _MISSING:                                # explicit head_dim wins (gpt-oss: 64, not 45)
        return _as_pos_int(key, value, prefix)
    hidden = _opt_int(text, ["hidden_size", "n_embd", "d_model"], prefix)
    if hidden is None:
        raise ValueError(f"config key {prefix}'head_dim' is missing and cannot be derived: "
                         f"{prefix}'hidden_size' is missing too")
    if hidden % heads:
        raise ValueError(f"config key {prefix}'head_dim' is missing and {prefix}'hidden_size' "
                         f"({hidden}) is not a multiple of num_attention_heads ({heads})")
    return hidden // heads


def _layer_kinds(text: Mapping[str, Any], n_layers: int, model_type: str,
                 prefix: str) -> tuple[list[str], int | None, list[str]]:
    """Per-layer kinds, the sliding window (if any layer slides) and notes."""
    notes: list[str] = []
    window = None
    use_sw = text.get("use_sliding_window")
    raw_window = text.get("sliding_window")
    if raw_window is not None and use_sw is not False:
        window = _as_pos_int("sliding_window", raw_window, prefix)
    elif raw_window is not None and use_sw is False:
        notes.append(f"sliding_window={raw_window} is ignored: use_sliding_window is false")

    pattern = text.get("hybrid_override_pattern")
    if pattern is not None:                                   # Nemotron-H: one character per layer
        if not isinstance(pattern, str) or len(pattern) != n_layers:
            raise ValueError(f"config key {prefix}'hybrid_override_pattern' must be a string of "
                             f"num_hidden_layers={n_layers} characters, got "
                             f"{len(pattern) if isinstance(pattern, str) else pattern!r}")
        bad = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
        if bad:
            raise ValueError(f"config key {prefix}'hybrid_override_pattern' has unknown layer "
                             f"symbols {bad}; known: '*' attention, 'M' Mamba, '-' MLP, 'E' MoE")
        kinds = [_NEMOTRON_PATTERN[c] for c in pattern]
        return _apply_window_to_hybrid(kinds, window, notes), window, notes

    layer_types = text.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, (list, tuple)) or len(layer_types) != n_layers:
            got = len(layer_types) if isinstance(layer_types, (list, tuple)) else repr(layer_types)
            raise ValueError(f"config key {prefix}'layer_types' must list num_hidden_layers="
                             f"{n_layers} layer types, got {got}")
        kinds = []
        for i, t in enumerate(layer_types):
            if t not in _LAYER_TYPE_NAMES:
                raise ValueError(f"config key {prefix}'layer_types' has unknown layer type {t!r} "
                                 f"at layer {i}; known: {sorted(_LAYER_TYPE_NAMES)}")
            kinds.append(_LAYER_TYPE_NAMES[t])
        if SLIDING in kinds and window is None:
            raise ValueError(f"config key {prefix}'sliding_window' is missing (or null) but "
                             f"{prefix}'layer_types' has sliding_attention layers")
        return kinds, (window if SLIDING in kinds else None), notes

    if text.get("attn_layer_period") is not None or text.get("attn_layer_offset") is not None:
        period = _req_int(text, ["attn_layer_period"], prefix)             # Jamba
        offset = text.get("attn_layer_offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
            raise ValueError(f"config key {prefix}'attn_layer_offset' must be an integer in "
                             f"[0, attn_layer_period={period}), got {offset!r}")
        kinds = [FULL if i % period == offset else MAMBA for i in range(n_layers)]
        return _apply_window_to_hybrid(kinds, window, notes), window, notes

    if text.get("full_attention_interval") is not None:                   # Qwen3-Next
        interval = _req_int(text, ["full_attention_interval"], prefix)
        kinds = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
        return _apply_window_to_hybrid(kinds, window, notes), window, notes

    if window is None:
        return [FULL] * n_layers, None, notes

    key, value = _first(text, ["sliding_window_pattern", "_sliding_window_pattern"])
    if value is _MISSING and model_type in _DEFAULT_SLIDING_PATTERN:
        value = _DEFAULT_SLIDING_PATTERN[model_type]
        notes.append(f"{model_type}: every {value}th layer is full attention, the rest slide "
                     f"(transformers' default for this model type; the config does not say)")
    if value is not _MISSING:
        p = _as_pos_int(key, value, prefix)
        return [FULL if (i + 1) % p == 0 else SLIDING for i in range(n_layers)], window, notes

    if use_sw is True and text.get("max_window_layers") is not None:      # Qwen2 family
        first = text["max_window_layers"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"config key {prefix}'max_window_layers' must be a non-negative "
                             f"integer, got {first!r}")
        kinds = [SLIDING if i >= first else FULL for i in range(n_layers)]
        return kinds, (window if SLIDING in kinds else None), notes

    return [SLIDING] * n_layers, window, notes                             # Mistral-7B-v0.1, Phi-3


def _apply_window_to_hybrid(kinds: list[str], window: int | None, notes: list[str]) -> list[str]:
    if window is not None:
        notes.append(f"sliding_window={window} applied to every attention layer of the hybrid")
        return [SLIDING if k == FULL else k for k in kinds]
    return kinds


def _state_spec(text: Mapping[str, Any], kinds: Sequence[str], prefix: str) -> StateSpec | None:
    if MAMBA in kinds:
        if text.get("mamba_num_heads") is not None:                        # Mamba-2 (Nemotron-H)
            nh = _req_int(text, ["mamba_num_heads"], prefix)
            hd = _req_int(text, ["mamba_head_dim"], prefix)
            n = _req_int(text, ["ssm_state_size"], prefix)
            groups = _req_int(text, ["n_groups"], prefix)
            kernel = _req_int(text, ["conv_kernel"], prefix)
            channels = nh * hd + 2 * groups * n
            return StateSpec("mamba2", nh * hd * n, channels * (kernel - 1),
                             f"Mamba-2: {nh} heads x {hd} x state {n}; conv {channels} ch x {kernel - 1}")
        if text.get("mamba_d_state") is not None:                          # Mamba-1 (Jamba)
            hidden = _req_int(text, ["hidden_size"], prefix)
            expand = _req_int(text, ["mamba_expand"], prefix)
            n = _req_int(text, ["mamba_d_state"], prefix)
            kernel = _req_int(text, ["mamba_d_conv"], prefix)
            d_inner = expand * hidden
            return StateSpec("mamba1", d_inner * n, d_inner * (kernel - 1),
                             f"Mamba-1: d_inner {d_inner} x state {n}; conv {d_inner} ch x {kernel - 1}")
        return None
    if LINEAR in kinds and text.get("linear_num_value_heads") is not None:  # Gated DeltaNet
        nk = _req_int(text, ["linear_num_key_heads"], prefix)
        nv = _req_int(text, ["linear_num_value_heads"], prefix)
        dk = _req_int(text, ["linear_key_head_dim"], prefix)
        dv = _req_int(text, ["linear_value_head_dim"], prefix)
        kernel = _req_int(text, ["linear_conv_kernel_dim"], prefix)
        channels = 2 * nk * dk + nv * dv
        return StateSpec("gated_deltanet", nv * dk * dv, channels * (kernel - 1),
                         f"Gated DeltaNet: {nv} heads x {dk} x {dv}; conv {channels} ch x {kernel - 1}")
    return None


def from_hf_config(cfg: Mapping[str, Any] | str | os.PathLike[str], name: str | None = None) -> Geometry:
    """Read the KV-cache geometry of a model from its Hugging Face ``config.json``.

    ``cfg`` is the parsed dict or a path to the file (or to a folder holding it); a
    multimodal config's ``text_config`` / ``llm_config`` is used. Handles MHA / GQA / MQA
    (``num_key_value_heads`` absent means MHA; Falcon's ``multi_query``), an explicit
    ``head_dim`` over ``hidden_size / num_attention_heads``, sliding windows on every layer
    or interleaved (``layer_types``, ``sliding_window_pattern``), MLA (``kv_lora_rank``),
    and hybrids whose other layers keep no KV (``layer_types`` with ``linear_attention``,
    ``full_attention_interval``, ``attn_layer_period``/``attn_layer_offset``,
    ``hybrid_override_pattern``).

    Raises ``ValueError`` naming the key that is missing or inconsistent.
    """
    raw = load_config(cfg)
    text, prefix = _text_part(raw)
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    n_layers = _req_int(text, ["num_hidden_layers", "n_layer", "num_layers", "n_layers"], prefix)
    heads = _req_int(text, ["num_attention_heads", "n_head", "num_heads", "n_heads"], prefix)
    kv, kv_key = _kv_heads(text, heads, prefix)
    if heads % kv:
        raise ValueError(f"config key {prefix}{kv_key!r} ({kv}) must divide "
                         f"num_attention_heads ({heads})")
    head_dim = _head_dim(text, heads, prefix)
    naive_head_dim = head_dim
    kinds, window, notes = _layer_kinds(text, n_layers, model_type, prefix)

    mla_latent = None
    v_head_dim = head_dim
    if text.get("kv_lora_rank") is not None:                   # DeepSeek-V2/V3 MLA
        rank = _req_int(text, ["kv_lora_rank"], prefix)
        rope = _req_int(text, ["qk_rope_head_dim"], prefix)
        mla_latent = rank + rope
        kinds = [MLA if k == FULL else k for k in kinds]
        nope = text.get("qk_nope_head_dim")
        if isinstance(nope, int) and nope > 0:
            # What a cache that decompresses MLA would hold (HF DynamicCache does).
            head_dim = nope + rope
            v_head_dim = _opt_int(text, ["v_head_dim"], prefix) or head_dim
        notes.append(f"MLA: one latent of kv_lora_rank {rank} + qk_rope_head_dim {rope} = "
                     f"{mla_latent} values per token per layer, shared by K and V (vLLM, SGLang); "
                     f"num_key_value_heads={kv} does not apply")
        if SLIDING in kinds:
            raise ValueError(f"config key {prefix}'sliding_window' combined with MLA is not supported")

    state = _state_spec(text, kinds, prefix)
    if any(k in STATE_KINDS for k in kinds) and state is None:
        notes.append("the config does not say enough to size the recurrent state of its "
                     "linear-attention / SSM layers; state bytes are not reported")
    state_dtype = None
    sdt = text.get("mamba_ssm_cache_dtype")
    if isinstance(sdt, str) and sdt in _STATE_DTYPE_NAMES:
        state_dtype = _STATE_DTYPE_NAMES[sdt]

    max_pos = _opt_int(text, ["max_position_embeddings", "n_positions", "max_seq_len",
                              "seq_length", "max_sequence_length"], prefix)
    rope_scaling = bool(text.get("rope_scaling")) and isinstance(text.get("rope_scaling"), Mapping)
    display = name or str(raw.get("_name_or_path") or model_type or "model")
    return Geometry(
        name=display, model_type=model_type, layer_kinds=tuple(kinds),
        num_attention_heads=heads, kv_heads=kv, head_dim=head_dim, v_head_dim=v_head_dim,
        window=window, mla_latent=mla_latent, max_position_embeddings=max_pos,
        rope_scaling=rope_scaling, state=state, state_dtype=state_dtype,
        naive=(n_layers, kv, naive_head_dim),
        notes=tuple(notes),
    )



# ----------------------------------------------------------------------------- parameter counts

#: Model types whose weights :func:`parameter_counts` can count from the config alone: decoder-only
#: transformers with RMSNorm, SwiGLU MLPs (or MoE experts of them) and untied or tied embeddings.
PARAM_COUNT_TYPES = ("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "gemma2",
                     "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "falcon", "jamba", "nemotron_h",
                     "qwen3_next")


def parameter_counts(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, int]:
    """Parameters of a model by what they are, counted from its ``config.json``.

    Keys: ``embedding`` (input embedding, plus the output head unless ``tie_word_embeddings``),
    ``attention`` (Q, K, V, O projections with their biases, Qwen3's q/k norms, gpt-oss's sinks),
    ``dense_mlp`` (SwiGLU gate/up/down of dense layers), ``experts`` (the routed experts' weight
    matrices: what MoE checkpoints such as gpt-oss quantize), ``router`` (routers and expert biases),
    ``norms``, and ``total``. Supported ``model_type``: :data:`PARAM_COUNT_TYPES` (Phi-3 fuses QKV and
    gate/up into one matrix each, the same counts; Gemma-2 has four RMSNorms a layer and ties its
    embeddings by default; DeepSeek-V2/V3 count MLA's projections — q, or q_a/q_b with q_lora_rank, the
    kv_a projection to the latent and the decoupled RoPE key, its norm, kv_b, o — the first
    ``first_k_dense_replace`` layers dense, the others ``n_routed_experts`` routed plus ``n_shared_experts``
    shared experts, V3's router bias; the multi-token-prediction module of ``num_nextn_predict_layers`` is
    not part of the served model and is not counted; Gemma-3 adds q/k norms and, for the multimodal
    checkpoint, its SigLIP vision tower and projector under ``vision``; Falcon counts its fused QKV
    (multi-query or grouped), a 4 x hidden MLP and LayerNorms with biases, embeddings tied; Jamba counts
    its Mamba layers — in/out projections, the causal conv, x/dt projections, A and D, the inner norms —
    between attention layers every ``attn_layer_period``, experts every ``expert_layer_period``;
    Nemotron-H reads ``hybrid_override_pattern`` — ``M`` a Mamba-2 mixer (in_proj to z, x, B, C and dt,
    the causal conv with its bias, dt bias, A, D, the gated norm, out_proj), ``*`` attention, ``-`` a
    squared-ReLU MLP of two matrices, ``E`` a MoE layer of such MLPs (``n_routed_experts`` routed, one shared
    of ``moe_shared_expert_intermediate_size``, a router with its correction bias) — each behind one RMSNorm;
    Qwen3-Next counts gated attention (q_proj twice as wide: query and output gate; q/k norms) every
    ``full_attention_interval`` layers, Gated DeltaNet in the others (in_proj_qkvz, in_proj_ba, the conv,
    dt bias and A per value head, the gated norm, out_proj) and MoE with a gated shared expert in every
    layer; its multi-token-prediction layer is not counted);
    another type, or a missing ``vocab_size`` /
    ``intermediate_size``, raises ValueError naming it (give the count with ``--params`` or the bytes with
    ``--weights-gib`` instead).
    """
    raw = load_config(cfg)
    text, prefix = _text_part(raw)
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    if model_type not in PARAM_COUNT_TYPES:
        raise ValueError(f"config key {prefix}'model_type' {model_type!r}: kvcost counts parameters from the "
                         f"config only for {', '.join(PARAM_COUNT_TYPES)}; give --params N or --weights-gib X")
    layers = _req_int(text, ["num_hidden_layers"], prefix)
    hidden = _req_int(text, ["hidden_size"], prefix)
    heads = _req_int(text, ["num_attention_heads"], prefix)
    kv, _ = _kv_heads(text, heads, prefix)
    hd = _head_dim(text, heads, prefix)
    vocab = _req_int(text, ["vocab_size"], prefix)
    inter = (_opt_int(text, ["intermediate_size"], prefix) or 0) if model_type in ("falcon", "qwen3_next",
                                                                                   "nemotron_h") else \
        _req_int(text, ["intermediate_size"], prefix)          # Falcon: ffn_hidden_size; Qwen3-Next: all MoE
    n_exp = _opt_int(text, ["num_local_experts", "num_experts"], prefix) or 0
    moe_inter = _opt_int(text, ["moe_intermediate_size"], prefix) or inter
    gemma = model_type in ("gemma2", "gemma3", "gemma3_text")
    tied = bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", gemma or model_type == "falcon")))
    if model_type.startswith("deepseek"):
        return _deepseek_counts(text, prefix, layers, hidden, heads, vocab, inter, tied)
    if model_type == "falcon":
        return _falcon_counts(text, prefix, layers, hidden, heads, kv, hd, vocab, tied)
    if model_type == "jamba":
        return _jamba_counts(text, prefix, layers, hidden, heads, kv, hd, vocab, inter, tied)
    if model_type == "nemotron_h":
        return _nemotron_h_counts(text, prefix, layers, hidden, heads, kv, vocab, inter, tied)
    if model_type == "qwen3_next":
        return _qwen3_next_counts(text, prefix, layers, hidden, heads, kv, hd, vocab, tied)
    gpt_oss = model_type == "gpt_oss"
    qkv_bias = gpt_oss or model_type == "qwen2" or bool(text.get("attention_bias"))
    q, k = heads * hd, kv * hd
    attn = hidden * q + 2 * hidden * k + q * hidden
    if qkv_bias:
        attn += q + 2 * k
    if gpt_oss:
        attn += hidden + heads                      # o_proj bias and one learned sink per head
    if model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        attn += 2 * hd                              # q_norm and k_norm
    experts = router = dense = 0
    if n_exp:
        experts = n_exp * 3 * hidden * moe_inter
        router = hidden * n_exp
        if gpt_oss:
            router += n_exp + n_exp * (2 * moe_inter + hidden)     # router bias, expert biases
    else:
        dense = 3 * hidden * inter
    norms = layers * (4 if gemma else 2) * hidden + hidden
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": layers * attn,
           "dense_mlp": layers * dense, "experts": layers * experts, "router": layers * router, "norms": norms}
    vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else None
    if gemma and vision is not None:
        out["vision"] = _siglip_counts(vision, hidden)
    out["total"] = sum(out.values())
    return out


def _deepseek_counts(text: Mapping[str, Any], prefix: str, layers: int, hidden: int, heads: int, vocab: int,
                     inter: int, tied: bool) -> dict[str, int]:
    """DeepSeek-V2/V3 (MLA attention, DeepSeekMoE): see :func:`parameter_counts`."""
    kv_lora = _req_int(text, ["kv_lora_rank"], prefix)
    q_lora = _opt_int(text, ["q_lora_rank"], prefix)
    nope = _req_int(text, ["qk_nope_head_dim"], prefix)
    rope = _req_int(text, ["qk_rope_head_dim"], prefix)
    v_dim = _req_int(text, ["v_head_dim"], prefix)
    moe_inter = _req_int(text, ["moe_intermediate_size"], prefix)
    n_routed = _req_int(text, ["n_routed_experts"], prefix)
    n_shared = _opt_int(text, ["n_shared_experts"], prefix) or 0
    dense_layers = _opt_int(text, ["first_k_dense_replace"], prefix) or 0
    q_dim = heads * (nope + rope)
    q = hidden * q_dim if q_lora is None else hidden * q_lora + q_lora + q_lora * q_dim   # q_a, its norm, q_b
    attn = q + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
    moe_layers = layers - dense_layers
    v3 = str(text.get("model_type")) == "deepseek_v3" or text.get("topk_method") == "noaux_tc"
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": layers * attn,
           "dense_mlp": dense_layers * 3 * hidden * inter + moe_layers * n_shared * 3 * hidden * moe_inter,
           "experts": moe_layers * n_routed * 3 * hidden * moe_inter,
           "router": moe_layers * (hidden * n_routed + (n_routed if v3 else 0)),
           "norms": layers * 2 * hidden + hidden}
    out["total"] = sum(out.values())
    return out


def _falcon_counts(text: Mapping[str, Any], prefix: str, layers: int, hidden: int, heads: int, kv: int, hd: int,
                   vocab: int, tied: bool) -> dict[str, int]:
    """Falcon: fused QKV (one or grouped KV heads), dense out, a GELU MLP, LayerNorms with biases."""
    bias = bool(text.get("bias", False))
    ffn = _opt_int(text, ["ffn_hidden_size"], prefix) or 4 * hidden
    qkv = hidden * (heads + 2 * kv) * hd + ((heads + 2 * kv) * hd if bias else 0)
    attn = qkv + hidden * hidden + (hidden if bias else 0)
    mlp = 2 * hidden * ffn + ((ffn + hidden) if bias else 0)
    new = bool(text.get("new_decoder_architecture", False))
    parallel = bool(text.get("parallel_attn", True))
    lns = 2 if new or not parallel else 1           # ln_attn + ln_mlp, or input (+ post-attention) LayerNorm
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": layers * attn,
           "dense_mlp": layers * mlp, "experts": 0, "router": 0, "norms": layers * lns * 2 * hidden + 2 * hidden}
    out["total"] = sum(out.values())
    return out


def _jamba_counts(text: Mapping[str, Any], prefix: str, layers: int, hidden: int, heads: int, kv: int, hd: int,
                  vocab: int, inter: int, tied: bool) -> dict[str, int]:
    """Jamba: Mamba layers with attention every ``attn_layer_period``, MoE MLPs every ``expert_layer_period``."""
    d_state = _req_int(text, ["mamba_d_state"], prefix)
    d_conv = _req_int(text, ["mamba_d_conv"], prefix)
    d_inner = _req_int(text, ["mamba_expand"], prefix) * hidden
    dt_rank = _req_int(text, ["mamba_dt_rank"], prefix)
    conv_bias = bool(text.get("mamba_conv_bias", True))
    proj_bias = bool(text.get("mamba_proj_bias", False))
    inner_norms = bool(text.get("mamba_inner_layernorms", True))
    mamba = (hidden * 2 * d_inner + (2 * d_inner if proj_bias else 0)          # in_proj
             + d_inner * d_conv + (d_inner if conv_bias else 0)                # conv1d
             + d_inner * (dt_rank + 2 * d_state)                               # x_proj
             + dt_rank * d_inner + d_inner                                     # dt_proj with its bias
             + d_inner * d_state + d_inner                                     # A_log, D
             + d_inner * hidden + (hidden if proj_bias else 0)                 # out_proj
             + ((dt_rank + 2 * d_state) if inner_norms else 0))
    attn = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
    period, offset = _req_int(text, ["attn_layer_period"], prefix), _opt_int(text, ["attn_layer_offset"], prefix) or 0
    e_period = _req_int(text, ["expert_layer_period"], prefix)
    e_offset = _opt_int(text, ["expert_layer_offset"], prefix) or 0
    n_exp = _req_int(text, ["num_experts"], prefix)
    n_attn = sum(1 for i in range(layers) if i % period == offset)
    n_moe = sum(1 for i in range(layers) if i % e_period == e_offset)
    mlp = 3 * hidden * inter
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": n_attn * attn,
           "mamba": (layers - n_attn) * mamba, "dense_mlp": (layers - n_moe) * mlp, "experts": n_moe * n_exp * mlp,
           "router": n_moe * hidden * n_exp, "norms": layers * 2 * hidden + hidden}
    out["total"] = sum(out.values())
    return out


def _siglip_counts(vision: Mapping[str, Any], text_hidden: int) -> int:
    """A SigLIP vision tower (patch and position embeddings, encoder layers with biases, post-LayerNorm) and
    Gemma-3's projector into the text model (one matrix and an RMSNorm)."""
    prefix = "vision_config."
    h = _req_int(vision, ["hidden_size"], prefix)
    n = _req_int(vision, ["num_hidden_layers"], prefix)
    ff = _req_int(vision, ["intermediate_size"], prefix)
    patch = _req_int(vision, ["patch_size"], prefix)
    image = _req_int(vision, ["image_size"], prefix)
    channels = _opt_int(vision, ["num_channels"], prefix) or 3
    layer = 4 * (h * h + h) + (h * ff + ff) + (ff * h + h) + 2 * 2 * h
    embed = channels * patch * patch * h + h + (image // patch) ** 2 * h
    return n * layer + embed + 2 * h + h * text_hidden + h


def _nemotron_h_counts(text: Mapping[str, Any], prefix: str, layers: int, hidden: int, heads: int, kv: int,
                       vocab: int, inter: int, tied: bool) -> dict[str, int]:
    """Nemotron-H: Mamba-2, attention and MLP layers as ``hybrid_override_pattern`` lays them out."""
    pattern = text.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set("M*-E"):
        raise ValueError(f"config key {prefix}'hybrid_override_pattern' must be {layers} characters of M, *, - and E, "
                         f"got {pattern!r}")
    hd = _opt_int(text, ["attention_head_dim", "head_dim"], prefix) or hidden // heads
    m_heads = _req_int(text, ["mamba_num_heads"], prefix)
    m_hd = _req_int(text, ["mamba_head_dim"], prefix)
    groups = _req_int(text, ["n_groups"], prefix)
    d_state = _req_int(text, ["ssm_state_size"], prefix)
    d_conv = _req_int(text, ["conv_kernel"], prefix)
    d_inner = m_heads * m_hd
    conv_dim = d_inner + 2 * groups * d_state
    bias = bool(text.get("use_bias", text.get("mamba_proj_bias", False)))
    mamba = (hidden * (d_inner + conv_dim + m_heads) + ((d_inner + conv_dim + m_heads) if bias else 0)
             + conv_dim * d_conv + (conv_dim if text.get("use_conv_bias", True) else 0)
             + 3 * m_heads + d_inner                                       # dt_bias, A_log, D; the gated norm
             + d_inner * hidden + (hidden if bias else 0))
    attn = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
    n_moe = pattern.count("E")
    mlp = 2 * hidden * (inter if pattern.count("-") else 0)                # up and down, squared ReLU
    experts = router = shared = 0
    if n_moe:
        n_exp = _req_int(text, ["n_routed_experts"], prefix)
        experts = n_moe * n_exp * 2 * hidden * _req_int(text, ["moe_intermediate_size"], prefix)
        shared = n_moe * 2 * hidden * (_opt_int(text, ["moe_shared_expert_intermediate_size"], prefix) or 0)
        router = n_moe * (hidden * n_exp + n_exp)                          # the gate and its correction bias
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": pattern.count("*") * attn,
           "mamba": pattern.count("M") * mamba, "dense_mlp": pattern.count("-") * mlp + shared, "experts": experts,
           "router": router, "norms": layers * hidden + hidden}
    out["total"] = sum(out.values())
    return out


def _qwen3_next_counts(text: Mapping[str, Any], prefix: str, layers: int, hidden: int, heads: int, kv: int,
                       hd: int, vocab: int, tied: bool) -> dict[str, int]:
    """Qwen3-Next: gated attention every ``full_attention_interval`` layers, Gated DeltaNet between, MoE with a
    gated shared expert in every layer."""
    interval = _req_int(text, ["full_attention_interval"], prefix)
    n_full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    nk = _req_int(text, ["linear_num_key_heads"], prefix)
    nv = _req_int(text, ["linear_num_value_heads"], prefix)
    dk = _req_int(text, ["linear_key_head_dim"], prefix)
    dv = _req_int(text, ["linear_value_head_dim"], prefix)
    kernel = _req_int(text, ["linear_conv_kernel_dim"], prefix)
    n_exp = _req_int(text, ["num_experts"], prefix)
    moe_inter = _req_int(text, ["moe_intermediate_size"], prefix)
    shared = _opt_int(text, ["shared_expert_intermediate_size"], prefix) or 0
    gate = 2 if text.get("attn_output_gate", True) else 1
    attn = hidden * heads * hd * gate + 2 * hidden * kv * hd + heads * hd * hidden + 2 * hd
    key_dim, value_dim = nk * dk, nv * dv
    delta = (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv      # in_proj_qkvz, in_proj_ba
             + (2 * key_dim + value_dim) * kernel + 2 * nv + dv            # conv (no bias), dt_bias and A_log, norm
             + value_dim * hidden)                                         # out_proj
    out = {"embedding": vocab * hidden * (1 if tied else 2), "attention": n_full * attn,
           "linear_attention": (layers - n_full) * delta,
           "dense_mlp": layers * (3 * hidden * shared + (hidden if shared else 0)),   # shared expert and its gate
           "experts": layers * n_exp * 3 * hidden * moe_inter, "router": layers * hidden * n_exp,
           "norms": layers * 2 * hidden + hidden}
    out["total"] = sum(out.values())
    return out
