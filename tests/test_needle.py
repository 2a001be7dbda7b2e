"""The needle experiment against an independent transcription of the post's Block 2 loop."""
import numpy as np
import pytest

from kvcost.experiments import needle_cliff
from kvcost.inputs import synthetic
from kvcost.numerics import attention
from references import post_block2_quant


def _post_block2_needle(seed, n, d, trials, margin, pairs):
    rng = np.random.default_rng(seed)
    k = rng.normal(0, 1, (n, d))
    k[:, ::16] *= 4.0
    v = rng.normal(0, 1, (n, d))
    v[::64, :] *= 6.0
    rows = []
    for kb, vb in pairs:
        flips, werr, oerr = 0, [], []
        for _ in range(trials):
            q = rng.normal(0, 1, d)
            kt = rng.normal(0, 1, (n, d))
            kt[:, ::16] *= 4.0
            vt = rng.normal(0, 1, (n, d))
            nd = n // 2
            kt[nd] = q * ((kt @ q).max() + margin) / (q @ q)
            s = kt @ q
            w = np.exp(s - s.max())
            w /= w.sum()
            out = w @ vt
            kq, vq = post_block2_quant(kt, kb, 0), post_block2_quant(vt, vb, 1)
            sq = kq @ q
            wq = np.exp(sq - sq.max())
            wq /= wq.sum()
            flips += int(np.argmax(sq) != nd)
            werr.append(np.abs(wq - w).max())
            oerr.append(np.linalg.norm(wq @ vq - out) / np.linalg.norm(out))
        rows.append((kb, vb, flips, trials, np.mean(werr), np.mean(oerr)))
    return rows


@pytest.mark.parametrize("seed,n,d,trials,margin,pairs", [
    (7, 256, 32, 5, 0.5, [[8, 8], [4, 4], [2, 2]]),
    (3, 512, 64, 4, 0.1, [[3, 5], [6, 2]]),
    (11, 130, 16, 3, 2.0, [[16, 16]]),
])
def test_post_needle_table_matches_post_code_bit_for_bit(seed, n, d, trials, margin, pairs):
    got = needle_cliff.post_needle_table(seed, n, d, trials, margin, pairs)
    want = _post_block2_needle(seed, n, d, trials, margin, pairs)
    assert list(got.columns) == needle_cliff.NEEDLE_COLUMNS
    for row, ref in zip(got.itertuples(index=False), want):
        assert (row.k_bits, row.v_bits, row.flips, row.trials) == ref[:4]
        assert row.max_w_err == ref[4]   # exact: same operations in the same order
        assert row.out_rel_l2 == ref[5]


def test_needle_trial_has_the_requested_margin():
    trial = synthetic.post_needle_trial(np.random.default_rng(0), 300, 24, 0.75)
    scores = trial.k @ trial.q
    others = np.delete(scores, trial.needle)
    assert scores[trial.needle] - others.max() == pytest.approx(0.75, abs=1e-9)


def test_exact_roundtrips_change_nothing():
    trial = synthetic.post_needle_trial(np.random.default_rng(1), 200, 16, 0.5)
    e = attention.trial_errors(trial, None, None)
    assert not e.flipped and e.max_w_err == 0.0 and e.out_rel_l2 == 0.0


def test_error_sources_separates_k_and_v():
    df = needle_cliff.error_sources(0, 512, 32, 4, 0.5, [[16, 2]])
    # 16-bit K keeps every needle; 2-bit V alone costs far more than 16-bit K alone.
    assert int(df.flips_k_only[0]) == 0
    assert df.out_rel_l2_v_only[0] > 100 * df.out_rel_l2_k_only[0]


def test_margin_sweep_flip_rate_falls_with_margin_at_8_bits():
    df = needle_cliff.margin_sweep([0.01, 8.0], [8], trials=6, n_tokens=512, head_dim=32)
    rate = df.set_index("margin").flip_rate
    assert rate[8.0] == 0.0
    assert rate[0.01] >= rate[8.0]
    row = df.set_index("margin").loc[8.0]
    assert row.flip_rate_lo == 0.0 and 0.3 < row.flip_rate_hi < 0.5      # Wilson 95% for 0 of 6


def test_softmax_matches_the_post_formula_and_sums_to_one():
    s = np.array([1.0, 2.0, 3.0])
    w = attention.softmax(s)
    assert np.array_equal(w, np.exp(s - 3.0) / np.exp(s - 3.0).sum())
    assert w.sum() == pytest.approx(1.0)
