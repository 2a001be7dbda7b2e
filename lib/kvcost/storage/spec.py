"""The one parser of compound KV-cache storage specs: ``[store:]K[/V][+hadamard][@hf|@gguf][;skip=...]``.

Every module that takes a storage format as text (the CLI, :mod:`kvcost.models.footprint`, :mod:`kvcost.storage.quant`,
the real-decoder cache hook :mod:`kvcost.models.decoders`, the planner :mod:`kvcost.experiments.plan`)
reads it through :func:`parse_spec` and works on the :class:`CacheSpec` it returns; none slices the
text itself.

=======================  ===========================================================================
``store:``               the format stores the real decoder's cache (a passkey variant's prefix)
``K`` / ``K/V``          K's format, and V's when it differs (llama.cpp ``-ctk q8_0 -ctv q4_0``);
                         any :mod:`kvcost.storage.formats` name or alias (``fp8`` is ``fp8_e4m3``)
``+hadamard``            K and V rotated by the normalized Hadamard matrix of the whole head before storing
                         (QuaRot; llama.cpp PR #21038's idea). llama.cpp as shipped rotates K in blocks of
                         the largest power of two (>= 64) dividing the head size and V in blocks of 64,
                         by default, for quantized cache types only: :func:`llamacpp_rotation`
``@hf`` / ``@gguf``      the channel order K's blocks are cut in: transformers' or the GGUF file's
                         (:data:`kvcost.models.decoders.K_LAYOUTS`); only for formats with channel blocks
``;skip=a,b``            layers kept unquantized, as vLLM's ``kv_cache_dtype_skip_layers``: layer
                         indices or the attention type ``sliding_window``
``;skip_dtype=T``        the format those layers keep (default ``bf16``, vLLM's ``auto`` for a bf16
                         model)
=======================  ===========================================================================

Standard library only (the CLI path).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kvcost.storage import formats

__all__ = ["CHANNEL_ORDERS", "HADAMARD", "LLAMACPP_ROT_MIN", "SKIP_KINDS", "STORE_PREFIX", "CacheSpec",
           "ChannelOrderError", "llamacpp_rotation", "parse_spec"]

#: The prefix that marks a stored-format variant of the real decoder's runs.
STORE_PREFIX = "store:"
#: The rotation suffix and the only rotation there is.
HADAMARD = "+hadamard"
#: Channel orders K can be stored in (``@hf`` / ``@gguf``).
CHANNEL_ORDERS = ("gguf", "hf")
#: Attention types a skip list may name (vLLM ``kv_cache_dtype_skip_layers``).
SKIP_KINDS = ("sliding_window",)

#: llama.cpp's smallest rotation block, and V's only one (data/storage_formats.md, llama.cpp: rotation as shipped).
LLAMACPP_ROT_MIN = 64

_GRAMMAR = re.compile(
    r"(?P<store>store:)?(?P<k>[a-z0-9_]+)(?:/(?P<v>[a-z0-9_]+))?(?P<rot>\+hadamard)?(?:@(?P<order>[a-z]+))?"
    r"(?P<opts>(?:;[a-z_]+=[a-z0-9_,]*)*)")
_ALLOWED = ("'[store:]K[/V][+hadamard][@hf|@gguf][;skip=sliding_window,0,...][;skip_dtype=T]', K and V "
            "kvcost.storage.formats names")


class ChannelOrderError(ValueError):
    """A channel order (``@hf`` / ``@gguf``) given for a format whose stored values do not depend on it."""


@dataclass(frozen=True)
class CacheSpec:
    """A parsed storage spec: K's and V's formats (canonical :mod:`kvcost.storage.formats` names), the rotation,
    K's channel order, the layers kept in ``skip_dtype`` and whether it came with ``store:``."""

    k: str
    v: str
    rotation: str | None = None          # "hadamard" or None
    k_order: str | None = None           # "gguf" | "hf" | None (the caller's default)
    skip_layers: tuple[str, ...] = ()    # layer indices (as text) and attention types
    skip_dtype: str = "bf16"
    store: bool = False

    @property
    def k_format(self) -> formats.Format:
        return formats.get(self.k)

    @property
    def v_format(self) -> formats.Format:
        return formats.get(self.v)

    @property
    def base(self) -> str:
        """``K`` or ``K/V`` without rotation, order, skips or prefix."""
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    @property
    def label(self) -> str:
        """The canonical text of this spec (``parse_spec(s.label) == s``)."""
        text = (STORE_PREFIX if self.store else "") + self.base + (HADAMARD if self.rotation else "")
        if self.k_order is not None:
            text += f"@{self.k_order}"
        if self.skip_layers:
            text += ";skip=" + ",".join(self.skip_layers)
            if self.skip_dtype != "bf16":
                text += f";skip_dtype={self.skip_dtype}"
        return text

    @property
    def kv_label(self) -> str:
        """``K/V`` always (the planner's storage column)."""
        return f"{self.k}/{self.v}"

    def skips(self, layer: int, kind: str) -> bool:
        """True when layer ``layer`` (0-based) of attention kind ``kind`` (``full``, ``sliding``, ``mla``)
        is kept in :attr:`skip_dtype` rather than quantized."""
        return str(layer) in self.skip_layers or (kind == "sliding" and "sliding_window" in self.skip_layers)

    def layer_formats(self, layer: int, kind: str) -> tuple[str, str]:
        """``(K format, V format)`` names of one layer."""
        return (self.skip_dtype, self.skip_dtype) if self.skips(layer, kind) else (self.k, self.v)

    def without_store(self) -> CacheSpec:
        return CacheSpec(self.k, self.v, self.rotation, self.k_order, self.skip_layers, self.skip_dtype)


