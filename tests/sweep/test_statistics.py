"""The comparison statistics (atlas_lab/sweep/statistics.py) against answers known by hand and by simulation."""
import math

import numpy as np
import pytest
from rich.console import Console

from atlas_lab.sweep import statistics as st
from atlas_lab.sweep.report import differences, result_rows, summarize
from test_report import synthetic_study

SIMULATIONS = 4000  # simulated studies: a rate's standard error is at most √(0.25 / 4000) ≈ 0.008


def test_sign_flip_p_is_the_share_of_sign_patterns_as_extreme():
    assert st.sign_flip_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # all + or all −
    assert st.sign_flip_p([1, -1]) == 1.0
    assert st.sign_flip_p([3, 1, -1]) == pytest.approx(6 / 8)  # |±3 ± 1 ± 1| ≥ 3 but for ±(3 − 1 − 1)
    assert st.sign_flip_p([0.5]) is None


def test_holm_adjusts_step_down_and_keeps_the_order():
    adjusted = st.holm([0.01, 0.04, 0.03, None])  # sorted 0.01, 0.03, 0.04: ×3, ×2, ×1, then running maxima
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[3] is None
    assert st.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_paired_t_p_matches_the_t_distribution():
    # d = [0.10, 0.12, 0.08]: t = 0.1 / (0.02 / √3) = 8.66 at 2 degrees of freedom
    from scipy.stats import t
    assert st.paired_t_p([0.10, 0.12, 0.08]) == pytest.approx(2 * t.sf(0.1 / (0.02 / math.sqrt(3)), 2))


def test_bootstrap_interval_holds_the_mean_and_narrows_with_pairs():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0.1, 0.2, 8), rng.normal(0.1, 0.2, 128)
    for d in (small, large):
        low, high = st.bootstrap_interval(list(d))[:2]
        assert low < d.mean() < high
    width = {n: np.subtract(*st.bootstrap_interval(list(d))[1::-1]) for n, d in (("small", small), ("large", large))}
    assert width["large"] < width["small"]


def test_zero_spread_is_no_evidence():
    """Two or five identical differences: no t p (t is undefined), and the sign-flip test says what it can: 2/2ⁿ."""
    assert st.paired_t_p([-0.0035, -0.0035]) is None and st.paired_t_p([0.2] * 5) is None
    assert st.paired_t_p([0.0, 0.0, 0.0]) is None
    assert st.sign_flip_p([-0.0035, -0.0035]) == pytest.approx(0.5)
    assert st.paired_power(5, 0.1, 0.0) is None and st.seeds_for_power(0.1, 0.0) is None


def test_the_least_sign_flip_p_is_two_in_two_to_the_n():
    assert [st.min_sign_flip_p(n) for n in (1, 2, 3, 5, 6)] == [None, 0.5, 0.25, 0.0625, 0.03125]
    for n in (2, 3, 5, 7):  # every difference on one side reaches it
        assert st.sign_flip_p(list(np.arange(1.0, n + 1))) == pytest.approx(st.min_sign_flip_p(n))


def test_bootstrap_enumerates_every_resample_up_to_the_limit():
    """Five pairs: all 5⁵ = 3,125 resamples, the percentile ends the inverted distribution function of their means
    (the 79th and 3,047th of 3,125 sorted: ⌈0.025 · 3125⌉, ⌈0.975 · 3125⌉); the same list by brute force."""
    import itertools

    d = [0.0205, 0.0425, -0.0617, -0.0135, 0.3690]
    boot = st.bootstrap_interval(d)
    means = np.sort([np.mean(r) for r in itertools.product(d, repeat=5)])
    assert boot.exact and boot.resamples == 3125 and boot.mc_error == 0.0
    assert (boot.low, boot.high) == (pytest.approx(means[78]), pytest.approx(means[3046]))
    assert (boot.low, boot.high) == tuple(pytest.approx(v) for v in np.quantile(means, [0.025, 0.975],
                                                                                method="inverted_cdf"))
    assert st.bootstrap_interval(d * 2 + d[:2]) .exact is False  # 12 pairs: 12¹² resamples, drawn
    assert 6 ** 6 <= st.EXACT_RESAMPLES < 7 ** 7 and st.bootstrap_interval(list(range(6))).exact


