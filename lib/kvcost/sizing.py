"""KV-cache sizing from a model's ``config.json``, and the capacity planner built on it.

The post's formula, ``2 x layers x KV heads x head_dim x bytes``, is exact for a plain
GQA/MHA transformer and wrong for most models shipped since: sliding-window layers keep
at most ``window`` tokens, MLA layers keep one compressed latent instead of K and V,
and linear-attention / state-space layers keep no KV at all (a constant state instead).
:func:`from_hf_config` reads all of these from a Hugging Face config into a
:class:`Geometry`; :func:`cache_bytes` sizes one sequence's cache in any storage format
of :mod:`kvcost.formats`; :func:`requests_in_budget`, :func:`max_context` and
:func:`plan` answer the capacity questions.

The post's own (naive) formula is kept too — :func:`naive_bytes_per_token`,
:func:`post_table` — because notebook 01 reproduces the post's table to the digit
before correcting it.

Only the standard library is imported at module level (the CLI must answer in well
under a second); pandas and matplotlib are imported inside the functions that need them.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from . import formats

__all__ = [
    "Geometry", "StateSpec", "Plan",
    "from_hf_config", "load_model", "list_models", "model_record", "models_dir", "check_models",
    "cache_bytes", "kv_bytes_per_token", "marginal_bytes_per_token", "state_bytes", "shared_bytes", "layer_breakdown",
    "requests_in_budget", "max_context", "context_warnings", "plan",
    "naive_bytes_per_token", "naive_geometry", "post_table", "post_listing", "POST_MODELS",
    "corrected_table", "cache_curve", "curves", "reading_checks", "GIB", "MIB", "KIB",
]

KIB = 1024
MIB = 1024 ** 2
GIB = 1024 ** 3

#: The five models of the post's Block 1, in its order.
POST_MODELS = ["Llama-3.1-8B", "Qwen3-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Llama-2-7B"]

# Layer kinds in Geometry.layer_kinds.
FULL, SLIDING, MLA, LINEAR, MAMBA, NONE = "full", "sliding", "mla", "linear", "mamba", "none"
_KV_KINDS = (FULL, SLIDING, MLA)
_STATE_KINDS = (LINEAR, MAMBA)

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
        return sum(1 for k in self.layer_kinds if k in _KV_KINDS)

    @property
    def state_layers(self) -> int:
        """Layers that keep a constant recurrent state instead (linear attention, SSM)."""
        return sum(1 for k in self.layer_kinds if k in _STATE_KINDS)

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


def _as_pos_int(key: str, value: Any, prefix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if isinstance(value, float) and value.is_integer() and value > 0:
            return int(value)
        raise ValueError(f"config key {prefix}{key!r} must be a positive integer, got {value!r}")
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


def _load_config(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    if isinstance(cfg, (str, os.PathLike)):
        path = Path(cfg)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"config path {str(cfg)!r} is not a config.json file or a folder holding one")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"config file {path.name!r} is not valid JSON: {err}") from None
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
    raw = _load_config(cfg)
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
    if any(k in _STATE_KINDS for k in kinds) and state is None:
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


# ----------------------------------------------------------------------------- model registry

def models_dir() -> Path:
    """Folder of the model records: ``$KVCOST_MODELS_DIR`` or ``data/models`` in the checkout."""
    env = os.environ.get("KVCOST_MODELS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2] / "data" / "models"
    return here if here.is_dir() else Path.cwd() / "data" / "models"


_RECORDS: dict[str, dict[str, Any]] | None = None


def _records() -> dict[str, dict[str, Any]]:
    global _RECORDS
    if _RECORDS is None:
        recs: dict[str, dict[str, Any]] = {}
        folder = models_dir()
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            rec = json.loads(path.read_text(encoding="utf-8"))
            recs[rec["name"]] = rec
        _RECORDS = recs
    return _RECORDS


def list_models() -> list[str]:
    """Names of the models in ``data/models``, sorted case-insensitively."""
    return sorted(_records(), key=str.lower)


def model_record(name: str) -> dict[str, Any]:
    """The full record of a model (config subset, sources, notes); ValueError listing known names."""
    recs = _records()
    if isinstance(name, str):
        if name in recs:
            return recs[name]
        folded = {k.lower(): k for k in recs}
        if name.lower() in folded:
            return recs[folded[name.lower()]]
        by_repo = {str(r.get("hf_repo", "")).lower(): k for k, r in recs.items()}
        if name.lower() in by_repo:
            return recs[by_repo[name.lower()]]
    raise ValueError(f"unknown model {name!r}; known models: {list_models()}")


def check_models(param: str, names: Any, min_len: int = 1) -> list[str]:
    """Validate a notebook/CLI list of model names; returns their canonical names.

    Names match case-insensitively, and Hugging Face repo ids work too; anything else raises
    ValueError naming ``param`` and listing the known models.
    """
    if not isinstance(names, (list, tuple)) or len(names) < min_len or not all(isinstance(n, str) for n in names):
        raise ValueError(f"parameter {param!r} must be a list of at least {min_len} model name(s) "
                         f"from {list_models()}, got {names!r}")
    out = []
    for name in names:
        try:
            out.append(model_record(name)["name"])
        except ValueError:
            raise ValueError(f"parameter {param!r}: unknown model {name!r}; known models: {list_models()}") from None
    return out


def load_model(name: str) -> Geometry:
    """The :class:`Geometry` of a model in ``data/models`` (by name or Hugging Face repo id)."""
    rec = model_record(name)
    return from_hf_config(rec["config"], name=rec["name"])


def naive_geometry(name: str) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) as the post's Block 1 reads them from a model's config."""
    return load_model(name).naive


