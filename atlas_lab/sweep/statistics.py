"""The statistics of a study's paired comparisons (docs/platform.md, "Reading a study").

A point is compared with the baseline seed by seed: d_r = v_r(point) − v_r(baseline), r = 1..n.

    paired t        t = mean(d) / (s/√n), two-sided p from Student's t with n − 1 degrees of freedom; none where
                    the d_r have no spread (s = 0: t is 0/0 or ∞ from a degenerate sample, which is no evidence)
    sign flip       the exact permutation test of mean(d) = 0: every sign pattern of the d_r (2ⁿ of them, or
                    FLIPS random ones beyond n = 16), two-sided; no normality assumed (bounded, skewed accuracies).
                    Its smallest reachable p is 2/2ⁿ (0.0625 at 5 pairs): below 6 pairs it cannot reach 0.05
    bootstrap       the percentile interval of mean(d): exact, over all nⁿ resamples of the pairs, where there are
                    at most EXACT_RESAMPLES (n ≤ 6); else over DRAWS random ones (fixed seed), with the Monte-Carlo
                    standard error of its ends. Percentiles are the inverted distribution function (the smallest
                    resampled mean whose share at or below it reaches the level)
    Holm            across a study's m comparisons: p_(i) sorted, adjusted p_(i) = max_{j≤i} min(1, (m − j + 1) p_(j));
                    a comparison is resolved where its adjusted p < α, the family-wise error rate held at α
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
                    (``holm_level``): power is stated at that level, not at α
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


def no_spread(d: list[float]) -> bool:
    """Whether the d_r are identical up to floating-point rounding (sd at most 1e-9 of the largest |d_r|: 0.5 − 0.4965
    and 0.6 − 0.5965 differ in their last bits)."""
    x = np.asarray(d, dtype=float)
    return len(x) < 2 or float(np.std(x, ddof=1)) <= 1e-9 * float(np.max(np.abs(x)))


def paired_t_p(d: list[float]) -> float | None:
    """Two-sided p of the paired t test of mean(d) = 0; None below two pairs or where the d_r have no spread
    (``no_spread``: identical differences are no evidence, t is undefined)."""
    from scipy.stats import t

    n = len(d)
    if n < 2 or no_spread(d):
        return None
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


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


def holm(p: list[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the order given (a None stays None and is not counted)."""
    known = sorted((v, i) for i, v in enumerate(p) if v is not None)
    m, out, running = len(known), list(p), 0.0
    for rank, (v, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def holm_level(rank: int, m: int, alpha: float = ALPHA) -> float:
    """The level Holm's method holds the comparison of p-rank ``rank`` (1: the smallest p) of ``m`` to:
    α/(m − rank + 1)."""
    return alpha / (m - rank + 1)


def holm_ranks(p: list[float | None]) -> list[int | None]:
    """Each p's rank among the known ones (1: the smallest; ties in the order given); None stays None."""
    order = sorted((v, i) for i, v in enumerate(p) if v is not None)
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


def seeds_for_power(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER,
                    most: int = 100_000) -> int | None:
    """The fewest pairs (≥ 2) whose paired t test reaches ``power`` for ``delta`` at ``sd`` (power grows with n:
    doubling, then bisection); None where it takes more than ``most``."""
    if not delta or not sd:
        return None
    low, high = 1, 2  # power(low) < power ≤ power(high) once found
    while paired_power(high, delta, sd, alpha) < power:
        low, high = high, 2 * high
        if high > 2 * most:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if paired_power(mid, delta, sd, alpha) >= power else (mid, high)
    return high if high <= most else None


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
