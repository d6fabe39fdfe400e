"""The report's statistics on synthetic studies whose answers are known by hand."""
import csv
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from atlas_lab.sweep.report import axis_labels, differences, interval, result_rows, summarize

T_975 = {2: 4.302652729749464, 4: 2.7764451051977934}  # Student's t quantile 0.975 at 2 and 4 degrees of freedom


def synthetic_study(values: dict[tuple, list], direction="maximize", baseline=None, states=None, metric="val/acc",
                    summary="final", tuned=None):
    """A grid study over axes (preset, memory) whose point labels -> per-repeat values; None is a failed repeat.
    A value (steps, censored) is a steps_to repeat. tuned: point labels -> the setting its trials ran at."""
    study = optuna.create_study(direction=direction)
    for key, value in (("metric", metric), ("direction", direction), ("sampler", "grid"), ("summary", summary),
                       ("grid_keys", ["model.preset", "model.memory"]), ("baseline", baseline)):
        study.set_user_attr(key, value)
    dists = {"model.preset": CategoricalDistribution(["atlas", "atlas_mag"]),
             "model.memory": CategoricalDistribution(["atlas", "linear", "gd"])}
    for (preset, memory), per_repeat in values.items():
        for repeat, v in enumerate(per_repeat):
            state = (states or {}).get((preset, memory, repeat), TrialState.COMPLETE if v is not None else
                                       TrialState.FAIL)
            attrs = {"labels": {"model.preset": preset, "model.memory": memory}, "repeat": repeat}
            if tuned:
                attrs["tuned"] = tuned[preset, memory]
            if isinstance(v, tuple):
                v, attrs["censored"] = v[0], [v[1]]
            if state == TrialState.FAIL:
                attrs["fail_reason"] = "FloatingPointError: val/acc is nan"
            study.add_trial(create_trial(state=state, value=v if state == TrialState.COMPLETE else None,
                                         params={"model.preset": preset, "model.memory": memory}, distributions=dists,
                                         user_attrs=attrs))
    return study


def test_interval_is_the_t_interval_of_the_mean():
    stats = interval([1.0, 2.0, 3.0])
    assert stats["n"] == 3 and stats["mean"] == 2.0 and stats["std"] == 1.0
    half = T_975[2] / math.sqrt(3)
    assert stats["low"] == pytest.approx(2 - half, rel=1e-9) and stats["high"] == pytest.approx(2 + half, rel=1e-9)
    stats = interval([0.5, 0.7, 0.6, 0.9, 0.8])  # mean 0.7, std sqrt(0.025)
    assert stats["high"] - stats["mean"] == pytest.approx(T_975[4] * math.sqrt(0.025 / 5), rel=1e-9)
    assert interval([0.4]) == {"n": 1, "mean": 0.4, "std": None, "low": None, "high": None}  # no spread from one
    assert interval([])["mean"] is None


