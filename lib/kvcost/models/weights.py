"""The bytes of a model's weights one replica holds, and where the figure comes from.

From the first of: ``--weights-gib X``; a safetensors index's ``metadata.total_size``; ``--params N`` x
``--weights-dtype T``; a registry record's cited parameter count at its weight format, split where the
checkpoint quantizes only part of it (gpt-oss: MXFP4 experts, bf16 attention and embeddings); the
parameters counted from a ``config.json`` (:func:`kvcost.models.hfconfig.parameter_counts`). The MoE experts'
share is kept apart for the decode estimate (a decode step reads only the experts its tokens reach).

Standard library only (the CLI path).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcost.models.hfconfig import load_config, parameter_counts
from kvcost.models.registry import model_record
from kvcost.storage import formats
from kvcost.units import GIB

__all__ = ["Weights", "model_weights"]


@dataclass(frozen=True)
class Weights:
    """Bytes of a model's weights, where the figure comes from, and its MoE experts (for decode reads)."""

    bytes: int
    source: str
    params: int | None = None
    expert_bytes: int = 0
    num_experts: int = 0
    experts_per_token: int = 0

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def _bits(name: str, flag: str) -> float:
    try:
        return formats.bits_per_value(name)
    except ValueError:
        raise ValueError(f"{flag} must be a kvcost format name such as bf16, fp8_e4m3, mxfp4, nvfp4, q4_0 "
                         f"(`python -m kvcost formats`), got {name!r}") from None


#: config.json ``torch_dtype`` values -> kvcost format names.
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _experts(cfg: dict[str, Any]) -> tuple[int, int]:
    """(routed experts, experts per token) as a config names them (0, 0 for a dense model)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    n = text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 0
    k = text.get("num_experts_per_tok") or text.get("experts_per_token") or 0
    return (int(n), int(k)) if isinstance(n, int) and isinstance(k, int) else (0, 0)


def _from_index(index: str | Path) -> Weights:
    path = Path(index)
    if path.is_dir():
        path = path / "model.safetensors.index.json"
    try:
        total = json.loads(path.read_text(encoding="utf-8"))["metadata"]["total_size"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--weights-index: cannot read metadata.total_size from {str(path)!r} "
                         f"({type(err).__name__})") from None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise ValueError(f"--weights-index: metadata.total_size in {str(path)!r} must be a positive integer, "
                         f"got {total!r}")
    return Weights(total, f"{total:,} bytes: metadata.total_size of {path.name}")


def _from_record(rec: dict[str, Any], weights_dtype: str | None) -> Weights | None:
    """A record's cited count at its weight format (the quantized part at its own), or None without one."""
    p = rec.get("parameters")
    if not isinstance(p, dict) or not isinstance(p.get("total"), int):
        return None
    n_exp, k_exp = _experts(rec["config"])
    q = p.get("quantized") if isinstance(p.get("quantized"), dict) else None
    expert_params = p.get("experts") if isinstance(p.get("experts"), int) else (
        q["params"] if q and q["part"] == "experts" else 0)
    if weights_dtype is not None:
        bits = _bits(weights_dtype, "--weights-dtype")
        return Weights(math.ceil(p["total"] * bits / 8), f"{p['total']:,} parameters x {bits:g} bits "
                       f"({weights_dtype}, --weights-dtype); {p['source']}", p["total"],
                       math.ceil(expert_params * bits / 8), n_exp, k_exp)
    bits = float(p.get("bits_per_weight") or _bits(p.get("dtype", "bf16"), "parameters.dtype"))
    if q is None:
        return Weights(math.ceil(p["total"] * bits / 8), f"{p['total']:,} parameters x {bits:g} bits "
                       f"({p.get('dtype', 'bf16')}); {p['source']}", p["total"],
                       math.ceil(expert_params * bits / 8), n_exp, k_exp)
    qbits = float(q.get("bits_per_weight") or _bits(q["dtype"], "parameters.quantized.dtype"))
    qb = math.ceil(q["params"] * qbits / 8)
    rest = p["total"] - q["params"]
    src = (f"{q['params']:,} {q['part']} parameters x {qbits:g} bits ({q['dtype']}) + {rest:,} others x "
           f"{bits:g} bits ({p.get('dtype', 'bf16')}); {p['source']}; {q['source']}")
    exp_bytes = qb if q["part"] == "experts" else math.ceil(expert_params * qbits / 8)
    return Weights(qb + math.ceil(rest * bits / 8), src, p["total"], exp_bytes, n_exp, k_exp)


