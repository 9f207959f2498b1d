"""Small-sample statistics for comparison reports: intervals, pass^k, paired tests, Holm.

Every function takes plain counts and returns plain floats, so reports, ``harness compare``
and notebooks share one definition of each number. Sources:

* Wilson score interval: E. B. Wilson (1927), "Probable inference, the law of succession,
  and statistical inference", JASA 22(158):209-212.
* pass^k: S. Yao, N. Shinn, P. Razavi, K. Narasimhan (2024), "tau-bench: A Benchmark for
  Tool-Agent-User Interaction in Real-World Domains", arXiv:2406.12045, section 5.
* Exact McNemar mid-p test: M. W. Fagerland, S. Lydersen, P. Laake (2013), "The McNemar test
  for binary matched-pairs data: mid-p and asymptotic are better than exact conditional",
  BMC Medical Research Methodology 13:91.
* Paired difference interval: R. G. Newcombe (1998), "Improved confidence intervals for the
  difference between binomial proportions based on paired data", Statistics in Medicine
  17:2635-2650, method 10, as stated in M. W. Fagerland, S. Lydersen, P. Laake (2014),
  "Recommended tests and confidence intervals for paired binomial proportions", Statistics
  in Medicine 33:2850-2875, section 5.
* Paired difference score interval: T. Tango (1998), "Equivalence test and confidence interval for the
  difference in proportions for the paired-sample design", Statistics in Medicine 17:891-908, as stated in
  Fagerland, Lydersen, Laake (2014), section 4; it inverts the score test, which for a difference of 0 is
  McNemar's asymptotic test, so the interval excludes 0 exactly when that test rejects.
* Holm's step-down adjustment: S. Holm (1979), "A simple sequentially rejective multiple test
  procedure", Scandinavian Journal of Statistics 6(2):65-70.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["holm", "mcnemar_midp", "newcombe_paired_diff", "pass_hat_k", "tango_paired_diff", "wilson_interval"]

_Z95 = 1.959963984540054  # standard normal 97.5% quantile


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if confidence == 0.95:
        return _Z95
    from scipy import stats  # imported when used: a second of start-up every report would pay

    return float(stats.norm.ppf(0.5 + confidence / 2))


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927).

    Closed form, with ``p = successes / n`` and ``z`` the normal quantile::

        (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)

    Args:
        successes: count in ``[0, n]``.
        n: trials, at least 1.
        confidence: two-sided coverage in (0, 1).

    Returns:
        ``(low, high)``, rates in [0, 1]; ``(0, high)`` at 0 successes and ``(low, 1)`` at n.

    Raises:
        ValueError: ``n < 1`` or ``successes`` outside ``[0, n]``.
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes}/{n}")
    z = _z(confidence)
    p = successes / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    low = 0.0 if successes == 0 else (centre - half) / denominator
    high = 1.0 if successes == n else (centre + half) / denominator
    return max(0.0, low), min(1.0, high)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Chance that k independent trials of one task all pass, estimated from c passes in n trials.

    tau-bench's unbiased estimator (Yao et al. 2024): ``C(c, k) / C(n, k)``. A benchmark's
    pass^k is the mean of this over its tasks. ``pass_hat_k(n, c, 1) == c / n``.

    Args:
        n: scored trials of the task.
        c: passes among them, in ``[0, n]``.
        k: trials that must all pass, in ``[1, n]``.

    Returns:
        The estimate, a rate in [0, 1].

    Raises:
        ValueError: ``k`` outside ``[1, n]`` or ``c`` outside ``[0, n]``.
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return math.comb(c, k) / math.comb(n, k)


def mcnemar_midp(b: int, c: int) -> float:
    """Exact McNemar mid-p value for paired binary data (Fagerland, Lydersen, Laake 2013).

    Under the null, the ``b + c`` discordant pairs split as Binomial(b + c, 1/2). With
    ``m = min(b, c)``: ``mid-p = 2·P(X <= m) - P(X = m)``, i.e. the exact two-sided p-value
    minus the probability of the observed split.

    Args:
        b: pairs where the first member succeeded and the second failed.
        c: pairs where the first failed and the second succeeded.

    Returns:
        The mid-p value in [0, 1]; 1.0 when there are no discordant pairs.
    """
    n = b + c
    if n == 0:
        return 1.0
    m = min(b, c)
    from scipy import stats

    midp = 2 * stats.binom.cdf(m, n, 0.5) - stats.binom.pmf(m, n, 0.5)
    return float(min(1.0, max(0.0, midp)))


def newcombe_paired_diff(a: int, b: int, c: int, d: int, *, confidence: float = 0.95) -> tuple[float, float, float]:
    """Difference of two paired proportions with Newcombe's hybrid score interval (method 10).

    The 2×2 table of pairs: ``a`` both succeed, ``b`` only the first, ``c`` only the second,
    ``d`` neither; ``n = a + b + c + d``. The difference is ``p1 - p2 = (b - c) / n``. With
    Wilson intervals ``(l1, u1)`` for ``p1 = (a + b) / n`` and ``(l2, u2)`` for
    ``p2 = (a + c) / n``, and ``phi = A / sqrt((a+b)(c+d)(a+c)(b+d))`` (0 when a margin is empty) with
    ``A = ad - bc - n/2`` when ``ad - bc > n/2``, 0 when ``0 <= ad - bc <= n/2``, else ``ad - bc``::

        low  = diff - sqrt((p1-l1)² - 2·phi·(p1-l1)(u2-p2) + (u2-p2)²)
        high = diff + sqrt((u1-p1)² - 2·phi·(u1-p1)(p2-l2) + (p2-l2)²)

    (Newcombe 1998; Fagerland, Lydersen, Laake 2014.)

    Args:
        a, b, c, d: pair counts, each >= 0, summing to at least 1.
        confidence: two-sided coverage in (0, 1).

    Returns:
        ``(diff, low, high)``, all in [-1, 1].

    Raises:
        ValueError: a negative count or no pairs.
    """
    _check_pairs(a, b, c, d)
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, confidence=confidence)
    l2, u2 = wilson_interval(a + c, n, confidence=confidence)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross: float = a * d - b * c  # Newcombe's continuity-corrected correlation: ad - bc shrunk by n/2 towards 0 when positive
    cross = cross - n / 2 if cross > n / 2 else 0.0 if cross >= 0 else cross
    phi = 0.0 if margins == 0 else cross / math.sqrt(margins)
    diff = p1 - p2
    low = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = diff + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return diff, max(-1.0, low), min(1.0, high)


def _check_pairs(a: int, b: int, c: int, d: int) -> None:
    """Raise ``ValueError`` unless the 2×2 table of pairs has non-negative counts and at least one pair."""
    if min(a, b, c, d) < 0 or a + b + c + d == 0:
        raise ValueError(f"need non-negative counts and at least one pair, got {(a, b, c, d)}")


def _tango_score(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic for ``H0: p1 - p2 = delta`` (Tango 1998, equation 3): decreasing in ``delta``."""
    big_a = 2 * n
    big_b = -b - c + (2 * n - b + c) * delta
    big_c = -c * delta * (1 - delta)
    p21 = (-big_b + math.sqrt(max(0.0, big_b * big_b - 4 * big_a * big_c))) / (2 * big_a)  # constrained MLE of p21
    variance, score = n * (2 * p21 + delta * (1 - delta)), b - c - n * delta
    if variance > 0:
        return score / math.sqrt(variance)
    return 0.0 if score == 0 else math.copysign(math.inf, score)