# ----------------------------------------------------------------------------- sizing

def _check_context(context: Any, name: str = "context") -> int:
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"parameter {name!r} must be a non-negative integer number of tokens, got {context!r}")
    return context


def _kv_formats(dtype: str, v_dtype: str | None) -> tuple[formats.Format, formats.Format]:
    """The K and V storage formats (V defaults to K's); errors name the parameter."""
    try:
        kf = formats.get(dtype)
    except ValueError as err:
        raise ValueError(f"parameter 'dtype': {err}") from None
    if v_dtype is None:
        return kf, kf
    try:
        return kf, formats.get(v_dtype)
    except ValueError as err:
        raise ValueError(f"parameter 'v_dtype': {err}") from None


def _tokens_bytes(fmt: formats.Format, tokens: int, n_values: int, head_dim: int) -> Fraction:
    """Bytes of ``tokens`` rows of ``n_values`` in ``fmt``, with KIVI's fp16 residual window."""
    if tokens == 0 or n_values == 0:
        return Fraction(0)
    if fmt.residual:
        recent = min(tokens, fmt.residual)
        old = tokens - recent
        resid = formats.get(fmt.residual_format)
        return old * fmt.row_bytes(n_values, head_dim) + recent * resid.row_bytes(n_values, head_dim)
    return tokens * fmt.row_bytes(n_values, head_dim)


def layer_breakdown(g: Geometry, context: int, dtype: str = "bf16",
                    v_dtype: str | None = None) -> list[dict[str, Any]]:
    """One row per kind of KV-holding layer: layers, tokens held, K and V bytes (exact Fractions)."""
    context = _check_context(context)
    kf, vf = _kv_formats(dtype, v_dtype)
    rows = []
    for kind in (FULL, SLIDING, MLA):
        n = g.count(kind)
        if not n:
            continue
        tokens = min(context, g.window) if kind == SLIDING and g.window is not None else context
        if kind == MLA:
            assert g.mla_latent is not None
            k_b = _tokens_bytes(kf, tokens, g.mla_latent, g.mla_latent)
            v_b = Fraction(0)      # the latent is shared by K and V: no separate V
        else:
            k_b = _tokens_bytes(kf, tokens, g.kv_heads * g.head_dim, g.head_dim)
            v_b = _tokens_bytes(vf, tokens, g.kv_heads * g.v_head_dim, g.v_head_dim)
        rows.append({"kind": kind, "layers": n, "tokens": tokens,
                     "k_bytes": n * k_b, "v_bytes": n * v_b})
    return rows


