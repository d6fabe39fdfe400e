"""A sweep worker: claims waiting trials one at a time and runs each as a Lightning fit.

    python -m atlas_lab.sweep.worker SWEEP_FILE --storage URL --tracking-uri URI --parent RUN_ID

A trial's exception or non-finite loss fails that trial (reason kept in Optuna and MLflow) and the
worker goes on with the next one.
"""
from __future__ import annotations

import argparse
import json
import math
import threading
import traceback

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback
from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from ..lit.cli import AtlasCLI, SaveConfigToTracking
from ..lit.module import SequenceModel
from . import study as studies
from .spec import SweepSpec, cli_args, load_sweep
from .tracking import child_run, finish_run, flatten


class OptunaPruning(Callback):
    """Reports the sweep metric to Optuna after every validation epoch and stops a trial the pruner prunes."""

    def __init__(self, trial: optuna.Trial, metric: str):
        self.trial, self.metric = trial, metric

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch
        self.trial.report(float(trainer.callback_metrics[self.metric]), step=epoch)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at epoch {epoch}")


class TrialCLI(AtlasCLI):
    """The run's config with the trial's logger (its MLflow child run) and without progress bars or checkpoints."""

    def __init__(self, *args, run_id: str, tracking_uri: str, root_dir: str, **kwargs):
        self.run_id, self.tracking_uri, self.root_dir = run_id, tracking_uri, root_dir
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self):
        trainer = self.config["trainer"]
        trainer["logger"] = {"class_path": "lightning.pytorch.loggers.MLFlowLogger",
                             "init_args": {"tracking_uri": self.tracking_uri, "run_id": self.run_id,
                                           "log_model": False}}
        keep = []
        for cb in trainer.get("callbacks") or []:
            path = cb["class_path"] if isinstance(cb, dict) else cb.class_path
            if not any(s in path for s in ("ProgressBar", "ModelCheckpoint", "ModelSummary")):
                keep.append(cb)
        trainer["callbacks"] = keep
        trainer["enable_progress_bar"] = False
        trainer["enable_checkpointing"] = False
        trainer["enable_model_summary"] = False
        trainer["default_root_dir"] = self.root_dir


def _suggest(trial: optuna.Trial, key: str, spec: dict):
    if "choices" in spec:
        return trial.suggest_categorical(key, spec["choices"])
    if spec.get("int") or (isinstance(spec["low"], int) and isinstance(spec["high"], int) and not spec.get("log")):
        return trial.suggest_int(key, int(spec["low"]), int(spec["high"]), log=bool(spec.get("log", False)))
    return trial.suggest_float(key, float(spec["low"]), float(spec["high"]), log=bool(spec.get("log", False)))


def _log_learning_curves(client: MlflowClient, run_id: str, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["train/loss", metric] + (["val/loss"] if metric != "val/loss" else [])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.2))
    for ax, name in zip(axes, names):
        history = client.get_metric_history(run_id, name)
        ax.plot([m.step for m in history], [m.value for m in history], marker="." if len(history) < 30 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.tight_layout()
    client.log_figure(run_id, fig, "learning_curves.png")
    plt.close(fig)


def _log_slices(client: MlflowClient, run_id: str, metrics: dict) -> None:
    rows = sorted((k, float(v)) for k, v in metrics.items() if "/acc/" in k)
    if rows:
        text = "| slice | accuracy |\n|---|---|\n" + "".join(f"| {k} | {v:.4f} |\n" for k, v in rows)
        client.log_text(run_id, text, "slices.md")


def fit_once(spec: SweepSpec, trial: optuna.Trial, overrides: dict, run_id: str, tracking_uri: str,
             prune: bool) -> float:
    """One Lightning fit logged to MLflow run ``run_id``; returns the final value of ``spec.metric``."""
    client = MlflowClient(tracking_uri)
    callbacks = [OptunaPruning(trial, spec.metric)] if prune else []
    cli = TrialCLI(SequenceModel, L.LightningDataModule, subclass_mode_data=True, run=False,
                   args=cli_args(spec.base, overrides), save_config_callback=SaveConfigToTracking,
                   save_config_kwargs={"overwrite": True}, trainer_defaults={"callbacks": callbacks},
                   run_id=run_id, tracking_uri=tracking_uri,
                   root_dir=f"runs/sweeps/{spec.study}/trial-{trial.number}")
    params = flatten(cli.config)
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i:i + 100])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    metrics = {k: v for k, v in cli.trainer.callback_metrics.items()}
    _log_slices(client, run_id, metrics)
    if spec.metric not in metrics:
        raise KeyError(f"metric {spec.metric!r} was not logged; logged metrics: {sorted(metrics)}")
    value = float(metrics[spec.metric])
    if not math.isfinite(value):
        raise FloatingPointError(f"{spec.metric} is {value}")
    _log_learning_curves(client, run_id, spec.metric)
    return value


def run_trial(spec: SweepSpec, study: optuna.Study, trial: optuna.Trial, tracking_uri: str, parent: str) -> None:
    """Run a claimed trial to the end and tell Optuna its state; never raises for a failing trial."""
    client = MlflowClient(tracking_uri)
    labels = {k: trial.suggest_categorical(k, list(spec.grid[k])) for k in spec.grid}
    sampled = {k: _suggest(trial, k, s) for k, s in spec.search.items()}
    repeat = trial.user_attrs.get("repeat", 0)
    seeds = [repeat] if spec.sampler == "grid" else list(range(spec.repeats))
    values, run_ids, run_id = [], [], None
    try:
        for seed in seeds:
            run_id = child_run(client, parent, spec.study, trial.number, seed)
            run_ids.append(run_id)
            trial.set_user_attr("mlflow_run_ids", run_ids)
            client.set_tag(run_id, "sweep.labels", json.dumps(labels))
            overrides = {**spec.overrides(labels, sampled), "seed_everything": seed}
            values.append(fit_once(spec, trial, overrides, run_id, tracking_uri, prune=seed == seeds[0]))
            finish_run(client, run_id, "COMPLETE")
    except optuna.TrialPruned as e:
        finish_run(client, run_id, "PRUNED", str(e))
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    except Exception as e:  # the trial fails, the study goes on
        reason = f"{type(e).__name__}: {e}"
        trial.set_user_attr("fail_reason", reason[:2000])
        trial.set_user_attr("traceback", traceback.format_exc()[-4000:])
        if run_id is not None:
            finish_run(client, run_id, "FAIL", reason)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    study.tell(trial, sum(values) / len(values))


def work(spec: SweepSpec, storage: str, tracking_uri: str, parent: str) -> int:
    """Claim and run trials until the queue is empty; returns how many this worker ran."""
    study = studies.load_study(spec, storage)
    done = 0
    while (trial := studies.claim_waiting_trial(study)) is not None:
        for key, value in studies.owner_attrs().items():
            trial.set_user_attr(key, value)
        stop = threading.Event()

        def heartbeat(trial_id=trial._trial_id):
            while not stop.wait(studies.HEARTBEAT_SECONDS):
                studies.beat(study, trial_id)

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        try:
            run_trial(spec, study, trial, tracking_uri, parent)
        finally:
            stop.set()
            thread.join()
        done += 1
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sweep")
    ap.add_argument("--storage", required=True)
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--parent", required=True)
    args = ap.parse_args(argv)
    work(load_sweep(args.sweep), args.storage, args.tracking_uri, args.parent)


if __name__ == "__main__":
    main()
