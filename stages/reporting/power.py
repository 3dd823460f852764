"""Statistical power of the paired comparison over seeds: what the seeds could have detected.

"Not significant" over three seeds says little: the difference may be absent, or the seeds too
few to see it. For n paired seeds whose differences have the standard deviation s (ddof 1), the
paired t-test at level alpha (two-sided) detects a true mean difference delta with probability

    power = P(|T| > t_crit),  T ~ noncentral t(df = n - 1, nc = delta / s * sqrt(n))

(``scipy.stats.nct``; the power of the one-sample t-test on the differences, as statsmodels'
``TTestPower`` and G*Power compute it). The report gives two numbers from it: the smallest
difference the run seeds detect with power 0.8 (``detectable_difference``) and the number of
seeds that would detect a difference of ``report.min_effect`` (``seeds_needed``), both from the
observed s: an estimate from few seeds, itself uncertain.

The Wilcoxon signed-rank test has no closed-form power. The approximation used here: the t-test
power above with n * 3/pi pairs (the signed-rank test's asymptotic relative efficiency against
the t-test under normal differences; Lehmann, Nonparametrics, 1975) at the largest level the
exact test can attain at or below alpha (``wilcoxon_level``: scipy's test is exact up to
``EXACT_WILCOXON_PAIRS`` pairs, and its p-values are discrete: at 6 pairs the two-sided level
is 0.031, at 5 none reaches 0.05). Simulated under normal differences, the exact test's power
at the difference this approximation calls detectable is 0.75 at 6 pairs and 0.80-0.81 from 7
to 30 (``tests/report/test_power.py``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, stats

from stages.reporting.significance import Test

ALPHA = 0.05
POWER = 0.8
# Lehmann's asymptotic relative efficiency of the signed-rank test to the t-test (normal data).
WILCOXON_EFFICIENCY = 3 / math.pi
# scipy.stats.wilcoxon's method='auto' computes the exact p-value up to this many pairs.
EXACT_WILCOXON_PAIRS = 50
# Beyond this many seeds the answer is "more than anyone runs".
MAX_SEEDS = 10_000


def t_power(effect: float, n: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample (paired) t-test for a standardised effect
    ``effect`` = delta / s with ``n`` pairs (n may be fractional: an effective sample size)."""
    df = n - 1
    critical = float(stats.t.ppf(1 - alpha / 2, df))
    noncentrality = effect * math.sqrt(n)
    # The lower tail P(T < -t_crit) as the upper tail of -T: scipy's nct.cdf returns NaN far in
    # the lower tail (df 1, noncentrality 8), its sf does not.
    return float(
        stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality)
    )


@functools.cache
def wilcoxon_level(n: int, alpha: float = ALPHA) -> float:
    """The largest two-sided level at or below ``alpha`` that the exact signed-rank test with
    ``n`` pairs attains (0: none), or ``alpha`` beyond ``EXACT_WILCOXON_PAIRS`` (scipy's normal
    approximation there)."""
    if n > EXACT_WILCOXON_PAIRS:
        return alpha
    # The null distribution of the positive-rank sum: each rank 1..n in or out, equally likely.
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    levels = 2 * np.cumsum(counts) / counts.sum()
    attained = levels[levels <= alpha * (1 + 1e-12)]
    return float(attained.max()) if attained.size else 0.0


def exact_wilcoxon_floor(alpha: float = ALPHA) -> int:
    """The fewest pairs whose exact two-sided signed-rank p-value can reach ``alpha``: the
    smallest p with n pairs is 2 / 2^n (every difference of one sign)."""
    n = 1
    while 2.0 ** (1 - n) > alpha:
        n += 1
    return n


def _power(effect: float, n: int, test: Test, alpha: float) -> float:
    if test == "wilcoxon":
        level = wilcoxon_level(n, alpha)
        return t_power(effect, n * WILCOXON_EFFICIENCY, level) if level > 0 else 0.0
    return t_power(effect, n, alpha)


def detectable_effect(n: int, test: Test = "paired_t", alpha: float = ALPHA) -> float:
    """The smallest standardised effect delta / s that ``n`` pairs detect with power
    ``POWER``; infinite where the test cannot reject at all (exact Wilcoxon, too few pairs)."""
    if n < 2 or (test == "wilcoxon" and wilcoxon_level(n, alpha) == 0):
        return math.inf
    upper = 1.0
    while _power(upper, n, test, alpha) < POWER:
        upper *= 2
    return float(
        optimize.brentq(lambda d: _power(d, n, test, alpha) - POWER, 0.0, upper, xtol=1e-10)
    )


def detectable_difference(
    sd: float | None, n: int, test: Test = "paired_t", alpha: float = ALPHA
) -> float | None:
    """The smallest true mean difference (in the measure's points) that ``n`` pairs whose
    differences have standard deviation ``sd`` detect with power ``POWER``; None without an
    sd (fewer than two pairs)."""
    if sd is None or not math.isfinite(sd):
        return None
    effect = detectable_effect(n, test, alpha)
    if math.isinf(effect):
        return math.inf
    return effect * sd


def seeds_needed(
    min_effect: float, sd: float | None, test: Test = "paired_t", alpha: float = ALPHA
) -> int | None:
    """The fewest paired seeds that detect a true difference of ``min_effect`` with power
    ``POWER``, given the observed sd of the differences; None without an sd or beyond
    ``MAX_SEEDS``."""
    if sd is None or not math.isfinite(sd):
        return None
    floor = exact_wilcoxon_floor(alpha) if test == "wilcoxon" else 2
    if sd == 0:
        return floor  # identical differences on every seed: any shift is seen at once
    effect = min_effect / sd

    def enough(n: int) -> bool:
        return _power(effect, n, test, alpha) >= POWER

    # The exact Wilcoxon test's attainable level jumps with n, so its power is not monotone
    # there: scan those n one by one; beyond, power grows with n: bisect.
    first_monotone = EXACT_WILCOXON_PAIRS + 1 if test == "wilcoxon" else floor
    for n in range(floor, first_monotone):
        if enough(n):
            return n
    if not enough(MAX_SEEDS):
        return None
    low, high = first_monotone, MAX_SEEDS
    if enough(low):
        return low
    while high - low > 1:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high
