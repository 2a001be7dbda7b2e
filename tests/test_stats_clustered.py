"""stats.clustered_rate: a pooled rate whose interval respects clustering, held to known cases."""
import numpy as np
import pytest

from kvcost import stats


def test_clusters_at_zero_and_one_count_as_one_trial_each():
    # 20 clusters of 20 trials, half at 0%, half at 100%: the information is in the 20 clusters
    ks, ns = [0, 20] * 10, [20] * 20
    p, lo, hi, n_eff = stats.clustered_rate(ks, ns)
    assert p == 0.5 and n_eff == pytest.approx(19, rel=1e-12)      # m - 1
    k = 0.5 * n_eff
    assert (lo, hi) == pytest.approx(stats._wilson_real(k, n_eff, stats.Z95))
    assert hi - lo > 0.4                                # the plain Wilson interval on 400 trials is 0.1 wide
    wlo, whi = stats.wilson(200, 400)
    assert whi - wlo < 0.1


def test_homogeneous_clusters_give_the_pooled_wilson_interval():
    # every cluster at the same rate: no spread beyond the binomial, deff = 1
    _p, lo, hi, n_eff = stats.clustered_rate([5, 5, 5, 5], [10, 10, 10, 10])
    assert n_eff == 40 and (lo, hi) == pytest.approx(stats.wilson(20, 40))


def test_all_agree_is_taken_at_one_trial_per_cluster():
    p, lo, hi, n_eff = stats.clustered_rate([20, 20, 20], [20, 20, 20])
    assert (p, hi, n_eff) == (1.0, 1.0, 3.0) and lo == pytest.approx(stats.wilson(3, 3)[0])
    assert stats.clustered_rate([0, 0], [5, 5])[1:3] == (0.0, pytest.approx(stats.wilson(0, 2)[1]))


def test_coverage_on_a_beta_binomial_where_plain_wilson_fails():
    # 30 clusters x 20 trials, cluster rates Beta(a, b) with mean 0.7 and ICC 0.3: the clustered interval
    # covers the true mean about 95% of the time, plain Wilson on the pooled count far less
    rng = np.random.default_rng(0)
    icc, mean = 0.3, 0.7
    s = 1 / icc - 1
    hit_c = hit_w = 0
    reps = 400
    for _ in range(reps):
        rates = rng.beta(mean * s, (1 - mean) * s, 30)
        ks = rng.binomial(20, rates)
        _, lo, hi, _ = stats.clustered_rate(ks.tolist(), [20] * 30)
        wlo, whi = stats.wilson(int(ks.sum()), 600)
        hit_c += lo <= mean <= hi
        hit_w += wlo <= mean <= whi
    assert 0.90 <= hit_c / reps <= 0.99
    assert hit_w / reps < 0.6


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="'trials'"):
        stats.clustered_rate([1], [2])
    with pytest.raises(ValueError, match="'successes'"):
        stats.clustered_rate([3, 1], [2, 2])
    with pytest.raises(ValueError, match="one entry per cluster"):
        stats.clustered_rate([1, 1], [2])
    assert stats.clustered_rate_text([0, 20] * 2, [20] * 4, "heads").startswith("40/80 = 50% [")
