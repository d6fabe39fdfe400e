"""A study's quality against its cost: each grid point's tokens/s and s/step beside its metric, read back from its
trials' MLflow runs, the plot of the metric against tokens/s with its Pareto front, and ``--estimate``'s projection
checked against the hours the journal measured; all on the parent run. A study known by hand in a real MLflow store
runs by default; the whole path (--estimate, the sweep's fits, the report) under -m slow, and the UI test looks at
the plot on the parent run.

Error model: the report's numbers are means of the values it reads (the runs' metrics, the journal's times), so they
equal the same means taken here to float64 rounding (relative 1e-9); the measured ÷ projected ratio likewise.
"""
import csv
import io
import json
import statistics
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from atlas_lab.cli import main
from atlas_lab.sweep.costs import pareto
from atlas_lab.sweep.report import summarize
from atlas_lab.sweep.tracking import child_run, experiment_id, init_store, parent_run
from sweep_helpers import load, runs_of, write_sweep

# a study of two points, two seeds each: (preset, repeat) -> (val/acc, tokens/s, s/step, minutes the trial ran)
TRIALS = {("gla", 0): (0.50, 1000.0, 0.020, 3.0), ("gla", 1): (0.60, 1200.0, 0.018, 5.0),
          ("deltanet", 0): (0.70, 600.0, 0.030, 6.0), ("deltanet", 1): (0.80, 800.0, 0.026, 8.0)}


def test_pareto_front_keeps_the_points_no_other_beats_on_both():
    points = [(100.0, 0.5), (200.0, 0.4), (150.0, 0.6), (50.0, 0.6), (200.0, 0.4), (120.0, 0.3)]
    assert pareto(points, maximize=True) == [1, 2, 4]  # (50, 0.6) is as good as (150, 0.6) but slower
    assert pareto(points, maximize=False) == [1, 4, 5]  # lower is better: (120, 0.3) beats (100, 0.5)


