"""The statistics of a study's paired comparisons (docs/platform.md, "Reading a study").

A point is compared with the baseline seed by seed: d_r = v_r(point) − v_r(baseline), r = 1..n.

    paired t        t = mean(d) / (s/√n), two-sided p from Student's t with n − 1 degrees of freedom
    sign flip       the exact permutation test of mean(d) = 0: every sign pattern of the d_r (2ⁿ of them, or
                    FLIPS random ones beyond n = 16), two-sided; no normality assumed (bounded, skewed accuracies)
    bootstrap       the percentile interval of mean(d) over DRAWS resamples of the pairs (fixed seed)
    Holm            across a study's m comparisons: p_(i) sorted, adjusted p_(i) = max_{j≤i} min(1, (m − j + 1) p_(j));
                    a comparison is resolved where its adjusted p < α, the family-wise error rate held at α
    power           the seeds a paired t test needs to detect a mean difference δ at α with power 1 − β, for the
                    observed sd of the d_r: the smallest n with P(|T_{n−1}(δ√n/sd)| > t_{1−α/2, n−1}) ≥ 1 − β
                    (T noncentral t)
"""
from __future__ import annotations

import itertools
import math

import numpy as np

ALPHA = 0.05
POWER = 0.8
DRAWS = 10_000  # bootstrap resamples
FLIPS = 20_000  # random sign patterns beyond EXACT pairs
EXACT = 16


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
    return float(nct.sf(crit, n - 1, shift) + nct.cdf(-crit, n - 1, shift))


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
