"""A sweep worker: claims waiting trials one at a time and runs each as a Lightning fit.

    python -m atlas_lab.sweep.worker SWEEP_FILE --storage URL --tracking-uri URI --parent RUN_ID \
        --worker-id ID --driver-pid PID

The sweep command starts it. A trial's exception or non-finite loss fails that trial (reason kept in
Optuna and MLflow) and the worker goes on with the next one. A trial of one process is fitted in the
worker; a trial of several (``trainer.devices`` or ``num_nodes`` above 1) is one job
(``atlas_lab.sweep.job``) whose ranks Lightning's launcher starts, so the worker claims it once and no
rank ever claims anything. While it lives the worker beats into its trial, and it ends itself, and
its job's processes, as soon as the sweep command that started it is gone (the command also has the
kernel kill it then: ``PR_SET_PDEATHSIG``), and it never claims a trial once the command is gone.

Threads: the workers of every sweep command on the machine share its cores. Unless the user set
``OMP_NUM_THREADS``, a worker registers in ``ATLAS_LAB_WORKER_REGISTRY`` (default
``$TMPDIR/atlas-lab-workers``) and trains with max(1, cores // live workers) threads, counted again
every few seconds during a fit, so a second sweep started beside a first one slows neither several-fold.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from optuna.exceptions import UpdateFinishedTrialError

from ..noise import quiet
from ..lit.cli import AtlasCLI, SaveConfigToTracking, check_config
from ..lit.module import SequenceModel
from . import study as studies
from .curve import LearningCurve
from .spec import SweepSpec, cli_args, load_sweep
from .tracking import child_run, finish_run


def fit_ends(trainer) -> bool:
    """Whether the training batch just run ends the fit: a stop was asked for (``trainer.should_stop``: early
    stopping, max_time, the end-of-fit validation's request), max_steps is reached, or it is the last batch of the
    last epoch."""
    if trainer.should_stop:
        return True
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return True
    last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    return bool(last_batch) and trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs


def scheduled(trainer) -> bool:
    """Whether the validation schedule (``val_check_interval``, ``check_val_every_n_epoch``) has a validation after
    the training batch just run, whatever stop was asked for: Lightning's own decision, taken again without
    ``should_stop`` (which makes the loop validate one more time)."""
    loop = trainer.fit_loop.epoch_loop
    decide = getattr(loop, "_should_check_val_fx", None)
    if decide is None:
        return False
    stop = trainer.should_stop
    trainer.should_stop = False
    try:
        return bool(decide(getattr(trainer.fit_loop, "_data_fetcher", None)))
    except Exception:
        return False
    finally:
        trainer.should_stop = stop


class OptunaPruning(Callback):
    """Reports the sweep metric to Optuna after every validation of the fit's schedule, as step 0, 1, 2, … (one
    per epoch, or several with ``trainer.val_check_interval`` below 1), and stops a trial the pruner prunes. Under
    DDP rank 0 reports and decides, and every rank stops together.

    When the fit ends it is never pruned: the training is over, and pruning would mark a trial that trained to its
    end PRUNED and drop its result. The validation that ``ValidateAtEnd`` adds at the end of a fit whose last steps
    no scheduled validation saw is not reported either: only the trials that end between two scheduled validations
    have it, so its step would set one trial's end beside another's middle. A scheduled validation that falls on the
    fit's last step is reported as any other. The end-of-fit validation is told apart by the fit having ended
    (``fit_ends``) with no validation scheduled there (``scheduled``), or by running outside a training epoch (from
    ``on_train_end``); every rank tells it alike."""

    def __init__(self, trial: optuna.Trial, metric: str):
        self.trial, self.metric, self.validations = trial, metric, 0
        self.in_epoch = False

    def on_train_epoch_start(self, trainer, pl_module):
        self.in_epoch = True

    def on_train_epoch_end(self, trainer, pl_module):
        self.in_epoch = False

    def on_train_end(self, trainer, pl_module):
        self.in_epoch = False

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not self.in_epoch or self.metric not in trainer.callback_metrics:
            return
        ending = fit_ends(trainer)
        if ending and not scheduled(trainer):
            return
        step, prune = self.validations, False
        self.validations += 1
        if trainer.is_global_zero:
            self.trial.report(float(trainer.callback_metrics[self.metric]), step=step)
            prune = not ending and self.trial.should_prune()
        if trainer.strategy.broadcast(prune):
            raise optuna.TrialPruned(f"pruned at validation {step} (epoch {trainer.current_epoch})")


def registry() -> Path:
    """Where the sweep workers of this machine register (``ATLAS_LAB_WORKER_REGISTRY``)."""
    return Path(os.environ.get("ATLAS_LAB_WORKER_REGISTRY") or Path(tempfile.gettempdir()) / "atlas-lab-workers")


def machine_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CoreShare(Callback):
    """This machine's cores shared among the sweep workers running on it, whatever command started them: each
    worker holds an ``flock`` on a file of its own in ``registry()`` while it lives (the kernel drops it when the
    worker dies, however it dies), and trains with max(1, cores // workers holding one) threads. During a fit the
    count is taken again every ``every`` seconds and ``torch.set_num_threads`` follows it, so a worker that started
    alone gives cores back when another sweep starts, and takes them again when it ends. ``used``: the thread counts
    of the current fit, in order. Off (``enabled`` False) when the user set OMP_NUM_THREADS or the registry cannot
    be written: then the threads are the environment's."""

    def __init__(self, enabled: bool, every: float = 2.0):
        self.enabled, self.every, self.used = enabled, every, []
        self._file, self._last = None, 0.0
        if enabled:
            try:
                folder = registry()
                folder.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    folder.chmod(0o1777)  # every user's workers share the machine's cores
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".new-")
                self._file = os.fdopen(fd, "w")
                fcntl.flock(self._file, fcntl.LOCK_EX)
                os.rename(tmp, folder / f"{socket.gethostname()}-{os.getpid()}.worker")  # counted once locked
            except OSError:
                self.enabled = False

    @staticmethod
    def live() -> int:
        """The workers registered and alive (their file's flock is held); the files of dead ones are removed."""
        count = 0
        for path in registry().glob("*.worker"):
            try:
                with open(path) as f:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        count += 1
                        continue
                    path.unlink(missing_ok=True)  # its worker is gone
            except OSError:
                continue
        return count

    def threads(self) -> int:
        return max(1, machine_cores() // max(1, self.live()))

    def adjust(self, force: bool = False) -> None:
        if not self.enabled or (not force and time.monotonic() - self._last < self.every):
            return
        import torch

        self._last = time.monotonic()
        n = self.threads()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        if not self.used or self.used[-1] != n:
            self.used.append(n)

    def on_fit_start(self, trainer, pl_module):
        self.used = []
        self.adjust(force=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.adjust()


class TrialCLI(AtlasCLI):
    """The run's config with the trial's logger (its MLflow child run) and without progress bars or checkpoints."""

    def __init__(self, *args, run_id: str, tracking_uri: str, root_dir: str, **kwargs):
        self.run_id, self.tracking_uri, self.root_dir = run_id, tracking_uri, root_dir
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self):
        trainer = self.config["trainer"]
        trainer["logger"] = {"class_path": "atlas_lab.lit.cli.RunLogger",
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
             prune: bool, cores: CoreShare | None = None) -> dict[str, float]:
    """One Lightning fit logged to MLflow run ``run_id``; returns the trainer's final metrics and the summaries of
    the metric's learning curve (curve.py). Under DDP every rank runs it (metrics are reduced across ranks); rank 0
    alone logs to MLflow. ``cores``: the worker's share of the machine's cores, followed during the fit."""
    curve = LearningCurve(spec.metric, spec.direction == "maximize", spec.threshold)
    callbacks = [curve] + ([OptunaPruning(trial, spec.metric)] if prune else []) + ([cores] if cores else [])
    cli = TrialCLI(SequenceModel, L.LightningDataModule, subclass_mode_data=True, run=False,
                   args=cli_args(spec.base, overrides), save_config_callback=SaveConfigToTracking,
                   save_config_kwargs={"overwrite": True}, trainer_defaults={"callbacks": callbacks},
                   run_id=run_id, tracking_uri=tracking_uri,
                   root_dir=f"runs/sweeps/{spec.study}/trial-{trial.number}")
    if cli.trainer.is_global_zero:
        MlflowClient(tracking_uri).set_tag(run_id, "trainer.world_size", str(cli.trainer.world_size))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items()} | curve.summaries()


