"""What the accuracy of a KV format rests on: the committed measurements that have it, each naming what it
was measured on and at what length — the synthetic head of ``data/plan_needle`` (notebook 09's needle),
the real decoders' passkey grids (``data/real_model``: notebook 08's SmolLM2-135M and notebook 08b's Gemma 3
270M, :func:`default_passkey_tables`), and for FP8 attention on a
GPU kvcost models, each of that GPU's attention kernels emulated on SmolLM2's head profiles
(``data/which_gpu``, notebook 10's needle kept by carried weight) beside the published figures for the
same kernels (``data/accumulation_published.csv``, ``data/which_gpu/published_statements.csv``, each naming
only the model its source names) — never the planned model; a format with none says so.

Standard library only (the CLI path).
"""
from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcost import stats
from kvcost.models.decoder_registry import DECODERS
from kvcost.numerics.kernel_facts import KERNELS, kv_format, serves_mla
from kvcost.paths import data_path
from kvcost.planning.gpus import GPU, SM100
from kvcost.provenance import checked
from kvcost.storage import formats
from kvcost.storage.spec import HADAMARD, CacheSpec, parse_spec

__all__ = ["KERNEL_GRIDS", "PASSKEY_MODEL", "PASSKEY_UNIT_CSV", "PUBLISHED_NIAH", "SYNTHETIC_BASIS", "PasskeyTable",
           "accuracy_evidence", "accuracy_lookup", "default_accuracy_csv", "default_kernel_dir",
           "default_passkey_csv", "default_passkey_tables", "grid_gpu", "kernel_lookup", "passkey_lookup",
           "published_lookup"]


def _retrieved(rows: list[dict[str, str]]) -> int:
    return sum(1 for r in rows if r["retrieved"] in ("True", "true", "1", "1.0"))


def default_accuracy_csv() -> Path:
    """The committed needle measurement (notebook 09's, ``scripts/plan_needle.py``): 200 haystacks per cell."""
    return data_path("plan_needle", "needle.csv")


def default_passkey_csv() -> Path:
    """The committed real-decoder passkey grid (notebook 08's): SmolLM2-135M, 1k to 8k tokens, 20 trials a cell."""
    return DECODERS["smollm2-135m"].results_file("passkey.csv")


@dataclass(frozen=True)
class PasskeyTable:
    """One real decoder's committed passkey grid: ``model``, the decoder it was measured on (as its README names
    it); ``csv``, the grid (``context, trial, variant, success``); ``kernels``, for each emulated attention
    variant the planner reads (``fa3``, ``fa3:arch=Blackwell``), the tables holding its rows with what each
    emulates, in the order they are reported."""
    model: str
    csv: Path
    kernels: tuple[tuple[str, str, Path], ...] = ()        # (variant, what it emulates, table)


FA3_GRID = "FlashAttention-3 FP8 attention on Hopper, emulated"
FA3_UNIT = "FlashAttention-3 FP8 attention on Hopper's MMA-Sim-exact tensor-core unit"
FA3_BLACKWELL = "FlashAttention-3's FP8 attention on Blackwell's MMA-Sim-exact tensor-core unit (tcgen05)"


def _smollm2_table(path: Path) -> PasskeyTable:
    """SmolLM2's grid layout: its ``fa3`` rows from the first emulation, the same kernel re-run on Hopper's
    MMA-Sim-exact unit in ``passkey_unit.csv`` beside it (notebook 08)."""
    return PasskeyTable(PASSKEY_MODEL, path,
                        (("fa3", FA3_GRID, path), ("fa3", FA3_UNIT, path.with_name(PASSKEY_UNIT_CSV))))


def default_passkey_tables() -> tuple[PasskeyTable, ...]:
    """Both real decoders' committed passkey grids: SmolLM2-135M-Instruct (1k to 8k tokens) and Gemma 3 270M
    (4k to 32k; its FP8 kernel rows ran on the MMA-Sim-exact units, Hopper's and Blackwell's)."""
    gemma = DECODERS["gemma3-270m"]
    grid = gemma.results_file("passkey.csv")
    return (_smollm2_table(default_passkey_csv()),
            PasskeyTable(gemma.title, grid,
                         (("fa3", FA3_UNIT, grid), ("fa3:arch=Blackwell", FA3_BLACKWELL, grid))))


