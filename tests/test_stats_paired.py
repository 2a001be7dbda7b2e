"""stats.paired_binary / paired_losses / detectable_loss: paired passkey comparisons held to cases worked by hand."""
import pytest

from kvcost import stats


def test_paired_binary_counts_the_discordant_trials():
    ref = [1, 1, 1, 1, 0, 0, 1, 1]
    mine = [1, 0, 0, 1, 1, 0, 1, 0]
    one = stats.paired_binary(mine, ref)
    assert (one["trials"], one["successes"], one["ref_successes"], one["lost"], one["gained"]) == (8, 4, 6, 3, 1)
    assert one["p_value"] == pytest.approx(2 * (1 + 4) / 16)          # 2·P(X <= 1), X ~ Bin(4, 1/2)
    assert (one["lo"], one["hi"]) == stats.wilson(4, 8)
    with pytest.raises(ValueError, match="'mine' and 'ref'"):
        stats.paired_binary([1, 0], [1])


def test_paired_losses_need_significance_and_direction():
    # 7 lost of 7 discordant: p = 2·2^-7 = 0.0156 < 0.05 alone; 7 gained is rejected but is no loss;
    # 1 lost can never reach significance (Tarone: it does not enlarge the family)
    assert stats.paired_losses([7], [0]) == [True]
    assert stats.paired_losses([0], [7]) == [False]
    assert stats.paired_losses([7, 1], [0, 0]) == [True, False]
    # two rows that could both reach 0.05: 7/0 (p 0.0156) needs p <= 0.025 and passes; 6/0 (p 0.031) then needs 0.05
    assert stats.paired_losses([7, 6], [0, 0]) == [True, True]
    # 5/0 (p 0.0625) is never significant, so the 6/0 row beside it stands alone
    assert stats.paired_losses([6, 5], [0, 0]) == [True, False]
    with pytest.raises(ValueError, match="'lost' and 'gained'"):
        stats.paired_losses([1, 2], [0])


def test_detectable_loss_grows_with_the_family():
    assert stats.detectable_loss(20, [0] * 12) == 6            # 2·2^-6 = 0.031 < 0.05
    assert stats.detectable_loss(20, [9] * 12) == 9            # 12 rows that could: 2·2^-9 < 0.05/12 < 2·2^-8
    assert stats.detectable_loss(5, [0]) is None               # the reference retrieved 5: no loss of 6 exists


def test_paired_shift_is_the_mean_difference_with_an_interval_that_covers_a_known_shift():
    import numpy as np

    ref = np.random.default_rng(1).normal(0.0, 1.0, 40)
    one = stats.paired_shift(ref - 0.3, ref)                 # every trial moved by exactly -0.3
    assert one["shift"] == pytest.approx(-0.3) and one["shift_lo"] == pytest.approx(-0.3)
    assert one["shift_hi"] == pytest.approx(-0.3)
    noisy = ref - 0.3 + np.random.default_rng(2).normal(0.0, 0.2, 40)
    t = stats.paired_shift(noisy, ref)
    assert t["shift_lo"] < -0.3 < t["shift_hi"] < 0 and t == stats.paired_shift(noisy, ref)   # seeded
    none = stats.paired_shift(ref + np.random.default_rng(3).normal(0.0, 0.2, 40), ref)
    assert none["shift_lo"] < 0 < none["shift_hi"]
    with pytest.raises(ValueError, match="'mine' and 'ref'"):
        stats.paired_shift([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        stats.paired_shift([float("nan")], [1.0])


def test_t95_reads_the_table_conservatively():
    assert stats.t95(1) == pytest.approx(12.706, abs=1e-3) and stats.t95(3) == pytest.approx(3.182, abs=1e-3)
    assert stats.t95(3.7) == stats.t95(3) and stats.t95(500) == stats.t95(30) > 1.96
    for bad in (0, 0.5, float("nan"), "3", True):
        with pytest.raises(ValueError, match="'df'"):
            stats.t95(bad)
