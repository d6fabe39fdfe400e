"""Sweeps end to end with real Optuna storage and a real MLflow store in a temporary folder."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from atlas_lab.cli import main
from atlas_lab.sweep.tracking import finish_run
from sweep_helpers import ROOT, load, runs_of, write_sweep

def test_grid_with_repeats_runs_every_point_once_under_one_parent(workdir):
    sweep = write_sweep("grid.yaml", repeats=2, grid={"model.preset": ["gla", "deltanet"], "model.lr": [1e-3, 3e-3]},
                        fixed={"trainer.max_epochs": 1}, baseline={"model.preset": "gla", "model.lr": 1e-3})
    assert main(["sweep", sweep]) == 0
    trials = load().get_trials()
    assert len(trials) == 8 and all(t.state == TrialState.COMPLETE for t in trials)
    points = sorted((t.params["model.preset"], t.params["model.lr"], t.user_attrs["repeat"]) for t in trials)
    assert len(set(points)) == 8
    client, parents, children = runs_of()
    assert len(parents) == 1 and len(children) == 8
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    # repeat r adds r to both seeds (initialisation and data), the same r at every point: the points are paired
    seeds = sorted((c.info.run_name, c.data.params["seed_everything"], c.data.params["data.init_args.seed"])
                   for c in children)
    assert seeds == sorted((f"lr={lr} preset={m} seed={r}", str(r), str(r))  # grid keys in file order
                           for m in ("gla", "deltanet") for lr in (0.001, 0.003) for r in (0, 1))
    child = children[0]
    # params: the flattened resolved config, each key once (not Lightning's hparams again as lr, memory/memory)
    assert not {"lr", "preset", "d_model"} & set(child.data.params) and not any("/" in k for k in child.data.params)
    assert [m for m in child.data.metrics if "lr" in m] == ["train/lr"]  # one line per rate, not one per group
    assert child.data.params["model.preset"] in ("gla", "deltanet") and "trainer.max_epochs" in child.data.params
    assert child.data.tags["optuna.state"] == "COMPLETE" and "val/acc" in child.data.metrics
    artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"config.yaml", "learning_curves.png", "slices.md"} <= artifacts
    summary = {a.path for a in client.list_artifacts(parents[0].info.run_id, "summary")}
    assert {"summary/results.csv", "summary/results.md", "summary/ablation.png"} <= summary
    table = Path("runs/sweeps/s/results.md").read_text()
    assert table.count("| 2 |") >= 4 and "paired differences to the baseline" in table  # 4 points of 2 seeds each
    # the parent run carries the summary: the grid axes as params, the best and per-point means as metrics
    summary = parents[0].data
    assert summary.params["grid.model.preset"] == "gla, deltanet" and summary.params["study.metric"] == "val/acc"
    assert {"best/val/acc", "mean/0.001 gla", "mean/0.003 deltanet", "diff/0.003 gla"} <= set(summary.metrics)
    assert summary.tags["atlas_lab.baseline"] == "0.001 gla"
    # the workers' logs hold no other package's noise (atlas_lab/noise.py applies in workers too)
    logs = "".join(p.read_text() for p in Path("runs/sweeps/s").glob("worker-*.log"))
    assert "Warning" not in logs and "Tip:" not in logs, logs
    # running the same command again resumes: nothing new runs
    assert main(["sweep", sweep]) == 0
    assert len(load().get_trials()) == 8 and len(runs_of()[2]) == 8
    # the report command prints and writes the same table
    os.remove("runs/sweeps/s/results.md")
    assert main(["report", "s"]) == 0 and Path("runs/sweeps/s/results.md").read_text() == table


@pytest.mark.slow  # ~60 s; the default suite has workers and a tracking server in test_faults (a killed sweep takes
# them along) and one grid claimed once by racing commands (test_sweep_scale, on PostgreSQL)
def test_two_workers_share_one_grid_through_a_tracking_server(workdir, capsys):
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3, 3e-3, 4e-3]})
    assert main(["sweep", sweep, "--workers", "2"]) == 0
    trials = load().get_trials()
    assert sorted(t.params["model.lr"] for t in trials) == [1e-3, 2e-3, 3e-3, 4e-3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["pid"] for t in trials}) == 2  # both workers took trials
    assert len(runs_of()[2]) == 4
    # only links that work: none of MLflow's to the server the command has stopped, the command that serves the runs
    out = capsys.readouterr().out + "".join(p.read_text() for p in Path("runs/sweeps/s").glob("worker-*.log"))
    assert "View run" not in out and "View experiment" not in out and "/#/experiments/" not in out, out
    assert out.count("browse its runs: atlas-lab ui --study s\n") == 1
    # the journal outlives its MLflow store (another machine, a lost runs/mlflow.db): the resume makes a new parent
    other = "sqlite:///" + str(Path("other.db").resolve())
    assert main(["sweep", sweep, "--tracking-uri", other]) == 0
    hint = f"browse its runs: atlas-lab ui --study s --tracking-uri {other}"
    assert "".join(hint.split()) in "".join(capsys.readouterr().out.split())  # the console folds long lines
    parents = MlflowClient(other).search_runs([MlflowClient(other).get_experiment_by_name("atlas-lab-sweeps")
                                               .experiment_id], filter_string="tags.`atlas_lab.role` = 'study'")
    assert len(parents) == 1 and load().user_attrs["mlflow_parent_run_id"] == parents[0].info.run_id
    finish_run(MlflowClient(other), runs_of()[2][0].info.run_id, "FAIL", "worker lost")  # a lost trial's old run
    # one worker writes to the store directly (no server) beside the experiment the 2-worker study created
    one = write_sweep("one.yaml", study="t", grid={"model.lr": [1e-3]})
    assert main(["sweep", one]) == 0 and load("t").get_trials()[0].state == TrialState.COMPLETE


@pytest.mark.slow  # ~16 s; the default suite has a trial ending before its first validation (test_the_end_of_fit_...)
def test_a_smoke_study_of_a_few_steps_measures_each_trial_at_its_end(workdir):
    """The study a user runs first: a grid over seeds and trainer.max_steps, here 2 steps (before the first
    validation, after the epoch's 4 batches) and 4 (on it). `atlas-lab sweep` completes every trial with the metric
    of its validation at the end, which ran once (MLflow holds one value, the trial's)."""
    sweep = write_sweep("smoke.yaml", grid={"seed_everything": [0], "trainer.max_steps": [2, 4]})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = load().get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials), done.stdout
    client, _, children = runs_of()
    for child in children:
        trial = next(t for t in trials if str(t.number) == child.data.tags["optuna.trial_number"])
        history = client.get_metric_history(child.info.run_id, "val/acc")
        assert [m.value for m in history] == [trial.value], (child.info.run_name, history)


@pytest.mark.slow
def test_a_grid_over_a_component_option_reaches_the_component(workdir):
    """model.memory.optimizer.ns_steps on atlas (optimizer: muon, written as a short-hand by the preset): each
    trial's muon takes its value; the option is logged with the child's config. (slow: two atlas trials through
    `atlas-lab sweep`; the default suite checks the option's path through the CLI in tests/memory/test_components.py
    and every shipped sweep's grid points, sweeps/ns_steps.yaml's among them, in test_shipped_sweep_files_are_valid)"""
    sweep = write_sweep("ns.yaml", grid={"model.memory.optimizer.ns_steps": [1, 3]},
                        fixed={"model.preset": "atlas", "model.memory_heads": 2, "trainer.max_steps": 2})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(t.state == TrialState.COMPLETE for t in load().get_trials()) and len(load().get_trials()) == 2
    logged = sorted(child.data.params["model.memory.optimizer.ns_steps"] for child in runs_of()[2])
    assert logged == ["1", "3"]


def test_nan_loss_fails_its_trial_and_the_study_goes_on(workdir):
    sweep = write_sweep("nan.yaml", grid={"model.lr": [1.0e+30, 3.0e-3]}, fixed={"trainer.gradient_clip_val": None})
    assert main(["sweep", sweep]) == 0
    by_lr = {t.params["model.lr"]: t for t in load().get_trials()}
    assert by_lr[1e30].state == TrialState.FAIL
    assert "non-finite" in by_lr[1e30].user_attrs["fail_reason"]
    assert by_lr[3e-3].state == TrialState.COMPLETE
    failed = [c for c in runs_of()[2] if c.data.tags["optuna.state"] == "FAIL"]
    assert len(failed) == 1 and "non-finite" in failed[0].data.tags["failure_reason"]
    assert failed[0].info.status == "FAILED"
    assert "| 1e+30 | 0 | — | — | — | 1 | 0 | 0 | 0 | FloatingPointError: non-finite" in \
        Path("runs/sweeps/s/results.md").read_text()  # n 0, failed 1: counted, never averaged in
    # --retry-failed runs the failed point again (it fails again); the first attempt is superseded
    assert main(["sweep", sweep, "--retry-failed"]) == 0
    nan_trials = [t for t in load().get_trials() if t.params["model.lr"] == 1e30]
    assert len(nan_trials) == 2 and all(t.state == TrialState.FAIL for t in nan_trials)
    assert load().user_attrs["superseded_trials"] == [by_lr[1e30].number]
    assert main(["sweep", sweep]) == 0 and len(load().get_trials()) == 3  # without the flag: nothing reruns


def test_median_pruner_prunes_a_hopeless_trial(workdir):
    sweep = write_sweep("prune.yaml", metric="val/loss", direction="minimize",
                        grid={"model.lr": [1.0e-2, 1.0e-9]}, pruner={"type": "median", "warmup_epochs": 0},
                        fixed={"trainer.max_epochs": 3, "trainer.val_check_interval": 0.5})
    assert main(["sweep", sweep]) == 0
    by_lr = {t.params["model.lr"]: t for t in load().get_trials()}
    assert by_lr[1e-2].state == TrialState.COMPLETE
    assert sorted(by_lr[1e-2].intermediate_values) == list(range(6))  # every validation, 2 an epoch, reported
    assert by_lr[1e-9].state == TrialState.PRUNED
    assert len(by_lr[1e-9].intermediate_values) < 6


@pytest.mark.slow  # 52 s; pruning: test_median_pruner_prunes_a_hopeless_trial
def test_the_end_of_fit_validation_is_neither_reported_nor_pruned(workdir):
    """A trial of 12 steps validates on schedule after steps 4, 8 and 12 (epochs of 4 batches); one of 2 steps ends
    before its first scheduled validation, so the fit validates once more at its end (ValidateAtEnd). The median
    pruner (warm-up 0) has the first trial's value at validation 0 to judge by, and the short trial's end-of-fit
    value (2 steps trained) is worse: judged as a validation of the schedule, the short trial would be reported at
    step 0 and PRUNED, its finished fit thrown away. It completes, with nothing reported; the long trial reports its
    three scheduled validations, the last of them on its final step."""
    sweep = write_sweep("end.yaml", metric="val/loss", direction="minimize", grid={"trainer.max_steps": [12, 2]},
                        pruner={"type": "median", "warmup_epochs": 0},
                        fixed={"trainer.max_epochs": 10, "model.lr": 1.0e-2})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    by_steps = {t.params["trainer.max_steps"]: t for t in load().get_trials()}
    assert by_steps[12].state == TrialState.COMPLETE and sorted(by_steps[12].intermediate_values) == [0, 1, 2]
    assert by_steps[2].state == TrialState.COMPLETE, by_steps[2].user_attrs
    assert by_steps[2].intermediate_values == {} and by_steps[2].value > by_steps[12].intermediate_values[0]


@pytest.mark.parametrize("sweep", sorted(p.name for p in (ROOT / "sweeps").glob("*.yaml")))
def test_shipped_sweep_files_are_valid(sweep, monkeypatch, tmp_path):
    """Every grid point of every shipped sweep builds its data and model. A sweep on a corpus the user prepares
    (data.init_args.data_dir: the paper-size language models) is checked on experiments/lm.yaml's data at d_model 32
    and 2 layers: its keys and values, not its sizes (tests/lit/test_lit.py checks those)."""
    import dataclasses

    from atlas_lab.sweep import load_sweep, validate_configs

    monkeypatch.chdir(ROOT)
    spec = load_sweep(f"sweeps/{sweep}")
    configs = [yaml.safe_load(Path(b).read_text()) for b in spec.base]
    if any("data_dir" in c.get("data", {}).get("init_args", {}) for c in configs):
        lm = yaml.safe_load(Path("experiments/lm.yaml").read_text())
        small = tmp_path / "base.yaml"
        small.write_text(yaml.safe_dump({**configs[-1], "data": lm["data"], "trainer": lm["trainer"]}))
        spec = dataclasses.replace(spec, base=[small], fixed={**spec.fixed, "model.d_model": 32, "model.n_layers": 2,
                                                             "model.memory_heads": 2, "model.n_heads": 2})
    validate_configs(spec)


def test_repeat_r_adds_r_to_the_configured_seeds():
    from atlas_lab.sweep.worker import repeat_seeds

    config = {"seed_everything": 7, "data": {"init_args": {"seed": 12345}}}
    assert repeat_seeds(config, 0) == {"seed_everything": 7, "data.init_args.seed": 12345}
    assert repeat_seeds(config, 2) == {"seed_everything": 9, "data.init_args.seed": 12347}
    # seed_everything true (a random seed) or absent counts as 0; a data module without a seed keeps its data
    assert repeat_seeds({"seed_everything": True, "data": {"init_args": {}}}, 1) == {"seed_everything": 1}


def test_report_columns_use_the_shortest_unique_key_suffix():
    from atlas_lab.sweep.spec import short_names
    keys = ["model.memory.architecture", "model.memory.optimizer", "model.lr", "data.init_args.lr"]
    assert short_names(keys) == ["architecture", "optimizer", "model.lr", "init_args.lr"]


@pytest.mark.slow  # 14 real fits on two workers: about two minutes of a test worker
def test_a_tuned_study_reports_each_point_at_its_pilot_choice(workdir):
    """`tune:` on model.lr (1e-6: the model does not learn; 0.01: it does) with 3 pilot seeds, steps to val/loss ≤ 4.0
    as the summary (the untrained loss is ln 64 ≈ 4.16; at 0.01 it is 3.94 or below after the 32 steps), two
    workers. Each point's pilot trials (seeds 1000-1002, never reported) run first; its reported repeats then run at the
    candidate with the fewest steps, and every trial logs every summary of its curve. The lr-1e-6 pilots never reach
    the threshold: censored at the 32 steps trained."""
    sweep = write_sweep("tuned.yaml", metric="val/loss", direction="minimize", summary={"steps_to": 4.0},
                        repeats=1, grid={"model.preset": ["gla", "deltanet"]},
                        tune={"grid": {"model.lr": [1.0e-6, 0.01]}, "seeds": 3},
                        fixed={"model.warmup_steps": 0, "data.init_args.train_slices": [[16, 2, 512]],
                               "trainer.val_check_interval": 0.5},
                        baseline={"model.preset": "gla"})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep, "--workers", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = load().get_trials()
    assert len(trials) == 14 and all(t.state == TrialState.COMPLETE for t in trials), done.stdout
    pilots = [t for t in trials if "tune" in t.user_attrs]
    reported = [t for t in trials if "tune" not in t.user_attrs]
    assert sorted(t.user_attrs["repeat"] for t in pilots) == [1000] * 4 + [1001] * 4 + [1002] * 4
    for t in pilots:
        lr = t.user_attrs["tune"]["model.lr"]
        assert t.user_attrs["censored"] == [lr == 1e-6] and (t.value == 32) >= (lr == 1e-6), (lr, t.value)
    assert all(t.user_attrs["tuned"] == {"model.lr": 0.01} for t in reported)
    for point in ("gla", "deltanet"):  # a point's reported trials wait for its pilots
        assert min(t.datetime_start for t in reported if t.params["model.preset"] == point) > \
            max(t.datetime_complete for t in pilots if t.params["model.preset"] == point)
    client, _, children = runs_of()
    by_number = {t.number: t for t in trials}
    for child in children:
        trial = by_number[int(child.data.tags["optuna.trial_number"])]
        metrics, params = child.data.metrics, child.data.params
        assert {"val/loss.final", "val/loss.best", "val/loss.mean", "val/loss.steps_to_4"} <= set(metrics)
        assert metrics["val/loss.steps_to_4"] == trial.value
        assert float(params["model.lr"]) == trial.user_attrs.get("tune", {"model.lr": 0.01})["model.lr"]
        assert int(params["seed_everything"]) == trial.user_attrs["repeat"]
    assert "tuned settings" in done.stdout and "(Gehan)" in done.stdout  # the header may wrap at 80 columns
