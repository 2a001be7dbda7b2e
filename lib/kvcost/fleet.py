"""A fleet plan: which KV dtype fits how many requests of what context on given GPUs, how fast they
decode, and what the accuracy evidence for each format is.

- **Weights** (:func:`weights`): a registry record's cited parameter count at its weight format, split
  where the checkpoint quantizes only part of it (gpt-oss: MXFP4 experts, bf16 attention and
  embeddings); or ``--params N --weights-dtype T``; or ``--weights-gib X``; or counted from a
  ``config.json`` (:func:`kvcost.hfconfig.parameter_counts`), or a safetensors index's ``total_size``.
- **GPUs** (:func:`gpus`, ``data/gpus.csv``): memory (as a driver reports it where a log shows it, else
  the vendor's decimal GB), memory bandwidth, the KV formats the GPU computes in natively, each with
  its source; aliases (``H100`` is the H100 SXM); :func:`custom_gpu` for anything else.
- **Capacity** per KV format, as the engine named counts it: ``none`` (every KV layer keeping each
  token, sliding layers their window), ``vllm`` (:func:`kvcost.vllm.plan`: whole blocks, hybrid
  groups, window - 1 + max_num_batched_tokens per sliding layer) or ``llama.cpp``
  (:func:`kvcost.llamacpp.allocate`: padded cells, the SWA cache, ``--swa-full``).
- **Decode speed** (:func:`decode`): an estimate from memory traffic, never a measurement: per step the
  weights are read once (MoE: the experts the batch's tokens reach) and every request's KV cache at
  its format's true bytes (sliding layers capped at their window), over bandwidth x a stated
  efficiency. ``claims.plan.decode_checks`` sets it against published ITL measurements.
- **Accuracy evidence** (:func:`accuracy_evidence`): each measurement says what it rests on — the
  synthetic head of ``data/plan_needle`` or the real decoder's passkey of ``data/real_model`` — and
  names the model it was measured on, never the planned one; a format with none says so.

Standard library only (the CLI path).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import formats, llamacpp, stats, vllm
from .hfconfig import MLA, SLIDING, Geometry, load_config, parameter_counts
from .models import model_record
from .output import repo_root
from .provenance import checked
from .sizing import cache_bytes, check_context, growth_bytes_per_token, kv_bytes_per_token, max_context, state_bytes
from .storage.spec import CacheSpec, parse_spec
from .units import GIB

__all__ = [
    "DEFAULT_DTYPES",
    "DEFAULT_EFFICIENCY",
    "ENGINES",
    "GPU",
    "RESERVE_GIB",
    "Decode",
    "Fleet",
    "FleetRow",
    "Weights",
    "accuracy_evidence",
    "accuracy_lookup",
    "custom_gpu",
    "decode",
    "default_accuracy_csv",
    "default_passkey_csv",
    "gpu",
    "gpus",
    "kernel_support",
    "passkey_lookup",
    "plan",
    "weights",
    "weights_bytes",
]

#: KV formats compared by default: K and V the same, or (K, V) pairs.
DEFAULT_DTYPES = ["bf16", "fp8_e4m3", "q8_0", "q4_0"]
#: Reserve per GPU for activations, CUDA graphs and non-torch memory (GiB). vLLM logs show 1.42 GiB peak
#: activation + 0.03 GiB non-torch for a 7B model (https://github.com/vllm-project/vllm/issues/13882) and
#: ~2.1 GiB peak over weights for Llama-3.1-8B on a 24 GB GPU (https://github.com/vllm-project/vllm/issues/10517);
#: the peak grows with max_num_batched_tokens (vllm-project/vllm PR #48322). 2.0 GiB is the stated default.
RESERVE_GIB = 2.0
#: The share of a GPU's memory bandwidth the decode estimate assumes is reached: a stated modelling
#: choice, not a fit. claims.plan.decode_checks shows the shares the published ITL fits imply.
DEFAULT_EFFICIENCY = 0.8
#: Engines whose capacity rules the plan can follow ("none": engine-independent bytes).
ENGINES = ("none", "vllm", "llama.cpp")


@dataclass(frozen=True)
class GPU:
    """One GPU: memory (GiB as the plan uses it), bandwidth and native KV formats, with their sources."""

    name: str
    total_gib: float
    basis: str
    source: str
    aliases: tuple[str, ...] = ()
    vendor: str = ""
    arch: str = ""
    bandwidth_tbs: float | None = None
    bandwidth_source: str = ""
    kv_native: tuple[str, ...] = ()
    note: str = ""


def _data() -> Path:
    return Path(__file__).resolve().parents[2] / "data"


def _split(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(";") if t.strip())


def gpus() -> dict[str, GPU]:
    """The GPU catalogue (``data/gpus.csv``) by lower-case name: memory as the driver reports it where a
    log shows it, else the vendor's decimal GB; bandwidth in TB/s (decimal) where a source gives it."""
    out = {}
    with open(checked(_data() / "gpus.csv"), newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            vendor_gib = float(r["memory"]) * 1e9 / GIB
            if r["total_gib_reported"]:
                total, basis, src = (float(r["total_gib_reported"]), f"{r['total_gib_reported']} GiB as a vLLM log "
                                     f"reports it", r["reported_source"])
            else:
                total, basis, src = (vendor_gib, f"vendor {r['memory']} {r['unit']} (decimal, {vendor_gib:.2f} GiB)",
                                     r["source"])
            out[r["name"].lower()] = GPU(r["name"], total, basis, src, _split(r["aliases"]), r["vendor"], r["arch"],
                                         float(r["bandwidth_tbs"]) if r["bandwidth_tbs"] else None,
                                         r["bandwidth_source"], _split(r["kv_native"]), r["note"])
    return out


def gpu(name: str) -> GPU:
    """One GPU by name or alias (case-insensitive; ``H100`` is the H100 SXM); ValueError naming ``--gpu``."""
    cat = gpus()
    if isinstance(name, str):
        key = name.lower()
        if key in cat:
            return cat[key]
        for card in cat.values():
            if key in (a.lower() for a in card.aliases):
                return card
    raise ValueError(f"--gpu must be one of {', '.join(g.name for g in cat.values())} (or an alias: "
                     f"{', '.join(a for g in cat.values() for a in g.aliases)}), or give --gpu-memory-gib; "
                     f"got {name!r}")


def _positive(name: str, value: Any, hi: float = 2.0 ** 20) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= hi):
        raise ValueError(f"{name} must be a number above 0 and at most {hi:g}, got {value!r}")
    return float(value)


