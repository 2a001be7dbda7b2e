"""Notebook 06's two effects carried through a real decoder: the ``split`` passkey variant
(kvcost.experiments.real_decoder_passkey.split_attention), on cases whose answer is known."""
import numpy as np
import pandas as pd
import pytest

from kvcost.claims import long_range_needle as claims
from kvcost.experiments import real_decoder_passkey as pk
from kvcost.retrieval import ruler

torch = pytest.importorskip("torch")


class Tok:                                         # one id per character: lengths and spans are exact
    def __call__(self, s, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in s]}


def test_the_prompt_knows_where_its_needle_is():
    p = ruler.build_prompt(Tok(), 2000, 0.3, seed=4)
    a, b = p.needle
    assert "".join(map(chr, p.prefix[a:b])) == f" One of the special magic numbers for {p.key} is: {p.value}."


def test_split_variants_parse_and_refuse_bad_options():
    assert pk.parse_variant("split:haystack=0.5") == ("split", {"haystack": 0.5})
    assert pk.parse_variant("split:needle=0,layer=10,rows=answer") == (
        "split", {"needle": 0.0, "layer": 10, "rows": "answer"})
    for bad, word in (("split:haystack=abc", "must be a number"), ("split:needle=9", r"\[0, 4\]"),
                      ("split:frac_bits=5", "unknown option"), ("split:rows=all", "rows")):
        with pytest.raises(ValueError, match=word):
            pk.parse_variant(bad)


def _attention(q, k, v, scaling, drop=None):
    """Plain float64 causal attention, the query rows last, optionally with keys ``drop`` removed from the
    sum but not from the softmax (their weight simply lost)."""
    hq, hk = q.shape[1], k.shape[1]
    k, v = np.repeat(k, hq // hk, axis=1), np.repeat(v, hq // hk, axis=1)
    n_q, n_k = q.shape[2], k.shape[2]
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scaling
    s = np.where(np.tri(n_q, n_k, n_k - n_q, dtype=bool), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    if drop is not None:
        w[..., drop[0]:drop[1]] = 0.0
    return np.einsum("bhqk,bhkd->bhqd", w, v)


def test_split_attention_is_exact_attention_and_removes_what_it_is_told():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((1, 6, 5, 16), (1, 2, 40, 16), (1, 2, 40, 16)))
    t = [torch.tensor(x, dtype=torch.float32) for x in (q, k, v)]
    span, scale = (10, 17), 0.25
    whole = pk.split_attention(*t, scale, span, 1.0, 1.0).numpy()
    np.testing.assert_allclose(whole, _attention(q, k, v, scale), rtol=0, atol=2e-6)
    gone = pk.split_attention(*t, scale, span, 1.0, 0.0).numpy()            # the needle removed
    np.testing.assert_allclose(gone, _attention(q, k, v, scale, drop=span), rtol=0, atol=2e-6)
    # the two parts add up: haystack x g plus needle x c, for any g and c
    g, c = 0.5, 0.25
    mixed = pk.split_attention(*t, scale, span, g, c).numpy()
    needle_part = whole - gone
    np.testing.assert_allclose(mixed, g * gone + c * needle_part, rtol=0, atol=4e-6)
    assert np.abs(needle_part).max() > 1e-3          # the needle's keys do contribute here


def test_propagation_table_pairs_each_variant_with_exact():
    rows = []
    for t in range(20):
        rows.append({"context": 1024, "trial": t, "variant": "exact", "success": 1, "margin": 2.0})
        rows.append({"context": 1024, "trial": t, "variant": "split:needle=0", "success": 0, "margin": -3.0})
        rows.append({"context": 1024, "trial": t, "variant": "split:haystack=0.7", "success": int(t >= 3),
                     "margin": 1.0})
    rows.append({"context": 1024, "trial": 0, "variant": "fa3", "success": 1, "margin": 2.0})   # not a split
    table = pk.propagation_table(pd.DataFrame(rows)).set_index("variant")
    assert list(table.index) == ["split:needle=0", "split:haystack=0.7"]
    gone, shrunk = table.loc["split:needle=0"], table.loc["split:haystack=0.7"]
    assert (gone["lost"], gone["gained"], gone["successes"], gone["changes_answer"]) == (20, 0, 0, True)
    assert gone["margin_drop"] == 5.0 and gone["needle"] == 0.0 and gone["layer"] == "every"
    # 3 of 20 lost is no detected change (p = 0.25); 6 lost, none gained, is the least this test can see
    assert (shrunk["lost"], shrunk["changes_answer"], shrunk["detectable"]) == (3, False, 6)
    assert shrunk["p_value"] == 0.25 and shrunk["haystack"] == 0.7


def _table(hay_changes: bool, removed_changes: bool = True):
    """A propagation table with a needle removal, a needle cut, a haystack shrink and one single-layer row."""
    base = {"context": 1024, "trials": 20, "exact_successes": 20, "gained": 0, "detectable": 6}

    def row(variant, haystack, needle, layer, changes):
        lost = 18 if changes else 1
        return {**base, "variant": variant, "haystack": haystack, "needle": needle, "layer": layer,
                "successes": 20 - lost, "lost": lost, "changes_answer": changes}

    return pd.DataFrame([row("split:needle=0", 1.0, 0.0, "every", removed_changes),
                         row("split:needle=0.25", 1.0, 0.25, "every", True),
                         row("split:haystack=0.5", 0.5, 1.0, "every", hay_changes),
                         row("split:haystack=0.5,layer=10", 0.5, 1.0, 10, False)])


def test_propagation_reading_says_which_loss_changes_the_answer():
    holds = claims.propagation_reading(_table(hay_changes=False))
    assert holds.agrees is True and holds.word == "holds"
    fails = claims.propagation_reading(_table(hay_changes=True))
    assert fails.agrees is False and "haystack's contribution to 0.5 at every layer" in fails.note
    assert "haystack x 0.5 at layer 10: 19/20" in fails.computed
    # the needle removed and the answer unchanged: the test cannot tell, whatever the haystack rows say
    blind = claims.propagation_reading(_table(hay_changes=True, removed_changes=False))
    assert blind.agrees is None and "cannot tell" in blind.note