def tango_paired_diff(a: int, b: int, c: int, d: int, *, confidence: float = 0.95) -> tuple[float, float, float]:
    """Difference of two paired proportions with Tango's asymptotic score interval (Tango 1998).

    The 2×2 table of pairs as in :func:`newcombe_paired_diff`; ``diff = (b - c) / n``. With ``p21`` the maximum
    likelihood estimate of the "only the second" cell under ``H0: p1 - p2 = delta`` (a quadratic's root), the score
    statistic is::

        T(delta) = (b - c - n·delta) / sqrt(n·(2·p21 + delta·(1 - delta)))

    and the interval is every ``delta`` with ``|T(delta)| <= z`` (found by root finding; Fagerland, Lydersen, Laake
    2014, section 4). ``T(0) = (b - c) / sqrt(b + c)`` is McNemar's asymptotic statistic, so the interval holds 0
    exactly when McNemar's asymptotic test does not reject; it is never of zero width while ``n >= 1``.

    Args:
        a, b, c, d: pair counts, each >= 0, summing to at least 1.
        confidence: two-sided coverage in (0, 1).

    Returns:
        ``(diff, low, high)``, all in [-1, 1].

    Raises:
        ValueError: a negative count or no pairs.
    """
    _check_pairs(a, b, c, d)
    from scipy.optimize import brentq

    n, z = a + b + c + d, _z(confidence)
    diff = (b - c) / n
    edge = 1e-12
    low = -1.0 if diff <= -1 else brentq(lambda x: _tango_score(b, c, n, x) - z, -1 + edge, diff, xtol=1e-12)
    high = 1.0 if diff >= 1 else brentq(lambda x: _tango_score(b, c, n, x) + z, diff, 1 - edge, xtol=1e-12)
    return diff, max(-1.0, float(low)), min(1.0, float(high))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order.

    Sort ascending; the i-th smallest (from 0) becomes ``max over j <= i of min(1, (m - j)·p_(j))``.
    Rejecting where the adjusted value is <= alpha controls the family-wise error rate at alpha.

    Args:
        pvalues: m raw p-values in [0, 1].

    Returns:
        m adjusted p-values in [0, 1], same order as given.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i], i))
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