def default_kernel_dir() -> Path:
    """Notebook 10's committed kernel grids (``scripts/which_gpu_grid.py``): every attention kernel on
    SmolLM2-135M's head profiles, 4k to 1M tokens."""
    return data_path("which_gpu")


#: Notebook 10's grid files in a kernel folder, in the order they are read: every one of SmolLM2's 270 query
#: heads x 2 haystacks at 4,096, 32,768, 131,072 and 1,048,576 tokens (every kernel: kvcost.experiments.which_gpu's
#: EVERY_HEAD_KERNELS and SMOLLM2_HEAD_GRIDS), 16 heads x 2 at 4,096, 4 heads at 4k-128k, 2 heads at 1M.
#: A kernel's rows at one length come from the first file that has them.
KERNEL_GRIDS = ("grid_heads.csv", "grid_heads_32k.csv", "grid_heads_128k.csv", "grid_heads_1m.csv", "grid_4k.csv",
                "grid.csv", "grid_1m.csv")
#: The published accuracies and statements set beside the emulated kernels, by GPU (notebook 10's ``gpu``):
#: quantity keys of data/accumulation_published.csv and statement keys of published_statements.csv.
#: Each key names what its figure measured, as the planner prints it.
PUBLISHED_NIAH: dict[str, dict[str, str]] = {
    "Hopper": {"niah_bf16": "bf16 attention", "niah_fp8_tensor_core_accumulation": "FP8, no fix",
               "niah_fp8_two_level": "FP8, two-level (PR #104)", "niah_pr104_baseline": "PR #104, every step",
               "niah_two_level_flush_every_4_steps": "PR #122, every 4 steps",
               "niah_two_level_flush_every_64_steps": "PR #122, every 64 steps"},
    "Blackwell": {"b200_accumulation_fixed": "statement"},
}
KERNEL_BASIS = ("attention kernels on {gpu} emulated on the unit, bit for bit MMA-Sim, on SmolLM2-135M-Instruct's "
                "head profiles in a synthetic haystack (data/which_gpu, notebook 10; needle kept: carried weight "
                "within a factor 2 of exact's)")

#: What each committed evidence table was measured on, as its README says.
SYNTHETIC_BASIS = "synthetic head with MiniLM statistics (data/plan_needle), not a decoder"
PASSKEY_MODEL = DECODERS["smollm2-135m"].title
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


def _folder(path: Path) -> str:
    """``path``'s folder as a reader knows it (``data/real_model``), or its own name outside the data."""
    try:
        return str(Path("data") / Path(path).resolve().parent.relative_to(data_path().resolve()))
    except ValueError:
        return Path(path).parent.name


def grid_gpu(card: GPU | None) -> str | None:
    """The GPU of notebook 10's grid whose units run on ``card``: Hopper's wgmma, Blackwell's tcgen05 (the SM100
    family only: DGX Spark and the RTX cards have no tcgen05) or CDNA3's MFMA; None for any other card."""
    if card is None:
        return None
    if card.arch in ("Hopper", "CDNA3"):
        return card.arch
    return "Blackwell" if card.name in SM100 else None


def kernel_lookup(folder: str | Path | None, gpu: str, kv: str, mla: bool,
                  context: int) -> list[tuple[str, int, int, int, int]]:
    """Notebook 10's needle on ``gpu`` for every kernel there that reads a ``kv`` cache (``e4m3`` or ``nvfp4``)
    and serves MLA models (``mla``) or the others: (kernel label, haystacks kept, haystacks, heads, tokens) at
    the largest length measured <= ``context``, else at the smallest one (the caller says which). Empty when
    the folder has no grid."""
    if folder is None:
        return []
    cells: dict[tuple[str, str, str], list[dict[str, str]]] = {}     # (kernel, gpu, length) -> its first file's rows
    for name in KERNEL_GRIDS:
        path = Path(folder) / name
        if path.is_file():
            mine: dict[tuple[str, str, str], list[dict[str, str]]] = {}
            with open(checked(path), newline="", encoding="utf-8") as f:
                for r in csv.DictReader(f):
                    mine.setdefault((r["kernel"], r["gpu"], r["n_tokens"]), []).append(r)
            for key, rows in mine.items():
                cells.setdefault(key, rows)
    seen = [r for rows in cells.values() for r in rows]
    out = []
    for label, (kernel, _fix) in KERNELS.items():
        if serves_mla(kernel) != mla or kv_format(kernel) != kv:
            continue
        mine = [r for r in seen if r["kernel"] == label and r["gpu"] == gpu]
        if not mine:
            continue
        lengths = sorted({int(r["n_tokens"]) for r in mine})
        below = [n for n in lengths if n <= context]
        at_len = below[-1] if below else lengths[0]
        at = [r for r in mine if int(r["n_tokens"]) == at_len]
        out.append((label, sum(r["kept"] == "True" for r in at), len(at), len({r["head"] for r in at}), at_len))
    return out