def _canonical(name: str, what: str, param: str) -> str:
    try:
        return formats.get(name).name
    except ValueError as err:
        raise ValueError(f"parameter {param!r}: {what} {name!r}: {err}") from None


def parse_spec(spec: str | CacheSpec, v_dtype: str | None = None, *, param: str = "dtype") -> CacheSpec:
    """The :class:`CacheSpec` of ``spec`` (see the module docstring for the grammar).

    ``v_dtype`` (sizing's and the CLI's separate V format) sets V when ``spec`` names only K; naming V
    twice, differently, is an error. ``param`` names the parameter in error messages. A
    :class:`CacheSpec` is returned as it is (with ``v_dtype`` applied).
    """
    if isinstance(spec, CacheSpec):
        out = spec
    else:
        if not isinstance(spec, str):
            raise ValueError(f"parameter {param!r} must be a storage spec string {_ALLOWED}, got {spec!r}")
        text = spec.strip().lower()
        m = _GRAMMAR.fullmatch(text)
        if not m:
            raise ValueError(f"parameter {param!r} must be a storage spec {_ALLOWED}, got {spec!r}")
        k = _canonical(m["k"], "format", param)
        v = _canonical(m["v"], "V format", param) if m["v"] else k
        order = m["order"]
        if order is not None and order not in CHANNEL_ORDERS:
            raise ValueError(f"parameter {param!r}: channel order '@{order}' in {spec!r} must be one of "
                             f"{['@' + o for o in CHANNEL_ORDERS]}")
        if order is not None and not formats.get(k).channel_blocks:
            raise ChannelOrderError(f"parameter {param!r}: {spec!r}: '@{order}' (K's channel order) changes only "
                                    f"formats storing K in blocks of channels; {k} stores the same values in either "
                                    f"order")
        skips: tuple[str, ...] = ()
        skip_dtype = "bf16"
        for opt in filter(None, m["opts"].split(";")):
            key, _, value = opt.partition("=")
            if key == "skip":
                items = tuple(i for i in value.split(",") if i)
                bad = [i for i in items if not (i.isdigit() or i in SKIP_KINDS)]
                if not items or bad:
                    raise ValueError(f"parameter {param!r}: skip list {value!r} in {spec!r} must be layer indices "
                                     f"or {list(SKIP_KINDS)}")
                skips = items
            elif key == "skip_dtype":
                skip_dtype = _canonical(value, "skip_dtype", param)
            else:
                raise ValueError(f"parameter {param!r}: unknown option {key!r} in {spec!r}; allowed: skip, "
                                 f"skip_dtype")
        if skip_dtype != "bf16" and not skips:
            raise ValueError(f"parameter {param!r}: {spec!r} sets skip_dtype without a skip list")
        out = CacheSpec(k, v, "hadamard" if m["rot"] else None, order, skips, skip_dtype, bool(m["store"]))
    if v_dtype is not None:
        v = _canonical(v_dtype, "V format", "v_dtype")
        if out.v != out.k and out.v != v:
            raise ValueError(f"parameter 'v_dtype': {v_dtype!r} contradicts the V format {out.v!r} of the spec "
                             f"{out.label!r}")
        out = CacheSpec(out.k, v, out.rotation, out.k_order, out.skip_layers, out.skip_dtype, out.store)
    return out


def _rot_block(fmt: str, head_dim: object, param: str, largest: bool) -> int | None:
    f = formats.get(fmt)
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"parameter {param!r} must be a positive integer, got {head_dim!r}")
    if f.family != "ggml" or head_dim % LLAMACPP_ROT_MIN:
        return None
    n = LLAMACPP_ROT_MIN
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return n


def llamacpp_rotation(type_k: str, type_v: str | None = None, head_dim_k: int = 128, head_dim_v: int | None = None,
                      *, disabled: bool = False) -> tuple[int | None, int | None]:
    """The Hadamard block sizes llama.cpp rotates K and V in by default, ``(k_block, v_block)``, None where it
    does not rotate (llama.cpp's ``llama_kv_cache`` constructor and ``build_input_k_rot`` / ``build_input_v_rot``,
    read in llama-cpp-python 0.3.36's vendored ggml-org/llama.cpp@0c1e57098; data/storage_formats.md).

    A cache is rotated only when its type is a quantized ggml type (``-ctk`` / ``-ctv`` q8_0, q4_0, q4_1,
    q5_0, q5_1, iq4_nl; never f32 / f16 / bf16) and the head size is a multiple of 64: K (and Q) in blocks of the
    largest power of two dividing the head size, V in blocks of 64 (the attention output rotated back with the same
    matrix). ``disabled=True`` is ``LLAMA_ATTN_ROT_DISABLE=1``. Models whose layers differ in head size are not
    rotated (``n_embd_head_k_all = -1``), and DeepSeek's lightning indexers always rotate K: neither is modelled here.
    ``type_v`` defaults to ``type_k`` and ``head_dim_v`` to ``head_dim_k``."""
    if not isinstance(disabled, bool):
        raise ValueError(f"parameter 'disabled' must be True or False, got {disabled!r}")
    tv = type_k if type_v is None else type_v
    hv = head_dim_k if head_dim_v is None else head_dim_v
    k = _rot_block(_canonical(type_k, "format", "type_k"), head_dim_k, "head_dim_k", True)
    v = _rot_block(_canonical(tv, "format", "type_v"), hv, "head_dim_v", False)
    return (None, None) if disabled else (k, v)