def is_one_process(config) -> bool:
    """Whether a trial's resolved config surely runs in one process (devices 1 or one listed device, num_nodes 1);
    anything else ("auto", "0,", 2, …) runs as a job of its own, which is right for one process too."""
    trainer = config["trainer"]
    devices = trainer.get("devices")
    one = devices in (1, "1") or isinstance(devices, (list, tuple)) and len(devices) == 1
    return one and trainer.get("num_nodes", 1) == 1


def repeat_seeds(config, repeat: int) -> dict[str, int]:
    """The seed overrides of repeat r: r added to the resolved ``seed_everything`` (initialisation, dropout) and to
    the data module's ``seed`` (generated data and training order). Repeat 0 is the config as written, and repeat r
    of every grid point sees the same data, so points are compared in pairs."""
    base = config.get("seed_everything")
    out = {"seed_everything": (base if isinstance(base, int) and not isinstance(base, bool) else 0) + repeat}
    data_seed = (config.get("data") or {}).get("init_args", {}).get("seed")
    if isinstance(data_seed, int) and not isinstance(data_seed, bool):
        out["data.init_args.seed"] = data_seed + repeat
    return out


def fit_in_job(spec: SweepSpec, storage: str, trial: optuna.Trial, overrides: dict, run_id: str, tracking_uri: str,
               prune: bool, watchdog: "Watchdog") -> dict[str, float]:
    """``fit_once`` in a job of its own (``atlas_lab.sweep.job``), for a trial of several processes: Lightning's
    launcher starts the other ranks from the job's command line, so they join this trial. Rank 0 writes the
    outcome to a file; a job that dies without one fails the trial with the end of its log."""
    folder = Path("runs") / "sweeps" / spec.study / f"trial-{trial.number}"
    folder.mkdir(parents=True, exist_ok=True)
    result, log = folder / f"result-{run_id}.json", folder / f"job-{run_id}.log"
    result.unlink(missing_ok=True)
    with open(log, "ab") as out:
        job = subprocess.Popen([sys.executable, "-m", "atlas_lab.sweep.job", *spec.argv(), "--storage", storage,
                                "--tracking-uri", tracking_uri, "--trial-id", str(trial._trial_id), "--run-id", run_id,
                                "--overrides", json.dumps(overrides), "--result", str(result),
                                "--parent-pid", str(os.getpid())] + (["--prune"] if prune else []),
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        watchdog.job = job
        try:
            code = job.wait()
        finally:
            watchdog.job = None
            kill_group(job.pid)  # ranks left behind by a rank that died
    if not result.exists():
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        raise RuntimeError(f"trial job exited with code {code} and no result (log {log}): " + " | ".join(tail))
    outcome = json.loads(result.read_text())
    if "pruned" in outcome:
        raise optuna.TrialPruned(outcome["pruned"])
    if "error" in outcome:
        raise TrialJobError(outcome["error"])
    return outcome["metrics"]


class TrialJobError(RuntimeError):
    """A trial's job failed; the message is the job's own ``Type: message``."""


def finish_fit(client: MlflowClient, run_id: str, spec: SweepSpec, metrics: dict[str, float]) -> float:
    """The per-slice table, the curve's summaries and the learning curves of a finished fit; returns the study's
    objective (the metric's summary)."""
    _log_slices(client, run_id, metrics)
    summaries = {k: v for k, v in metrics.items() if k.startswith(spec.metric + ".")}
    if spec.metric not in metrics or spec.objective not in metrics:
        raise KeyError(f"metric {spec.metric!r} was not logged; logged metrics: {sorted(metrics)}")
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in summaries.items()])
    value = float(metrics[spec.objective])
    if not math.isfinite(value):
        raise FloatingPointError(f"{spec.objective} is {value}")
    _log_learning_curves(client, run_id, spec.metric)
    return value


