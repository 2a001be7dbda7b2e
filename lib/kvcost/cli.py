"""Command line: ``python -m kvcost size CONFIG_OR_MODEL --context N --dtype FMT ...``.

Subcommands:

- ``size``     a capacity plan for one model (a name from ``data/models``, a Hugging Face
               repo id listed there, or a path to a ``config.json`` / a folder holding one)
- ``models``   the model records kvcost knows
- ``formats``  the storage formats and their true bits per value

Only the standard library and :mod:`kvcost.sizing` / :mod:`kvcost.formats` are imported,
so an answer takes well under a second.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import formats, models, sizing

__all__ = ["main", "build_parser", "format_plan"]


def _bytes(n: float | int | None) -> str:
    """Human-readable binary size: B, KiB, MiB, GiB, TiB."""
    if n is None:
        return "n/a"
    n = float(n)
    for unit, scale in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:,.3f} {unit}"
    return f"{n:,.0f} B"


def _geometry(target: str) -> sizing.Geometry:
    return models.resolve(target)


def format_plan(p: sizing.Plan) -> str:
    """The readable table ``kvcost size`` prints."""
    fmt_label = p.dtype if p.dtype == p.v_dtype else f"K {p.dtype} / V {p.v_dtype}"
    rows = [
        ("model", p.model),
        ("layers", p.summary),
        ("format", f"{fmt_label} ({formats.bits_per_value(p.dtype):g}"
                   + ("" if p.dtype == p.v_dtype else f" / {formats.bits_per_value(p.v_dtype):g}")
                   + " bits per value)"),
        ("per token", f"{_bytes(p.bytes_per_token)} while every KV layer holds it"),
        (f"cache at {p.context:,} tokens", _bytes(p.cache_bytes)),
        ("  post's formula would say", _bytes(p.naive_cache_bytes)
         + (f"  ({p.naive_cache_bytes / p.cache_bytes:.2f}x)" if p.cache_bytes else "")),
    ]
    if p.state_bytes:
        rows.append(("recurrent state per sequence", f"{_bytes(p.state_bytes)} ({p.state_dtype}, constant)"))
    elif p.state_bytes is None:
        rows.append(("recurrent state per sequence", "unknown (config does not say enough)"))
    if p.shared_bytes:
        rows.append(("shared scales", _bytes(p.shared_bytes)))
    if p.budget_gib is not None:
        rows.append((f"requests of {p.request_tokens:,} tokens in {p.budget_gib:g} GiB",
                     "n/a" if p.requests is None else f"{p.requests:,}"))
        rows.append((f"longest context in {p.budget_gib:g} GiB",
                     "unbounded (every KV layer is windowed)" if p.max_context_unbounded
                     else f"{p.max_context:,} tokens"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("")
    lines.append(f"{'layer kind':<10} {'layers':>6} {'tokens held':>12} {'K bytes':>16} {'V bytes':>16}")
    for r in p.breakdown:
        lines.append(f"{r['kind']:<10} {r['layers']:>6} {r['tokens']:>12,} {_bytes(r['k_bytes']):>16} "
                     f"{_bytes(r['v_bytes']):>16}")
    for n in p.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    ap = argparse.ArgumentParser(prog="python -m kvcost",
                                 description="KV-cache sizing and capacity planning from model configs.")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("size", help="size the KV cache of one model")
    s.add_argument("model", metavar="CONFIG_OR_MODEL",
                   help="a model name from `python -m kvcost models`, or a path to config.json")
    s.add_argument("--context", type=int, default=131072, help="tokens per sequence (default 131072)")
    s.add_argument("--dtype", default="bf16", help="K format (and V unless --v-dtype); default bf16")
    s.add_argument("--v-dtype", default=None, help="V format when it differs from K")
    s.add_argument("--budget-gib", type=float, default=None, help="KV memory budget in GiB")
    s.add_argument("--request-tokens", type=int, default=None,
                   help="tokens per request for the concurrency count (default: --context)")
    s.add_argument("--state-dtype", default=None,
                   help="format of SSM / linear-attention state (default: the config's, else bf16)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    m = sub.add_parser("models", help="list the models in data/models")
    m.add_argument("--json", action="store_true")
    f = sub.add_parser("formats", help="list storage formats and their true bits per value")
    f.add_argument("--json", action="store_true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "models":
            names = models.list_models()
            if args.json:
                print(json.dumps([{"name": n, "hf_repo": models.model_record(n).get("hf_repo")} for n in names],
                                 indent=2))
            else:
                for n in names:
                    print(f"{n:28s} {models.model_record(n).get('hf_repo', '')}")
            return 0
        if args.command == "formats":
            rows = [formats.describe(n) for n in formats.names()]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                for r in rows:
                    print(f"{r['format']:16s} {r['bits_per_value']:6.3f} bits  {r['description']}")
            return 0
        g = _geometry(args.model)
        p = sizing.plan(g, args.context, args.dtype, args.v_dtype, budget_gib=args.budget_gib,
                        request_tokens=args.request_tokens, state_dtype=args.state_dtype)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for w in p.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(p.as_dict(), indent=2))
    else:
        print(format_plan(p))
    return 0
