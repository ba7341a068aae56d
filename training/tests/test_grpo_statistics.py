"""An iteration's mean reward and its 95% interval: the t quantile held to the printed table
(NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2, the 0.975 column), intervals
worked by hand."""

from __future__ import annotations

import math

import pytest

from training.grpo_statistics import mean_interval, t_cdf, t_quantile

# Upper critical values of Student's t at 0.975, as the handbook's table prints them.
NIST_0975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    7: 2.365,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    50: 2.009,
    100: 1.984,
}


@pytest.mark.parametrize(("df", "printed"), sorted(NIST_0975.items()))
def test_the_quantile_is_the_tables(df, printed):
    assert round(t_quantile(0.975, df), 3) == printed


def test_the_cdf_at_zero_is_a_half_and_the_quantile_inverts_it():
    assert t_cdf(0.0, 7) == pytest.approx(0.5, abs=1e-15)
    # df = 1 is the Cauchy distribution: P(T <= 1) = 1/2 + atan(1)/pi = 3/4 exactly.
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    assert t_quantile(0.75, 1) == pytest.approx(1.0, abs=1e-9)
    # df = 2 has a closed form: t = (2p - 1) sqrt(2 / (1 - (2p - 1)^2)); p = 0.975 -> 4.3027.
    assert t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), abs=1e-9)
    assert t_cdf(-1.0, 1) == pytest.approx(0.25, abs=1e-12)


def test_a_mean_and_its_interval_by_hand():
    # 1, 2, 3, 4: mean 2.5, s^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, s / sqrt(4) =
    # sqrt(5/12) = 0.645497; t(0.975, 3) = 3.182446 -> half width 2.054260.
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert low == pytest.approx(0.445740, abs=1e-6)
    assert high == pytest.approx(4.554260, abs=1e-6)
    # 0 and 1: mean 0.5, s = sqrt(0.5) = 0.707107, s / sqrt(2) = 0.5; t(0.975, 1) =
    # 12.706205 -> half width 6.353102.
    mean, low, high = mean_interval([0.0, 1.0])
    assert (mean, low, high) == (
        0.5,
        pytest.approx(-5.853102, abs=1e-6),
        pytest.approx(6.853102, abs=1e-6),
    )


def test_equal_values_one_value_and_none():
    assert mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert mean_interval([3.5]) == (3.5, None, None)
    assert mean_interval([]) == (None, None, None)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)
