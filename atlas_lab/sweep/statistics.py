"""The statistics of a study's paired comparisons (docs/platform.md, "Reading a study").

A point is compared with the baseline seed by seed: d_r = v_r(point) − v_r(baseline), r = 1..n.

    precision       a stored value v carries its storage's rounding, at most ε|v| (ε = 2⁻²⁴ where every value is a
                    float32, as Lightning logs metrics; 2⁻⁵³ for float64), so d_r = a_r − b_r carries at most
                    ε(|a_r| + |b_r|) plus float64's own subtraction error (``rounding``). The d_r have no spread where
                    max(d) − min(d) is within twice the largest such error: one value up to rounding
    paired t        t = mean(d) / (s/√n), two-sided p from Student's t with n − 1 degrees of freedom; none where
                    the d_r have no spread (their s is rounding, t is 0/0 or a rounding error's ∞: no evidence)
    equivalence     two one-sided t tests (TOST) of |mean(d)| ≥ margin: p = max(P(T ≥ (mean + margin)/(s/√n)),
                    P(T ≤ (mean − margin)/(s/√n))); below a level a it says the (1 − 2a) interval lies within ±margin
    sign flip       the exact permutation test of mean(d) = 0: every sign pattern of the d_r (2ⁿ of them, or
                    FLIPS random ones beyond n = 16), two-sided; no normality assumed (bounded, skewed accuracies).
                    Its smallest reachable p is 2/2ⁿ (0.0625 at 5 pairs): below 6 pairs it cannot reach 0.05
    bootstrap       the percentile interval of mean(d): exact, over all nⁿ resamples of the pairs, where there are
                    at most EXACT_RESAMPLES (n ≤ 6); else over DRAWS random ones (fixed seed), with the Monte-Carlo
                    standard error of its ends. Percentiles are the inverted distribution function (the smallest
                    resampled mean whose share at or below it reaches the level)
    Holm            across a study's m comparisons with a p (a missing or NaN p is left out of the family, as if the
                    comparison were absent): p_(i) sorted, adjusted p_(i) = max_{j≤i} min(1, (m − j + 1) p_(j)); a
                    comparison is resolved where its adjusted p < α, the family-wise error rate held at α
    Fisher          escape counts (seeds that reached a threshold) of two points, k_a of n_a and k_b of n_b: the
                    two-sided exact test of equal rates, summing the hypergeometric probabilities of the 2×2 tables
                    with the same margins that are no more likely than the observed one
    Gehan           steps to a threshold, right-censored where never reached (the steps trained): the generalised
                    Wilcoxon statistic U = Σ_{i∈a, j∈b} u_ij, u_ij = +1 where i surely reached it before j, −1 where
                    surely after, 0 where censoring leaves it open; two-sided p from the exact permutation
                    distribution of U over every split of the pooled runs (SPLITS random splits beyond EXACT_SPLITS)
    power           the seeds a paired t test needs to detect a mean difference δ at α with power 1 − β, for the
                    observed sd of the d_r: the smallest n with P(|T_{n−1}(δ√n/sd)| > t_{1−α/2, n−1}) ≥ 1 − β
                    (T noncentral t). A verdict by Holm's method uses α/(m − i + 1) at the comparison's rank i of m
                    (``holm_level``): power is stated at that level, not at α. The TOST's power at a true difference
                    δ (0: the points equal): with u = s/σ, (n − 1)u² ~ χ²_{n−1}, E_u[max(0, Φ(√n(margin − δ)/σ −
                    t_c u) − Φ(−√n(margin + δ)/σ + t_c u))], t_c = t_{1−a, n−1} (exact, by quadrature)
    bounds          a t interval of a bounded metric (an accuracy in [0, 1]) is cut to the metric's range: the
                    parameter lies in it, so the cut interval covers as often as the uncut one
    too few         a comparison on fewer than MIN_PAIRS pairs is never resolved, whatever its p
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

ALPHA = 0.05
POWER = 0.8
DRAWS = 20_000  # bootstrap resamples where the exact enumeration is too large
EXACT_RESAMPLES = 100_000  # the bootstrap enumerates every resample up to this many (nⁿ: 3,125 at 5 pairs)
MIN_PAIRS = 3  # fewer pairs: "too few seeds", never a verdict
FLIPS = 20_000  # random sign patterns beyond EXACT pairs
EXACT = 16
EXACT_SPLITS = 200_000  # Gehan: every split up to this many
SPLITS = 20_000


FLOAT32_EPS = 2.0 ** -24  # a float32's rounding, relative (half its ulp): how Lightning logs a metric
FLOAT64_EPS = 2.0 ** -53


def storage_eps(values: list[float]) -> float:
    """The relative rounding of stored values: FLOAT32_EPS where every one is a float32 (it survives the round trip),
    else FLOAT64_EPS."""
    x = np.asarray(values, dtype=float)
    return FLOAT32_EPS if np.array_equal(x.astype(np.float32).astype(float), x) else FLOAT64_EPS


def rounding(a: list[float], b: list[float]) -> float:
    """The largest rounding error of a paired difference a_r − b_r of stored values: ε(|a_r| + |b_r|) from storage
    (``storage_eps``) and 2⁻⁵³ of it again from float64's subtraction; 0 without pairs."""
    if not len(a):
        return 0.0
    scale = float(np.max(np.abs(np.asarray(a, dtype=float)) + np.abs(np.asarray(b, dtype=float))))
    return (storage_eps(list(a) + list(b)) + FLOAT64_EPS) * scale


