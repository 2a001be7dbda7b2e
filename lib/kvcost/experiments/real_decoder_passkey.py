"""Passkey retrieval on a real decoder (SmolLM2-135M, Gemma 3 270M): exact attention, stored K/V formats, the FP8
kernel path.

RULER's single-needle task (``niah_single_1``, in the decoder's template as RULER wraps it for the model's type,
:data:`kvcost.retrieval.ruler.TEMPLATES`: a "noise" haystack of repeated sentences, one
needle "One of the special magic numbers for {key} is: {value}." at a chosen depth, the
question at the end, a 7-digit value) built to a token budget with the model's tokenizer
(:func:`kvcost.retrieval.ruler.build_prompt`). A trial succeeds when greedy decoding reproduces the value: scored by
teacher forcing, the model's top-1 token equals the value's token at every position of the
answer (exactly the condition for greedy decoding to emit the value after the answer prefix).

Variants of one trial (:data:`VARIANTS` holds the spellings):

- ``exact``: stock attention (torch SDPA, float32).
- ``store:<fmt>``: K/V stored in ``fmt`` (kvcost.models.decoders.StoredCache) for every row.
- ``fa3[:k=v,...]``: FlashAttention-3's FP8 forward pass (kvcost.fa3.attend: Q, K, V in e4m3 at
  scale 1.0, P in e4m3, P·V on the tensor core with ``frac_bits``, ``flush_every``) for the
  question and answer rows of every layer, earlier rows exact (fast mode; the exact prefix is
  computed once per trial and shared); ``fa3:rows=answer[,...]`` emulates only the rows that
  predict the answer (the last ``n_answer + 1``: the question itself exact too), the cheapest
  mode; ``fa3full[...]`` runs every row of every layer through it (faithful mode).
- ``split:haystack=g,needle=c[,layer=L][,rows=answer]``: exact attention whose output is split into what the
  needle sentence's keys contribute and what every other key does, the haystack's part scaled by ``g`` and
  the needle's by ``c`` (default 1 each), for the same rows as ``fa3`` (at every layer, or at layer ``L``
  only). It carries notebook 06's two effects through the real decoder separately: the haystack shrinkage
  the FP8 kernel causes (gain 0.45–0.69 there) with the needle intact, and the needle's loss with the
  haystack intact; ``split:needle=0`` (the needle removed from attention) is the case whose answer is known.

torch and transformers are imported where used (the ``[real-model]`` extra).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd

from kvcost import stats
from kvcost.models import decoders, sliding_window
from kvcost.numerics import fa3
from kvcost.paths import data_path
from kvcost.provenance import checked
from kvcost.retrieval.ruler import Prompt, results_name  # results_name: re-exported

__all__ = ["PROPAGATION_CSV", "ROWS", "results_name", "parse_variant", "FA3Attention", "committed_propagation",
           "propagation_table", "run_trial", "split_attention"]

#: Which rows a fast-mode variant emulates: ``tail`` (the question and the answer) or ``answer``
#: (the last ``n_answer + 1`` rows, those whose logits are scored).
ROWS = ("tail", "answer")


def parse_variant(name: str) -> tuple[str, dict[str, Any]]:
    """``(kind, options)`` of a variant name: ``exact``, ``store:<fmt>``, ``fa3[:k=v,...]``,
    ``fa3full[:k=v,...]`` (options: ``frac_bits`` (the P·V register alone), ``qk_frac_bits`` (QKᵀ's),
    ``flush_every``, ``p_format``, ``arch`` (the GPU whose FP8 unit runs the kernel, e.g. ``Blackwell``),
    and for ``fa3`` ``rows``: ``tail`` (question and answer, the default) or ``answer``)."""
    kind = decoders.variant_kind(name)
    if kind == "exact":
        return "exact", {}
    if kind == "store":
        fmt = decoders.stored_format(name)
        decoders.parse_format(fmt)
        return "store", {"fmt": fmt}
    opts = name.partition(":")[2]
    out: dict[str, Any] = {}
    for item in filter(None, opts.split(",")):
        k, _, v = item.partition("=")
        if kind == "split" and k in ("haystack", "needle"):
            try:
                out[k] = float(v)
            except ValueError:
                raise ValueError(f"parameter 'variant': {k}={v!r} in {name!r} must be a number (the gain on "
                                 f"the {k}'s contribution)") from None
            if not 0.0 <= out[k] <= 4.0:
                raise ValueError(f"parameter 'variant': {k}={v!r} in {name!r} must be in [0, 4]")
        elif kind == "split" and k == "layer":
            out[k] = int(v)
        elif kind == "split" and k not in ("rows",):
            raise ValueError(f"parameter 'variant': unknown option {k!r} in {name!r} (split takes haystack, "
                             "needle, layer, rows)")
        elif k in ("frac_bits", "qk_frac_bits", "flush_every"):
            out[k] = int(v)
        elif k == "p_format":
            out[k] = v
        elif k == "arch":
            fa3.unit_for(v.replace("_", " "))          # 'Ada_Lovelace' in a variant name: no spaces there
            out[k] = v.replace("_", " ")
        elif k == "rows" and kind in ("fa3", "split") and v in ROWS:
            if v != "tail":
                out[k] = v
        elif k == "rows":
            raise ValueError(f"parameter 'variant': rows={v!r} in {name!r}: fa3 takes rows in {list(ROWS)}, "
                             "fa3full emulates every row")
        else:
            raise ValueError(f"parameter 'variant': unknown option {k!r} in {name!r}")
    return kind, out


class FA3Attention:
    """A transformers attention function: kvcost.fa3.attend while ``active``, else SDPA; a sliding-window
    layer (a call with ``sliding_window`` shorter than its keys: Gemma 3's 15 of 18) always through the exact
    banded attention (:func:`kvcost.models.sliding_window.banded_attention`), so that the FP8 emulation acts on the
    global layers only (counted in ``calls``; the sliding ones in ``sliding_calls``).

    Register it (:meth:`register`) and switch ``active`` / ``options`` between forward passes.
    K and V are stored in e4m3 (the kernel's cache) once per layer and reused while the cache
    they came from only grows: the keys a later call shares with the last one are not rounded
    again (the same values, so the same result, as storing them every call).
    """

    NAME = "kvcost_fa3"

    def __init__(self) -> None:
        self.active = False
        self.options: dict[str, Any] = {}
        #: while set (with ``active``), exact attention split at the needle instead of the FP8 kernel:
        #: ``{"haystack": g, "needle": c, "span": (start, end), "layer": L or None}``
        self.split: dict[str, Any] | None = None
        self.calls = 0
        self.sliding_calls = 0
        self._stored: dict[int, tuple[np.ndarray, ...]] = {}

    def stored_kv(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``k``, ``v`` (kv_heads, n, d) float32 as the FP8 cache holds them (fa3.store, e4m3)."""
        n0 = 0
        old = self._stored.get(layer)
        if old is not None:
            m = min(old[0].shape[1], k.shape[1])
            if np.array_equal(old[0][:, :m], k[:, :m]) and np.array_equal(old[1][:, :m], v[:, :m]):
                n0 = m
        sk, sv = (fa3.store(x[:, n0:], "e4m3") for x in (k, v))
        if n0:
            sk, sv = np.concatenate([old[2][:, :n0], sk], axis=1), np.concatenate([old[3][:, :n0], sv], axis=1)
        self._stored[layer] = (k.copy(), v.copy(), sk, sv)
        return sk, sv

    def __call__(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                 **kwargs: Any) -> tuple[Any, None]:
        import torch
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        window = kwargs.pop("sliding_window", None)
        if window is not None and window < key.shape[2]:
            # a sliding-window layer (Gemma 3's): exact banded attention, emulated or not — transformers
            # builds no mask for a custom attention name, and the FP8 emulation has no window
            self.sliding_calls += 1
            out = sliding_window.banded_attention(query, key, value, int(window), scaling or query.shape[-1] ** -0.5)
            return out.transpose(1, 2).contiguous(), None
        split = self.split if self.active else None
        if split is not None and split.get("layer") not in (None, module.layer_idx):
            split, exact = None, True
        else:
            exact = not self.active
        if split is not None:
            self.calls += 1
            out = split_attention(query, key, value, scaling or query.shape[-1] ** -0.5, split["span"],
                                  split.get("haystack", 1.0), split.get("needle", 1.0))
            return out.transpose(1, 2).contiguous(), None
        if exact:
            n_q, n_k = query.shape[2], key.shape[2]
            if attention_mask is None and 1 < n_q < n_k:
                # transformers builds no mask for a custom attention name, and SDPA's is_causal would
                # align the triangle top-left; a chunk after a cache needs it bottom-right
                attention_mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)[None, None]
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        self.calls += 1
        k, v = self.stored_kv(module.layer_idx, key[0].detach().numpy(), value[0].detach().numpy())
        # kv_format e4m3 on values already e4m3: the store leaves them as they are, and tells fa3 its
        # float32-lane tensor core applies without a check
        out = fa3.attend(query[0].detach().numpy(), k, v, causal=True, softmax_scale=scaling, kv_format="e4m3",
                         **self.options)
        return torch.from_numpy(out.astype(np.float32)).transpose(0, 1).unsqueeze(0), None

    def register(self, model: Any) -> None:
        from transformers import AttentionInterface

        AttentionInterface.register(self.NAME, self)
        model.set_attn_implementation(self.NAME)


def split_attention(query: Any, key: Any, value: Any, scaling: float, span: tuple[int, int], haystack: float,
                    needle: float) -> Any:
    """Exact causal attention (float32, the query rows the last of the keys) whose output is
    ``haystack`` x what the keys outside ``span`` contribute + ``needle`` x what the keys in ``span`` do.
    query (1, hq, n_q, d), key and value (1, hkv, n_k, d) torch tensors; returns (1, hq, n_q, d)."""
    import torch

    group = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(group, dim=1)
    v = value.repeat_interleave(group, dim=1)
    n_q, n_k = query.shape[2], key.shape[2]
    s = (query @ k.transpose(-1, -2)) * scaling
    causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    w = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    m = torch.zeros(n_k, dtype=w.dtype)
    m[span[0]:span[1]] = 1.0
    return haystack * ((w * (1.0 - m)) @ v) + needle * ((w * m) @ v)


def _score(logits: Any, tail: list[int], n_answer: int) -> dict[str, Any]:
    """Teacher-forced check of the answer rows: ``logits`` (rows, vocab) for the last rows of the
    tail (at least ``n_answer + 1``), where each row predicts the next tail token."""
    ans = np.asarray(tail[-n_answer:])
    rows = logits[-n_answer - 1:-1].detach().numpy().astype(np.float64)
    top = rows.argmax(axis=1)
    true = rows[np.arange(n_answer), ans]
    rows2 = rows.copy()
    rows2[np.arange(n_answer), ans] = -np.inf
    margin = float(np.min(true - rows2.max(axis=1)))
    return {"success": bool(np.all(top == ans)), "margin": margin}


def run_trial(model: Any, attn: FA3Attention, prompt: Prompt, variants: list[str]) -> dict[str, dict[str, Any]]:
    """Score every variant on one prompt; returns ``{variant: {"success", "margin", "seconds"}}``.

    ``margin``: the smallest logit gap, over the answer tokens, between the value's token and the
    best other token (negative when a wrong token wins). ``seconds``: the variant's time (the shared
    exact prefix is counted in the first variant that needs it).
    """
    import torch

    parsed = {v: parse_variant(v) for v in variants}
    out: dict[str, dict[str, Any]] = {}
    full = torch.tensor([prompt.prefix + prompt.tail])
    n_pre = len(prompt.prefix)
    shared = None
    with torch.no_grad():
        for name, (kind, opt) in parsed.items():
            t0 = time.perf_counter()
            if kind in ("exact", "fa3", "split"):
                if shared is None:
                    attn.active = False
                    shared = decoders.StoredCache("fp32")
                    model(full[:, :n_pre], cache=shared, use_cache=True, logits_to_keep=1)
                extra = shared.get_seq_length() - n_pre
                if extra > 0:
                    shared.crop(-extra)
                opt = dict(opt)
                start = n_pre
                if opt.pop("rows", "tail") == "answer":      # the question's rows exact as well
                    start = full.shape[1] - prompt.n_answer - 1
                    attn.active = False
                    model(full[:, n_pre:start], cache=shared, use_cache=True, logits_to_keep=1)
                if kind == "split":
                    attn.split = {"haystack": opt.pop("haystack", 1.0), "needle": opt.pop("needle", 1.0),
                                  "layer": opt.pop("layer", None), "span": prompt.needle}
                attn.active, attn.options = kind in ("fa3", "split"), opt
                logits = model(full[:, start:], cache=shared, use_cache=True,
                               logits_to_keep=prompt.n_answer + 1).logits[0]     # the rows _score reads
            elif kind == "store":
                attn.active = False
                cache = decoders.StoredCache(opt["fmt"], model=model)
                logits = model(full, cache=cache, use_cache=True,
                               logits_to_keep=len(prompt.tail)).logits[0]
            else:                                    # fa3full: every row of every layer
                attn.active, attn.options = True, opt
                logits = model(full, cache=decoders.StoredCache("fp32"), use_cache=True,
                               logits_to_keep=len(prompt.tail)).logits[0]
            attn.active, attn.split = False, None
            out[name] = _score(logits, prompt.tail, prompt.n_answer) | {"seconds": time.perf_counter() - t0}
    return out


#: Where the propagation grid's rows are committed (``scripts/real_model_passkey.py --out``).
PROPAGATION_CSV = "real_model/propagation.csv"


def committed_propagation() -> pd.DataFrame:
    """The committed propagation grid (:data:`PROPAGATION_CSV`, its sha256 checked): one row per (context,
    trial, variant), as the passkey grid's."""
    return pd.read_csv(checked(data_path(*PROPAGATION_CSV.split("/"))))


def propagation_table(rows: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """The ``split`` variants of a passkey grid against exact attention on the same trials: per (context,
    variant) the effect it applies (``haystack`` and ``needle`` gains, the ``layer`` or every layer),
    ``successes`` of ``trials`` with the Wilson 95% ``lo``/``hi``, the discordant trials (``lost``: exact
    answered and the variant did not; ``gained``: the reverse), the exact McNemar ``p_value``,
    ``changes_answer`` (p below ``alpha`` with more lost than gained), the median answer-logit ``margin``
    and its median paired drop from exact's (``margin_drop``), and ``detectable``: the fewest lost trials (none
    gained) that would reach ``alpha`` at these ``trials`` — what "no change detected" could have seen."""
    exact = rows[rows["variant"] == "exact"].set_index(["context", "trial"])
    out = []
    for (c, v), g in rows[rows["variant"] != "exact"].groupby(["context", "variant"], sort=False):
        kind, opt = parse_variant(v)
        if kind != "split":
            continue
        g = g[[(c, t) in exact.index for t in g["trial"]]]
        ref = exact.loc[[(c, t) for t in g["trial"]]]
        mine, theirs = g["success"].to_numpy().astype(bool), ref["success"].to_numpy().astype(bool)
        lost, gained = int(np.sum(theirs & ~mine)), int(np.sum(mine & ~theirs))
        k, n = int(mine.sum()), len(g)
        lo, hi = stats.wilson(k, n)
        p = stats.mcnemar_exact(lost, gained)
        need = next((d for d in range(1, n + 1) if stats.mcnemar_min_p(d) < alpha), None)
        out.append({"context": int(c), "variant": v, "haystack": opt.get("haystack", 1.0),
                    "needle": opt.get("needle", 1.0), "layer": opt.get("layer", "every"), "trials": n,
                    "successes": k, "lo": lo, "hi": hi, "exact_successes": int(theirs.sum()), "lost": lost,
                    "gained": gained, "p_value": p, "changes_answer": bool(p < alpha and lost > gained),
                    "margin": float(np.median(g["margin"])),
                    "margin_drop": float(np.median(ref["margin"].to_numpy() - g["margin"].to_numpy())),
                    "detectable": need})
    return pd.DataFrame(out)