def test_a_drawn_bootstrap_states_its_monte_carlo_error():
    """Beyond the enumeration, ≥ 20,000 draws; the stated error of the ends is about the spread of the ends over
    independent draws (their sd over 20 seeds within a factor of 2.5 of the stated one)."""
    d = list(np.random.default_rng(3).normal(0.1, 0.2, 9))
    runs = [st.bootstrap_interval(d, seed=s) for s in range(20)]
    assert all(b.resamples >= 20_000 and not b.exact for b in runs)
    spread = max(np.std([b.low for b in runs], ddof=1), np.std([b.high for b in runs], ddof=1))
    stated = np.mean([b.mc_error for b in runs])
    assert stated / 2.5 < spread < stated * 2.5, (spread, stated)


def test_holm_levels_follow_the_rank():
    p = [0.2, 0.001, None, 0.04]
    assert st.holm_ranks(p) == [3, 1, None, 2]
    assert [st.holm_level(r, 3) for r in (1, 2, 3)] == pytest.approx([0.05 / 3, 0.025, 0.05])
    # Holm's adjusted p is below α exactly where the p of that rank, and of every smaller rank, is below its level
    rng = np.random.default_rng(4)
    for _ in range(200):
        p = list(rng.uniform(0, 0.06, size=int(rng.integers(1, 6))))
        ranks, m = st.holm_ranks(p), len(p)
        ordered = sorted(p)
        for v, a, rank in zip(p, st.holm(p), ranks):
            below = all(ordered[j - 1] < st.holm_level(j, m) for j in range(1, rank + 1))
            assert (a < st.ALPHA) == below, (p, v)


def test_power_is_a_probability_deep_in_the_tail():
    """At alpha 0.01 with 5 pairs and a large effect (shift 7.5) scipy's noncentral t cdf of the lower tail is NaN;
    the power is still a number, equal to a simulation's rejection rate within 3 standard errors."""
    power = st.paired_power(5, 0.1, 0.03, alpha=0.01)
    d = np.random.default_rng(2).normal(0.1, 0.03, size=(SIMULATIONS, 5))
    from scipy.stats import ttest_1samp
    rate = np.mean(ttest_1samp(d, 0.0, axis=1).pvalue < 0.01)
    assert math.isfinite(power) and abs(rate - power) < 3 * math.sqrt(0.25 / SIMULATIONS)
    assert st.paired_power(4, 0.1, 0.03, alpha=0.01) < st.POWER <= power
    assert st.seeds_for_power(0.1, 0.03, alpha=0.01) == 5


@pytest.mark.parametrize("delta,sd", [(0.2, 0.2), (0.1, 0.2), (0.05, 0.03)])
def test_a_known_effect_resolves_at_the_predicted_number_of_seeds(delta, sd):
    """Simulated paired studies at the predicted n reach power 0.8 (within 3 standard errors); one seed fewer
    falls short of it by the formula."""
    n = st.seeds_for_power(delta, sd)
    assert st.paired_power(n, delta, sd) >= st.POWER > st.paired_power(n - 1, delta, sd)
    rng = np.random.default_rng(1)
    d = rng.normal(delta, sd, size=(SIMULATIONS, n))
    from scipy.stats import ttest_1samp
    rate = np.mean(ttest_1samp(d, 0.0, axis=1).pvalue < st.ALPHA)
    assert abs(rate - st.paired_power(n, delta, sd)) < 3 * math.sqrt(0.25 / SIMULATIONS)