def no_spread(d: list[float], error: float = 0.0) -> bool:
    """Whether the d_r are one value up to rounding: max(d) − min(d) ≤ 2 · ``error`` (each d_r's largest rounding
    error, ``rounding``), and never more than float64's own (2⁻⁵⁰ of the largest |d_r|, where ``error`` is 0)."""
    x = np.asarray(d, dtype=float)
    if len(x) < 2:
        return True
    return float(x.max() - x.min()) <= max(2 * error, 2.0 ** -50 * float(np.max(np.abs(x))))


def paired_t_p(d: list[float], error: float = 0.0) -> float | None:
    """Two-sided p of the paired t test of mean(d) = 0; None below two pairs or where the d_r have no spread
    (``no_spread`` at their rounding ``error``: identical differences are no evidence, t is undefined)."""
    from scipy.stats import t

    n = len(d)
    if n < 2 or no_spread(d, error):
        return None
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def equivalence_p(d: list[float], margin: float, error: float = 0.0) -> float | None:
    """p of the two one-sided t tests that mean(d) ≤ −margin and mean(d) ≥ margin (the larger of the two): below a
    level a, the (1 − 2a) t interval of mean(d) lies within ±margin. None below two pairs or without spread."""
    from scipy.stats import t

    n = len(d)
    if n < 2 or no_spread(d, error):
        return None
    mean, se = float(np.mean(d)), float(np.std(d, ddof=1)) / math.sqrt(n)
    return float(max(t.sf((mean + margin) / se, n - 1), t.cdf((mean - margin) / se, n - 1)))


def metric_bounds(metric: str) -> tuple[float, float]:
    """The range a metric's values lie in: [0, 1] for an accuracy (a name with "acc"), [0, ∞) for a loss or a
    perplexity, else unbounded."""
    name = metric.lower()
    if "acc" in name:
        return 0.0, 1.0
    if "loss" in name or "ppl" in name or "perplexity" in name:
        return 0.0, math.inf
    return -math.inf, math.inf


def difference_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """The range of a difference of two values in ``bounds``: [lo − hi, hi − lo]."""
    low, high = bounds
    return low - high, high - low


def sign_flip_p(d: list[float], seed: int = 0) -> float | None:
    """Two-sided p of the sign-flip permutation test of mean(d) = 0: the share of sign patterns whose |mean| is at
    least the observed one (exact up to EXACT pairs). None below two pairs."""
    n = len(d)
    if n < 2:
        return None
    x = np.abs(np.asarray(d, dtype=float))
    observed = abs(float(np.sum(d))) - 1e-12 * max(1.0, float(x.sum()))  # ties count as at least as extreme
    if n <= EXACT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(FLIPS, n))
    return float(np.mean(np.abs(signs @ x) >= observed))


def min_sign_flip_p(n: int) -> float | None:
    """The smallest p the exact sign-flip test can reach with n pairs: 2/2ⁿ (every d_r on one side); None below 2."""
    return None if n < 2 else 2.0 / 2 ** n


class Bootstrap(NamedTuple):
    """A percentile bootstrap interval: its ends, the resamples it used, whether they were every resample (exact),
    and the Monte-Carlo standard error of its ends (0 where exact)."""
    low: float
    high: float
    resamples: int
    exact: bool
    mc_error: float


