"""Command line: ``python -m kvcost size|plan|models|formats``.

- ``size MODEL``  the KV cache of one model at one context (engine-independent, or exactly as
  llama.cpp allocates it with ``--engine llama.cpp``)
- ``plan MODEL``  vLLM's block pool for a KV budget (``--engine vllm --kv-memory-gib X``), or a
  fleet plan on a catalogued GPU (``--gpu H100``) or any GPU (``--gpu-memory-gib X --bandwidth-tbs Y``)
  with every KV format side by side: requests as ``--engine`` counts them, a decode-speed estimate,
  and what each format's accuracy evidence rests on
- ``models`` / ``formats`` / ``gpus``  what kvcost knows

MODEL is a name from ``data/models`` (or a Hugging Face repo id listed there) or a path to a
``config.json`` (or its folder). Contexts accept ``131072``, ``128k`` or ``1M``. Bad input stops
with one ``error:`` line naming the flag and exit code 2. Standard library only (fast).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from kvcost.engines import llamacpp, vllm
from kvcost.models import footprint, registry, weights
from kvcost.params import shorten
from kvcost.planning import capacity, decode, evidence, fleet, gpus
from kvcost.storage import formats
from kvcost.units import GIB, KIB, MIB

__all__ = ["build_parser", "format_plan", "main", "parse_tokens"]

_SUFFIX = {"": 1, "k": 1024, "m": 1024 ** 2}
_FLAG_OF = {"context": "--context", "dtype": "--dtype", "v_dtype": "--v-dtype", "budget_gib": "--budget-gib",
            "request_tokens": "--request-tokens", "state_dtype": "--state-dtype", "requests": "--requests",
            "dtypes": "--dtypes"}


def parse_tokens(text: str) -> int:
    """A token count: ``131072``, ``128k`` (x1024) or ``1M`` (x1024^2); at least 1."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"must be a whole number of tokens such as 131072, 128k or 1M, got {text!r}")
    n = int(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 token, got {text!r}")
    return n


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"\s*\d{1,18}\s*", str(text)) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {shorten(text)}")
    return int(text)


#: The largest memory figure a flag takes, GiB (1 PiB: beyond any one GPU or budget, and far from
#: where GiB x 2^30 stops being an exact float).
MAX_GIB = 2.0 ** 20


def _number(text: str) -> float:
    try:
        x = float(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"must be a number, got {shorten(text)}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {shorten(text)}")
    return x


def _gib(text: str) -> float:
    """A memory figure in GiB: more than 0 and at most :data:`MAX_GIB`."""
    x = _number(text)
    if not 0 < x <= MAX_GIB:
        raise argparse.ArgumentTypeError(f"must be a number of GiB above 0 and at most {MAX_GIB:,.0f} (1 PiB), "
                                         f"got {shorten(text)}")
    return x


def _reserve_gib(text: str) -> float:
    """A reserve in GiB: 0 or more, at most :data:`MAX_GIB`."""
    x = _number(text)
    if not 0 <= x <= MAX_GIB:
        raise argparse.ArgumentTypeError(f"must be a number of GiB from 0 to {MAX_GIB:,.0f}, got {shorten(text)}")
    return x


def _fraction(text: str) -> float:
    """vLLM's ``gpu_memory_utilization``: ``Field(gt=0, le=1)`` in vllm/config/cache.py."""
    x = _number(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction above 0 and at most 1 (as vLLM requires), "
                                         f"got {shorten(text)}")
    return x