def custom_gpu(memory_gib: float | None = None, bandwidth_tbs: float | None = None,
               base: GPU | None = None) -> GPU:
    """A GPU given by its numbers (``--gpu-memory-gib``, ``--bandwidth-tbs``), or a catalogued one with
    either number replaced. Natively computed KV formats: the base GPU's, none (bf16 only) without one."""
    if memory_gib is None and base is None:
        raise ValueError("--gpu-memory-gib is needed without --gpu (GiB of memory per GPU)")
    card = base or GPU("custom GPU", 0.0, "", "given on the command line", kv_native=())
    if memory_gib is not None:
        mem = _positive("--gpu-memory-gib", memory_gib)
        card = replace(card, name=f"{card.name} ({mem:g} GiB)" if base else f"{mem:g} GiB GPU", total_gib=mem,
                       basis=f"{mem:g} GiB as given (--gpu-memory-gib)", source="given on the command line")
    if bandwidth_tbs is not None:
        bw = _positive("--bandwidth-tbs", bandwidth_tbs, hi=1000.0)
        card = replace(card, bandwidth_tbs=bw, bandwidth_source="given on the command line (--bandwidth-tbs)")
    return card


def kernel_support(card: GPU, fmt: str | formats.Format) -> tuple[str, str]:
    """Whether ``card`` computes attention in ``fmt`` natively: ``("native", "")``, ``("emulated", why)``
    for a hardware format the GPU lacks (the engine stores it and upcasts in the kernel, or refuses),
    or ``("software", why)`` for a format no GPU has (llama.cpp blocks, per-token scales, KIVI)."""
    f = formats.get(fmt)
    if f.family == "float" or f.name in card.kv_native:
        return "native", ""
    if f.family in ("fp8", "nvfp4", "mx") and f.scale in ("none", "tensor", "block"):
        have = ", ".join(card.kv_native) or "none beyond bf16/fp16"
        return "emulated", (f"{f.name} on {card.name} ({card.arch or 'unknown architecture'}, native KV formats: "
                            f"{have}): no tensor-core path, so an engine stores it and upcasts in the kernel, "
                            f"or refuses it; the decode estimate ignores that cost")
    return "software", (f"{f.name} is a software layout on every GPU: the attention kernel dequantizes it "
                        f"(its cost is not in the decode estimate)")


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