def cache_bytes(g: Geometry, context: int, dtype: str = "bf16", v_dtype: str | None = None) -> int:
    """Bytes of KV cache one sequence of ``context`` tokens holds, over all layers.

    Sliding-window layers hold ``min(context, window)`` tokens; MLA layers hold their
    latent (in ``dtype``; ``v_dtype`` does not apply); linear-attention / SSM layers hold
    no KV (see :func:`state_bytes`). ``dtype`` / ``v_dtype`` are :mod:`kvcost.formats`
    names; block formats are counted in whole blocks per row, the total rounded up to a
    whole byte. Unknown format or negative context: ``ValueError``.
    """
    rows = layer_breakdown(g, context, dtype, v_dtype)
    total = sum((r["k_bytes"] + r["v_bytes"] for r in rows), Fraction(0))
    return math.ceil(total)


def kv_bytes_per_token(g: Geometry, dtype: str = "bf16", v_dtype: str | None = None) -> float:
    """Bytes one token costs while every KV layer still holds it (context within every window).

    This is the short-context slope of :func:`cache_bytes`; beyond a sliding window only
    full and MLA layers keep growing (:func:`marginal_bytes_per_token`). KIVI's fp16 residual
    window is not included (it is a per-sequence cost).
    """
    kf, vf = _kv_formats(dtype, v_dtype)
    total = Fraction(0)
    for kind in (FULL, SLIDING, MLA):
        n = g.count(kind)
        if not n:
            continue
        if kind == MLA:
            assert g.mla_latent is not None
            total += n * kf.row_bytes(g.mla_latent, g.mla_latent)
        else:
            total += n * (kf.row_bytes(g.kv_heads * g.head_dim, g.head_dim)
                          + vf.row_bytes(g.kv_heads * g.v_head_dim, g.v_head_dim))
    return float(total)


def marginal_bytes_per_token(g: Geometry, context: int, dtype: str = "bf16",
                             v_dtype: str | None = None) -> int:
    """Bytes the next token adds to a sequence already ``context`` tokens long."""
    context = _check_context(context)
    return cache_bytes(g, context + 1, dtype, v_dtype) - cache_bytes(g, context, dtype, v_dtype)


def state_bytes(g: Geometry, dtype: str | None = None) -> int | None:
    """Constant recurrent-state bytes one sequence keeps in linear-attention / SSM layers.

    ``dtype`` defaults to the config's ``mamba_ssm_cache_dtype`` when it has one, else
    bf16. 0 for a model without such layers; ``None`` when the config does not say
    enough to size the state.
    """
    if g.state_layers == 0:
        return 0
    if g.state is None:
        return None
    fmt = formats.get(dtype or g.state_dtype or "bf16")
    return math.ceil(g.state_layers * g.state.values * fmt.bytes_per_value())


def shared_bytes(g: Geometry, dtype: str = "bf16", v_dtype: str | None = None) -> int:
    """Context-independent cache metadata shared by all sequences (static per-head scales)."""
    kf, vf = _kv_formats(dtype, v_dtype)
    heads = 1 if g.count(MLA) else g.kv_heads
    per_layer = formats.fixed_bytes(kf, heads) + (0 if g.count(MLA) else formats.fixed_bytes(vf, heads))
    return g.kv_layers * per_layer


def _budget_bytes(budget_gib: Any) -> int:
    if isinstance(budget_gib, bool) or not isinstance(budget_gib, (int, float)) or not (
            budget_gib > 0 and math.isfinite(budget_gib)):
        raise ValueError(f"'budget_gib' must be a positive number of GiB, got {budget_gib!r}")
    return int(budget_gib * GIB)