def test_points_count_failed_and_pruned_repeats_without_averaging_them():
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.2, None, 0.4],
                             ("atlas_mag", "gd"): [0.9, 0.1, 0.3]},
                            states={("atlas_mag", "gd", 1): TrialState.PRUNED})
    columns, rows = result_rows(study)
    assert columns == ["model.preset", "model.memory"]
    by = {(r["model.preset"], r["model.memory"]): r for r in rows}
    linear = by["atlas", "linear"]
    assert (linear["n"], linear["failed"], linear["pruned"]) == (2, 1, 0)
    assert linear["mean"] == pytest.approx(0.3) and linear["values"] == {0: 0.2, 2: 0.4}
    assert "nan" in linear["reason"]
    gd = by["atlas_mag", "gd"]
    assert (gd["n"], gd["failed"], gd["pruned"], gd["mean"]) == (2, 0, 1, pytest.approx(0.6))
    assert [(r["model.preset"], r["model.memory"]) for r in rows] == [("atlas", "atlas"), ("atlas_mag", "gd"),
                                                                     ("atlas", "linear")]  # best mean first


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_paired_differences_to_the_baseline(direction):
    # d(linear) = [0.10, 0.12, 0.08]: mean 0.10, std 0.02, an interval clear of 0;
    # d(gd) = [1, 2, 0] / 10: mean 0.1, std 0.1, an interval that holds 0 (unresolved at n = 3);
    # d(atlas_mag, atlas) pairs repeats 0 and 2 only (repeat 1 failed)
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78],
                             ("atlas", "gd"): [0.6, 0.8, 0.7], ("atlas_mag", "atlas"): [0.4, None, 0.9]},
                            direction=direction, baseline={"model.preset": "atlas", "model.memory": "atlas"})
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows)}
    assert set(diffs) == {"memory=linear", "memory=gd", "preset=atlas_mag"}
    linear = diffs["memory=linear"]
    assert linear["pairs"] == 3 and linear["diff"] == pytest.approx(0.10) and linear["std"] == pytest.approx(0.02)
    assert linear["low"] == pytest.approx(0.10 - T_975[2] * 0.02 / math.sqrt(3))
    assert linear["excludes_0"] and linear["better"] == (direction == "maximize")
    gd = diffs["memory=gd"]
    assert gd["diff"] == pytest.approx(0.1) and gd["std"] == pytest.approx(0.1) and not gd["excludes_0"]
    mag = diffs["preset=atlas_mag"]
    assert mag["pairs"] == 2 and mag["diff"] == pytest.approx(((0.4 - 0.5) + (0.9 - 0.7)) / 2)
    # unpaired, the same numbers would not resolve linear: its seeds vary more than its difference
    assert interval([0.6, 0.72, 0.78])["low"] < interval([0.5, 0.6, 0.7])["high"]


def test_summary_files_hold_the_statistics_and_the_differences(tmp_path):
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78]},
                            baseline={"model.preset": "atlas", "model.memory": "atlas"})
    out = summarize(study, console=Console(width=200, record=True), out_dir=tmp_path)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["model.memory"], r["n"], float(r["mean"])) for r in rows] == [("linear", "3", pytest.approx(0.7)),
                                                                            ("atlas", "3", pytest.approx(0.6))]
    assert float(rows[1]["ci_low"]) == pytest.approx(0.6 - T_975[2] * 0.1 / math.sqrt(3))
    diff = list(csv.DictReader((out / "differences.csv").open()))
    assert len(diff) == 1 and diff[0]["excludes_0"] == "True" and float(diff[0]["diff"]) == pytest.approx(0.1)
    md = (out / "results.md").read_text()
    assert "paired differences to the baseline" in md and "* better" in md
    assert (out / "ablation.png").stat().st_size > 0


def test_plot_axes_put_numeric_labels_in_order():
    """A numeric grid axis (the Omega window) is plotted in ascending order, not in the best-first order of the rows;
    other axes keep the rows' order."""
    rows = [{"window": 2, "preset": "atlas"}, {"window": 32, "preset": "atlas"}, {"window": 1, "preset": "omeganet"},
            {"window": 16, "preset": "atlas"}, {"window": 4, "preset": "omeganet"}]
    assert axis_labels(rows, "window") == ["1", "2", "4", "16", "32"]
    assert axis_labels(rows, "preset") == ["atlas", "omeganet"]
    assert axis_labels([{"flag": True}, {"flag": False}], "flag") == ["True", "False"]


def test_the_parent_run_shows_values_to_the_digits_of_the_tables(tmp_path, monkeypatch):
    """The parent run's best, per-point means and paired differences are rounded as the tables and trial lines show
    them (4 decimals): a mean of 0.85, 0.86, 0.85 is 0.8533 in the MLflow UI, not 0.8533333333."""
    from mlflow.tracking import MlflowClient

    from atlas_lab.sweep.tracking import parent_run

    monkeypatch.chdir(tmp_path)
    study = synthetic_study({("atlas", "atlas"): [0.85, 0.86, 0.85], ("atlas", "linear"): [0.5, 0.6, 0.6]},
                            baseline={"model.preset": "atlas", "model.memory": "linear"})
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = parent_run(client, "s", "memory")
    summarize(study, client, parent, console=Console(width=200, record=True), out_dir=tmp_path)
    metrics = client.get_run(parent).data.metrics
    assert metrics["best/val/acc"] == 0.8533 and metrics["mean/atlas atlas"] == 0.8533
    assert metrics["mean/atlas linear"] == 0.5667 and metrics["diff/atlas atlas"] == 0.2867


