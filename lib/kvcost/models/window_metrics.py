"""What a stored cache costs one text window, as llama.cpp's perplexity tool measures it: per token the
negative log-likelihood of the next token, KL(reference || stored) in nats and top-1 agreement against the
references (the fp32 and fp16 caches), summed over the window's scored rows.

:func:`token_metrics` is the definition, on a whole logit matrix (SmolLM2's committed rows). A vocabulary
of 262,144 (Gemma 3) makes that matrix 1 GiB of float32 for a 2k window's scored half, so
:func:`chunked_logit_metrics` computes the same sums a few rows at a time; it also computes each reference's
probabilities and top-1 once per chunk rather than once per format, and reduces each row's KL with one
batched product: for the nine formats of a committed Gemma window about twice as fast (``make bench``). The
per-token terms are :func:`token_metrics`' own (``p_ref · (log p_ref − log q)``); only the order of the sums
differs. :func:`chunked_window_metrics` runs a model's head on final hidden states as the logits.

torch is imported inside the functions (the optional ``[real-model]`` extra).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvcost.provenance import CODE_COLUMN

__all__ = ["WINDOW_FIELDS", "WINDOW_KEY", "chunked_logit_metrics", "chunked_window_metrics", "logits_of",
           "token_metrics", "window_tokens"]

#: The columns of a per-window perplexity row, shared by our runs and llama.cpp's (``scripts/real_model_ppl.py``,
#: ``scripts/llamacpp_reference.py``), the last naming the code that wrote the row (kvcost.provenance.CODE_COLUMN),
#: and the key that makes a row finished.
WINDOW_FIELDS = ["context", "window", "format", "n", "nll_sum", "kl_fp32_sum", "kl_fp16_sum", "top1_fp32", "top1_fp16",
                 "correct", "seconds", CODE_COLUMN]
WINDOW_KEY = [("context", int), ("window", int), ("format", str)]


def token_metrics(logits: Any, targets: Any, ref_logprobs: Sequence[Any] = ()) -> dict[str, np.ndarray]:
    """Per-token metrics of one window's scored rows (torch tensors, float32).

    ``logits`` (n, vocab) predict ``targets`` (n,). Returns numpy arrays: ``nll`` (negative log
    likelihood of the target), ``argmax`` (the top-1 token), and for each reference log-prob
    matrix in ``ref_logprobs`` ``kl{i}`` = KL(reference || this) in nats and ``top1_{i}`` (same
    top-1 token as the reference).
    """
    import torch

    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    out = {"nll": (-lp.gather(1, targets.view(-1, 1))[:, 0]).numpy(),
           "argmax": lp.argmax(dim=-1).numpy()}
    for i, ref in enumerate(ref_logprobs):
        ref = ref.to(torch.float64)
        out[f"kl{i}"] = torch.sum(torch.exp(ref) * (ref - lp), dim=-1).clamp_min(0.0).numpy()
        out[f"top1_{i}"] = (lp.argmax(dim=-1) == ref.argmax(dim=-1)).numpy()
    return out


def window_tokens(ids: Sequence[int], window: int, context: int, bos: int | None = None) -> list[int]:
    """The tokens of text window ``window`` (``context`` consecutive tokens of ``ids``), its first one
    replaced by ``bos`` when given — as llama.cpp's perplexity tool does for a model whose GGUF says
    ``add_bos_token`` (kvcost.models.decoders.Decoder.bos_first)."""
    chunk = list(ids[window * context:(window + 1) * context])
    if len(chunk) != context:
        raise ValueError(f"parameter 'window': window {window} of {context} tokens runs past the {len(ids)} tokens")
    if bos is not None:
        chunk[0] = int(bos)
    return chunk


def logits_of(model: Any, hidden: Any) -> Any:
    """The logits a causal-LM head gives for final hidden states ``hidden`` (rows, hidden_size): ``lm_head``,
    then the config's ``final_logit_softcapping`` where it has one (Gemma 2's; Gemma 3 has none)."""
    import torch

    logits = model.lm_head(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _reference(logits: Any) -> tuple[Any, Any, Any]:
    """One reference's rows as every format's metrics read them: log-probabilities and probabilities (float64)
    and the top-1 token."""
    import torch

    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return lp, torch.exp(lp), lp.argmax(dim=-1)


def _row_kl(p_ref: Any, lp_ref: Any, lp: Any) -> Any:
    """Per row, sum_v p_ref (lp_ref − lp): token_metrics' terms, reduced by one batched product (clamped at 0)."""
    import torch

    diff = lp_ref - lp
    return torch.bmm(p_ref.unsqueeze(1), diff.unsqueeze(2))[:, 0, 0].clamp_min(0.0)