def _dtype_bits(name: str, flag: str) -> float:
    try:
        return formats.bits_per_value(name)
    except ValueError:
        raise ValueError(f"{flag} must be a kvcost format name such as bf16, fp8_e4m3, mxfp4, nvfp4, q4_0 "
                         f"(`python -m kvcost formats`), got {name!r}") from None


_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _experts(cfg: dict[str, Any]) -> tuple[int, int]:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    n = text.get("num_local_experts") or text.get("num_experts") or 0
    k = text.get("num_experts_per_tok") or text.get("experts_per_token") or 0
    return (int(n), int(k)) if isinstance(n, int) and isinstance(k, int) else (0, 0)


def weights(model: str | None = None, cfg: Any = None, params: int | None = None, weights_dtype: str | None = None,
            weights_gib: float | None = None, index: str | Path | None = None) -> Weights:
    """The weights one replica holds, from the first of: ``weights_gib`` (``--weights-gib``), a safetensors
    ``index`` (``model.safetensors.index.json``: ``metadata.total_size`` bytes), ``params`` x
    ``weights_dtype`` (``--params``, default bf16), the registry record of ``model`` (its cited count,
    quantized part apart; ``weights_dtype`` replaces every part's format), the parameters counted from
    ``cfg`` (a config dict or path) at its ``torch_dtype``. ValueError naming the flags when none applies."""
    n_exp, k_exp = _experts(load_config(cfg)) if cfg is not None else (0, 0)
    if weights_gib is not None:
        gib = _positive("--weights-gib", weights_gib)
        return Weights(int(gib * GIB), f"{gib:g} GiB as given (--weights-gib)")
    if index is not None:
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
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, int) or params < 1:
            raise ValueError(f"--params must be a positive integer number of parameters, got {params!r}")
        dt = weights_dtype or "bf16"
        bits = _dtype_bits(dt, "--weights-dtype")
        return Weights(math.ceil(params * bits / 8), f"{params:,} parameters x {bits:g} bits ({dt}; --params)", params)
    rec = None
    if model is not None:
        try:
            rec = model_record(model)
        except ValueError:
            rec = None
    p = rec.get("parameters") if rec else None
    if isinstance(p, dict) and isinstance(p.get("total"), int):
        n_exp, k_exp = _experts(rec["config"])
        q = p.get("quantized") if isinstance(p.get("quantized"), dict) else None
        if weights_dtype is not None:
            bits = _dtype_bits(weights_dtype, "--weights-dtype")
            exp_params = q["params"] if q else 0
            return Weights(math.ceil(p["total"] * bits / 8), f"{p['total']:,} parameters x {bits:g} bits "
                           f"({weights_dtype}, --weights-dtype); {p['source']}", p["total"],
                           math.ceil(exp_params * bits / 8), n_exp, k_exp)
        bits = float(p.get("bits_per_weight") or _dtype_bits(p.get("dtype", "bf16"), "parameters.dtype"))
        if q:
            qbits = float(q["bits_per_weight"])
            qb = math.ceil(q["params"] * qbits / 8)
            rest = p["total"] - q["params"]
            total = qb + math.ceil(rest * bits / 8)
            src = (f"{q['params']:,} {q['part']} parameters x {qbits:g} bits ({q['dtype']}) + {rest:,} others x "
                   f"{bits:g} bits ({p.get('dtype')}); {p['source']}; {q['source']}")
            return Weights(total, src, p["total"], qb if q["part"] == "experts" else 0, n_exp, k_exp)
        exp_bytes = 0
        return Weights(math.ceil(p["total"] * bits / 8), f"{p['total']:,} parameters x {bits:g} bits "
                       f"({p.get('dtype')}); {p['source']}", p["total"], exp_bytes, n_exp, k_exp)
    if cfg is not None:
        raw = load_config(cfg)
        try:
            c = parameter_counts(raw)
        except ValueError as err:
            raise ValueError(f"the weights cannot be sized: {err}") from None
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
        dt = weights_dtype or _TORCH_DTYPES.get(str(text.get("torch_dtype") or raw.get("torch_dtype")
                                                    or raw.get("dtype") or ""), "bf16")
        bits = _dtype_bits(dt, "--weights-dtype")
        qc = raw.get("quantization_config") if isinstance(raw.get("quantization_config"), dict) else {}
        if qc.get("quant_method") == "mxfp4" and weights_dtype is None and c["experts"]:
            qb = math.ceil(c["experts"] * 4.25 / 8)
            rest = c["total"] - c["experts"]
            return Weights(qb + math.ceil(rest * bits / 8), f"{c['experts']:,} expert parameters x 4.25 bits (mxfp4, "
                           f"the config's quantization_config) + {rest:,} others x {bits:g} bits ({dt}); counted from "
                           f"the config", c["total"], qb, n_exp, k_exp)
        return Weights(math.ceil(c["total"] * bits / 8), f"{c['total']:,} parameters counted from the config x "
                       f"{bits:g} bits ({dt})", c["total"], math.ceil(c["experts"] * bits / 8), n_exp, k_exp)
    name = rec["name"] if rec else model
    raise ValueError(f"the weights of {name!r} cannot be sized: its record has no cited parameter count; give "
                     f"--params N [--weights-dtype T] or --weights-gib X")