def add_tune_trial(study, preset, memory, candidate, slot, value, seed=0):
    """A tune trial of point (preset, memory): candidate {key: value} on pilot seed ``seed``, its summary ``value``."""
    dists = {"model.preset": CategoricalDistribution(["atlas", "atlas_mag"]),
             "model.memory": CategoricalDistribution(["atlas", "linear", "gd"])}
    labels = {"model.preset": preset, "model.memory": memory}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=value, params=labels, distributions=dists,
                                 user_attrs={"labels": labels, "repeat": 1000 + seed, "slot": slot,
                                             "tune": candidate}))


def test_steps_to_a_threshold_counts_escapes_and_ranks_censored_steps(tmp_path):
    """Steps to val/acc 0.9, censored at 800 where never reached: the linear point escapes in 1 of 5 seeds, the
    baseline in all 5. Fisher's p, by hand: 6 of 10 escaped; P(x of the linear 5) = C(6, x) C(4, 5 − x) / 252 =
    6, 60, 120, 60, 6 (/252) for x = 1..5, and the tables no likelier than x = 1 are x = 1 and 5: 12/252. Gehan's p is
    that of the baseline ahead in every decided pair (2/252), and the verdict is the rank test's."""
    base = [(200, False), (300, False), (250, False), (400, False), (350, False)]
    linear = [(800, True), (800, True), (700, False), (800, True), (800, True)]
    study = synthetic_study({("atlas", "atlas"): base, ("atlas", "linear"): linear}, direction="minimize",
                            baseline={"model.preset": "atlas", "model.memory": "atlas"},
                            metric="val/acc.steps_to_0.9", summary="steps_to")
    columns, rows = result_rows(study)
    assert {r["model.memory"]: r["escaped"] for r in rows} == {"atlas": 5, "linear": 1}
    (d,) = differences(study, columns, rows)
    assert d["escaped"] == "1/5 vs 5/5"
    assert d["p_fisher"] == pytest.approx(12 / 252)
    assert d["p_rank"] == pytest.approx(2 / 252) and d["resolved"] and d["better"] is False
    md = (summarize(study, console=Console(width=250, record=True), out_dir=tmp_path) / "results.md").read_text()
    assert "Gehan rank test's p" in md and "1/5 vs 5/5" in md and "* worse" in md


def test_a_tuned_study_reports_the_pilot_choice_apart_from_its_points(tmp_path):
    """Tune trials (repeats 1000+) are never a point's value; per point the candidate with the best pilot mean is
    chosen (the first on a tie) and shown with every candidate's mean."""
    from atlas_lab.sweep.study import tuned_setting

    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6], ("atlas", "linear"): [0.7, 0.8]},
                            baseline={"model.preset": "atlas", "model.memory": "atlas"})
    study.set_user_attr("tune_keys", ["model.lr"])
    for slot, (lr, values) in enumerate(((1e-3, (0.9, 0.7)), (3e-3, (0.95, 0.75)), (1e-2, (0.1, 0.2)))):
        for seed, v in enumerate(values):
            add_tune_trial(study, "atlas", "atlas", {"model.lr": lr}, slot, v, seed)
    add_tune_trial(study, "atlas", "linear", {"model.lr": 1e-3}, 0, 0.5)
    add_tune_trial(study, "atlas", "linear", {"model.lr": 3e-3}, 1, 0.5)
    columns, rows = result_rows(study)
    assert {r["model.memory"]: r["n"] for r in rows} == {"atlas": 2, "linear": 2}  # the pilots are not points
    assert tuned_setting(study, {"model.preset": "atlas", "model.memory": "atlas"})[0] == {"model.lr": 3e-3}
    assert tuned_setting(study, {"model.preset": "atlas", "model.memory": "linear"})[0] == {"model.lr": 1e-3}
    out = summarize(study, console=Console(width=250, record=True), out_dir=tmp_path)
    tuned = {r["model.memory"]: r for r in csv.DictReader((out / "tuned.csv").open())}
    assert tuned["atlas"]["chosen"] == '{"model.lr": 0.003}'
    assert "lr=0.003: 0.8500" in tuned["atlas"]["candidates"] and "lr=0.01: 0.1500" in tuned["atlas"]["candidates"]
    assert "tuned settings" in (out / "results.md").read_text()


