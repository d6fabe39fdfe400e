"""The statistics of a study's paired comparisons (docs/platform.md, "Reading a study").

A point is compared with the baseline seed by seed: d_r = v_r(point) − v_r(baseline), r = 1..n.

    paired t        t = mean(d) / (s/√n), two-sided p from Student's t with n − 1 degrees of freedom
    sign flip       the exact permutation test of mean(d) = 0: every sign pattern of the d_r (2ⁿ of them, or
                    FLIPS random ones beyond n = 16), two-sided; no normality assumed (bounded, skewed accuracies)
    bootstrap       the percentile interval of mean(d) over DRAWS resamples of the pairs (fixed seed)
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
                    (T noncentral t)
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

ALPHA = 0.05
POWER = 0.8
DRAWS = 10_000  # bootstrap resamples
FLIPS = 20_000  # random sign patterns beyond EXACT pairs
EXACT = 16
EXACT_SPLITS = 200_000  # Gehan: every split up to this many
SPLITS = 20_000


def paired_t_p(d: list[float]) -> float | None:
    """Two-sided p of the paired t test of mean(d) = 0; None below two pairs (1.0 for n ≥ 2 identical zeros)."""
    from scipy.stats import t

    n = len(d)
    if n < 2:
        return None
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
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


def bootstrap_interval(d: list[float], level: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """The percentile bootstrap interval of mean(d); None below two pairs."""
    if len(d) < 2:
        return None
    x = np.asarray(d, dtype=float)
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(DRAWS, len(x)))].mean(1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def holm(p: list[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the order given (a None stays None and is not counted)."""
    known = sorted((v, i) for i, v in enumerate(p) if v is not None)
    m, out, running = len(known), list(p), 0.0
    for rank, (v, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def paired_power(n: int, delta: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t test at alpha with n pairs, for a true mean difference delta and sd."""
    from scipy.stats import nct, t

    if n < 2:
        return 0.0
    if sd == 0:
        return 1.0 if delta != 0 else alpha
    crit = float(t.ppf(1 - alpha / 2, n - 1))
    shift = abs(delta) * math.sqrt(n) / sd
    # P(T < −crit) for T ~ nct(shift) is P(T > crit) for nct(−shift): scipy's cdf returns NaN deep in the lower tail
    # (e.g. crit 4.6, 4 degrees of freedom, shift 7.5), its sf does not
    return float(nct.sf(crit, n - 1, shift) + nct.sf(crit, n - 1, -shift))


def seeds_for_power(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER,
                    most: int = 100_000) -> int | None:
    """The fewest pairs (≥ 2) whose paired t test reaches ``power`` for ``delta`` at ``sd`` (power grows with n:
    doubling, then bisection); None where it takes more than ``most``."""
    if not delta or sd is None:
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