def weights_bytes(model: str) -> tuple[int, str]:
    """Bytes of a registry model's weights (its cited count, quantized part apart) and where they come from."""
    w = weights(model)
    return w.bytes, w.source


def _retrieved(rows: list[dict[str, str]]) -> int:
    return sum(1 for r in rows if r["retrieved"] in ("True", "true", "1", "1.0"))


def default_accuracy_csv() -> Path:
    """The committed needle measurement (notebook 09's, ``scripts/plan_needle.py``): 200 haystacks per cell."""
    return repo_root() / "data" / "plan_needle" / "needle.csv"


def default_passkey_csv() -> Path:
    """The committed real-decoder passkey grid (notebook 08's): SmolLM2-135M, 1k to 8k tokens, 20 trials a cell."""
    return repo_root() / "data" / "real_model" / "passkey.csv"


#: What each committed evidence table was measured on, as its README says.
SYNTHETIC_BASIS = "synthetic head with MiniLM statistics (data/plan_needle), not a decoder"
PASSKEY_MODEL = "SmolLM2-135M-Instruct"


def accuracy_lookup(path: str | Path | None, storage: str,
                    context: int) -> tuple[int, int, int, int, int] | None:
    """Needle results for ``storage`` ('K/V' names) at the largest measured length <= ``context``.

    Returns (retrieved, trials, n_tokens, reference retrieved, reference trials), the reference being
    the unquantized cache (``none/none``) at the same length. Reads a needle table with columns
    ``storage``, ``n_tokens``, ``retrieved`` (exact-arithmetic rows when it has ``accumulator``), as
    notebook 06 writes ``storage_formats.csv`` and notebook 09 ``needle.csv``. None when the file or
    a matching row is missing.
    """
    if path is None or not Path(path).is_file():
        return None
    with open(checked(path), newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("accumulator", "exact") == "exact"]
    mine = [r for r in rows if r.get("storage") == storage]
    lengths = sorted({int(r["n_tokens"]) for r in mine if int(r["n_tokens"]) <= context})
    if not lengths:
        return None
    at = [r for r in mine if int(r["n_tokens"]) == lengths[-1]]
    ref = [r for r in rows if r.get("storage") == "none/none" and int(r["n_tokens"]) == lengths[-1]]
    return _retrieved(at), len(at), lengths[-1], _retrieved(ref), len(ref)


def passkey_lookup(path: str | Path | None, variant: str,
                   context: int) -> tuple[int, int, int, int, int] | None:
    """The real decoder's passkey for ``variant`` (``store:q4_0``, ``store:q8_0/q4_0``, ``fa3``) at the largest
    measured context <= ``context``, else at the smallest measured one (the caller says which):
    (successes, trials, context, exact successes, exact trials). None without rows."""
    if path is None or not Path(path).is_file():
        return None
    with open(checked(path), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["variant"] == variant]
    if not mine:
        return None
    lengths = sorted({int(r["context"]) for r in mine})
    below = [n for n in lengths if n <= context]
    at_len = below[-1] if below else lengths[0]
    at = [r for r in mine if int(r["context"]) == at_len]
    ref = [r for r in rows if r["variant"] == "exact" and int(r["context"]) == at_len]
    ok = sum(1 for r in at if r["success"] in ("1", "True", "true"))
    ok0 = sum(1 for r in ref if r["success"] in ("1", "True", "true"))
    return ok, len(at), at_len, ok0, len(ref)