def test_a_null_effect_is_called_resolved_at_most_at_the_nominal_rate():
    """Over simulated studies of 3 comparisons with no effect (skewed, bounded values: accuracies), the chance that
    any comparison is called resolved after Holm's correction stays at or below 0.05 (within 3 standard errors);
    the sign-flip test's rate alone stays below 0.05 too."""
    rng = np.random.default_rng(2)
    family, flips = 0, 0
    for _ in range(SIMULATIONS // 4):
        base = rng.beta(8, 2, size=6)
        points = [np.clip(base + rng.beta(8, 2, size=6) - rng.beta(8, 2, size=6), 0, 1) for _ in range(3)]
        d = [list(p - base) for p in points]
        p = st.holm([st.paired_t_p(x) for x in d])
        family += any(v < st.ALPHA for v in p)
        flips += st.sign_flip_p(d[0]) < st.ALPHA
    n = SIMULATIONS // 4
    assert family / n <= st.ALPHA + 3 * math.sqrt(st.ALPHA * (1 - st.ALPHA) / n)
    assert flips / n <= st.ALPHA + 3 * math.sqrt(st.ALPHA * (1 - st.ALPHA) / n)


def test_the_report_states_holm_and_the_seeds_each_comparison_needs(tmp_path):
    """d(linear) = [0.10, 0.12, 0.08] (sd 0.02), d(gd) = [0.1, 0.2, 0.0] (sd 0.1): Holm over 2 comparisons; the
    power and the seeds for ±0.1 at each one's Holm level: linear's p is the smaller (level 0.025), gd's 0.05."""
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78],
                             ("atlas", "gd"): [0.6, 0.8, 0.7]},
                            baseline={"model.preset": "atlas", "model.memory": "atlas"})
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows, power=0.1)}
    linear, gd = diffs["memory=linear"], diffs["memory=gd"]
    assert linear["p_holm"] == pytest.approx(min(1, 2 * min(linear["p"], gd["p"]))) and linear["resolved"]
    assert gd["p_holm"] == pytest.approx(max(linear["p_holm"], gd["p"])) and not gd["resolved"]
    assert (linear["holm_level"], gd["holm_level"]) == (0.025, 0.05)
    assert (linear["seeds"], gd["seeds"]) == (st.seeds_for_power(0.1, 0.02, alpha=0.025),
                                              st.seeds_for_power(0.1, 0.1))
    assert linear["power"] == pytest.approx(st.paired_power(3, 0.1, 0.02, alpha=0.025))
    assert st.seeds_for_power(0.1, 0.1, alpha=0.025) > st.seeds_for_power(0.1, 0.1)  # the level matters
    out = summarize(study, console=Console(width=250, record=True), out_dir=tmp_path, power=0.1)
    md = (out / "results.md").read_text()
    assert "Holm's method across these 2 comparisons" in md and "seeds for ±0.1" in md
    assert "| memory=linear | 3 | 0.0200 | 0.025 (1 of 2) |" in md


def test_the_table6_power_at_holms_first_level():
    """The committed Table 6 study's linear-memory comparison (sd of the paired differences 0.2064, 5 pairs): at
    Holm's first level over 4 comparisons (0.0125) ±0.1 needs 51 seeds, not the 36 of α = 0.05."""
    assert st.seeds_for_power(0.1, 0.2064, alpha=0.05 / 4) == 51 and st.seeds_for_power(0.1, 0.2064) == 36
    assert 0.02 < st.paired_power(5, 0.1, 0.2064, alpha=0.0125) < 0.05


def test_report_power_is_a_positive_number(capsys):
    from atlas_lab.cli import main
    assert main(["report", "nothing", "--power", "0"]) == 2
    assert "--power: expected a number > 0, got '0'" in capsys.readouterr().err


def test_fisher_p_sums_the_tables_no_more_likely_than_the_observed_one():
    # margins 5 of 10 escaped, 5 runs a side: P(x) = C(5, x) C(5, 5 − x) / 252 = 1, 25, 100, 100, 25, 1 (/252)
    assert st.fisher_p(5, 5, 0, 5) == pytest.approx(2 / 252)
    assert st.fisher_p(4, 5, 1, 5) == pytest.approx(52 / 252)
    assert st.fisher_p(3, 6, 3, 6) == 1.0 and st.fisher_p(0, 5, 0, 5) == 1.0
    assert st.fisher_p(1, 0, 0, 5) is None


def test_gehan_counts_the_pairs_censoring_leaves_decided():
    a = [(100, False), (200, False)]  # reached the threshold at steps 100 and 200
    b = [(150, True), (300, False)]  # never reached it in 150 steps; reached it at 300
    # a1 before b1 (100 ≤ 150) and b2; a2 after b1's censoring: open; a2 before b2: U = 3
    assert st.gehan_u(a, b) == 3 and st.gehan_u(b, a) == -3
    fast = [(float(t), False) for t in (100, 110, 120, 130, 140)]
    slow = [(float(t), False) for t in (300, 310)] + [(400.0, True)] * 3
    assert st.gehan_p(fast, slow) == pytest.approx(2 / 252)  # the two splits as extreme: fast first, fast last
    assert st.gehan_p([(400.0, True)] * 5, [(400.0, True)] * 5) == 1.0  # nobody escaped: nothing to compare