def run_trial(spec: SweepSpec, storage: str, study: optuna.Study, trial: optuna.Trial, tracking_uri: str,
              parent: str, watchdog: "Watchdog", cores: CoreShare | None = None) -> None:
    """Run a claimed trial to the end and tell Optuna its state; never raises for a failing trial."""
    client = MlflowClient(tracking_uri)
    labels = {k: trial.suggest_categorical(k, list(spec.grid[k])) for k in spec.grid}
    sampled = {k: _suggest(trial, k, s) for k, s in spec.search.items()}
    repeat = trial.user_attrs.get("repeat", 0)
    repeats = [repeat] if spec.sampler == "grid" else list(range(spec.repeats))
    tune = trial.user_attrs.get("tune")  # a tune trial: its candidate, on a pilot seed
    values, censored, run_ids, run_id = [], [], [], None
    try:
        if tune is None and spec.tune:  # a reported trial of a tuned point: the pilot seeds' choice
            tune, _ = studies.tuned_setting(study, labels)
            if tune is None:
                raise RuntimeError(f"no tune candidate of this point completed (tune.grid: {list(spec.tune)})")
            trial.set_user_attr("tuned", tune)
        fixed = spec.overrides(labels, sampled) | (tune or {})
        config = check_config(cli_args(spec.base, fixed)).config  # the same for each repeat
        for r in repeats:
            overrides = {**fixed, **repeat_seeds(config, r)}
            name = spec.run_name(labels, sampled, overrides["seed_everything"], trial.number, tune,
                                 "tune" in trial.user_attrs)
            run_id = child_run(client, parent, spec.study, trial.number, name,
                               {"sweep.labels": json.dumps(labels), "sweep.repeat": str(r)}
                               | ({"sweep.tune": json.dumps(tune)} if tune else {}))
            run_ids.append(run_id)
            trial.set_user_attr("mlflow_run_ids", run_ids)
            prune = r == repeats[0] and "tune" not in trial.user_attrs
            if is_one_process(config):
                metrics = fit_once(spec, trial, overrides, run_id, tracking_uri, prune, cores)
                if cores is not None and cores.used:
                    trial.set_user_attr("threads", cores.used)
            else:
                metrics = fit_in_job(spec, storage, trial, overrides, run_id, tracking_uri, prune, watchdog)
            values.append(finish_fit(client, run_id, spec, metrics))
            if spec.threshold is not None:
                censored.append(bool(metrics[f"{spec.metric}.censored_{spec.threshold:g}"]))
            finish_run(client, run_id, "COMPLETE")
        if len(repeats) > 1:
            trial.set_user_attr("repeat_values", values)
        if censored:
            trial.set_user_attr("censored", censored)
        outcome = dict(values=[sum(values) / len(values)])
    except optuna.TrialPruned as e:
        finish_run(client, run_id, "PRUNED", str(e))
        outcome = dict(state=optuna.trial.TrialState.PRUNED)
    except SIGTERMException:  # the worker is being stopped, not the trial failing: it stays RUNNING, its heartbeat
        raise  # stops, and the next sweep command finds it lost and runs it again
    except (Exception, SystemExit) as e:  # the trial fails, the study goes on (a failed trial is not lost: no retry)
        reason = str(e) if isinstance(e, TrialJobError) else f"{type(e).__name__}: {e}"
        trial.set_user_attr("fail_reason", reason[:2000])
        trial.set_user_attr("traceback", traceback.format_exc()[-4000:])
        if run_id is not None:
            finish_run(client, run_id, "FAIL", reason)
        outcome = dict(state=optuna.trial.TrialState.FAIL)
    try:
        study.tell(trial, **outcome)
    except UpdateFinishedTrialError:  # its heartbeat stood still past the grace period: failed and enqueued again
        print(f"trial {trial.number}: already failed as lost by a sweep command; this result is dropped", flush=True)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Watchdog(threading.Thread):
    """Beats into the worker's current trial every ``heartbeat_seconds()``, and ends the worker, and the job of its
    trial, as soon as the sweep command that started it is gone (the worker is then an orphan: its parent PID
    changes), so a SIGKILLed command leaves nothing behind that claims trials."""

    def __init__(self, study: optuna.Study, driver_pid: int):
        super().__init__(daemon=True)
        self.study, self.driver_pid = study, driver_pid
        self.trial_id: int | None = None
        self.job: subprocess.Popen | None = None
        self.writing = threading.Lock()  # a beat never runs inside the worker's claim (see ``work``)

    def driver_alive(self) -> bool:
        return os.getppid() == self.driver_pid

    def run(self):
        last = 0.0
        while True:
            time.sleep(min(1.0, studies.heartbeat_seconds()))
            if not self.driver_alive():
                print(f"sweep command (PID {self.driver_pid}) gone: worker stops", flush=True)
                if self.job is not None:
                    kill_group(self.job.pid)
                os.kill(os.getpid(), signal.SIGKILL)
            trial_id = self.trial_id
            if trial_id is not None and time.monotonic() - last >= studies.heartbeat_seconds():
                try:
                    with self.writing:
                        studies.beat(self.study, trial_id)
                    last = time.monotonic()
                except Exception as e:  # a storage hiccup: the next beat tries again
                    print(f"heartbeat of trial id {trial_id} failed: {type(e).__name__}: {e}", flush=True)