def test_a_point_without_a_stable_candidate_says_where_its_reported_trials_ran(tmp_path):
    """Every candidate of the linear point diverged on a pilot seed: none is chosen, and its reported trials, which
    ran at lr 0.001 before the pilots of more seeds, are named with that setting (tables, results.md, tuned.csv);
    a point whose trials ran at its choice shows the choice alone."""
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6], ("atlas", "linear"): [0.7, 0.8]},
                            baseline={"model.preset": "atlas", "model.memory": "atlas"},
                            tuned={("atlas", "atlas"): {"model.lr": 3e-3}, ("atlas", "linear"): {"model.lr": 1e-3}})
    study.set_user_attr("tune_keys", ["model.lr"])
    add_tune_trial(study, "atlas", "atlas", {"model.lr": 3e-3}, 0, 0.6)
    add_tune_trial(study, "atlas", "linear", {"model.lr": 1e-3}, 0, 0.5)
    labels = {"model.preset": "atlas", "model.memory": "linear"}
    for slot, lr in ((0, 1e-3), (1, 3e-3)):  # a second pilot seed: both diverge
        study.add_trial(create_trial(state=TrialState.FAIL, params=labels, distributions={
            "model.preset": CategoricalDistribution(["atlas", "atlas_mag"]),
            "model.memory": CategoricalDistribution(["atlas", "linear", "gd"])}, user_attrs={
            "labels": labels, "repeat": 1001, "slot": slot, "tune": {"model.lr": lr},
            "fail_reason": "FloatingPointError: non-finite training loss nan at step 9"}))
    console = Console(width=250, record=True)
    out = summarize(study, console=console, out_dir=tmp_path)
    tuned = {r["model.memory"]: r for r in csv.DictReader((out / "tuned.csv").open())}
    assert (tuned["linear"]["chosen"], tuned["linear"]["reported_at"]) == ("null", '[{"model.lr": 0.001}]')
    assert (tuned["atlas"]["chosen"], tuned["atlas"]["reported_at"]) == ('{"model.lr": 0.003}', '[{"model.lr": 0.003}]')
    for text in (console.export_text(), (out / "results.md").read_text()):
        assert "none stable; reported at model.lr=0.001" in text
        assert "model.lr=0.003 (reported" not in text


# --- the cost of a study, from its journal ---

def timed_study(minutes: dict[tuple, list[float]], values: dict[tuple, list[float]], gap_after: int | None = None):
    """A grid study like synthetic_study whose trials ran one after another for the given minutes (a gap of a day
    after trial number ``gap_after``)."""
    from datetime import datetime, timedelta

    study = synthetic_study({k: [None] * 0 for k in values}, baseline={"model.preset": "atlas", "model.memory":
                                                                       "atlas"})
    dists = {"model.preset": CategoricalDistribution(["atlas", "atlas_mag"]),
             "model.memory": CategoricalDistribution(["atlas", "linear", "gd"])}
    clock, number = datetime(2026, 1, 1, 12, 0), 0
    for key, per_repeat in values.items():
        for repeat, (v, m) in enumerate(zip(per_repeat, minutes[key])):
            trial = create_trial(state=TrialState.COMPLETE, value=v, params=dict(zip(("model.preset", "model.memory"),
                                                                                     key)),
                                 distributions=dists, user_attrs={"labels": dict(zip(("model.preset", "model.memory"),
                                                                                     key)), "repeat": repeat})
            trial.datetime_start, trial.datetime_complete = clock, clock + timedelta(minutes=m)
            study.add_trial(trial)
            clock += timedelta(minutes=m) + (timedelta(days=1) if number == gap_after else timedelta())
            number += 1
    return study


