"""A trial's learning curve as numbers a study can compare: the validations of its metric, summarised.

Validations v_1..v_m at global steps s_1..s_m (the last one at the end of training, see ``ValidateAtEnd``):

    final          v_m
    best           max_i v_i (min_i for a metric that improves downwards)
    mean           (1/m) Σ_i v_i — the area under the curve per validation: rewards learning early
    steps_to_x     s_i of the first v_i ≥ x (≤ x downwards); censored when no v_i reaches x: then the steps trained,
                   a lower bound, and censored_x = 1

A run in the middle of a transition has a final value that depends on when it left the plateau; ``steps_to`` is
that time itself, and ``best`` is what a converged run reached.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from .spec import curve_key


def summarize_curve(steps: list[int], values: list[float], maximize: bool = True, threshold: float | None = None,
                    steps_trained: int | None = None) -> dict[str, float]:
    """{final, best, mean} of a curve (and steps_to_<x>, censored_<x> with a threshold); {} for no validation.
    steps_trained: the censoring time when x is never reached (default the last validation's step)."""
    if not values:
        return {}
    out = {"final": values[-1], "best": max(values) if maximize else min(values), "mean": sum(values) / len(values)}
    if threshold is not None:
        reached = [s for s, v in zip(steps, values) if (v >= threshold if maximize else v <= threshold)]
        key = curve_key("steps_to", threshold)
        out[key] = float(reached[0] if reached else (steps_trained if steps_trained is not None else steps[-1]))
        out[f"censored_{threshold:g}"] = 0.0 if reached else 1.0
    return out


class LearningCurve(Callback):
    """Records ``metric`` at every validation (sanity checks left out); ``summaries()`` after the fit returns
    ``{"<metric>.<summary>": value}`` (summarize_curve). Under DDP the logged value is already reduced, so every
    rank records the same curve."""

    def __init__(self, metric: str, maximize: bool = True, threshold: float | None = None):
        self.metric, self.maximize, self.threshold = metric, maximize, threshold
        self.steps: list[int] = []
        self.values: list[float] = []
        self.steps_trained = 0

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        if self.steps and self.steps[-1] == trainer.global_step:  # validated twice at one step: keep the last
            self.steps.pop(), self.values.pop()
        self.steps.append(trainer.global_step)
        self.values.append(float(trainer.callback_metrics[self.metric]))

    def on_train_end(self, trainer, pl_module):
        self.steps_trained = trainer.global_step

    def summaries(self) -> dict[str, float]:
        found = summarize_curve(self.steps, self.values, self.maximize, self.threshold, self.steps_trained or None)
        return {f"{self.metric}.{k}": v for k, v in found.items()}
