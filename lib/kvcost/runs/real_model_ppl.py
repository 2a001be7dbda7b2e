"""Perplexity, KL divergence and top-1 agreement of a real decoder with its K/V cache in each format.

    python scripts/real_model_ppl.py --context 2048            # resumable: finished rows are kept
    python -m kvcost.runs.real_model_ppl --context 2048        # the same job
    python scripts/real_model_ppl.py --context 8192 --formats fp32 fp16 q8_0 q4_0
    python scripts/real_model_ppl.py --model gemma3-270m --context 2048 --formats fp32 fp16 q8_0 q4_0
    python -m kvcost.sweep run real_model_ppl                # the whole grid as a sweep (sweeps/)

Text: ``--text`` (kvcost.models.decoders.TEXTS: data/text/pride_and_prejudice.txt, the first 2,000 lines of
the novel, by default; ``pride_and_prejudice_full``, the whole novel, for windows of 8k and 32k tokens), tokenized
without special tokens; its first ``--tokens`` tokens (default 16,384) are cut into consecutive windows of
``--context`` tokens. The first text is the start of the second, so the windows they share are the same tokens.
Each window is one forward pass with a fresh cache whose K (after RoPE) and V are stored in the
format (kvcost.models.decoders.StoredCache: every query reads the stored values, as llama.cpp's cache
does; block formats cut K's blocks in llama.cpp's channel order, ``<format>@hf`` in transformers' —
sweep real_model_layout). As llama.cpp's perplexity tool does, only the second half of a window is scored: logits at
positions C/2 .. C-2 predict tokens C/2+1 .. C-1 (C/2 - 1 predictions per window).

One CSV row per (context, window, format), appended as soon as it is computed
(data/real_model/ppl_windows.csv): ``n`` predictions, ``nll_sum``, ``kl_fp32_sum`` and
``kl_fp16_sum`` (KL from the fp32-cache and fp16-cache model, nats), ``top1_fp32`` /
``top1_fp16`` (predictions whose top-1 token equals the reference's), ``correct`` (top-1 is the
target), ``seconds``. The fp32 and fp16 rows of a window are computed first (the references).

``--model`` picks the decoder (kvcost.models.decoders.DECODERS; SmolLM2-135M by default). Gemma 3 270M's rows
go to data/real_model/gemma3_270m/ppl_windows.csv; its sliding-window layers attend through the banded
attention (``--attention banded``, its default: the stock logits to float32 rounding, ``make bench``), each
window starts with BOS in place of its first token (llama.cpp's perplexity tool does so for a GGUF with
``add_bos_token``), and its metrics are computed ``--row-chunk`` rows at a time from the final hidden states
(kvcost.models.window_metrics.chunked_window_metrics: its 262,144-token vocabulary would make a window's logits 1 GiB
per format). A window's rows are then written together, once all its formats are computed. SmolLM2's
defaults are its committed runs' (stock attention, no BOS, all rows at once).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from kvcost import provenance
from kvcost.models import decoders, window_metrics
from kvcost.paths import repo_root
from kvcost.script_args import checked, int_at_least

ROOT = repo_root()
OUT = ROOT / "data" / "real_model" / "ppl_windows.csv"
#: Where each decoder's rows go by default.
#: Each decoder's default output: ppl_windows.csv in its results folder (kvcost.models.decoders.Decoder.data).
OUTS = {d.name: d.results_file("ppl_windows.csv") for d in decoders.DECODERS.values()}
DEFAULT_FORMATS = [
    "fp32", "fp16", "bf16", "fp8_e4m3", "q8_0", "q4_0", "q5_1", "q5_1+hadamard", "q4_0+hadamard", "kivi2",
    "kivi4", "q4_1", "q5_0", "iq4_nl", "q8_0/q4_0", "fp8_e4m3_token", "fp8_e4m3_head", "fp8_e4m3+hadamard",
    "q8_0+hadamard", "kivi2+hadamard", "q4_1+hadamard", "q5_0+hadamard", "iq4_nl+hadamard", "kivi4+hadamard",
    "q8_0/q4_0+hadamard", "fp8_e4m3_token+hadamard", "fp8_e4m3_head+hadamard",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line (a sweep checks each run's flags with it before anything runs):
    adds ``window_list``, the windows to run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int_at_least(64, even=True), required=True,
                    help="tokens per window (even, >= 64)")
    ap.add_argument("--tokens", type=int_at_least(0), default=16384, help="tokens of text used (default 16384)")
    ap.add_argument("--windows", type=int_at_least(0), default=None, help="at most this many windows (the first ones)")
    ap.add_argument("--window", type=int_at_least(0), nargs="+", default=None,
                    help="only these windows (0-based; a sweep runs one window per run)")
    ap.add_argument("--formats", type=checked(decoders.parse_format), nargs="+", default=DEFAULT_FORMATS,
                    help="storage formats (fp32 and fp16, the references, are always run)")
    ap.add_argument("--text", choices=list(decoders.TEXTS), default=decoders.DEFAULT_TEXT,
                    help="the text the windows are cut from (default %(default)s; data/text/README.md)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=list(decoders.DECODERS), default=decoders.DEFAULT_DECODER,
                    help="the decoder (default %(default)s)")
    ap.add_argument("--attention", choices=list(decoders.ATTENTIONS), default=None,
                    help="stock or banded (default: banded for a decoder with sliding-window layers)")
    ap.add_argument("--row-chunk", type=int_at_least(0), default=None,
                    help="metrics this many rows at a time from the hidden states (0: all logits at once; "
                         "default 0 for SmolLM2, 256 for Gemma)")
    ap.add_argument("--out", type=Path, default=None, help="the CSV rows are appended to (provenance beside it; "
                    "default per model: data/real_model/[gemma3_270m/]ppl_windows.csv)")
    args = ap.parse_args(argv)
    dec = decoders.decoder(args.model)
    args.out = args.out or OUTS[dec.name]
    args.attention = args.attention or ("banded" if dec.sliding_window else "stock")
    args.row_chunk = (256 if dec.name != decoders.DEFAULT_DECODER else 0) if args.row_chunk is None else args.row_chunk
    args.window_list = list(range(args.tokens // args.context))
    if args.window is not None:
        if max(args.window) >= len(args.window_list):
            ap.error(f"--window: {args.tokens} tokens make {len(args.window_list)} windows of {args.context}, "
                     f"numbered from 0; got {args.window}")
        args.window_list = sorted(set(args.window))
    if args.windows is not None:
        args.window_list = args.window_list[:args.windows]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    formats = ["fp32", "fp16"] + [f for f in args.formats if f not in ("fp32", "fp16")]
    windows = args.window_list

    import torch

    dec = decoders.decoder(args.model)
    model, tok = decoders.load(dec.name, args.threads, attention=args.attention)
    text = decoders.TEXTS[args.text]
    ids = tok(provenance.checked(text).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if dec.bos_first else None
    if len(ids) < args.tokens:
        raise SystemExit(f"real_model_ppl.py: error: --tokens {args.tokens}: the text {args.text} has only "
                         f"{len(ids)} tokens" + ("" if args.text != decoders.DEFAULT_TEXT else
                                                 "; --text pride_and_prejudice_full is the whole novel"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    provenance.write_run(
        args.out.with_suffix(".json"), started=True, machine=True,
        command="python scripts/real_model_ppl.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        versions=decoders.versions(dec.name), note={
            "gguf_sha256": provenance.sha256(decoders.gguf_path(dec.name)),
            "text": str(text.relative_to(ROOT)), "text_sha256": provenance.sha256(text), "text_tokens": len(ids),
            **({} if dec.name == decoders.DEFAULT_DECODER else {
                "model": dec.name, "gguf": dec.gguf, "attention": args.attention, "bos_first": dec.bos_first,
                "row_chunk": args.row_chunk, "git_commit": provenance.git_commit(), "terms": dec.terms})})
    done = provenance.finished_keys(args.out, window_metrics.WINDOW_KEY)
    with provenance.appending(args.out, window_metrics.WINDOW_FIELDS) as write:
        c = args.context
        for w in windows:
            todo = [f for f in formats if (c, w, f) not in done]
            if not todo:
                continue
            x = torch.tensor([window_metrics.window_tokens(ids, w, c, bos)])
            targets = x[0, c // 2 + 1:]
            if args.row_chunk:
                _chunked_window(model, x, targets, c, w, formats, todo, args.row_chunk, write)
                continue
            cached, refs = {}, []
            for fmt in formats:
                if fmt not in todo and fmt not in ("fp32", "fp16"):
                    continue
                t0 = time.perf_counter()
                if fmt in cached:
                    logits = cached[fmt]
                else:
                    with torch.no_grad():
                        logits = model(x, cache=decoders.StoredCache(fmt, model=model), use_cache=True,
                                       logits_to_keep=c // 2).logits[0, :-1]
                if fmt == "fp32":          # both references before any row: fp32 then fp16
                    refs.append(torch.log_softmax(logits.to(torch.float64), dim=-1))
                    seconds = {"fp32": time.perf_counter() - t0}
                    t1 = time.perf_counter()
                    with torch.no_grad():
                        cached["fp16"] = model(x, cache=decoders.StoredCache("fp16", model=model),
                                               use_cache=True, logits_to_keep=c // 2).logits[0, :-1]
                    seconds["fp16"] = time.perf_counter() - t1
                    refs.append(torch.log_softmax(cached["fp16"].to(torch.float64), dim=-1))
                if fmt not in todo:
                    continue
                m = window_metrics.token_metrics(logits, targets, refs)
                row = {"context": c, "window": w, "format": fmt, "n": int(m["nll"].size),
                       "nll_sum": repr(float(m["nll"].sum())),
                       "kl_fp32_sum": repr(float(m["kl0"].sum())), "kl_fp16_sum": repr(float(m["kl1"].sum())),
                       "top1_fp32": int(m["top1_0"].sum()), "top1_fp16": int(m["top1_1"].sum()),
                       "correct": int((m["argmax"] == targets.numpy()).sum()),
                       "seconds": round(seconds[fmt] if fmt in seconds else time.perf_counter() - t0, 1)}
                write(row)
                print(f"context {c} window {w} {fmt}: ppl {float(2.718281828459045 ** (m['nll'].mean())):.4f} "
                      f"KL {m['kl0'].mean():.5f} ({row['seconds']} s)", flush=True)
    return 0


def _chunked_window(model, x, targets, c: int, w: int, formats: list[str], todo: list[str], rows: int,
                    write) -> None:
    """One window the memory-light way: each format's final hidden states of the scored rows (one forward
    pass each, fp32 and fp16 first), then the metrics ``rows`` rows at a time; the window's rows are
    written together."""
    import torch

    hidden, seconds = {}, {}
    for fmt in formats:
        if fmt not in todo and fmt not in ("fp32", "fp16"):
            continue
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.model(input_ids=x, cache=decoders.StoredCache(fmt, model=model), use_cache=True)
        hidden[fmt] = out.last_hidden_state[0, c // 2:c - 1]
        seconds[fmt] = time.perf_counter() - t0
        print(f"context {c} window {w} {fmt}: forward {seconds[fmt]:.1f} s", flush=True)
    t0 = time.perf_counter()
    sums = window_metrics.chunked_window_metrics(model, hidden, targets, rows=rows)
    head = (time.perf_counter() - t0) / len(hidden)           # the heads' time, shared evenly
    for fmt in (f for f in formats if f in todo):
        m = sums[fmt]
        row = {"context": c, "window": w, "format": fmt, "n": m["n"], "nll_sum": repr(m["nll_sum"]),
               "kl_fp32_sum": repr(m["kl_fp32_sum"]), "kl_fp16_sum": repr(m["kl_fp16_sum"]),
               "top1_fp32": m["top1_fp32"], "top1_fp16": m["top1_fp16"], "correct": m["correct"],
               "seconds": round(seconds[fmt] + head, 1)}
        write(row)
        print(f"context {c} window {w} {fmt}: ppl {math.exp(m['nll_sum'] / m['n']):.4f} "
              f"KL {m['kl_fp32_sum'] / m['n']:.5f} ({row['seconds']} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
