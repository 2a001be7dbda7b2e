"""Notebook 01's verdict: the post's sizing tables to the digits printed, and its readings of them."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvcost.claims import vendor_table
from kvcost.claims.report import READING, Check, Verdict, as_kind, compare_table
from kvcost.inputs import post
from kvcost.models.footprint import cache_bytes, naive_bytes_per_token
from kvcost.models.hfconfig import SLIDING
from kvcost.models.registry import POST_MODELS, list_models, load_model
from kvcost.units import GIB

__all__ = ["errata", "formula_off", "printed", "readings", "verdict"]

#: Said under the verdict of a run whose parameters are not the post's.
NON_DEFAULT = ("Non-default parameters: the table is what the post's code gives for them; the post printed numbers, "
               "and made its readings, for its defaults only.")


def formula_off(context: int, tolerance: float = 0.01) -> tuple[list[str], list[str], list[str]]:
    """Registry models at ``context`` in bf16: (off by more than ``tolerance``, within it, beyond their maximum).

    A model whose ``max_position_embeddings`` is below ``context`` is not counted either way: its
    cache at that length is not a configuration anyone runs.
    """
    off, exact, beyond = [], [], []
    for name in list_models():
        g = load_model(name)
        if g.max_position_embeddings is not None and context > g.max_position_embeddings:
            beyond.append(g.name)
            continue
        naive = naive_bytes_per_token(*g.naive) * context
        true = cache_bytes(g, context)
        (off if abs(naive - true) > tolerance * true else exact).append(
            f"{g.name} {naive / true:.2g}x" if abs(naive - true) > tolerance * true else g.name)
    return off, exact, beyond


def printed(table: pd.DataFrame, listing: pd.DataFrame, models: Sequence[str]) -> list[Check]:
    """``table`` (:func:`kvcost.experiments.sizing.post_table`) and ``listing``
    (:func:`kvcost.experiments.sizing.post_listing`) against the post's printed sizing table and listing,
    for the ``models`` asked for. Only meaningful at the post's defaults."""
    tab, lst = post.sizing_table(), post.sizing_listing()
    return (compare_table(tab[tab.model.isin(models)], table, ["model"],
                          {"kib_per_token_bf16": ".0f", "gib_at_context_bf16": ".1f",
                           "gib_at_context_fp8": ".1f", "requests_at_budget": "d"})
            + compare_table(lst[lst.model.isin(models)], listing, ["model"],
                            {"kv_heads": "d", "kib_per_token": ".0f", "ratio": ".1f"}))


def errata() -> list[Check]:
    """None here: notebook 05 holds the post's published measurements as errata (01 reads three of them)."""
    return []


def verdict(table: pd.DataFrame, listing: pd.DataFrame, models: Sequence[str], context: int,
            post_defaults: bool) -> Verdict:
    """Notebook 01's verdict: at the post's defaults its printed numbers and readings; otherwise nothing is
    compared and the verdict says so."""
    if not post_defaults:
        return Verdict(extra=NON_DEFAULT)
    return Verdict(printed=printed(table, listing, models), readings=readings(context), errata=errata())


def readings(context: int = 131_072) -> list[Check]:
    """The post's readings of its sizing section: claim = the post's words, computed = what kvcost finds."""
    checks = []
    llama, _qwen, mistral, oss, l2 = (load_model(n) for n in POST_MODELS)
    # "One formula covers every model, and it is exact enough to plan capacity with."
    off, exact, beyond = formula_off(context)
    counted = len(off) + len(exact)
    beyond_text = (f"; {len(beyond)} more are trained to less than {context:,} tokens and not counted "
                   f"({', '.join(beyond)})" if beyond else "")
    checks.append(Check(
        READING, "One formula covers every model, and it is exact enough to plan capacity with", "exact",
        f"at {context:,} tokens in bf16 it is off by more than 1% for {len(off)} of the {counted} models "
        f"trained to that length ({', '.join(off)}){beyond_text}",
        not off, "sliding windows, MLA latents and SSM/linear layers are outside the formula; a sliding "
        "window saves memory only in an engine that frees tokens outside it (llama.cpp's --swa-full "
        "keeps every token)"))
    # The post's own table, corrected: gpt-oss-20b and Mistral-7B-v0.1 at 128k.
    for g, shown in ((oss, "6.0"), (mistral, "16.0")):
        true = cache_bytes(g, 131_072) / GIB                     # the post's claim is at 128k
        naive = naive_bytes_per_token(*g.naive) * 131_072 / GIB
        maxpos = g.max_position_embeddings
        past = (f"; 128k is past its max_position_embeddings {maxpos:,}" if maxpos is not None and maxpos < 131_072
                else "")
        checks.append(Check(
            READING, f"{g.name} needs {shown} GiB of bf16 KV at 128k", shown,
            f"{true:.3f} GiB: {g.count(SLIDING)} of {g.num_layers} layers keep only a "
            f"{g.window}-token window ({naive / true:.1f}x less than the formula){past}",
            abs(true - naive) < 0.05,
            "the formula counts windowed layers at full context; the saving holds in engines that free "
            "tokens outside the window (vLLM, llama.cpp without --swa-full), not in llama.cpp with --swa-full"))
    # "Llama-2-7B costs 4x the KV bytes of an 8B Llama-3 model because GQA is the 4x"
    ratio = cache_bytes(l2, context) / cache_bytes(llama, context)
    checks.append(Check(READING, "Llama-2-7B costs 4x the KV bytes of an 8B Llama-3 model; GQA is the 4x", "4x",
                        f"{ratio:g}x ({l2.kv_heads} against {llama.kv_heads} KV heads, same layers "
                        f"and head_dim)", ratio == 4.0 and l2.kv_heads == 4 * llama.kv_heads))
    # The published measurements the arithmetic must match (shared with notebook 05).
    checks += as_kind([vendor_table.weights_ratio_check(), *vendor_table.qwen3_q8_0_checks(),
                       *vendor_table.dgx_spark_buffer_checks()], READING)
    return checks