def test_the_cost_sums_trial_times_and_sizes_each_open_design_with_its_baseline():
    """baseline 6 minutes a trial, linear (resolved: ahead in every seed) 3, gd (open) 9; gd's design: the seeds
    for ±0.1 at its Holm level, each run for gd and for the baseline: seeds × (9 + 6) minutes."""
    from datetime import timedelta, timezone

    from atlas_lab.sweep.report import study_cost

    values = {("atlas", "atlas"): [0.5, 0.6, 0.7, 0.55], ("atlas", "linear"): [0.9, 0.95, 0.97, 0.93],
              ("atlas", "gd"): [0.6, 0.5, 0.8, 0.45]}
    minutes = {("atlas", "atlas"): [6] * 4, ("atlas", "linear"): [3] * 4, ("atlas", "gd"): [9] * 4}
    study = timed_study(minutes, values, gap_after=3)
    columns, rows = result_rows(study)
    diffs = differences(study, columns, rows, power=0.1)
    cost = study_cost(study, columns, rows, diffs)
    assert cost["trials"] == 12 and cost["trial_hours"] == pytest.approx((24 + 12 + 36) / 60)
    assert cost["busy_hours"] == pytest.approx(72 / 60) and cost["wall_hours"] == pytest.approx(24 + 72 / 60)
    assert cost["minutes"][("atlas", "gd")] == pytest.approx(9) and cost["baseline_minutes"] == pytest.approx(6)
    (design,) = cost["designs"]
    gd = next(d for d in diffs if d["changes"] == "memory=gd")
    lost = create_trial(state=TrialState.FAIL, params={"model.preset": "atlas", "model.memory": "gd"},
                        distributions=study.get_trials()[0].distributions,
                        user_attrs={"labels": {"model.preset": "atlas", "model.memory": "gd"}, "repeat": 9})
    start = study.get_trials()[-1].datetime_complete
    lost.datetime_start, lost.datetime_complete = start, start + timedelta(hours=5)  # noticed lost 5 hours later
    beat = (start + timedelta(minutes=4)).replace(tzinfo=timezone.utc).timestamp()  # its worker's last sign of life
    lost.set_user_attr("heartbeat", beat)
    study.add_trial(lost)
    assert study_cost(study, columns, rows, diffs)["trial_hours"] == pytest.approx((24 + 12 + 36 + 4) / 60)
    assert design["changes"] == "memory=gd" and design["seeds"] == gd["seeds"] > 4
    assert design["hours"] == pytest.approx(gd["seeds"] * (9 + 6) / 60) == cost["open_hours"]


def test_report_cost_is_written_and_needs_a_difference_to_size_for(tmp_path, monkeypatch, capsys):
    from atlas_lab.cli import main

    values = {("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "gd"): [0.6, 0.5, 0.8]}
    study = timed_study({k: [2, 2, 2] for k in values}, values)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    copy = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    for key, value in study.user_attrs.items():
        copy.set_user_attr(key, value)
    for t in study.get_trials():
        copy.add_trial(t)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "s", "--storage", storage, "--cost"]) == 2
    err = capsys.readouterr().err
    assert "--cost: study 's' declares no margin; expected --power DELTA" in err and err.count("\n") == 1
    assert not (tmp_path / "runs" / "sweeps" / "s" / "cost.md").exists()
    assert main(["report", "s", "--storage", storage, "--cost", "--power", "0.1"]) == 0
    md = (tmp_path / "runs" / "sweeps" / "s" / "cost.md").read_text()
    assert md.startswith("6 trials, 0.20 trial-hours") and "| memory=gd | 2.0 |" in md


def test_a_value_that_rounds_to_zero_is_shown_without_a_sign():
    from atlas_lab.sweep.report import _fmt

    assert [_fmt(v) for v in (-0.00001, 0.0, -0.00006, -0.5, 1.0)] == ["0.0000", "0.0000", "-0.0001", "-0.5000",
                                                                     "1.0000"]