def _from_config(raw: dict[str, Any], weights_dtype: str | None) -> Weights:
    try:
        c = parameter_counts(raw)
    except ValueError as err:
        raise ValueError(f"the weights cannot be sized: {err}") from None
    n_exp, k_exp = _experts(raw)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    dt = weights_dtype or _TORCH_DTYPES.get(str(text.get("torch_dtype") or raw.get("torch_dtype")
                                                or raw.get("dtype") or ""), "bf16")
    bits = _bits(dt, "--weights-dtype")
    qc = raw.get("quantization_config") if isinstance(raw.get("quantization_config"), dict) else {}
    if qc.get("quant_method") == "mxfp4" and weights_dtype is None and c["experts"]:
        qbits = formats.bits_per_value("mxfp4")
        qb = math.ceil(c["experts"] * qbits / 8)
        rest = c["total"] - c["experts"]
        return Weights(qb + math.ceil(rest * bits / 8), f"{c['experts']:,} expert parameters x {qbits:g} bits "
                       f"(mxfp4, the config's quantization_config) + {rest:,} others x {bits:g} bits ({dt}); "
                       f"counted from the config", c["total"], qb, n_exp, k_exp)
    return Weights(math.ceil(c["total"] * bits / 8), f"{c['total']:,} parameters counted from the config x "
                   f"{bits:g} bits ({dt})", c["total"], math.ceil(c["experts"] * bits / 8), n_exp, k_exp)


def model_weights(model: str | None = None, cfg: Any = None, params: int | None = None,
                  weights_dtype: str | None = None, weights_gib: float | None = None,
                  index: str | Path | None = None) -> Weights:
    """The weights one replica holds, from the first of: ``weights_gib`` (``--weights-gib``), a safetensors
    ``index`` (``model.safetensors.index.json``: ``metadata.total_size`` bytes), ``params`` x
    ``weights_dtype`` (``--params``, default bf16), the registry record of ``model`` (its cited count,
    quantized part apart; ``weights_dtype`` replaces every part's format), the parameters counted from
    ``cfg`` (a config dict or path) at its ``torch_dtype``. ValueError naming the flags when none applies."""
    raw = load_config(cfg) if cfg is not None else None
    if weights_gib is not None:
        if (isinstance(weights_gib, bool) or not isinstance(weights_gib, (int, float))
                or not math.isfinite(weights_gib) or not 0 < weights_gib <= 2.0 ** 20):
            raise ValueError(f"--weights-gib must be a number above 0 and at most {2.0 ** 20:g}, got {weights_gib!r}")
        return Weights(int(weights_gib * GIB), f"{weights_gib:g} GiB as given (--weights-gib)")
    if index is not None:
        return _from_index(index)
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, int) or params < 1:
            raise ValueError(f"--params must be a positive integer number of parameters, got {params!r}")
        dt = weights_dtype or "bf16"
        bits = _bits(dt, "--weights-dtype")
        return Weights(math.ceil(params * bits / 8), f"{params:,} parameters x {bits:g} bits ({dt}; --params)", params)
    rec = None
    if model is not None:
        try:
            rec = model_record(model)
        except ValueError:
            rec = None
    if rec is not None:
        w = _from_record(rec, weights_dtype)
        if w is not None:
            return w
    if raw is not None:
        return _from_config(raw, weights_dtype)
    why = "its record has no cited parameter count" if rec else "kvcost has no record or config of it"
    raise ValueError(f"the weights of {rec['name'] if rec else model!r} cannot be sized: {why}; give "
                     f"--params N [--weights-dtype T] or --weights-gib X")