def published_lookup(gpu: str) -> list[dict[str, str]]:
    """The published figures for ``gpu``'s FP8 attention (:data:`PUBLISHED_NIAH`): each row's source, setting
    (which names the model only where the source does) and value or statement."""
    keys = list(PUBLISHED_NIAH.get(gpu, {}))
    out = []
    with open(checked(data_path("accumulation_published.csv")), newline="", encoding="utf-8") as f:
        out += [r for r in csv.DictReader(f) if r["quantity"] in keys]
    with open(checked(data_path("which_gpu", "published_statements.csv")), newline="", encoding="utf-8") as f:
        out += [r for r in csv.DictReader(f) if r["statement"] in keys]
    return sorted(out, key=lambda r: keys.index(r.get("quantity") or r["statement"]))


def _kernel_text(rows: list[tuple[str, int, int, int, int]], gpu: str, context: int) -> str:
    """One clause per (length, count): the kernels that kept the needle that many times there."""
    groups: dict[tuple[int, int, int, int], list[str]] = {}
    for label, k, n, heads, at in rows:
        groups.setdefault((at, k, n, heads), []).append(label)
    parts = []
    for (at, k, n, heads), labels in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] - kv[0][2])):
        short = "" if at >= context else f" (shorter than the planned {context:,})"
        parts.append(f"{k}/{n} haystacks kept ({heads} heads) at {at:,} tokens{short} by "
                     + ", ".join(f"[{x}]" for x in labels))
    return KERNEL_BASIS.format(gpu=gpu) + ": " + "; ".join(parts)