def test_gehan_without_censoring_is_the_exact_wilcoxon_rank_sum_test():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(2)
    for n_a, n_b in ((5, 5), (6, 4), (7, 7)):
        a, b = rng.exponential(300, n_a) + 50, rng.exponential(600, n_b)
        expected = mannwhitneyu(a, b, method="exact").pvalue
        assert st.gehan_p([(x, False) for x in a], [(x, False) for x in b]) == pytest.approx(expected, rel=1e-9)


def test_gehan_calls_a_null_effect_resolved_at_most_at_the_nominal_rate():
    """Censored steps-to-threshold of two alike points, 6 seeds each, about a third never escaping: the rank test
    rejects at most at 0.05 + 3 standard errors."""
    rng = np.random.default_rng(5)
    budget, n, runs = 2000.0, 6, 600

    def draw(scale):
        t = rng.exponential(scale, n)
        return [(min(x, budget), bool(x > budget)) for x in t]

    null = np.mean([st.gehan_p(draw(1800.0), draw(1800.0)) < st.ALPHA for _ in range(runs)])
    assert null <= st.ALPHA + 3 * math.sqrt(st.ALPHA * (1 - st.ALPHA) / runs), null


# --- precision, missing p, equivalence ---

# the baseline's five values from a demo journal (float32, as Lightning logs a metric), and a point that is 0.0035
# below it in every seed: its differences are one value, spread only by float32 rounding
FLOAT32_BASELINE = [0.3019999861717224, 0.9769999980926514, 0.996999979019165, 0.9925000071525574,
                    0.9244999885559082]


def test_storage_precision_is_float32_where_every_value_is_one():
    assert st.storage_eps(FLOAT32_BASELINE) == st.FLOAT32_EPS
    assert st.storage_eps(FLOAT32_BASELINE + [0.4965]) == st.FLOAT64_EPS  # 0.4965 is no float32


def test_float32_rounded_identical_differences_have_no_spread_and_no_p():
    """The differences come out as −0.00350001 and −0.00349998 (sd about 1e-8, well above float64's rounding and
    far below float32's): one value up to storage rounding, so no t p (it would be about 1e-22 otherwise)."""
    point = [float(np.float32(b - 0.0035)) for b in FLOAT32_BASELINE]
    d = [a - b for a, b in zip(point, FLOAT32_BASELINE)]
    assert np.std(d, ddof=1) > 1e-9  # the old tolerance, 1e-9 of the largest |d|, took this spread for evidence
    error = st.rounding(point, FLOAT32_BASELINE)
    assert st.no_spread(d, error) and st.paired_t_p(d, error) is None
    assert st.equivalence_p(d, 0.05, error) is None
    assert not st.no_spread(d) and st.paired_t_p(d) < 1e-15  # at float64's precision it would be a verdict
    spread = [x + e for x, e in zip(d, [0.0, 1e-4, -1e-4, 2e-4, 0.0])]  # a real spread is still one
    assert not st.no_spread(spread, error) and st.paired_t_p(spread, error) is not None


