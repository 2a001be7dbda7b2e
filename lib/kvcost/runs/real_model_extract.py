"""Real decoder K/V: SmolLM2-135M over Pride and Prejudice, statistics of every layer and head,
and a small extract for the notebooks (``make real-model`` runs this).

    python scripts/real_model_extract.py
    python -m kvcost.runs.real_model_extract          # the same job

One forward pass over the first ``--tokens`` (2,048) tokens of data/text/pride_and_prejudice.txt
with float32 attention. Captured per layer: K before RoPE (``k_proj``'s output), K after RoPE
and V (what the cache stores), and the queries after RoPE (a recording attention function).

Written to data/real_model/:

- ``head_stats.csv``: one row per (layer, kv_head) over all tokens: for K before and after RoPE
  the largest channel-RMS ratio, outlier and persistent channels (ratio >= 4, as the post's
  synthetic K; kvcost.inputs.extracts.channel_outlier_table), for V the largest token-norm ratio and
  outlier tokens (>= 6, as the post's synthetic V), and rho = RMS(V's channel means) /
  RMS(V's channel spreads).
- ``query_stats.csv``: one row per (layer, query head) over the last 512 query rows: median
  score spread (std of the scaled scores q.k/sqrt(d) of a row), median weight on token 0 (the
  sink), median weight of the largest key.
- ``smollm2_kv.npz`` (<= 4 MiB): kvcost.inputs.extracts's file format (``k`` = K after RoPE, ``v``,
  token arrays, ``meta``) for layers LAYERS and the first ``--keep`` tokens, plus ``k_pre``
  (K before RoPE) and ``q`` (queries after RoPE at the last 64 kept positions, ``q_pos``), all
  float16. ``kvcost.inputs.extracts.load_real_kv`` reads it.
- ``smollm2_kv.json``: command, versions, date, digests of the inputs and outputs.

``--model gemma3-270m`` writes the same files for Gemma 3 270M to data/real_model/gemma3_270m/
(``gemma3_270m_kv.npz`` / ``.json``; layers GEMMA_LAYERS), its window starting with BOS as the perplexity
runs' do, its sliding-window layers attending through kvcost.models.sliding_window's banded attention. K is seen at
three stages there: ``k_proj``'s output (``k_pre``), after QK-norm (``k_norm``, before RoPE) and after RoPE
(``k_post``); each row says the layer's attention type (``layer_type``: sliding or full), and a query's
sink share (weight on token 0, BOS) is NaN in a sliding layer whose window no longer reaches token 0.

``--check`` (what ``make real-model`` runs) writes nothing into the repository: it extracts into a temporary
folder and compares with the committed files (:func:`compare_outputs`), so a fresh clone stays clean: a float32
forward pass moves in its last bits with the BLAS and CPU, so the statistics are held to ``STATS_RTOL`` and the
float16 arrays to one float16 rounding (``ARRAY_RTOL``), their integer and text members exactly; it exits 1 naming
each file and column that differs by more.

``--heads`` writes instead the every-head extract notebook 10's haystacks read (``smollm2_heads.npz`` /
``gemma3_270m_heads.npz`` and its ``.json``; the statistics files are left as they are): the same file
format for every layer that attends over the whole context (SmolLM2: all 30; Gemma: its global layers 5, 11
and 17 — a sliding layer never sees a long-range needle), ``q`` at the last ``--q-rows`` (8) kept positions,
without ``k_pre``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kvcost import provenance
from kvcost.inputs import extracts
from kvcost.models import decoders, sliding_window, window_metrics
from kvcost.paths import repo_root

ROOT = repo_root()
TEXT = decoders.TEXT
OUT = ROOT / "data" / "real_model"
LAYERS = (0, 1, 10, 20, 29)
#: Gemma 3 270M's layers in the extract: the first sliding-window layer, the first global one, the sliding
#: layer after it, the last (global) layer.
GEMMA_LAYERS = (0, 5, 6, 17)
Q_ROWS = 64
#: Query rows per head in the every-head extract (``--heads``): one per haystack notebook 10 draws.
HEADS_Q_ROWS = 8
#: ``--check``'s tolerance on the statistics CSVs (relative): a float32 forward pass on another CPU or BLAS
#: moved them by at most 4e-6 (2026-12-02, this machine against the committed rows).
STATS_RTOL = 1e-4
#: ``--check``'s tolerance on the float16 arrays: two float16 roundings (2^-10 relative each) of float32 values
#: that differ in their last bits; ``ARRAY_ATOL`` for values near zero (the smallest float16 normal).
ARRAY_RTOL = 2.0 ** -9
ARRAY_ATOL = 2.0 ** -14


def head_stats(k_pre: np.ndarray, k_post: np.ndarray, v: np.ndarray, k_norm: np.ndarray | None = None,
               kinds: list[str] | None = None) -> list[dict]:
    rows = []
    stages = (("k_pre", k_pre), *((("k_norm", k_norm),) if k_norm is not None else ()), ("k_post", k_post))
    tables = {name: extracts.channel_outlier_table(x, 4.0) for name, x in stages}
    vt = extracts.token_outlier_table(v, 6.0)
    for i, (layer, head) in enumerate(zip(vt["layer"], vt["head"])):
        vv = v[layer, head]
        row = {"layer": int(layer), "kv_head": int(head)}
        if kinds is not None:
            row["layer_type"] = kinds[int(layer)]
        for name, t in tables.items():
            row[f"{name}_max_channel_ratio"] = float(t["max_ratio"][i])
            row[f"{name}_outlier_channels"] = int(t["outlier_channels"][i])
            row[f"{name}_persistent_channels"] = int(t["persistent_channels"][i])
            row[f"{name}_top_channel"] = int(t["top_channel"][i])
        row["v_max_token_ratio"] = float(vt["max_ratio"][i])
        row["v_outlier_tokens"] = int(vt["outlier_tokens"][i])
        row["v_top_token"] = int(vt["top_token"][i])
        row["rho"] = extracts.channel_mean_ratio(vv)
        rows.append(row)
    return rows


def query_stats(q: np.ndarray, k: np.ndarray, rows: int, scaling: float | None = None,
                windows: list[int | None] | None = None, kinds: list[str] | None = None) -> list[dict]:
    """q (layers, 9, T, d), k (layers, 3, T, d) after RoPE: causal scores of the last ``rows`` queries
    (scaled by ``scaling``, default 1/sqrt(d); within each layer's window where ``windows`` gives one)."""
    n_l, hq, t, d = q.shape
    group = hq // k.shape[1]
    pos = np.arange(t - rows, t)
    causal = np.arange(t)[None, :] > pos[:, None]
    scale = 1 / np.sqrt(d) if scaling is None else scaling
    out = []
    for layer in range(n_l):
        w = windows[layer] if windows is not None else None
        mask = causal | (np.arange(t)[None, :] <= pos[:, None] - w) if w is not None else causal
        for h in range(hq):
            s = q[layer, h, pos] @ k[layer, h // group].T * scale
            s = np.where(mask, np.nan, s)
            spread = np.nanstd(s, axis=1)
            e = np.exp(s - np.nanmax(s, axis=1, keepdims=True))
            e = np.where(mask, 0.0, e)
            p = e / e.sum(axis=1, keepdims=True)
            sink = np.where(mask[:, 0], np.nan, p[:, 0])          # NaN where token 0 is out of the window
            row = {"layer": layer, "head": h, "score_spread": float(np.median(spread)),
                   "sink_share": float(np.nanmedian(sink)) if np.isfinite(sink).any() else float("nan"),
                   "top_weight": float(np.median(p.max(axis=1)))}
            out.append(row if kinds is None else {**row, "layer_type": kinds[layer]})
    return out


def compare_outputs(committed: Path, fresh: Path, names: list[str]) -> list[str]:
    """What differs between two extracts beyond float32 rounding, one line per file or column (empty: they
    agree). ``names`` are file names in both folders: ``.csv`` tables (integer and text columns exactly, float
    columns to ``STATS_RTOL``, NaN where NaN) and ``.npz`` extracts (float members to ``ARRAY_RTOL`` /
    ``ARRAY_ATOL``, the rest exactly; ``meta`` is not compared: it carries the versions and date)."""
    import pandas as pd

    problems = []
    for name in names:
        a_path, b_path = committed / name, fresh / name
        if not a_path.is_file():
            problems.append(f"{name}: not in {committed}")
            continue
        if name.endswith(".csv"):
            a, b = pd.read_csv(a_path), pd.read_csv(b_path)
            if list(a.columns) != list(b.columns) or len(a) != len(b):
                problems.append(f"{name}: columns or rows differ ({a.shape} committed, {b.shape} now)")
                continue
            for col in a.columns:
                x, y = a[col].to_numpy(), b[col].to_numpy()
                if a[col].dtype.kind == "f" or b[col].dtype.kind == "f":
                    x, y = x.astype(np.float64), y.astype(np.float64)
                    ok = np.isclose(x, y, rtol=STATS_RTOL, atol=0.0, equal_nan=True)
                    if not ok.all():
                        rel = np.abs(x - y) / np.maximum(np.abs(x), np.finfo(np.float64).tiny)
                        worst = np.nanmax(np.where(ok, 0.0, rel))
                        problems.append(f"{name}: column {col} differs in {int((~ok).sum())} rows (largest "
                                        f"relative difference {worst:.2g} > {STATS_RTOL:g})")
                elif not np.array_equal(x, y):
                    problems.append(f"{name}: column {col} differs in {int((x != y).sum())} rows")
        else:
            with np.load(a_path) as za, np.load(b_path) as zb:
                if sorted(za.files) != sorted(zb.files):
                    problems.append(f"{name}: members differ ({sorted(za.files)} committed, {sorted(zb.files)} now)")
                    continue
                for key in (k for k in za.files if k != "meta"):
                    x, y = za[key], zb[key]
                    if x.shape != y.shape:
                        problems.append(f"{name}: {key} has shape {y.shape}, committed {x.shape}")
                    elif x.dtype.kind == "f":
                        x64, y64 = x.astype(np.float64), y.astype(np.float64)
                        ok = np.isclose(x64, y64, rtol=ARRAY_RTOL, atol=ARRAY_ATOL, equal_nan=True)
                        if not ok.all():
                            problems.append(f"{name}: {key} differs in {int((~ok).sum())} of {x.size} values by more "
                                            f"than float16 rounding (largest {np.max(np.abs(x64 - y64)):.3g})")
                    elif not np.array_equal(x, y):
                        problems.append(f"{name}: {key} differs")
    return problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line: ``--out`` defaults per model."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--keep", type=int, default=512, help="tokens kept in the extract")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=list(decoders.DECODERS), default=decoders.DEFAULT_DECODER)
    ap.add_argument("--out", type=Path, default=None, help="default data/real_model/[gemma3_270m/]")
    ap.add_argument("--heads", action="store_true",
                    help="write the every-head extract (<model>_heads.npz: every full-attention layer, no k_pre)")
    ap.add_argument("--check", action="store_true",
                    help="extract into a temporary folder and compare with the committed files (writes nothing "
                         "here; exit 1 if they differ beyond float32 rounding)")
    ap.add_argument("--q-rows", type=int, default=None,
                    help=f"query rows kept per head (default {Q_ROWS}; {HEADS_Q_ROWS} with --heads)")
    args = ap.parse_args(argv)
    dec = decoders.decoder(args.model)
    args.out = args.out or ROOT / "data" / dec.data
    args.q_rows = args.q_rows if args.q_rows is not None else (HEADS_Q_ROWS if args.heads else Q_ROWS)
    if not 1 <= args.q_rows <= Q_ROWS:
        ap.error(f"--q-rows must be between 1 and {Q_ROWS}, got {args.q_rows}")
    if not Q_ROWS <= args.keep <= args.tokens:
        ap.error(f"--keep must be between {Q_ROWS} and --tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        return _check(args, argv)
    dec = decoders.decoder(args.model)
    smol = dec.name == decoders.DEFAULT_DECODER
    stem = Path(dec.extract_file(args.heads)).stem

    import pandas as pd
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model, tok = decoders.load(dec.name, args.threads)
    ids = tok(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"][:args.tokens]
    if dec.bos_first:
        ids = window_metrics.window_tokens(ids, 0, len(ids), tok.bos_token_id)
    n_layers = model.config.num_hidden_layers
    head_dim = model.config.head_dim if hasattr(model.config, "head_dim") else 64
    kinds = decoders.layer_types(model)
    k_pre, k_norm, k_post, v, q = ([None] * n_layers for _ in range(5))
    # a custom attention name gets no masks from transformers: sliding layers need the banded attention
    inner = sdpa_attention_forward if smol else sliding_window.BandedAttention()

    def record_q(module, query, key, value, attention_mask, **kwargs):
        q[module.layer_idx] = query[0].detach().numpy().copy()
        return inner(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("kvcost_record", record_q)
    model.set_attn_implementation("kvcost_record")

    def record_kv(layer, key, value):
        k_post[layer] = key[0].detach().numpy().copy()
        v[layer] = value[0].detach().numpy().copy()

    hooks = []
    for i, lay in enumerate(model.model.layers):
        def hook(_m, _inp, out, i=i):
            k_pre[i] = out[0].detach().view(out.shape[1], -1, head_dim).transpose(0, 1).numpy().copy()
        hooks.append(lay.self_attn.k_proj.register_forward_hook(hook))
        if not smol:                                # QK-norm: K after its RMSNorm, before RoPE
            def norm_hook(_m, _inp, out, i=i):
                k_norm[i] = out[0].detach().numpy().copy()
            hooks.append(lay.self_attn.k_norm.register_forward_hook(norm_hook))
    with torch.no_grad():
        model(torch.tensor([ids]), cache=decoders.StoredCache("fp32", record=record_kv, model=model),
              use_cache=True)
    for h in hooks:
        h.remove()
    k_pre, k_post, v, q = (np.stack(x).astype(np.float64) for x in (k_pre, k_post, v, q))
    k_norm = None if smol else np.stack(k_norm).astype(np.float64)

    args.out.mkdir(parents=True, exist_ok=True)
    stats_files = []
    if not args.heads:
        hs = pd.DataFrame(head_stats(k_pre, k_post, v, k_norm, None if smol else kinds))
        hs.to_csv(args.out / "head_stats.csv", index=False)
        windows = None if smol else [dec.sliding_window if k == "sliding" else None for k in kinds]
        scaling = None if smol else model.model.layers[0].self_attn.scaling
        qs = pd.DataFrame(query_stats(q, k_post, min(512, args.tokens - 1), scaling, windows,
                                      None if smol else kinds))
        qs.to_csv(args.out / "query_stats.csv", index=False)
        stats_files = [args.out / "head_stats.csv", args.out / "query_stats.csv"]

    keep, rows = args.keep, args.q_rows
    if args.heads:
        lay = [i for i, kind in enumerate(kinds) if kind != "sliding"]
    else:
        lay = list(LAYERS if smol else GEMMA_LAYERS)
    tokens = tok.convert_ids_to_tokens(ids[:keep])
    meta = {
        "model": dec.gguf, "dist": f"{dec.dist}=={dec.version}",
        "gguf_sha256": decoders.sha256(decoders.gguf_path(dec.name)),
        "text": str(TEXT.relative_to(ROOT)), "text_sha256": decoders.sha256(TEXT),
        "forward_tokens": args.tokens, "kept_tokens": keep, "layers": lay, "q_rows": rows,
        "k": "K after RoPE (what the cache stores)",
        **({"layer_choice": "every layer attending over the whole context"} if args.heads
           else {"k_pre": "k_proj output, before RoPE"}),
        "versions": decoders.versions(dec.name),
        **({} if smol else {"layer_types": kinds, "bos_first": True, "attention": "banded",
                            "k_norm": "K after QK-norm, before RoPE (head_stats only)", "terms": dec.terms,
                            "git_commit": provenance.git_commit()}),
    }
    arrays = {
        "k": k_post[lay, :, :keep].astype(np.float16), "v": v[lay, :, :keep].astype(np.float16),
        "token_ids": np.asarray(ids[:keep], dtype=np.int32), "tokens": np.asarray(tokens, dtype=np.str_),
        "window": np.zeros(keep, dtype=np.int16), "special": np.zeros(keep, dtype=bool),
        "meta": np.asarray(json.dumps(meta, sort_keys=True)),
        **({} if args.heads else {"k_pre": k_pre[lay, :, :keep].astype(np.float16)}),
        "q": q[lay, :, keep - rows:keep].astype(np.float16),
        "q_pos": np.arange(keep - rows, keep, dtype=np.int32),
    }
    npz = args.out / f"{stem}.npz"
    extracts.write_npz(npz, arrays)
    provenance.write_run(
        args.out / f"{stem}.json",
        command="python scripts/real_model_extract.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        note={**meta, "bytes": npz.stat().st_size},
        outputs=[npz, *stats_files])
    print(f"wrote {npz} ({npz.stat().st_size} bytes)" + (", head_stats.csv, query_stats.csv" if stats_files else ""))
    return 0


def _check(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--check``: the same extract into a temporary folder, compared with the committed one."""
    import tempfile

    dec = decoders.decoder(args.model)
    stem = Path(dec.extract_file(args.heads)).stem
    names = [f"{stem}.npz"] + ([] if args.heads else ["head_stats.csv", "query_stats.csv"])
    given = list(argv if argv is not None else sys.argv[1:])
    flags = [a for i, a in enumerate(given)      # the same flags, less --check and --out (the committed folder)
             if a != "--check" and not a.startswith("--out=") and "--out" not in [*given[i - 1:i], a]]
    with tempfile.TemporaryDirectory(prefix="kvcost-extract-") as tmp:
        main([*flags, "--out", tmp])
        problems = compare_outputs(args.out, Path(tmp), names)
    if problems:
        print(f"real_model_extract.py --check: the committed extract in {args.out} is not reproduced:", *problems,
              sep="\n  ", file=sys.stderr)
        return 1
    print(f"real_model_extract.py --check: {', '.join(names)} reproduce the committed files in "
          f"{args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out} to float32 rounding "
          f"(statistics to {STATS_RTOL:g} relative, float16 arrays to {ARRAY_RTOL:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
