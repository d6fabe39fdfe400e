"""A trial's learning-curve summaries (atlas_lab/sweep/curve.py) on curves whose answers are known."""
import pytest

from atlas_lab.sweep.curve import summarize_curve

STEPS = [100, 200, 300, 400]
PLATEAU_THEN_RISE = [0.25, 0.26, 0.80, 0.95]


def test_final_best_and_mean_of_a_rising_curve():
    out = summarize_curve(STEPS, PLATEAU_THEN_RISE, maximize=True)
    assert out == {"final": 0.95, "best": 0.95, "mean": pytest.approx((0.25 + 0.26 + 0.80 + 0.95) / 4)}


def test_best_is_the_minimum_of_a_metric_that_improves_downwards():
    out = summarize_curve(STEPS, [2.0, 1.0, 1.5, 1.7], maximize=False, threshold=1.2)
    assert (out["final"], out["best"]) == (1.7, 1.0)
    assert (out["steps_to_1.2"], out["censored_1.2"]) == (200.0, 0.0)


def test_steps_to_is_the_first_validation_at_or_above_the_threshold():
    out = summarize_curve(STEPS, PLATEAU_THEN_RISE, threshold=0.8)
    assert (out["steps_to_0.8"], out["censored_0.8"]) == (300.0, 0.0)  # 0.80 counts: at or above


def test_a_threshold_never_reached_is_censored_at_the_steps_trained():
    out = summarize_curve(STEPS, PLATEAU_THEN_RISE, threshold=0.99, steps_trained=450)
    assert (out["steps_to_0.99"], out["censored_0.99"]) == (450.0, 1.0)
    assert summarize_curve(STEPS, PLATEAU_THEN_RISE, threshold=0.99)["steps_to_0.99"] == 400.0


def test_no_validation_has_no_summary():
    assert summarize_curve([], [], threshold=0.5) == {}