def claim(study: optuna.Study, worker_id: str, watchdog: "Watchdog") -> optuna.Trial | None:
    """A waiting trial claimed and its owner recorded, as one step: on a journal, under its write lock (held across
    both writes), so the sweep command, which holds that lock while it kills its workers, never finds a trial
    claimed by one of them without its owner; None when none is ready."""
    lock = getattr(getattr(study._storage, "_backend", None), "_lock", None)
    with watchdog.writing, (lock if hasattr(lock, "__enter__") else contextlib.nullcontext()):
        trial = studies.claim_waiting_trial(study)
        if trial is not None:
            for key, value in studies.owner_attrs(worker_id).items():
                trial.set_user_attr(key, value)
    return trial


def work(spec: SweepSpec, storage: str, tracking_uri: str, parent: str, worker_id: str, driver_pid: int,
         cores: CoreShare | None = None) -> int:
    """Claim and run trials until the queue is empty or the sweep command is gone; returns how many this worker
    ran."""
    study = studies.load_study(spec, storage)
    watchdog = Watchdog(study, driver_pid)
    watchdog.start()
    done = 0
    while watchdog.driver_alive():  # never claim for a command that is gone
        trial = claim(study, worker_id, watchdog)
        if trial is None:
            if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
                break
            time.sleep(1.0)  # the waiting trials wait for their point's tuning, run by other workers
            continue
        watchdog.trial_id = trial._trial_id
        try:
            run_trial(spec, storage, study, trial, tracking_uri, parent, watchdog, cores)
        finally:
            watchdog.trial_id = None
        done += 1
    return done


def main(argv=None):
    quiet()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sweep")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--study", default=None)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--parent", required=True)
    ap.add_argument("--worker-id", required=True)
    ap.add_argument("--driver-pid", type=int, required=True)
    args = ap.parse_args(argv)
    if os.getppid() != args.driver_pid:  # the sweep command is gone already
        return
    cores = CoreShare(enabled=os.environ.get("ATLAS_LAB_SHARE_CORES") == "1")
    work(load_sweep(args.sweep, args.sets, args.study), args.storage, args.tracking_uri, args.parent, args.worker_id,
         args.driver_pid, cores)


if __name__ == "__main__":
    main()
