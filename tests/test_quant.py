"""Tests for kvcost.quant: bit-exactness to the post, error bounds, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from kvcost import quant, synthetic


def post_quant(x, bits, axis):
    """The post's Block 2 quantizer, verbatim, as the reference."""
    qmax = 2 ** (bits - 1) - 1
    scale = np.abs(x).max(axis=axis, keepdims=True) / qmax
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(x / scale), -qmax, qmax) * scale


# ---------------------------------------------------------------- the post, bit for bit

@pytest.mark.parametrize("bits", [2, 3, 4, 8, 16])
def test_intk_symmetric_is_bit_identical_to_post(bits):
    rng = np.random.default_rng(bits)
    x = rng.normal(0, 1, (257, 64))
    x[:, ::16] *= 4.0
    np.testing.assert_array_equal(quant.intk_roundtrip(x, bits, "token"), post_quant(x, bits, 1))
    np.testing.assert_array_equal(quant.intk_roundtrip(x, bits, "channel"), post_quant(x, bits, 0))


def test_axis_table_reproduces_post_printed_digits():
    k, v = synthetic.post_axis_cache(np.random.default_rng(7), 4096, 128)
    df = quant.axis_table(k, v, [8, 4, 2])
    assert list(df.columns) == ["cache", "bits", "per_token", "per_channel", "winner"]
    printed = [("K", 8, "1.212e-02", "8.506e-03", "per-channel"),
               ("K", 4, "2.199e-01", "1.542e-01", "per-channel"),
               ("K", 2, "7.749e-01", "9.020e-01", "per-token"),
               ("V", 8, "6.458e-03", "2.876e-02", "per-token"),
               ("V", 4, "1.175e-01", "5.104e-01", "per-token"),
               ("V", 2, "7.642e-01", "9.078e-01", "per-token")]
    for row, (c, b, pt, pc, w) in zip(df.itertuples(), printed):
        assert (row.cache, row.bits, row.winner) == (c, b, w)
        assert f"{row.per_token:.3e}" == pt
        assert f"{row.per_channel:.3e}" == pc


@pytest.mark.parametrize("bits", [1, 17])
def test_axis_table_bad_bits(bits):
    k = np.ones((4, 4))
    with pytest.raises(ValueError, match="'bits'"):
        quant.axis_table(k, k, [bits])