def _share(text: str) -> float:
    """The decode estimate's ``--efficiency``: the share of the memory bandwidth reached, above 0, at most 1."""
    x = _number(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be a share of the bandwidth above 0 and at most 1, got {shorten(text)}")
    return x


#: vLLM's allowed ``--block-size`` values: ``BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]`` in
#: vllm/config/cache.py (vLLM's docs add that CUDA kernels take at most 32).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


def _block_size(text: str) -> int:
    n = _positive_int(text)
    if n not in VLLM_BLOCK_SIZES:
        raise argparse.ArgumentTypeError(f"must be one of vLLM's block sizes {list(VLLM_BLOCK_SIZES)}, got {n}")
    return n


def _kv_cache_dtype(text: str) -> str:
    """A vLLM ``--kv-cache-dtype`` kvcost models; a name vLLM has that kvcost does not model
    (formats.ENGINE_UNMODELLED) is refused with why, not as an unknown name."""
    if text in vllm.CACHE_DTYPES:
        return text
    why = formats.ENGINE_UNMODELLED.get("vllm", {}).get(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is vLLM's, but kvcost does not model it: {why}; "
                                         f"modelled: {', '.join(sorted(vllm.CACHE_DTYPES))}")
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(sorted(vllm.CACHE_DTYPES))}, got {text!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:                 # one line, exit 2
        self.exit(2, f"error: {message}\n")


def _bytes(n: float | int | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit, scale in (("TiB", 1024 * GIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:,.3f} {unit}"
    return f"{n:,.0f} B"


def _flags(message: str) -> str:
    """Library messages name Python parameters; the command line names its flags."""
    for param, flag in _FLAG_OF.items():
        message = message.replace(f"parameter {param!r}", flag).replace(f"{param!r}", flag)
    return message


def format_plan(p: footprint.Plan) -> str:
    """The readable table ``kvcost size`` prints."""
    fmt_label = p.dtype if p.dtype == p.v_dtype else f"K {p.dtype} / V {p.v_dtype}"
    if p.skip_layers:
        fmt_label += f"; {', '.join(p.skip_layers)} layers in {p.skip_dtype}"
    mla = any(r["kind"] == "mla" for r in p.breakdown)
    rows = [("model", p.model), ("layers", p.summary), ("format", fmt_label)]
    rows.append(("per token", f"{_bytes(p.bytes_per_token)} while every KV layer holds it"))
    if p.bytes_per_token_past_windows != p.bytes_per_token:
        rows.append(("per token past the windows", f"{_bytes(p.bytes_per_token_past_windows)} (only full-attention "
                     f"layers keep growing)"))
    rows += [(f"cache at {p.context:,} tokens", _bytes(p.cache_bytes)),
             ("  post's formula would say", _bytes(p.naive_cache_bytes)
              + (f"  ({p.naive_cache_bytes / p.cache_bytes:.2f}x)" if p.cache_bytes else ""))]
    if p.state_bytes:
        rows.append(("recurrent state per sequence", f"{_bytes(p.state_bytes)} ({p.state_dtype}, constant)"))
    elif p.state_bytes is None:
        rows.append(("recurrent state per sequence", "unknown (config does not say enough)"))
    if p.shared_bytes:
        rows.append(("shared scales", _bytes(p.shared_bytes)))
    if p.budget_gib is not None:
        rows.append((f"requests of {p.request_tokens:,} tokens in {p.budget_gib:g} GiB",
                     f"{p.requests:,}" + ("  (does not fit)" if p.requests == 0 else "")))
        if p.max_context is not None and p.max_context != p.max_context_memory:
            memory = "no limit (every KV layer is windowed)" if p.max_context_unbounded else \
                f"{p.max_context_memory:,} tokens"
            longest = f"{p.max_context:,} tokens (the model's max_position_embeddings; memory alone: {memory})"
        else:
            longest = "unbounded by memory (every KV layer is windowed)" if p.max_context_unbounded else \
                f"{p.max_context_memory:,} tokens"
        rows.append((f"longest context in {p.budget_gib:g} GiB", longest))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("")
    if mla:
        lines.append(f"{'layer kind':<10} {'layers':>6} {'tokens held':>12} {'latent bytes':>16}")
        for r in p.breakdown:
            lines.append(f"{r['kind']:<10} {r['layers']:>6} {r['tokens']:>12,} {_bytes(r['latent_bytes']):>16}")
    else:
        lines.append(f"{'layer kind':<10} {'layers':>6} {'tokens held':>12} {'K bytes':>16} {'V bytes':>16}")
        for r in p.breakdown:
            lines.append(f"{r['kind']:<10} {r['layers']:>6} {r['tokens']:>12,} {_bytes(r['k_bytes']):>16} "
                         f"{_bytes(r['v_bytes']):>16}")
    for n in p.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _format_alloc(a: llamacpp.Allocation) -> str:
    lines = [f"llama.cpp KV cache of {a.model}: -c {a.n_ctx} (padded {a.n_ctx_padded}), {a.n_seq} sequence(s)"
             + (", unified" if a.kv_unified else "") + (", --swa-full" if a.swa_full else "")]
    lines += [b.log_line() for b in a.buffers]
    lines.append(f"KV buffers: {a.kv_bytes / MIB:,.2f} MiB" + (f"; recurrent state {a.recurrent_bytes / MIB:,.2f} MiB"
                                                                if a.recurrent_bytes else ""))
    return "\n".join(lines)


def _format_fleet(f: fleet.Fleet) -> str:
    bw = f"{f.bandwidth_tbs:g} TB/s" if f.bandwidth_tbs else "bandwidth unknown"
    engine = {"none": "engine-independent bytes (--engine vllm or llama.cpp for an engine's count)",
              "vllm": "as vLLM counts them (blocks, hybrid groups, sliding-window reservation)",
              "llama.cpp": "as llama.cpp allocates them (padded cells, SWA cache)"}[f.engine]
    lines = [f"{f.model} on {f.gpus} x {f.gpu} ({f.gpu_basis}; {bw}), tp {f.tp}, {f.replicas} replica(s), "
             f"utilization {f.utilization:g}",
             f"weights {f.weights_gib:.2f} GiB ({f.weights_source})",
             f"reserve {f.reserve_gib:g} GiB per GPU for activations and workspace; KV budget "
             + (f"{f.kv_budget_gib_per_gpu:.2f} GiB per GPU" if f.kv_budget_gib_per_gpu > 0 else
                f"none (weights and reserve exceed {f.utilization:g} x the GPU's memory by "
                f"{-f.kv_budget_gib_per_gpu:.2f} GiB)"),
             f"requests: {engine}", f.decode_note, "",
             f"{'K/V format':<30} {'bits':>5} {'KiB/token':>10} {'tokens':>12} {'requests':>9} "
             f"{'longest ctx':>12} {'kernel':>9} {'KV read':>7} {'batch':>6} {'ITL ms':>8} {'tok/s/req':>9} "
             f"{'tok/s/GPU':>10}"]
    for r in f.rows:
        lc = "n/a" if r.longest_context is None else f"{r.longest_context:,}"
        dec = (f"{r.decode_batch:>6,} {r.itl_ms:>8.2f} {r.tokens_per_s_request:>9.1f} {r.tokens_per_s_gpu:>10,.0f}"
               if r.itl_ms is not None and r.decode_batch is not None and r.tokens_per_s_request is not None
               and r.tokens_per_s_gpu is not None else f"{'-':>6} {'-':>8} {'-':>9} {'-':>10}")
        # the KV reads' share of bf16's rate in the decode estimate: a published kernel factor, or bytes only
        kv_read = "-" if r.kv_read_factor is None else (
            "bytes" if r.kv_read_basis.startswith("no published") else f"x{r.kv_read_factor:.2f}")
        lines.append(f"{r.spec or r.dtype + '/' + r.v_dtype:<30} {r.bits_per_value:>5.2f} {r.kib_per_token:>10.2f} "
                     f"{r.kv_tokens:>12,} {r.requests:>9,} {lc:>12} {r.kernel:>9} {kv_read:>7} {dec}")
    bases = dict.fromkeys(r.kv_read_basis for r in f.rows if r.kv_read_basis.startswith("no published"))
    if bases:
        lines += ["", "KV read 'bytes': " + "; ".join(bases)]
    lines += ["", f"accuracy evidence at {f.context:,} tokens (what each measurement rests on):"]
    lines += [f"  {r.spec or r.dtype}: {r.accuracy}" for r in f.rows]
    return "\n".join(lines)


#: The columns kvcost.planning.evidence.accuracy_lookup reads from a needle table.
_ACCURACY_COLUMNS = ("storage", "n_tokens", "retrieved")


def _accuracy_csv(flag: str | None) -> str | None:
    """--accuracy-csv: the committed needle measurement by default, 'none' for none, else a file that exists."""
    if flag is None:
        return str(evidence.default_accuracy_csv())
    if flag.lower() == "none":
        return None
    if not Path(flag).is_file():
        raise ValueError(f"--accuracy-csv: file not found: {flag}")
    try:
        with open(flag, encoding="utf-8") as f:
            header = f.readline().strip().split(",")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--accuracy-csv: cannot read {flag}: {type(err).__name__}") from None
    missing = [c for c in _ACCURACY_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"--accuracy-csv: {flag} lacks the column(s) {missing}; a needle table has "
                         f"{list(_ACCURACY_COLUMNS)} (as notebooks 06 and 09 write)")
    return flag


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    ap = _Parser(prog="python -m kvcost", description="KV-cache sizing and capacity planning from model configs.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("size", help="size the KV cache of one model")
    s.add_argument("model", metavar="MODEL", help="a name from `python -m kvcost models`, or a path to config.json")
    s.add_argument("--context", type=parse_tokens, default=131072, help="tokens per sequence: 131072, 128k, 1M")
    s.add_argument("--dtype", default="bf16", help="K format (and V unless --v-dtype), or a spec such as q8_0/q4_0 "
                   "or nvfp4;skip=sliding_window (`python -m kvcost formats`); default bf16")
    s.add_argument("--v-dtype", default=None, help="V format when it differs from K")
    s.add_argument("--budget-gib", type=_gib, default=None, help="KV memory budget in GiB")
    s.add_argument("--request-tokens", type=parse_tokens, default=None,
                   help="tokens per request for the count in --budget-gib (default: --context)")
    s.add_argument("--state-dtype", default=None, help="format of SSM / linear-attention state")
    s.add_argument("--engine", choices=["none", "llama.cpp"], default="none",
                   help="llama.cpp: the buffers llama.cpp allocates (padded cells, SWA cache, recurrent state)")
    s.add_argument("--n-seq", type=_positive_int, default=1, help="llama.cpp -np: parallel sequences")
    s.add_argument("--kv-unified", action="store_true", help="llama.cpp --kv-unified")
    s.add_argument("--swa-full", action="store_true", help="llama.cpp --swa-full: SWA layers keep every token")
    s.add_argument("--n-ubatch", type=_positive_int, default=512, help="llama.cpp -ub (default 512)")
    s.add_argument("--llama-version", choices=llamacpp.VERSIONS, default="current",
                   help="llama.cpp build era for the n_ctx padding rule (default current)")
    s.add_argument("--swa-f16", action="store_true",
                   help="SWA cache in f16 whatever --dtype says (builds between llama.cpp PR #21277 and #21332)")
    s.add_argument("--no-flash-attn", action="store_true", help="llama.cpp -fa off (legacy padding 32)")
    s.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("plan", help="vLLM's block pool for a budget, or a fleet plan on catalogued GPUs")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--engine", choices=list(capacity.ENGINES), default=None,
                   help="vllm: with --kv-memory-gib, vLLM's block pool; with --gpu, count requests as vLLM does "
                        "(llama.cpp: as llama.cpp allocates; none or absent: engine-independent bytes)")
    p.add_argument("--kv-memory-gib", type=_gib, default=None, help="vLLM's available KV memory per GPU")
    p.add_argument("--tp", type=_positive_int, default=1,
                   help="tensor-parallel size (must divide the attention heads, as vLLM requires)")
    p.add_argument("--block-size", type=_block_size, default=16,
                   help=f"tokens per KV block, one of vLLM's {list(VLLM_BLOCK_SIZES)} (default 16)")
    p.add_argument("--max-model-len", type=parse_tokens, default=None)
    p.add_argument("--max-num-batched-tokens", type=parse_tokens, default=2048)
    p.add_argument("--kv-cache-dtype", type=_kv_cache_dtype, default="auto", metavar="DTYPE",
                   help=f"vLLM's cache dtype: {', '.join(sorted(vllm.CACHE_DTYPES))} (default auto)")
    p.add_argument("--gpu", default=None, help="a GPU from data/gpus.csv, e.g. H100-80GB")
    p.add_argument("--gpus", type=_positive_int, default=1)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9, help="above 0, at most 1 (default 0.9)")
    p.add_argument("--context", type=parse_tokens, default=None, help="tokens per request (fleet plan)")
    p.add_argument("--concurrency", type=_positive_int, default=None, help="requests that must fit at once")
    p.add_argument("--dtypes", default=None, help="comma-separated K or K/V formats (default bf16,fp8_e4m3,q8_0,q4_0)")
    p.add_argument("--reserve-gib", type=_reserve_gib, default=fleet.RESERVE_GIB,
                   help=f"activation/workspace reserve per GPU (default {fleet.RESERVE_GIB:g})")
    p.add_argument("--accuracy-csv", default=None,
                   help="needle table to read accuracy from (default: the committed data/plan_needle/needle.csv, "
                        "200 haystacks per context and format; 'none' for no accuracy column)")
    _fleet_args(p)
    p.add_argument("--json", action="store_true")
    m = sub.add_parser("models", help="list the models in data/models and what each record can answer")
    m.add_argument("--json", action="store_true")
    f = sub.add_parser("formats", help="list storage formats and their true bits per value")
    f.add_argument("--json", action="store_true")
    gp = sub.add_parser("gpus", help="list the GPU catalogue (data/gpus.csv): memory, bandwidth, native KV formats")
    gp.add_argument("--json", action="store_true")
    return ap


def _params(text: str) -> int:
    """A parameter count: ``8030261248``, ``8.03e9``, ``70B`` or ``7.2B`` (x1e9), ``135M`` (x1e6)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:[eE]\d+)?)\s*([bBmM]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"must be a number of parameters such as 8030261248, 8.03e9 or 70B, "
                                         f"got {shorten(text)}")
    n = round(float(m.group(1)) * {"": 1, "b": 1e9, "m": 1e6}[m.group(2).lower()])
    if not 1 <= n <= 10 ** 15:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1e15 parameters, got {shorten(text)}")
    return n


def _fleet_args(p: argparse.ArgumentParser) -> None:
    """The fleet plan's GPU, weights and decode flags."""
    p.add_argument("--gpu-memory-gib", type=_gib, default=None,
                   help="memory per GPU in GiB: a GPU not in the catalogue, or a catalogued one's figure replaced")
    p.add_argument("--bandwidth-tbs", type=_number, default=None,
                   help="memory bandwidth per GPU in TB/s (decimal) for the decode estimate")
    p.add_argument("--efficiency", type=_share, default=decode.DEFAULT_EFFICIENCY,
                   help=f"share of the bandwidth decode reaches, above 0 and at most 1 (default "
                        f"{decode.DEFAULT_EFFICIENCY:g}, a stated assumption)")
    p.add_argument("--params", type=_params, default=None, help="parameter count of the weights (e.g. 70B)")
    p.add_argument("--weights-dtype", default=None,
                   help="format of the weights: bf16, fp8_e4m3, mxfp4, nvfp4, q4_0, ... (default: the record's, bf16)")
    p.add_argument("--weights-gib", type=_gib, default=None, help="GiB of weights per replica, as given")
    p.add_argument("--weights-index", default=None,
                   help="a model.safetensors.index.json (or its folder): weights = its metadata.total_size")
    p.add_argument("--swa-full", action="store_true", help="--engine llama.cpp: SWA layers keep every token")


def _emit(obj: Any, text: str, as_json: bool, warnings: Sequence[str]) -> int:
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(obj, indent=2) if as_json else text)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "models":
        rows = [registry.answers(n) for n in registry.list_models()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                print(f"{r['name']:28s} {r['hf_repo'] or '':44s} {r['answers']}")
        return 0
    if args.command == "gpus":
        cards = list(gpus.catalogue().values())
        if args.json:
            print(json.dumps([dataclasses.asdict(c) for c in cards], indent=2))
        else:
            for c in cards:
                bw = f"{c.bandwidth_tbs:g} TB/s" if c.bandwidth_tbs else "bandwidth unknown"
                print(f"{c.name:10s} {c.total_gib:8.2f} GiB  {bw:18s} {c.arch:14s} native KV: "
                      f"{', '.join(c.kv_native) or 'bf16/fp16 only'}"
                      + (f"  (aliases: {', '.join(c.aliases)})" if c.aliases else ""))
        return 0
    if args.command == "formats":
        rows = [formats.describe_full(n) for n in formats.all_names()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                print(f"{r['format']:16s} {r['bits_per_value']:6.3f} bits  {r['description']}")
        return 0
    g = registry.resolve(args.model)
    if args.command == "size":
        if args.engine == "llama.cpp":
            a = llamacpp.allocate(g, args.context, args.dtype, args.v_dtype, n_seq=args.n_seq,
                                  kv_unified=args.kv_unified, swa_full=args.swa_full, n_ubatch=args.n_ubatch,
                                  swa_f16=args.swa_f16, version=args.llama_version,
                                  flash_attn=not args.no_flash_attn)
            return _emit(a.as_dict(), _format_alloc(a), args.json, a.warnings)
        if args.request_tokens is not None and args.budget_gib is None:
            raise ValueError("--request-tokens needs --budget-gib (requests are counted in a budget)")
        p = footprint.plan(g, args.context, args.dtype, args.v_dtype, budget_gib=args.budget_gib,
                        request_tokens=args.request_tokens, state_dtype=args.state_dtype)
        warnings = list(p.warnings)
        if p.dtype in llamacpp.GGML_TYPES.values() and p.v_dtype in llamacpp.GGML_TYPES.values():
            warnings += llamacpp.cpu_fallback_warnings(p.dtype, p.v_dtype)
        d = p.as_dict()
        d["warnings"] = warnings
        return _emit(d, format_plan(p), args.json, warnings)
    if args.command == "plan" and (args.gpu is not None or args.gpu_memory_gib is not None) and not (
            args.engine == "vllm" and args.kv_memory_gib is not None):
        return _run_fleet(args, g)
    if args.engine == "vllm":
        if args.kv_memory_gib is None:
            raise ValueError("--engine vllm needs --kv-memory-gib")
        vllm.check_tp(g, args.tp)
        v = vllm.plan(g, args.kv_memory_gib, args.tp, args.block_size, args.max_model_len, args.kv_cache_dtype,
                      args.max_num_batched_tokens)
        d = v.as_dict()
        text = "\n".join(d["log_lines"] + [f"{v.num_blocks:,} blocks of {v.block_size} tokens, page {v.page_bytes:,} "
                                            f"bytes, groups {', '.join(v.groups)}"])
        return _emit(d, text, args.json, v.warnings)
    raise ValueError("plan needs --engine vllm --kv-memory-gib X (vLLM's block pool), or --gpu NAME or "
                     "--gpu-memory-gib X with --context N (a fleet plan)")


def _run_fleet(args: argparse.Namespace, g: Any) -> int:
    """``plan MODEL --gpu NAME | --gpu-memory-gib X --context N``: capacity per KV format as --engine counts it,
    a decode-speed estimate and the accuracy evidence."""
    if args.context is None:
        raise ValueError("--gpu needs --context (tokens per request)")
    card = gpus.gpu(args.gpu) if args.gpu is not None else None
    if card is None or args.gpu_memory_gib is not None or args.bandwidth_tbs is not None:
        card = gpus.custom_gpu(args.gpu_memory_gib, args.bandwidth_tbs, card)
    try:
        name: str | None = registry.model_record(args.model)["name"]
    except ValueError:
        name = None
    cfg = None if name is not None else args.model
    w = weights.model_weights(name, cfg=cfg, params=args.params, weights_dtype=args.weights_dtype,
                      weights_gib=args.weights_gib, index=args.weights_index)
    dts = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else None
    if dts is not None and not all(dts):
        raise ValueError(f"--dtypes must be comma-separated format names such as bf16,q8_0,q8_0/q4_0, "
                         f"got {shorten(args.dtypes)}")
    if args.swa_full and args.engine != "llama.cpp":
        raise ValueError("--swa-full is a llama.cpp flag: it needs --engine llama.cpp")
    vllm.check_tp(g, args.tp)
    fl = fleet.plan(g, name, None, args.context, args.gpus, args.tp, args.gpu_memory_utilization,
                    args.concurrency, dts, args.reserve_gib, _accuracy_csv(args.accuracy_csv),
                    engine=args.engine or "none", card=card, weights_=w, efficiency=args.efficiency,
                    block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                    swa_full=args.swa_full, passkey_csv=None if args.accuracy_csv == "none"
                    else evidence.default_passkey_tables(),
                    kernel_dir=None if args.accuracy_csv == "none" else evidence.default_kernel_dir())
    warns = list(fl.warnings) + [w for r in fl.rows for w in r.warnings]
    return _emit(fl.as_dict(), _format_fleet(fl), args.json, list(dict.fromkeys(warns)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input, with one ``error:`` line)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _run(args)
    except ValueError as err:
        print(f"error: {_flags(str(err))}", file=sys.stderr)
        return 2
    except (OverflowError, RecursionError, TypeError, KeyError, AttributeError) as err:
        # a config whose values are not what its keys promise (layer_types: [{}], num_hidden_layers: 1e300):
        # one line naming the model, not a traceback
        print(f"error: MODEL {shorten(args.model)}: cannot use this config: {type(err).__name__}: "
              f"{shorten(str(err), 160)}", file=sys.stderr)
        return 2