def accuracy_evidence(spec: str | CacheSpec, context: int, card: GPU | None = None, engine: str = "none",
                      needle_csv: str | Path | None = None,
                      passkey_csv: str | Path | None = None) -> tuple[str, tuple[dict[str, Any], ...]]:
    """What the accuracy of ``spec`` at ``context`` rests on: one entry per evidence table that has it, each
    naming what it was measured on and at what length (never the planned model), and a text joining them;
    "no evidence for ..." when neither table has the format. A measurement shorter than ``context`` says so.
    On a Hopper GPU under vLLM, fp8 also reports the real decoder with FlashAttention-3's FP8 attention
    emulated (the ``fa3`` variant)."""
    sp = parse_spec(spec, param="dtypes")
    label = f"{sp.k}/{sp.v}" + ("+hadamard" if sp.rotation else "")
    out: list[dict[str, Any]] = []
    acc = accuracy_lookup(needle_csv, label, context)
    if acc is not None:
        k, n, at, k0, n0 = acc
        on = (SYNTHETIC_BASIS if Path(needle_csv or "").resolve() == default_accuracy_csv().resolve()
              else f"needle table {Path(needle_csv or '').name} (a synthetic haystack, not a decoder)")
        out.append({"basis": "synthetic", "on": on, "test": "needle", "successes": k, "trials": n,
                    "context": at, "reference": f"{k0}/{n0}" if n0 else None})
    variants = [("stored cache", "store:" + (sp.k if sp.k == sp.v else f"{sp.k}/{sp.v}")
                 + ("+hadamard" if sp.rotation else ""))]
    if (card is not None and card.arch == "Hopper" and engine in ("vllm", "none")
            and formats.get(sp.k).family == "fp8"):
        variants.append(("FlashAttention-3 FP8 attention on Hopper, emulated", "fa3"))
    for what, var in variants:
        pk = passkey_lookup(passkey_csv, var, context)
        if pk is not None:
            k, n, at, k0, n0 = pk
            out.append({"basis": "real decoder", "on": f"{PASSKEY_MODEL} (data/real_model), {what}",
                        "test": "passkey", "variant": var, "successes": k, "trials": n, "context": at,
                        "reference": f"{k0}/{n0}" if n0 else None})
    if not out:
        return f"no evidence for {label} (no synthetic needle, no real-decoder passkey)", ()
    parts = []
    for e in out:
        short = "" if e["context"] >= context else f" (shorter than the planned {context:,})"
        ref = f"; unquantized {e['reference']}" if e["reference"] else ""
        parts.append(f"{e['on']}: {e['test']} {stats.rate_text(e['successes'], e['trials'])} at "
                     f"{e['context']:,} tokens{short}{ref}")
    return " | ".join(parts), tuple(out)


@dataclass(frozen=True)
class Decode:
    """A decode-speed estimate for one KV format at one context and batch (see :func:`decode`)."""

    batch: int
    context: int
    weights_read_bytes: float
    kv_read_bytes: float
    bytes_per_gpu: float
    bandwidth_tbs: float
    efficiency: float
    itl_ms: float
    tokens_per_s_request: float
    tokens_per_s_gpu: float
    slope_ms_per_token: float