def bootstrap_interval(d: list[float], level: float = 0.95, seed: int = 0) -> Bootstrap | None:
    """The percentile bootstrap interval of mean(d), exact over all nⁿ resamples up to EXACT_RESAMPLES, else over
    DRAWS random ones with the Monte-Carlo standard error of its ends (the larger of the two, from the order
    statistics one binomial sd either side of each end's rank); None below two pairs."""
    n = len(d)
    if n < 2:
        return None
    x = np.asarray(d, dtype=float)
    q = np.array([(1 - level) / 2, (1 + level) / 2])
    if n ** n <= EXACT_RESAMPLES:
        means = np.sort(x[np.indices((n,) * n).reshape(n, -1).T].mean(1))
        low, high = means[np.ceil(q * len(means) - 1e-9).astype(int) - 1]
        return Bootstrap(float(low), float(high), len(means), True, 0.0)
    means = np.sort(x[np.random.default_rng(seed).integers(0, n, size=(DRAWS, n))].mean(1))
    low, high = means[np.ceil(q * DRAWS - 1e-9).astype(int) - 1]
    band = np.sqrt(DRAWS * q * (1 - q))  # the rank's binomial sd
    below = np.clip(np.floor(q * DRAWS - band).astype(int) - 1, 0, DRAWS - 1)
    above = np.clip(np.ceil(q * DRAWS + band).astype(int) - 1, 0, DRAWS - 1)
    return Bootstrap(float(low), float(high), DRAWS, False, float(np.max((means[above] - means[below]) / 2)))


def _known(v: float | None) -> bool:
    return v is not None and not math.isnan(v)


