"""What the accuracy of a KV format rests on: the committed measurements that have it, each naming what it
was measured on and at what length — the synthetic head of ``data/plan_needle`` (notebook 09's needle) or
the real decoder's passkey of ``data/real_model`` (notebook 08's, SmolLM2-135M) — never the planned model;
a format with neither says so.

Standard library only (the CLI path).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from kvcost import stats
from kvcost.paths import data_path
from kvcost.planning.gpus import GPU
from kvcost.provenance import checked
from kvcost.storage import formats
from kvcost.storage.spec import HADAMARD, CacheSpec, parse_spec

__all__ = ["PASSKEY_MODEL", "PASSKEY_UNIT_CSV", "SYNTHETIC_BASIS", "accuracy_evidence", "accuracy_lookup",
           "default_accuracy_csv", "default_passkey_csv", "passkey_lookup"]


def _retrieved(rows: list[dict[str, str]]) -> int:
    return sum(1 for r in rows if r["retrieved"] in ("True", "true", "1", "1.0"))


def default_accuracy_csv() -> Path:
    """The committed needle measurement (notebook 09's, ``scripts/plan_needle.py``): 200 haystacks per cell."""
    return data_path("plan_needle", "needle.csv")


def default_passkey_csv() -> Path:
    """The committed real-decoder passkey grid (notebook 08's): SmolLM2-135M, 1k to 8k tokens, 20 trials a cell."""
    return data_path("real_model", "passkey.csv")


#: What each committed evidence table was measured on, as its README says.
SYNTHETIC_BASIS = "synthetic head with MiniLM statistics (data/plan_needle), not a decoder"
PASSKEY_MODEL = "SmolLM2-135M-Instruct"
#: The FP8 kernel's passkey cells re-run on Hopper's MMA-Sim-exact unit, beside the passkey grid.
PASSKEY_UNIT_CSV = "passkey_unit.csv"


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
    emulated (the ``fa3`` variant), and that kernel re-run on Hopper's MMA-Sim-exact unit
    (``passkey_unit.csv`` beside the passkey table) where it has rows."""
    sp = parse_spec(spec, param="dtypes")
    label = sp.kv_label + (HADAMARD if sp.rotation else "")          # the needle table's storage column
    out: list[dict[str, Any]] = []
    acc = accuracy_lookup(needle_csv, label, context)
    if acc is not None:
        k, n, at, k0, n0 = acc
        on = (SYNTHETIC_BASIS if Path(needle_csv or "").resolve() == default_accuracy_csv().resolve()
              else f"needle table {Path(needle_csv or '').name} (a synthetic haystack, not a decoder)")
        out.append({"basis": "synthetic", "on": on, "test": "needle", "successes": k, "trials": n,
                    "context": at, "reference": f"{k0}/{n0}" if n0 else None})
    variants = [("stored cache", CacheSpec(sp.k, sp.v, sp.rotation, store=True).label)]
    if (card is not None and card.arch == "Hopper" and engine in ("vllm", "none")
            and formats.get(sp.k).family == "fp8"):
        variants.append(("FlashAttention-3 FP8 attention on Hopper, emulated", "fa3"))
    tables = [(what, var, passkey_csv) for what, var in variants]
    if passkey_csv is not None and variants[-1][1] == "fa3":
        # the same kernel re-run on Hopper's bit-exact wgmma unit (MMA-Sim), beside the grid (notebook 08)
        tables.append(("FlashAttention-3 FP8 attention on Hopper's MMA-Sim-exact tensor-core unit", "fa3",
                       Path(passkey_csv).with_name(PASSKEY_UNIT_CSV)))
    for what, var, table in tables:
        pk = passkey_lookup(table, var, context)
        if pk is not None:
            k, n, at, k0, n0 = pk
            out.append({"basis": "real decoder", "on": f"{PASSKEY_MODEL} (data/real_model), {what}",
                        "test": "passkey", "variant": var, "successes": k, "trials": n, "context": at,
                        "reference": f"{k0}/{n0}" if n0 else None, "table": Path(table).name})
    if not out:
        return f"no evidence for {label} (no synthetic needle, no real-decoder passkey)", ()
    parts = []
    for e in out:
        short = "" if e["context"] >= context else f" (shorter than the planned {context:,})"
        ref = f"; unquantized {e['reference']}" if e["reference"] else ""
        parts.append(f"{e['on']}: {e['test']} {stats.rate_text(e['successes'], e['trials'])} at "
                     f"{e['context']:,} tokens{short}{ref}")
    if sp.skip_layers:
        parts.append(f"measured with every layer in {sp.kv_label}; this spec keeps {', '.join(sp.skip_layers)} "
                     f"layers in {sp.skip_dtype}")
    return " | ".join(parts), tuple(out)