def chunked_logit_metrics(logits: Callable[[str, int, int], Any], formats: Sequence[str], targets: Any,
                          refs: Sequence[str] = ("fp32", "fp16"), rows: int = 256) -> dict[str, dict[str, Any]]:
    """Per format, one window's summed metrics from its logits, ``rows`` rows at a time: ``logits(fmt, s, e)``
    gives rows ``s:e`` of format ``fmt``'s (n, vocab) logits (float32 torch), called once per chunk and format,
    the references' included (each reused for the format itself). Returns ``{fmt: {n, nll_sum, kl_fp32_sum,
    kl_fp16_sum, top1_fp32, top1_fp16, correct}}`` for every format in ``formats`` (the columns of
    :data:`WINDOW_FIELDS`, KL and top-1 against the references named by ``refs``, which need not be among
    ``formats``; a reference against itself is KL 0 and top-1 every row, exactly): the sums
    :func:`token_metrics` gives on the whole matrix, from the same per-token terms, up to the order of the
    sums."""
    import torch

    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"parameter 'rows' must be an integer >= 1, got {rows!r}")
    if len(refs) != 2:
        raise ValueError(f"parameter 'refs' names the two references of WINDOW_FIELDS (fp32, fp16), got {refs!r}")
    n = int(targets.shape[0])
    out = {f: {"n": n, "nll_sum": 0.0, "kl_fp32_sum": 0.0, "kl_fp16_sum": 0.0, "top1_fp32": 0, "top1_fp16": 0,
               "correct": 0} for f in formats}
    names = (("kl_fp32_sum", "top1_fp32"), ("kl_fp16_sum", "top1_fp16"))
    with torch.no_grad():
        for s in range(0, n, rows):
            e = min(s + rows, n)
            chunk = {r: logits(r, s, e) for r in refs}
            ref = {r: _reference(chunk[r]) for r in refs}
            tgt = targets[s:e]
            for fmt in formats:
                o = out[fmt]
                if fmt in ref:
                    lp = ref[fmt][0]
                else:
                    lp = torch.log_softmax(logits(fmt, s, e).to(torch.float64), dim=-1)
                top = lp.argmax(dim=-1)
                o["nll_sum"] += float(-lp.gather(1, tgt.view(-1, 1)).sum())
                o["correct"] += int((top == tgt).sum())
                for r, (kl, top1) in zip(refs, names):
                    if r == fmt:
                        o[top1] += e - s
                        continue
                    lp_ref, p_ref, top_ref = ref[r]
                    o[kl] += float(_row_kl(p_ref, lp_ref, lp).sum())
                    o[top1] += int((top == top_ref).sum())
    return out


def chunked_window_metrics(model: Any, hidden: dict[str, Any], targets: Any, refs: Sequence[str] = ("fp32", "fp16"),
                           rows: int = 256) -> dict[str, dict[str, Any]]:
    """Per format, one window's summed metrics from its final hidden states (``hidden[fmt]``: (n, hidden_size),
    the rows that predict ``targets``), computed ``rows`` rows at a time so that no (n, vocab) matrix is ever
    held whole (Gemma's vocabulary is 262,144: a 2k window's scored half would be 1 GiB of float32 logits per
    format, 2 GiB as float64). Each format's head runs once per chunk, the references' included. Returns
    ``{fmt: {n, nll_sum, kl_fp32_sum, kl_fp16_sum, top1_fp32, top1_fp16, correct}}`` (the
    columns of :data:`WINDOW_FIELDS`, references named by ``refs``), the same numbers
    :func:`token_metrics` gives on the whole matrix up to the order of the sums
    (:func:`chunked_logit_metrics` with the head as the logits)."""
    missing = [r for r in refs if r not in hidden]
    if missing:
        raise ValueError(f"parameter 'hidden' lacks the reference formats {missing}")
    return chunked_logit_metrics(lambda fmt, s, e: logits_of(model, hidden[fmt][s:e]), list(hidden), targets, refs,
                                 rows)