def _published_text(rows: list[dict[str, str]]) -> str:
    """The published figures, grouped by source and setting."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        names = {k: v for d in PUBLISHED_NIAH.values() for k, v in d.items()}
        what = (f"{names[r['quantity']]} {float(r['value']):.0%}" if r.get("quantity") else f"'{r['quote']}'")
        groups.setdefault((r["source"].split(",")[0].split(" (")[0], r["setting"]), []).append(what)
    return "published: " + "; ".join(f"{src} ({setting}): {', '.join(v)}" for (src, setting), v in groups.items())


def accuracy_evidence(spec: str | CacheSpec, context: int, card: GPU | None = None, engine: str = "none",
                      needle_csv: str | Path | None = None,
                      passkey_csv: str | Path | Sequence[PasskeyTable] | None = None,
                      kernel_dir: str | Path | None = None,
                      mla: bool = False) -> tuple[str, tuple[dict[str, Any], ...]]:
    """What the accuracy of ``spec`` at ``context`` rests on: one entry per evidence table that has it, each
    naming what it was measured on and at what length (never the planned model), and a text joining them;
    "no evidence for ..." when neither table has the format. A measurement shorter than ``context`` says so.
    On a Hopper GPU under vLLM, fp8 also reports the real decoder with FlashAttention-3's FP8 attention
    emulated (the ``fa3`` variant), and that kernel re-run on Hopper's MMA-Sim-exact unit
    (``passkey_unit.csv`` beside the passkey table) where it has rows. With ``kernel_dir`` (notebook 10's
    grids, :func:`default_kernel_dir`), an FP8 or NVFP4 cache on a GPU whose units kvcost models (vLLM or no
    engine) also reports each attention kernel of that GPU that reads it — MLA kernels for an ``mla`` model,
    the others otherwise — and the published figures for that GPU's FP8 attention. ``passkey_csv``: the real
    decoders' grids (:func:`default_passkey_tables`), or one grid laid out as SmolLM2's (a path). On a Blackwell
    GPU of the SM100 family an fp8 cache also reports the FP8 kernel on Blackwell's unit where a grid has it."""
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
    if passkey_csv is None:
        tables: Sequence[PasskeyTable] = ()
    elif isinstance(passkey_csv, (str, Path)):
        tables = (_smollm2_table(Path(passkey_csv)),)
    else:
        tables = passkey_csv
    fp8 = formats.get(sp.k).family == "fp8" and not mla and engine in ("vllm", "none") and card is not None
    kernels = ({"fa3"} if fp8 and card.arch == "Hopper" else
               {"fa3:arch=Blackwell"} if fp8 and card.name in SM100 else set())
    for t in tables:
        # the grid's plain store: labels cut K's blocks in the GGUF file's order (llama.cpp's)
        stored = CacheSpec(sp.k, sp.v, sp.rotation, "hf" if sp.k_order == "hf" else None, store=True)
        if (sp.k_order is None and formats.get(sp.k).channel_blocks
                and passkey_lookup(t.csv, stored.label, context) is None):
            # measured only with K's blocks in transformers' channel order (vLLM's and SGLang's)
            stored = CacheSpec(sp.k, sp.v, sp.rotation, "hf", store=True)
        what_stored = "stored cache" + (" (K's blocks in transformers' channel order)" if stored.k_order == "hf"
                                        else "")
        reads = [(stored.label, what_stored, t.csv)] + [k for k in t.kernels if k[0] in kernels]
        for var, what, table in reads:
            pk = passkey_lookup(table, var, context)
            if pk is not None:
                k, n, at, k0, n0 = pk
                out.append({"basis": "real decoder", "on": f"{t.model} ({_folder(t.csv)}), {what}",
                            "test": "passkey", "variant": var, "successes": k, "trials": n, "context": at,
                            "reference": f"{k0}/{n0}" if n0 else None, "table": Path(table).name,
                            "model": t.model})
    gpu = grid_gpu(card)
    family = formats.get(sp.k).family
    kv = {"fp8": "e4m3", "nvfp4": "nvfp4"}.get(family)
    if kernel_dir is not None and gpu is not None and kv is not None and engine in ("vllm", "none"):
        found = kernel_lookup(kernel_dir, gpu, kv, mla, context)
        for kern, k, n, heads, at in found:
            out.append({"basis": "emulated kernel", "on": KERNEL_BASIS.format(gpu=gpu), "test": "needle",
                        "variant": kern, "successes": k, "trials": n, "heads": heads, "context": at,
                        "reference": None, "table": "which_gpu"})
        pub = published_lookup(gpu) if kv == "e4m3" and not mla else []
        for r in pub:
            out.append({"basis": "published", "on": r["source"], "test": r.get("quantity") or r["statement"],
                        "setting": r["setting"], "value": float(r["value"]) if r.get("value") else None,
                        "quote": r.get("quote", ""), "url": r["url"]})
    if not out:
        return f"no evidence for {label} (no synthetic needle, no real-decoder passkey)", ()
    parts = []
    for e in out:
        if e["basis"] in ("emulated kernel", "published"):
            continue
        short = "" if e["context"] >= context else f" (shorter than the planned {context:,})"
        ref = f"; unquantized {e['reference']}" if e["reference"] else ""
        parts.append(f"{e['on']}: {e['test']} {stats.rate_text(e['successes'], e['trials'])} at "
                     f"{e['context']:,} tokens{short}{ref}")
    kern = [(e["variant"], e["successes"], e["trials"], e["heads"], e["context"]) for e in out
            if e["basis"] == "emulated kernel"]
    if kern:
        parts.append(_kernel_text(kern, gpu or "", context))
    pub_rows = [e for e in out if e["basis"] == "published"]
    if pub_rows:
        parts.append(_published_text([{"source": e["on"], "setting": e["setting"], "quote": e["quote"],
                                       **({"quantity": e["test"], "value": str(e["value"])}
                                          if e["value"] is not None else {})} for e in pub_rows]))
    if sp.skip_layers:
        parts.append(f"measured with every layer in {sp.kv_label}; this spec keeps {', '.join(sp.skip_layers)} "
                     f"layers in {sp.skip_dtype}")
    return " | ".join(parts), tuple(out)