def test_the_report_reads_each_trials_cost_from_its_run_and_sets_the_estimate_beside_the_journal(tmp_path,
                                                                                                monkeypatch):
    """A study whose answers are known by hand, in a real MLflow store: each trial's run holds its steady cost, the
    journal its times, runs/sweeps/<study>/estimate.json the projection (gla piloted at 4 minutes a fit, deltanet
    at 5; 0.5 h in all)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    init_store(uri)
    client = MlflowClient(uri)
    experiment_id(client)
    parent = parent_run(client, "costs", "memory")
    study = optuna.create_study(study_name="costs", direction="maximize")
    for key, value in (("metric", "val/acc"), ("direction", "maximize"), ("sampler", "grid"),
                       ("grid_keys", ["model.preset"]), ("mlflow_parent_run_id", parent)):
        study.set_user_attr(key, value)
    start = datetime(2026, 1, 1, 12, 0)
    for number, ((preset, repeat), (acc, tokens, step, minutes)) in enumerate(TRIALS.items()):
        run = child_run(client, parent, "costs", number, f"{preset} {repeat}", {"sweep.repeat": str(repeat)})
        client.log_metric(run, "cost/steady/tokens_per_s", tokens)
        client.log_metric(run, "cost/steady/s_per_step", step)
        trial = create_trial(state=TrialState.COMPLETE, value=acc, params={"model.preset": preset},
                             distributions={"model.preset": CategoricalDistribution(["gla", "deltanet"])},
                             user_attrs={"labels": {"model.preset": preset}, "repeat": repeat,
                                         "mlflow_run_ids": [run]})
        trial.datetime_start, trial.datetime_complete = start, start + timedelta(minutes=minutes)  # the journal's
        study.add_trial(trial)
    Path("runs/sweeps/costs").mkdir(parents=True)
    estimate = {"study": "costs", "when": "2026-01-01T11:00:00+00:00", "steps": 20, "device": "cpu, 1 thread",
                "hours": 0.5, "pilot_seconds": 6.0,
                "points": [{"label": "preset=gla", "labels": [{"model.preset": "gla"}], "fits": 2,
                            "hours_a_fit": 4 / 60, "error": None},
                           {"label": "preset=deltanet", "labels": [{"model.preset": "deltanet"}], "fits": 2,
                            "hours_a_fit": 5 / 60, "error": None}]}
    Path("runs/sweeps/costs/estimate.json").write_text(json.dumps(estimate))
    printed = io.StringIO()
    summarize(study, client, parent, console=Console(file=printed, width=200), out_dir=tmp_path / "out")
    with open(tmp_path / "out" / "quality_cost.csv") as f:
        rows = {r["model.preset"]: {k: v for k, v in r.items()} for r in csv.DictReader(f)}
    assert list(rows) == ["deltanet", "gla"]  # best first
    for preset, tokens, step, hours, projected in (("gla", 1100, 0.019, 4 / 60, 4 / 60),
                                                  ("deltanet", 700, 0.028, 7 / 60, 5 / 60)):
        row = rows[preset]
        assert float(row["tokens_per_s"]) == pytest.approx(tokens, rel=1e-9)
        assert float(row["s_per_step"]) == pytest.approx(step, rel=1e-9)
        assert float(row["hours"]) == pytest.approx(hours, rel=1e-9)
        assert float(row["projected"]) == pytest.approx(projected, rel=1e-9)
        assert float(row["ratio"]) == pytest.approx(hours / projected, rel=1e-9)
        half = 12.706204736174698 * 100  # t(0.975, 1) · s / √2, s = 100 √2 for both points
        assert float(row["tokens_low"]) == pytest.approx(tokens - half, rel=1e-9)
    metrics = client.get_run(parent).data.metrics
    assert metrics["measured/trial_hours"] == pytest.approx(22 / 60, rel=1e-9)
    assert metrics["estimate/hours"] == 0.5 and metrics["tokens_per_s/gla"] == pytest.approx(1100, rel=1e-9)
    assert metrics["estimate/hours_a_fit/deltanet"] == pytest.approx(5 / 60, rel=1e-9)
    artifacts = {a.path for a in client.list_artifacts(parent, "summary")}
    assert {"summary/quality_cost.csv", "summary/quality_cost.md", "summary/quality_cost.png"} <= artifacts
    assert [a.path for a in client.list_artifacts(parent, "estimate")] == ["estimate/estimate.json"]
    out = " ".join(printed.getvalue().split())
    assert "measured: 0.367 trial-hours against 0.500 h projected by --estimate 20 (cpu, 1 thread, " \
           "2026-01-01T11:00:00+00:00, in 6 s); measured ÷ projected 0.73" in out


@pytest.mark.slow
def test_report_sets_tokens_per_second_beside_the_metric_and_checks_the_estimate(sweep_dir, capsys):
    sweep = write_sweep("grid.yaml", repeats=2, grid={"model.preset": ["gla", "deltanet"]})
    assert main(["sweep", sweep, "--estimate", "3"]) == 0
    estimate = json.loads(Path("runs/sweeps/s/estimate.json").read_text())
    assert [p["labels"] for p in estimate["points"]] == [[{"model.preset": "gla"}], [{"model.preset": "deltanet"}]]
    assert estimate["hours"] == pytest.approx(sum(p["fits"] * p["hours_a_fit"] for p in estimate["points"]),
                                              rel=1e-9)
    capsys.readouterr()
    assert main(["sweep", sweep]) == 0
    client, (parent,), children = runs_of()
    study = load()

    # each point's tokens/s and s/step: the mean over its seeds of the trial runs' steady cost
    with open("runs/sweeps/s/quality_cost.csv") as f:
        rows = {r["model.preset"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"gla", "deltanet"}
    seconds = {}
    for t in study.get_trials():
        seconds.setdefault(t.params["model.preset"], []).append((t.datetime_complete - t.datetime_start)
                                                                .total_seconds())
    for preset, row in rows.items():
        runs = [c for c in children if json.loads(c.data.tags["sweep.labels"])["model.preset"] == preset]
        assert len(runs) == 2 and all(c.data.metrics["cost/steady/tokens_per_s"] > 0 for c in runs)
        for key in ("tokens_per_s", "s_per_step"):
            assert float(row[key]) == pytest.approx(statistics.fmean(c.data.metrics[f"cost/steady/{key}"]
                                                                     for c in runs), rel=1e-9)
        assert float(row["tokens_low"]) < float(row["tokens_per_s"]) < float(row["tokens_high"])
        hours = statistics.fmean(seconds[preset]) / 3600
        projected = next(p["hours_a_fit"] for p in estimate["points"] if p["labels"] == [{"model.preset": preset}])
        assert float(row["hours"]) == pytest.approx(hours, rel=1e-9)
        assert float(row["projected"]) == pytest.approx(projected, rel=1e-9)
        assert float(row["ratio"]) == pytest.approx(hours / projected, rel=1e-9)
        assert parent.data.metrics[f"tokens_per_s/{preset}"] == pytest.approx(float(row["tokens_per_s"]), rel=1e-9)
    measured = sum(sum(s) for s in seconds.values()) / 3600
    assert parent.data.metrics["measured/trial_hours"] == pytest.approx(measured, rel=1e-9)
    assert parent.data.metrics["estimate/hours"] == pytest.approx(estimate["hours"], rel=1e-9)

    # the plot and the estimate on the parent run, beside the report's other files
    summary = {a.path for a in client.list_artifacts(parent.info.run_id, "summary")}
    assert {"summary/quality_cost.png", "summary/quality_cost.csv", "summary/quality_cost.md",
            "summary/ablation.png"} <= summary
    assert Path("runs/sweeps/s/quality_cost.png").stat().st_size > 0
    logged = client.download_artifacts(parent.info.run_id, "estimate/estimate.json", str(sweep_dir))
    assert json.loads(Path(logged).read_text()) == estimate

    # atlas-lab report prints the table and the measured hours against the projection
    capsys.readouterr()
    assert main(["report", "s"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tokens/s" in out and f"measured: {measured:.3f} trial-hours against {estimate['hours']:.3f} h " \
                                  "projected by --estimate 3" in out