def holm(p: list[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the order given; a None or NaN p has none (None) and is not counted: the others
    are adjusted as if its comparison were absent."""
    known = sorted((v, i) for i, v in enumerate(p) if _known(v))
    m, out, running = len(known), [None] * len(p), 0.0
    for rank, (v, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def holm_level(rank: int, m: int, alpha: float = ALPHA) -> float:
    """The level Holm's method holds the comparison of p-rank ``rank`` (1: the smallest p) of ``m`` to:
    α/(m − rank + 1)."""
    return alpha / (m - rank + 1)


def holm_ranks(p: list[float | None]) -> list[int | None]:
    """Each p's rank among the known ones (1: the smallest; ties in the order given); None or NaN: None."""
    order = sorted((v, i) for i, v in enumerate(p) if _known(v))
    out: list[int | None] = [None] * len(p)
    for rank, (_, i) in enumerate(order, 1):
        out[i] = rank
    return out


def paired_power(n: int, delta: float, sd: float, alpha: float = ALPHA) -> float | None:
    """Power of the two-sided paired t test at alpha with n pairs, for a true mean difference delta and sd; None
    without a spread (sd 0 or None: the t test is undefined)."""
    from scipy.stats import nct, t

    if not sd:
        return None
    if n < 2:
        return 0.0
    crit = float(t.ppf(1 - alpha / 2, n - 1))
    shift = abs(delta) * math.sqrt(n) / sd
    # P(T < −crit) for T ~ nct(shift) is P(T > crit) for nct(−shift): scipy's cdf returns NaN deep in the lower tail
    # (e.g. crit 4.6, 4 degrees of freedom, shift 7.5), its sf does not
    return float(nct.sf(crit, n - 1, shift) + nct.sf(crit, n - 1, -shift))


def equivalence_power(n: int, margin: float, sd: float, alpha: float = ALPHA, delta: float = 0.0) -> float | None:
    """Power of the TOST at level alpha with n pairs to show |mean| < margin where the true difference is delta, for
    the paired differences' sd (exact: the normal mean's probability averaged over the sd's χ distribution); None
    without a spread."""
    from scipy.integrate import quad
    from scipy.stats import chi2, norm, t

    if not sd:
        return None
    if n < 2:
        return 0.0
    crit, root = float(t.ppf(1 - alpha, n - 1)), math.sqrt(n)
    upper, lower = root * (margin - delta) / sd, root * (margin + delta) / sd  # the z of each bound

    def inside(x: float) -> float:  # P(the TOST rejects | (n − 1)u² = x)
        u = math.sqrt(x / (n - 1))
        return max(0.0, float(norm.cdf(upper - crit * u) - norm.cdf(-lower + crit * u))) * float(chi2.pdf(x, n - 1))

    reach = (n - 1) * ((upper + lower) / (2 * crit)) ** 2  # beyond it the interval is wider than ±margin: 0
    return float(min(1.0, quad(inside, 0.0, reach, limit=200, epsabs=1e-10)[0]))


def _fewest(power_at, power: float, most: int) -> int | None:
    """The fewest pairs (≥ 2) whose ``power_at(n)`` reaches ``power`` (power grows with n: doubling, then
    bisection); None where it takes more than ``most``."""
    low, high = 1, 2  # power(low) < power ≤ power(high) once found
    while power_at(high) < power:
        low, high = high, 2 * high
        if high > 2 * most:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power_at(mid) >= power else (mid, high)
    return high if high <= most else None


def seeds_for_power(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER,
                    most: int = 100_000) -> int | None:
    """The fewest pairs (≥ 2) whose paired t test reaches ``power`` for ``delta`` at ``sd``; None where it takes
    more than ``most`` or without a spread."""
    if not delta or not sd:
        return None
    return _fewest(lambda n: paired_power(n, delta, sd, alpha), power, most)


def seeds_for_equivalence(margin: float, sd: float, alpha: float = ALPHA, power: float = POWER,
                          most: int = 100_000) -> int | None:
    """The fewest pairs (≥ 2) whose TOST shows equivalence within ±``margin`` with ``power`` where the points are
    equal, at ``sd``; None where it takes more than ``most`` or without a spread."""
    if not margin or not sd:
        return None
    return _fewest(lambda n: equivalence_power(n, margin, sd, alpha), power, most)


def fisher_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float | None:
    """Two-sided p of Fisher's exact test that k_a of n_a and k_b of n_b come from one rate; None without runs."""
    if n_a < 1 or n_b < 1:
        return None
    k, n = k_a + k_b, n_a + n_b
    tables = {x: math.comb(k, x) * math.comb(n - k, n_a - x) / math.comb(n, n_a)  # P(x of a's runs escaped)
              for x in range(max(0, k - n_b), min(k, n_a) + 1)}
    return min(1.0, sum(p for p in tables.values() if p <= tables[k_a] * (1 + 1e-9)))


def gehan_p(a: list[tuple[float, bool]], b: list[tuple[float, bool]], seed: int = 0) -> float | None:
    """Two-sided p of Gehan's test that two sets of (steps, censored) runs reach a threshold alike; None below one
    run on either side. A run censored at c has not reached it by c; two runs compare where one reached it at t and
    the other either reached it later or was censored at or after t."""
    if not a or not b:
        return None
    u = _gehan_scores(a + b)
    n, m = len(a) + len(b), len(a)
    if math.comb(n, m) <= EXACT_SPLITS:
        splits = _every_split(n, m)
    else:
        rng = np.random.default_rng(seed)
        splits = np.zeros((SPLITS, n))
        for row in range(SPLITS):
            splits[row, rng.permutation(n)[:m]] = 1.0
    statistic = ((splits @ u) * (1 - splits)).sum(1)  # U of each split: Σ_{i in, j out} u_ij
    observed = float(u[:m, m:].sum())
    return float(np.mean(np.abs(statistic) >= abs(observed) - 1e-9))


def gehan_u(a: list[tuple[float, bool]], b: list[tuple[float, bool]]) -> float:
    """Gehan's U of a against b: the pairs where a run of a surely reached the threshold first, minus those where a
    run of b did (> 0: a is faster)."""
    return float(_gehan_scores(a + b)[:len(a), len(a):].sum())


def _gehan_scores(runs: list[tuple[float, bool]]) -> np.ndarray:
    """u_ij of (steps, censored) runs: +1 where i surely reached the threshold before j, −1 where surely after."""
    t = np.array([r[0] for r in runs], dtype=float)
    event = np.array([not r[1] for r in runs])
    earlier = event[:, None] & (t[:, None] < t[None, :])  # i reached it before j reached it or was censored
    earlier |= event[:, None] & ~event[None, :] & (t[:, None] <= t[None, :])
    return earlier.astype(float) - earlier.T.astype(float)


@functools.lru_cache(maxsize=8)
def _every_split(n: int, m: int) -> np.ndarray:
    """Every way to pick m of n runs, as rows of 0/1 [C(n, m), n]."""
    splits = np.zeros((math.comb(n, m), n))
    for row, members in enumerate(itertools.combinations(range(n), m)):
        splits[row, list(members)] = 1.0
    return splits