def _rank_share(g: Geometry, tp: int) -> float:
    """The share of a request's KV bytes one tensor-parallel rank reads (KV heads split, or replicated)."""
    if g.count(MLA):
        return 1.0                              # one latent per token, kept whole on every rank
    return max(1, g.kv_heads // tp) / g.kv_heads


def decode(g: Geometry, w: Weights, spec: str | CacheSpec, context: int, batch: int, bandwidth_tbs: float,
           tp: int = 1, efficiency: float = DEFAULT_EFFICIENCY) -> Decode:
    """Estimated decode speed of ``batch`` requests at ``context`` tokens each on one replica of ``tp`` GPUs.

    Memory traffic per step, per GPU: the weights / tp (MoE: the non-expert weights, and the experts that
    ``batch`` tokens of ``experts_per_token`` reach out of ``num_experts``, 1 - (1 - k/E)^batch of them),
    plus every request's KV cache (:func:`kvcost.sizing.cache_bytes`: the format's true bytes, sliding layers
    at their window) and recurrent state, split over ranks as the heads are. Time = bytes / (bandwidth x
    ``efficiency``); it ignores compute, kernel launches and dequantization, which decode_checks shows.
    """
    check_context(context, "--context", lo=1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"--concurrency must be a positive integer, got {batch!r}")
    bw = _positive("--bandwidth-tbs", bandwidth_tbs, hi=1000.0)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ValueError(f"--efficiency must be in (0, 1], got {efficiency!r}")
    touched = 1.0
    if w.num_experts and w.experts_per_token and w.expert_bytes:
        touched = 1 - (1 - w.experts_per_token / w.num_experts) ** batch
    w_read = (w.bytes - w.expert_bytes) + w.expert_bytes * touched
    per_req = cache_bytes(g, context, spec) + (state_bytes(g) or 0)
    kv_read = batch * per_req
    per_gpu = w_read / tp + kv_read * _rank_share(g, tp)
    t = per_gpu / (bw * 1e12 * efficiency)
    slope = growth_bytes_per_token(g, spec) * _rank_share(g, tp) / (bw * 1e12 * efficiency) * 1e3
    return Decode(batch, context, w_read, kv_read, per_gpu, bw, float(efficiency), t * 1e3, 1 / t, batch / t / tp,
                  slope)


@dataclass(frozen=True)
class FleetRow:
    """One KV format on the fleet."""

    dtype: str
    v_dtype: str
    bits_per_value: float
    kib_per_token: float
    kv_tokens: int
    requests: int
    longest_context: int | None
    fits: bool
    accuracy: str
    warnings: tuple[str, ...]
    spec: str = ""
    engine_note: str = ""
    kernel: str = "native"
    decode_batch: int | None = None
    itl_ms: float | None = None
    tokens_per_s_request: float | None = None
    tokens_per_s_gpu: float | None = None
    evidence: tuple[dict[str, Any], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Fleet:
    model: str
    gpu: str
    gpu_total_gib: float
    gpu_basis: str
    gpus: int
    tp: int
    replicas: int
    utilization: float
    weights_gib: float
    weights_source: str
    reserve_gib: float
    kv_budget_gib_per_gpu: float
    context: int
    concurrency: int | None
    rows: tuple[FleetRow, ...]
    warnings: tuple[str, ...]
    engine: str = "none"
    bandwidth_tbs: float | None = None
    bandwidth_source: str = ""
    efficiency: float = DEFAULT_EFFICIENCY
    decode_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [dict(asdict(r), warnings=list(r.warnings), evidence=list(r.evidence)) for r in self.rows]
        d["warnings"] = list(self.warnings)
        return d


def _vllm_dtype(sp: CacheSpec) -> str | None:
    if sp.k != sp.v or sp.rotation or sp.skip_layers:
        return None
    if sp.k == "bf16":
        return "auto"
    return formats.engine_name(sp.k, "vllm")


def _vllm_rows(g: Geometry, sp: CacheSpec, budget_gib: float, tp: int, context: int, block_size: int,
               mnbt: int) -> tuple[int, int, int | None, str]:
    """(kv tokens, requests, longest context, note) per replica under vLLM's block pool."""
    name = _vllm_dtype(sp)
    if name is None:
        return 0, 0, None, (f"{sp.label}: not a vLLM --kv-cache-dtype (vLLM has "
                            f"{', '.join(sorted(vllm.CACHE_DTYPES))}; skip layers and K/V pairs are not modelled)")
    v = vllm.plan(g, budget_gib, tp, block_size, context, name, mnbt)
    cap = g.max_position_embeddings or 2 ** 24

    def fits(n: int) -> bool:
        return vllm.plan(g, budget_gib, tp, block_size, n, name, mnbt).max_concurrency >= 1

    if not fits(1):
        longest = 0
    elif fits(cap):
        longest = cap
    else:
        lo, hi = 1, cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        longest = lo
    groups = "+".join(v.groups)
    return v.kv_tokens, int(v.max_concurrency), longest, (f"vLLM --kv-cache-dtype {name}: {v.num_blocks:,} blocks of "
                                                          f"{block_size}, groups {groups}, {v.blocks_per_request:,} "
                                                          f"blocks per request")


def _llamacpp_rows(g: Geometry, sp: CacheSpec, budget_bytes: int, context: int,
                   swa_full: bool) -> tuple[int, int, int | None, str]:
    """(cells, requests, longest context, note) per replica as llama.cpp allocates: -c N x context, -np N."""
    tk, tv = formats.engine_name(sp.k, "llama.cpp"), formats.engine_name(sp.v, "llama.cpp")
    if tk is None or tv is None or sp.skip_layers:
        return 0, 0, None, f"{sp.label}: not a llama.cpp cache type (-ctk/-ctv: {', '.join(llamacpp.GGML_TYPES)})"

    def need(n_seq: int, ctx: int) -> int:
        a = llamacpp.allocate(g, n_seq * ctx, tk, tv, n_seq=n_seq, swa_full=swa_full)
        return a.kv_bytes + a.recurrent_bytes

    if need(1, context) > budget_bytes:
        n = 0
    else:
        lo, hi = 1, 2
        while need(hi, context) <= budget_bytes:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid, context) <= budget_bytes else (lo, mid)
        n = lo
    cap = g.max_position_embeddings or 2 ** 24
    if need(1, 1) > budget_bytes:
        longest = 0
    elif need(1, cap) <= budget_bytes:
        longest = cap
    else:
        lo, hi = 1, cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(1, mid) <= budget_bytes else (lo, mid)
        longest = lo
    cells = llamacpp.allocate(g, max(n, 1) * context, tk, tv, n_seq=max(n, 1), swa_full=swa_full).cells * max(n, 1)
    return cells, n, longest, (f"llama.cpp -ctk {tk} -ctv {tv} -c {max(n, 1) * context} -np {max(n, 1)}"
                               + (" --swa-full" if swa_full else ""))


def _check_tp(g: Geometry, tp: int) -> None:
    """vLLM's rule: attention heads split evenly over the ranks; KV heads split, or replicated when fewer."""
    if g.num_attention_heads % tp:
        raise ValueError(f"--tp {tp}: the {g.num_attention_heads} attention heads of {g.name} do not split evenly "
                         f"over {tp} ranks; use one of "
                         f"{[d for d in range(1, g.num_attention_heads + 1) if g.num_attention_heads % d == 0]}")
    if not g.count(MLA) and tp > 1 and g.kv_heads % tp and tp % g.kv_heads:
        raise ValueError(f"--tp {tp}: the {g.kv_heads} KV heads of {g.name} can be neither split nor replicated "
                         f"evenly over {tp} ranks ({g.kv_heads} % tp == 0 or tp % {g.kv_heads} == 0 is needed)")


def plan(g: Geometry, model: str | None, gpu_name: str | None, context: int, n_gpus: int = 1, tp: int = 1,
         utilization: float = 0.9, concurrency: int | None = None, dtypes: list[str] | None = None,
         reserve_gib: float = RESERVE_GIB, accuracy_csv: str | Path | None = None, *, engine: str = "none",
         card: GPU | None = None, weights_: Weights | None = None, efficiency: float = DEFAULT_EFFICIENCY,
         block_size: int = 16, max_num_batched_tokens: int = 2048, swa_full: bool = False,
         passkey_csv: str | Path | None = None) -> Fleet:
    """Plan ``model`` on ``n_gpus`` x a GPU (``gpu_name`` from the catalogue, or ``card``) at ``context``
    tokens per request, per KV format: capacity as ``engine`` counts it, a decode-speed estimate and the
    accuracy evidence.

    ``tp`` GPUs form one replica (weights and KV heads split over them); ``n_gpus // tp`` replicas.
    KV budget per GPU = total x ``utilization`` - weights / tp - ``reserve_gib``. ``dtypes`` are
    storage specs (``K``, ``K/V``, ``fp8_e4m3;skip=sliding_window``; default :data:`DEFAULT_DTYPES`).
    ``weights_`` overrides the weights (:func:`weights`); the decode estimate runs at ``concurrency``
    requests, or at as many as fit, and needs the GPU's bandwidth.
    """
    context = check_context(context, "--context", lo=1)
    for name, value in (("--gpus", n_gpus), ("--tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_gpus % tp:
        raise ValueError(f"--gpus ({n_gpus}) must be a multiple of --tp ({tp})")
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {utilization!r}")
    if (isinstance(reserve_gib, bool) or not isinstance(reserve_gib, (int, float)) or not math.isfinite(reserve_gib)
            or reserve_gib < 0):
        raise ValueError(f"--reserve-gib must be a number of GiB of 0 or more, got {reserve_gib!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ValueError(f"--concurrency must be a positive integer, got {concurrency!r}")
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    _check_tp(g, tp)
    card = card if card is not None else gpu(gpu_name)  # type: ignore[arg-type]
    w = weights_ if weights_ is not None else weights(model)
    replicas = n_gpus // tp
    budget_gpu = card.total_gib * utilization - w.gib / tp - reserve_gib
    warnings = []
    if g.max_position_embeddings is not None and context > g.max_position_embeddings:
        warnings.append(f"--context {context:,} exceeds max_position_embeddings {g.max_position_embeddings:,} "
                        f"of {g.name}")
    if g.count(SLIDING) and engine == "none":
        warnings.append(f"{g.count(SLIDING)} of {g.num_layers} layers of {g.name} slide over {g.window} tokens: "
                        f"the engine-independent counts keep only the window; vLLM reserves window - 1 + "
                        f"max_num_batched_tokens per sliding layer and llama.cpp --swa-full keeps every token "
                        f"(--engine vllm or --engine llama.cpp for their counts)")
    if not g.count(MLA) and g.kv_heads < tp:
        warnings.append(f"{g.kv_heads} KV heads over --tp {tp}: each rank keeps a replica of one KV head, so each "
                        f"GPU holds 1/{g.kv_heads} of the cache, not 1/{tp} (weights split {tp} ways)")
    bw = card.bandwidth_tbs
    rows = []
    for spec in dtypes or DEFAULT_DTYPES:
        sp = parse_spec(spec, param="dtypes")
        kf, vf = formats.get(sp.k), formats.get(sp.v)
        budget_replica = max(0.0, budget_gpu) * tp
        row_warn: list[str] = []
        if sp.k in llamacpp.GGML_TYPES.values() and sp.v in llamacpp.GGML_TYPES.values() and engine != "vllm":
            try:
                row_warn = llamacpp.cpu_fallback_warnings(sp.k, sp.v)
            except ValueError:
                row_warn = []
        kernel, why = max((kernel_support(card, sp.k), kernel_support(card, sp.v)),
                          key=lambda kw: ("native", "software", "emulated").index(kw[0]))
        if why:
            row_warn.append(why)
        per = cache_bytes(g, context, sp) + (state_bytes(g) or 0)
        per_token = kv_bytes_per_token(g, sp)
        note = ""
        if budget_gpu <= 0:
            tokens, req, mc = 0, 0, 0
        elif engine == "vllm":
            tok_r, req_r, mc, note = _vllm_rows(g, sp, budget_gpu, tp, context, block_size, max_num_batched_tokens)
            tokens, req = tok_r * replicas, req_r * replicas
        elif engine == "llama.cpp":
            tok_r, req_r, mc, note = _llamacpp_rows(g, sp, int(budget_replica * GIB), context, swa_full)
            tokens, req = tok_r * replicas, req_r * replicas
        else:
            req = int(budget_replica * GIB // per) * replicas
            mc = max_context(g, budget_replica, sp)
            if g.max_position_embeddings is not None:
                mc = g.max_position_embeddings if mc is None else min(mc, g.max_position_embeddings)
            # every KV layer holding the token: vLLM's "GPU KV cache size" counts tokens the same way
            tokens = int(budget_replica * GIB // per_token) * replicas if per_token else 0
        fits = req > 0
        acc_text, evidence = accuracy_evidence(sp, context, card, engine, accuracy_csv, passkey_csv)
        label = f"{sp.k}/{sp.v}"
        if concurrency is not None and req < concurrency:
            row_warn = [*row_warn, f"{label}: {req} requests of {context:,} tokens fit, {concurrency} asked"]
        batch = concurrency if concurrency is not None else (req // replicas if req else None)
        dec = decode(g, w, sp, context, batch, bw, tp, efficiency) if bw and batch else None
        rows.append(FleetRow(sp.k, sp.v, float(kf.bits_per_value(g.head_dim) + vf.bits_per_value(g.head_dim)) / 2,
                             per_token / 1024, tokens, req, mc, fits, acc_text, tuple(row_warn), sp.label, note,
                             kernel, batch, dec.itl_ms if dec else None, dec.tokens_per_s_request if dec else None,
                             dec.tokens_per_s_gpu if dec else None, evidence))
    if budget_gpu <= 0:
        warnings.append(f"does not fit: weights ({w.gib:.1f} GiB / tp {tp}) and the {reserve_gib:g} GiB "
                        f"reserve exceed {utilization:g} x {card.total_gib:.2f} GiB per GPU")
    elif not any(r.fits for r in rows):
        warnings.append(f"does not fit: no KV format holds one request of {context:,} tokens in "
                        f"{budget_gpu * tp:.2f} GiB per replica")
    if bw:
        dnote = (f"decode speed is an estimate, not a measurement: memory traffic (weights once per step, each "
                 f"request's KV at its format's bytes) over {bw:g} TB/s x {efficiency:g}; compute, kernel launches and "
                 f"dequantization are left out")
    else:
        dnote = f"no decode estimate: {card.name} has no catalogued memory bandwidth (give --bandwidth-tbs)"
    return Fleet(g.name, card.name, card.total_gib, card.basis, n_gpus, tp, replicas, utilization, w.gib, w.source,
                 reserve_gib, budget_gpu, context, concurrency, tuple(rows), tuple(warnings), engine, bw,
                 card.bandwidth_source, float(efficiency), dnote)
