"""The mean of a GRPO iteration's episode rewards and its 95% interval (Student's t).

Django-free. The t quantile is computed, not looked up: the t distribution's CDF from the
regularized incomplete beta function (its continued fraction, as in Press et al., Numerical
Recipes, 3rd ed., section 6.4), inverted by bisection. The tests hold it to the printed
tables (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_EPSILON = 1e-15
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPSILON:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p, for 0.5 <= p < 1 (bisection to double precision)."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError("t_quantile: 0.5 <= p < 1 and df >= 1")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2.0


def mean_interval(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high): the 95% interval of the mean, mean +- t(0.975, n-1) s / sqrt(n).
    No interval for fewer than two values; no mean for none."""
    n = len(values)
    if n == 0:
        return None, None, None
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None, None
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(0.975, n - 1) * math.sqrt(variance / n)
    return mean, mean - half, mean + half