def test_a_report_of_float32_rounded_identical_differences_gives_no_verdict(tmp_path):
    point = [float(np.float32(b - 0.0035)) for b in FLOAT32_BASELINE]
    study = synthetic_study({("atlas", "atlas"): FLOAT32_BASELINE, ("atlas", "linear"): point,
                             ("atlas", "gd"): [b - 0.1 - 0.01 * i for i, b in enumerate(FLOAT32_BASELINE)]},
                            baseline={"model.preset": "atlas", "model.memory": "atlas"})
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows)}
    linear, gd = diffs["memory=linear"], diffs["memory=gd"]
    assert linear["no_spread"] and linear["p"] is None and linear["p_holm"] is None and not linear["resolved"]
    assert gd["holm_m"] == 1 and gd["p_holm"] == gd["p"] and gd["resolved"]  # linear is left out of the family
    console = Console(width=300, record=True)
    md = (summarize(study, console=console, out_dir=tmp_path) / "results.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("| memory=linear | 5 |"))
    assert "worse" not in line and "no value" in line, line


def test_a_nan_or_missing_p_leaves_the_other_adjustments_as_if_it_were_absent():
    assert st.holm([float("nan"), 0.001, 0.01]) == [None, pytest.approx(0.002), pytest.approx(0.01)]
    assert st.holm([None, 0.001, 0.01]) == st.holm([float("nan"), 0.001, 0.01])
    assert st.holm([0.001, 0.01]) == pytest.approx([0.002, 0.01])
    assert st.holm_ranks([float("nan"), 0.01, 0.001]) == [None, 2, 1]


def test_equivalence_p_is_the_larger_one_sided_p_and_matches_the_interval():
    """TOST at level a says equivalent exactly where the (1 − 2a) t interval lies within ±margin."""
    from scipy.stats import t

    rng = np.random.default_rng(3)
    for _ in range(200):
        d = list(rng.normal(rng.uniform(-0.05, 0.05), rng.uniform(0.005, 0.05), size=int(rng.integers(3, 9))))
        n, mean, se = len(d), np.mean(d), np.std(d, ddof=1) / math.sqrt(len(d))
        low, high = mean - t.ppf(0.95, n - 1) * se, mean + t.ppf(0.95, n - 1) * se  # the 90 % interval
        p = st.equivalence_p(d, 0.04)
        assert p == pytest.approx(max(t.sf((mean + 0.04) / se, n - 1), t.cdf((mean - 0.04) / se, n - 1)))
        if abs(max(abs(low), abs(high)) - 0.04) > 1e-9:  # off the boundary, the two agree
            assert (p < 0.05) == (-0.04 < low and high < 0.04)


@pytest.mark.parametrize("n,margin,sd,alpha,delta", [(5, 0.05, 0.03, 0.05, 0.0), (10, 0.05, 0.05, 0.025, 0.01),
                                                     (3, 0.1, 0.05, 0.05, 0.0)])
def test_equivalence_power_is_the_simulated_rate(n, margin, sd, alpha, delta):
    """The quadrature against SIMULATIONS × 10 simulated designs: within 4 binomial standard errors."""
    from scipy.stats import t

    runs = SIMULATIONS * 10
    d = np.random.default_rng(n).normal(delta, sd, size=(runs, n))
    mean, se = d.mean(1), d.std(1, ddof=1) / math.sqrt(n)
    crit = t.ppf(1 - alpha, n - 1)
    rate = np.mean((mean - crit * se > -margin) & (mean + crit * se < margin))
    power = st.equivalence_power(n, margin, sd, alpha, delta)
    assert abs(power - rate) <= 4 * math.sqrt(rate * (1 - rate) / runs) + 1e-9, (power, rate)


def test_seeds_for_equivalence_are_the_fewest_that_reach_the_power():
    n = st.seeds_for_equivalence(0.05, 0.03, 0.05)
    assert st.equivalence_power(n, 0.05, 0.03, 0.05) >= st.POWER > st.equivalence_power(n - 1, 0.05, 0.03, 0.05)
    assert st.seeds_for_equivalence(0.05, 0.0) is None and st.seeds_for_equivalence(0.05, None) is None


def test_a_bounded_metrics_interval_stays_within_its_bounds():
    from atlas_lab.sweep.report import interval

    assert st.metric_bounds("val/acc.best") == (0.0, 1.0) and st.metric_bounds("val/loss")[0] == 0.0
    cut = interval([0.998, 0.6, 0.995, 0.99, 0.997], st.metric_bounds("val/acc"))
    uncut = interval([0.998, 0.6, 0.995, 0.99, 0.997])
    assert uncut["high"] > 1.0 and cut["high"] == 1.0 and cut["low"] == uncut["low"]
    assert interval([1.2, 1.4, 1.3], (0.0, 1.0))["high"] > 1.0  # values beyond the bounds: not the metric's
    assert st.difference_bounds((0.0, 1.0)) == (-1.0, 1.0)
