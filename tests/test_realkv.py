"""kvcost.inputs.extracts: the outlier statistics on arrays with known answers, the file format, and the
committed real K/V. No torch needed (the extraction script is the only torch user)."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kvcost.claims import real_kv as realkv_claims
from kvcost.experiments import real_kv as realkv_exp
from kvcost.inputs import extracts, post, synthetic
from kvcost.paths import repo_root


def _channel_cache() -> np.ndarray:
    """8 tokens x 4 channels of ones; channel 0 is 4 on every token, channel 2 is 20 on token 0."""
    x = np.ones((8, 4))
    x[:, 0] = 4.0
    x[0, 2] = 20.0
    return x


def test_channel_ratio_known_values():
    ratio = extracts.channel_ratio(_channel_cache())
    # RMS: channel 0 = 4, channel 2 = sqrt((400 + 7) / 8), channels 1 and 3 = 1; median of the four
    # is (1 + 4) / 2 = 2.5 for channel 2 > 4 > 1 = 1.
    rms2 = np.sqrt(407 / 8)
    med = (1.0 + 4.0) / 2
    np.testing.assert_allclose(ratio, [4 / med, 1 / med, rms2 / med, 1 / med])
    typical = extracts.channel_typical_ratio(_channel_cache())
    np.testing.assert_allclose(typical, [4.0, 1.0, 1.0, 1.0])   # medians 4, 1, 1, 1; their median 1


def test_channel_outlier_table_separates_persistent_from_spiky():
    table = extracts.channel_outlier_table(_channel_cache(), threshold=1.5)
    row = table.to_dict("records")[0]
    assert (row["layer"], row["head"]) == (0, 0)
    assert row["outlier_channels"] == 2       # channel 0 (ratio 1.6) and channel 2 (ratio 2.85)
    assert row["persistent_channels"] == 1    # only channel 0 is large on the typical token
    assert row["top_channel"] == 2
    assert row["max_ratio"] == pytest.approx(np.sqrt(407 / 8) / 2.5)
    assert row["top_typical_ratio"] == pytest.approx(1.0)
    assert row["top1_share"] == pytest.approx(1 / 8)  # channel 2 is the largest only on token 0


def test_channel_table_on_the_posts_synthetic_k():
    _, k, v = synthetic.post_stream(7, 4096, 128)
    kt = extracts.channel_outlier_table(k, 3.0)
    assert kt.loc[0, "outlier_channels"] == 8 and kt.loc[0, "persistent_channels"] == 8
    assert kt.loc[0, "top_channel"] % 16 == 0
    assert 3.8 < kt.loc[0, "max_ratio"] < 4.4
    vt = extracts.channel_outlier_table(v, 3.0)
    assert vt.loc[0, "outlier_channels"] == 0


def test_token_norm_ratio_and_table():
    x = np.ones((5, 4))
    x[2] *= 6.0
    np.testing.assert_allclose(extracts.token_norm_ratio(x), [1, 1, 6, 1, 1])
    special = np.array([True, False, True, False, False])
    table = extracts.token_outlier_table(x, 3.0, special)
    assert table.loc[0, ["outlier_tokens", "top_token", "outlier_special"]].tolist() == [1, 2, 1]
    assert table.loc[0, "outlier_fraction"] == pytest.approx(0.2)
    assert table.loc[0, "max_ratio"] == pytest.approx(6.0)
    # two heads, the outlier token in one of them: share 1/2 for token 2
    two = np.stack([x, np.ones((5, 4))])
    np.testing.assert_allclose(extracts.token_outlier_share(two, 3.0), [0, 0, 0.5, 0, 0])


def test_posts_synthetic_v_has_its_64_outlier_tokens():
    _, _, v = synthetic.post_stream(7, 4096, 128)
    table = extracts.token_outlier_table(v, 3.0)
    assert table.loc[0, "outlier_tokens"] == 64
    assert 5.5 < table.loc[0, "max_ratio"] < 7.0


def test_structure_table_sets_caches_side_by_side():
    _, k, v = synthetic.post_stream(7, 4096, 128)
    table = extracts.structure_table({"post K": k, "post V": v}, 3.0)
    assert table["cache"].tolist() == ["post K", "post V"]
    assert table["heads"].tolist() == [1, 1]
    assert table["heads_persistent_channels"].tolist() == [1, 0]
    assert table["heads_outlier_tokens"].tolist() == [0, 1]
    assert table.loc[1, "max_token_ratio"] == table.loc[1, "median_head_token_ratio"]
    with pytest.raises(ValueError, match="caches"):
        extracts.structure_table({}, 3.0)


def test_top_outlier_tokens_order():
    x = np.ones((1, 2, 4, 2))
    x[0, 0, 3] *= 5.0                          # token 3: outlier in one head of two
    x[0, :, 1] *= 2.0                          # token 1: larger than the rest in both heads
    kv = extracts.RealKV(x, x, np.arange(4), np.array(list("abcd")), np.zeros(4, int),
                       np.zeros(4, bool))
    top = extracts.top_outlier_tokens(kv, "K", 3.0, n=3)
    assert top["position"].tolist() == [3, 1, 0]
    assert top["share"].tolist() == [0.5, 0.0, 0.0]


def test_axis_by_head_reproduces_the_posts_axis_table():
    _, k, v = synthetic.post_stream(7, 4096, 128)
    by_head = realkv_exp.axis_by_head(k, v, [8, 4, 2])
    printed = post.axis_table()
    assert len(by_head) == len(printed) == 6
    for got, want in zip(by_head.to_dict("records"), printed.to_dict("records")):
        assert (got["cache"], str(got["bits"])) == (want["cache"], want["bits"])
        assert format(got["per_token"], ".3e") == want["per_token"]
        assert format(got["per_channel"], ".3e") == want["per_channel"]
        assert got["winner"] == want["winner"]


def test_axis_summary_and_verdict_on_the_posts_cache_all_hold():
    _, k, v = synthetic.post_stream(7, 4096, 128)
    by_head = realkv_exp.axis_by_head(k, v, [8, 4, 2])
    summary = realkv_exp.axis_summary(k, v, by_head)
    assert summary["winner"].tolist() == summary["post_winner"].tolist()
    assert summary["per_channel_heads"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    checks = realkv_claims.readings(extracts.channel_outlier_table(k, 3.0), extracts.token_outlier_table(v, 3.0),
                                    summary)
    assert len(checks) == 9 and all(c.agrees for c in checks)
    assert checks[-1].claim == "K flips from per-channel to per-token at 2 bits"


def test_verdict_fails_without_outliers():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(2, 64, 16))          # two plain Gaussian heads
    by_head = realkv_exp.axis_by_head(g, g, [8])
    summary = realkv_exp.axis_summary(g, g, by_head)
    checks = realkv_claims.readings(extracts.channel_outlier_table(g, 3.0), extracts.token_outlier_table(g, 3.0),
                                    summary)
    assert [c.agrees for c in checks[:2]] == [False, False]
    assert len(checks) == 4                    # no flip row without a 2-bit row
    assert checks[0].computed.startswith("0 of 2 K heads")


def test_grouped_axis_table_equal_span():
    x = np.ones((4, 2))
    x[:, 0] = [1.0, 2.0, 3.0, 4.0]
    table = realkv_exp.grouped_axis_table(x, x, [8], token_group=2)
    assert table.columns.tolist() == ["cache", "bits", "per_token", "per_channel_grouped", "winner"]
    with pytest.raises(ValueError, match="token_group"):
        realkv_exp.grouped_axis_table(x, x, [8], token_group=3)


@pytest.mark.parametrize("bad", [1.0, 0.5, float("nan"), "3", True])
def test_bad_threshold(bad):
    with pytest.raises(ValueError, match="threshold"):
        extracts.channel_outlier_table(np.ones((4, 4)), bad)


def test_bad_shapes():
    with pytest.raises(ValueError, match="'x'"):
        extracts.channel_rms(np.ones(4))
    with pytest.raises(ValueError, match="'x'"):
        extracts.token_norm_ratio(np.ones((1, 1, 1, 2, 2)))
    with pytest.raises(ValueError, match="'special'"):
        extracts.token_outlier_table(np.ones((4, 2)), 2.0, special=np.zeros(3, bool))


def _toy(tmp_path, name="kv.npz"):
    k = np.arange(2 * 3 * 4 * 2, dtype=np.float64).reshape(2, 3, 4, 2) / 8
    v = -k
    path = extracts.save_real_kv(tmp_path / name, k, v, [101, 7, 8, 102], ["[CLS]", "a", "b", "[SEP]"],
                               [0, 0, 0, 0], [True, False, False, True], {"model": "toy"})
    return k, v, path


def test_save_load_round_trip_and_bytes_are_reproducible(tmp_path):
    k, v, path = _toy(tmp_path)
    _, _, again = _toy(tmp_path, "again.npz")
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(again.read_bytes()).digest()
    kv = extracts.load_real_kv(path)
    np.testing.assert_array_equal(kv.k, k)
    np.testing.assert_array_equal(kv.v, v)
    assert kv.k.dtype == np.float64 and kv.shape == (2, 3, 4, 2)
    assert kv.tokens.tolist() == ["[CLS]", "a", "b", "[SEP]"]
    assert kv.meta == {"model": "toy"}
    text = extracts.without_special(kv)
    assert text.shape == (2, 3, 2, 2) and text.tokens.tolist() == ["a", "b"]
    top = extracts.top_outlier_tokens(kv, "V", 1.5, n=2)
    assert top.columns.tolist() == ["position", "token", "window", "special", "share", "median_ratio"]


def test_save_and_load_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="'k' and 'v'"):
        extracts.save_real_kv(tmp_path / "x.npz", np.ones((2, 2)), np.ones((2, 2)), [], [], [], [], {})
    with pytest.raises(ValueError, match="'token_ids'"):
        extracts.save_real_kv(tmp_path / "x.npz", np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)),
                            [1, 2], ["a", "b", "c"], [0, 0, 0], [False] * 3, {})
    with pytest.raises(ValueError, match="'path'"):
        extracts.load_real_kv(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="'cache'"):
        extracts.top_outlier_tokens(extracts.load_real_kv(_toy(tmp_path)[2]), "Q", 2.0)


def test_committed_real_kv():
    # the repository tracks no file over 4 MiB
    assert (repo_root() / "data" / "real_kv" / "minilm_l6_kv.npz").stat().st_size <= 4 * 2**20
    kv = extracts.load_real_kv()
    assert kv.shape == (6, 12, 448, 32)
    assert kv.v.shape == kv.k.shape
    # two windows of [CLS] + 222 word pieces + [SEP]
    assert np.flatnonzero(kv.special).tolist() == [0, 223, 224, 447]
    assert kv.tokens[:4].tolist() == ["[CLS]", "pride", "and", "prejudice"]
    assert kv.window.tolist() == [0] * 224 + [1] * 224
    assert kv.tokens[222:226].tolist() == ["##field", "[SEP]", "[CLS]", "is"]
    np.testing.assert_array_equal(kv.k.astype(np.float16).astype(np.float64), kv.k)
    assert kv.meta["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert kv.meta["window_tokens"] == 224 and kv.meta["windows"] == 2
    assert kv.meta["text_word_pieces_used"] == 444 and kv.meta["text_word_pieces_total"] == 4379
    assert kv.meta["text_sha256"] == hashlib.sha256(
        (repo_root() / "data" / "real_kv" / "pride_and_prejudice_ch1-3.txt").read_bytes()).hexdigest()
    assert isinstance(extracts.channel_outlier_table(kv.k, 3.0), pd.DataFrame)


def test_library_does_not_import_torch():
    code = "import sys, kvcost.inputs.extracts; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_write_npz_rewrites_the_committed_extracts_byte_for_byte(tmp_path):
    from kvcost import provenance
    from kvcost.inputs import extracts
    from kvcost.paths import repo_root

    for rel in ("data/real_kv/minilm_l6_kv.npz", "data/real_model/smollm2_kv.npz"):
        src = repo_root() / rel
        with np.load(src, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        out = extracts.write_npz(tmp_path / "sub" / src.name, arrays)
        assert provenance.sha256(out) == provenance.sha256(src), rel