def requests_in_budget(g: Geometry, budget_gib: float, context: int, dtype: str = "bf16",
                       v_dtype: str | None = None, include_state: bool = True,
                       state_dtype: str | None = None) -> int:
    """How many concurrent sequences of ``context`` tokens fit in ``budget_gib`` GiB of cache.

    Each sequence costs :func:`cache_bytes` plus (``include_state``) its recurrent state;
    static per-head scales are taken from the budget once.
    """
    budget = _budget_bytes(budget_gib) - shared_bytes(g, dtype, v_dtype)
    per = cache_bytes(g, context, dtype, v_dtype)
    if include_state:
        per += state_bytes(g, state_dtype) or 0
    if per <= 0:
        raise ValueError(f"'context' {context} gives an empty cache: no request size to divide by")
    return max(0, budget // per)


def max_context(g: Geometry, budget_gib: float, dtype: str = "bf16", v_dtype: str | None = None,
                requests: int = 1, include_state: bool = True,
                state_dtype: str | None = None) -> int | None:
    """The longest context ``requests`` concurrent sequences can each hold in ``budget_gib`` GiB.

    ``None`` when memory sets no limit (every KV layer is windowed and the windows fit);
    0 when not even an empty sequence's state fits.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ValueError(f"'requests' must be a positive integer, got {requests!r}")
    budget = _budget_bytes(budget_gib) - shared_bytes(g, dtype, v_dtype)
    fixed = (state_bytes(g, state_dtype) or 0) if include_state else 0

    def fits(ctx: int) -> bool:
        return requests * (cache_bytes(g, ctx, dtype, v_dtype) + fixed) <= budget

    if not fits(0):
        return 0
    if g.count(FULL) + g.count(MLA) == 0:
        # Only windowed layers: the cache stops growing at the largest window.
        return None if fits((g.window or 0) + 1) else _bisect(fits, 0, (g.window or 0) + 1)
    hi = 1
    while fits(hi):
        hi *= 2
    return _bisect(fits, hi // 2, hi)


def _bisect(fits: Any, lo: int, hi: int) -> int:
    """Largest x in [lo, hi) with fits(x), given fits(lo) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def context_warnings(g: Geometry, context: int) -> list[str]:
    """Warnings for a planned context: beyond ``max_position_embeddings``, or past every window."""
    context = _check_context(context)
    out = []
    if g.max_position_embeddings is not None and context > g.max_position_embeddings:
        extra = " (the config's rope_scaling may extend it)" if g.rope_scaling else ""
        out.append(f"context {context} exceeds max_position_embeddings "
                   f"{g.max_position_embeddings} of {g.name}{extra}")
    if g.kv_layers and g.count(SLIDING) == g.kv_layers and g.window is not None and context > g.window:
        out.append(f"every attention layer of {g.name} sees only the last {g.window} tokens: "
                   f"the cache stops growing there, and so does what the model attends to")
    return out


@dataclass(frozen=True)
class Plan:
    """A capacity plan for one model, context and format (see :func:`plan`)."""

    model: str
    summary: str
    context: int
    dtype: str
    v_dtype: str
    bytes_per_token: float
    cache_bytes: int
    naive_cache_bytes: int
    state_bytes: int | None
    state_dtype: str
    shared_bytes: int
    budget_gib: float | None
    request_tokens: int | None
    requests: int | None
    max_context: int | None
    max_context_unbounded: bool
    breakdown: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (Fractions as floats)."""
        d = asdict(self)
        d["breakdown"] = [{k: (float(v) if isinstance(v, Fraction) else v) for k, v in row.items()}
                          for row in self.breakdown]
        d["warnings"] = list(self.warnings)
        d["notes"] = list(self.notes)
        d["cache_gib"] = self.cache_bytes / GIB
        d["naive_cache_gib"] = self.naive_cache_bytes / GIB
        return d


def plan(g: Geometry, context: int, dtype: str = "bf16", v_dtype: str | None = None,
         budget_gib: float | None = None, request_tokens: int | None = None,
         state_dtype: str | None = None) -> Plan:
    """Everything a capacity planner asks, for one model at one context and format.

    ``requests`` is how many sequences of ``request_tokens`` (default: ``context``) fit in
    ``budget_gib``; ``max_context`` the longest single sequence that fits. ``naive_cache_bytes``
    is the post's formula (every layer, K and V of every KV head) in the same K and V formats.
    """
    context = _check_context(context)
    kf, vf = _kv_formats(dtype, v_dtype)
    rt = context if request_tokens is None else _check_context(request_tokens, "request_tokens")
    layers, kvh, hd = g.naive
    naive = math.ceil(layers * kvh * hd * context * (kf.bytes_per_value(hd) + vf.bytes_per_value(hd)))
    sdt = state_dtype or g.state_dtype or "bf16"
    requests = mc = None
    unbounded = False
    if budget_gib is not None:
        requests = requests_in_budget(g, budget_gib, rt, kf.name, vf.name, state_dtype=sdt) if rt else None
        mc = max_context(g, budget_gib, kf.name, vf.name, state_dtype=sdt)
        unbounded = mc is None
    return Plan(
        model=g.name, summary=g.summary(), context=context, dtype=kf.name, v_dtype=vf.name,
        bytes_per_token=kv_bytes_per_token(g, kf.name, vf.name),
        cache_bytes=cache_bytes(g, context, kf.name, vf.name), naive_cache_bytes=naive,
        state_bytes=state_bytes(g, sdt), state_dtype=sdt,
        shared_bytes=shared_bytes(g, kf.name, vf.name),
        budget_gib=budget_gib, request_tokens=rt, requests=requests, max_context=mc,
        max_context_unbounded=unbounded,
        breakdown=tuple(layer_breakdown(g, context, kf.name, vf.name)),
        warnings=tuple(context_warnings(g, context)), notes=g.notes,
    )


def cache_curve(g: Geometry, contexts: Iterable[int], dtype: str = "bf16",
                v_dtype: str | None = None) -> list[int]:
    """:func:`cache_bytes` at each context (for plots)."""
    return [cache_bytes(g, c, dtype, v_dtype) for c in contexts]


# ----------------------------------------------------------------------------- the post's formula

def naive_bytes_per_token(layers: int, kv_heads: int, head_dim: int, item_bytes: float = 2) -> float:
    """The post's formula: ``2 x layers x kv_heads x head_dim x item_bytes`` (K and V, every layer)."""
    return 2 * layers * kv_heads * head_dim * item_bytes


def post_table(models: Sequence[str] = POST_MODELS, context: int = 131_072, budget_gib: float = 24.0,
               request_tokens: int = 8192) -> Any:
    """The post's Block 1 table for ``models`` (a DataFrame with the contract's ``sizing.csv`` columns).

    Numbers follow the post's formula and rounding exactly: bf16 = 2 bytes, fp8 = 1 byte,
    ``requests = int(budget * 2**30 / (bytes_per_token * request_tokens))``.
    """
    import pandas as pd

    _check_context(context)
    rows = []
    for name in models:
        layers, kvh, hd = naive_geometry(name)
        b = naive_bytes_per_token(layers, kvh, hd)
        b8 = naive_bytes_per_token(layers, kvh, hd, 1)
        rows.append({
            "model": model_record(name)["name"], "layers": layers, "kv_heads": kvh, "head_dim": hd,
            "kib_per_token_bf16": b / 1024,
            "gib_at_context_bf16": b * context / 1024 ** 3,
            "gib_at_context_fp8": b8 * context / 1024 ** 3,
            "requests_at_budget": int(budget_gib * 1024 ** 3 / (b * request_tokens)),
        })
    return pd.DataFrame(rows, columns=["model", "layers", "kv_heads", "head_dim", "kib_per_token_bf16",
                                       "gib_at_context_bf16", "gib_at_context_fp8", "requests_at_budget"])


def post_listing(models: Sequence[str] = POST_MODELS) -> Any:
    """The post's second listing: KV heads, KiB/token and the ratio to 128 KiB/token (Llama-3.1-8B)."""
    import pandas as pd

    rows = []
    for name in models:
        layers, kvh, hd = naive_geometry(name)
        bpt = naive_bytes_per_token(layers, kvh, hd)
        rows.append({"model": model_record(name)["name"], "kv_heads": kvh, "kib_per_token": bpt / 1024,
                     "ratio": bpt / 131_072})
    return pd.DataFrame(rows, columns=["model", "kv_heads", "kib_per_token", "ratio"])


def corrected_table(models: Sequence[str], context: int = 131_072, dtype: str = "bf16",
                    budget_gib: float = 24.0, request_tokens: int = 8192) -> Any:
    """Naive (post's formula) against corrected sizing, per model, in one storage format."""
    import pandas as pd

    rows = []
    for name in models:
        g = load_model(name)
        p = plan(g, context, dtype, budget_gib=budget_gib, request_tokens=request_tokens)
        layers, kvh, hd = g.naive
        naive_req = int(budget_gib * GIB // (p.naive_cache_bytes / context * request_tokens)) \
            if context else None
        st = p.state_bytes
        rows.append({
            "model": g.name, "architecture": g.summary(),
            "naive_kib_per_token": naive_bytes_per_token(layers, kvh, hd,
                                                         float(formats.bytes_per_value(dtype, hd))) / 1024,
            "kib_per_token": p.bytes_per_token / 1024,
            "naive_gib_at_context": p.naive_cache_bytes / GIB,
            "gib_at_context": p.cache_bytes / GIB,
            "naive_over_true": (p.naive_cache_bytes / p.cache_bytes) if p.cache_bytes else float("inf"),
            "state_mib": (st / MIB) if st is not None else float("nan"),
            "naive_requests_at_budget": naive_req,
            "requests_at_budget": p.requests,
            "max_position_embeddings": g.max_position_embeddings,
            "context_ok": not any("max_position_embeddings" in w for w in p.warnings),
        })
    return pd.DataFrame(rows)


def curves(models: Sequence[str], contexts: Sequence[int], dtypes: Sequence[str] = ("bf16",),
           budget_gib: float = 24.0) -> Any:
    """Long table for plots: model, dtype, context, cache GiB (true and naive), requests in budget.

    ``requests`` counts sequences of ``context`` tokens (each with its recurrent state) that
    fit in ``budget_gib``; ``naive_requests`` the same by the post's formula.
    """
    import pandas as pd

    rows = []
    for name in models:
        g = load_model(name)
        layers, kvh, hd = g.naive
        for dt in dtypes:
            bpv = formats.bytes_per_value(dt, hd)
            st = state_bytes(g) or 0
            for ctx in contexts:
                c = cache_bytes(g, ctx, dt)
                naive = math.ceil(2 * layers * kvh * hd * bpv * ctx)
                rows.append({"model": g.name, "dtype": dt, "context": ctx, "gib": c / GIB,
                             "naive_gib": naive / GIB,
                             "requests": int(budget_gib * GIB // (c + st)) if c + st else None,
                             "naive_requests": int(budget_gib * GIB // naive) if naive else None})
    return pd.DataFrame(rows)


def reading_checks(context: int = 131_072) -> list[Any]:
    """The post's readings of its sizing section, each checked against kvcost's computation.

    Returns :class:`kvcost.report.Check` rows (claim = the post's words, computed = what
    kvcost finds, agrees = whether the reading holds).
    """
    from .report import Check

    checks = []
    llama, qwen, mistral, oss, l2 = (load_model(n) for n in POST_MODELS)
    # "One formula covers every model, and it is exact enough to plan capacity with."
    off = []
    for name in list_models():
        g = load_model(name)
        layers, kvh, hd = g.naive
        naive = naive_bytes_per_token(layers, kvh, hd) * context
        true = cache_bytes(g, context)
        if abs(naive - true) > 0.01 * true:
            off.append(f"{g.name} {naive / true:.2g}x")
    checks.append(Check(
        "One formula covers every model, and it is exact enough to plan capacity with", "exact",
        f"at {context:,} tokens in bf16 it is off by more than 1% for {len(off)} of "
        f"{len(list_models())} models ({', '.join(off)})",
        not off, "sliding windows, MLA latents and SSM/linear layers are outside the formula"))
    # The post's own table, corrected: gpt-oss-20b and Mistral-7B-v0.1 at 128k.
    for g, printed in ((oss, "6.0"), (mistral, "16.0")):
        true = cache_bytes(g, 131_072) / GIB                     # the post's claim is at 128k
        naive = naive_bytes_per_token(*g.naive) * 131_072 / GIB
        checks.append(Check(
            f"{g.name} needs {printed} GiB of bf16 KV at 128k", printed,
            f"{true:.3f} GiB: {g.count(SLIDING)} of {g.num_layers} layers keep only a "
            f"{g.window}-token window ({naive / true:.1f}x less than the formula)",
            abs(true - naive) < 0.05, "the formula counts windowed layers at full context"))
    # "Llama-2-7B costs 4x the KV bytes of an 8B Llama-3 model because GQA is the 4x"
    ratio = cache_bytes(l2, context) / cache_bytes(llama, context)
    checks.append(Check("Llama-2-7B costs 4x the KV bytes of an 8B Llama-3 model; GQA is the 4x", "4x",
                        f"{ratio:g}x ({l2.kv_heads} against {llama.kv_heads} KV heads, same layers "
                        f"and head_dim)", ratio == 4.0 and l2.kv_heads == 4 * llama.kv_heads))
    # The published measurements the arithmetic must match (shared with notebook 05).
    from .vendors import dgx_spark_buffer_checks, qwen3_q8_0_checks, weights_ratio_check

    checks += [weights_ratio_check(), *qwen3_q8_0_checks(), *dgx_spark_buffer_checks()]
    return checks
