"""``atlas-lab sweep FILE``: check everything, create or resume the study, run its workers, summarise.

Order of work, so that bad input never half-runs: (1) the sweep file and every grid value / search
bound are checked against the real run configuration; (2) only then are the Optuna study and the
MLflow parent run created (or found again); (3) missing work is enqueued, lost trials are failed
and enqueued again; (4) N worker processes run the queue (logging through one MLflow server on
loopback when several share a SQLite store); (5) the summary goes to the terminal, to files and to
the parent run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from rich.console import Console

from . import study as studies
from .report import summarize
from .spec import SweepError, SweepSpec, cli_args, load_sweep
from .tracking import finish_run, parent_run, resolve_uri, start_server, stop_server


def validate_configs(spec: SweepSpec) -> None:
    """Parse the run config of every grid value, search bound and choice (and one full point) — no run starts."""
    from ..lit.cli import parse_config

    def check(where: str, overrides: dict):
        try:
            parse_config(cli_args(spec.base, overrides))
        except ValueError as e:
            raise SweepError(f"{spec.path}: {where}: does not fit the run configuration:\n{e}") from None

    check("fixed", dict(spec.fixed))
    for key, labeled in spec.grid.items():
        for label, value in labeled.items():
            check(f"grid.{key} = {label}", {**spec.fixed, key: value})
    for key, s in spec.search.items():
        for value in s.get("choices", [s.get("low"), s.get("high")]):
            check(f"search.{key} = {value}", {**spec.fixed, key: value})
    if spec.grid:
        check("grid (first point)", spec.overrides(spec.grid_points()[0], {}))


def _report_finished(study, reported: set, console: Console) -> set:
    """Print one line per trial that finished since the last call; returns their numbers."""
    new = set()
    for t in study.get_trials(deepcopy=False, states=studies.FINISHED):
        if t.number in reported or studies.is_superseded(study, t):
            continue
        new.add(t.number)
        labels = t.user_attrs.get("labels") or t.params
        what = f"value {t.value:.4f}" if t.state == TrialState.COMPLETE else \
            f"[red]{t.state.name}[/red] {t.user_attrs.get('fail_reason', '')}"
        console.print(f"trial {t.number} {labels}: {what}")
    return new


def worker_env(n_workers: int) -> dict:
    """The environment of one of n_workers local workers: the CPU cores shared out between them
    (OMP_NUM_THREADS = cores // n_workers, at least 1), unless the user has set OMP_NUM_THREADS.
    Oversubscribed BLAS threads spin against each other and slow small matrix products several-fold."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // n_workers)))
    return env


def run_sweep(path: str, workers: int = 1, storage: str | None = None, tracking_uri: str | None = None,
              retry_failed: bool = False, console: Console | None = None) -> int:
    console = console or Console()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the driver prints its own progress lines
    spec = load_sweep(path)
    validate_configs(spec)
    storage = storage or studies.default_storage(spec.study)
    tracking_uri = resolve_uri(tracking_uri)
    Path("runs").mkdir(exist_ok=True)

    study = studies.load_study(spec, storage, create=True)
    studies.record_spec(study, spec)
    server = None
    try:
        log_uri = tracking_uri
        if workers > 1 and tracking_uri.startswith("sqlite:"):  # never several writers on one SQLite file
            server, log_uri = start_server(tracking_uri, log_path=f"runs/mlflow-server-{spec.study}.log")
            console.print(f"MLflow tracking server for the workers: {log_uri}")
        client = MlflowClient(log_uri)
        parent = study.user_attrs.get("mlflow_parent_run_id")
        if parent is None:
            parent = parent_run(client, spec.study, storage)
            study.set_user_attr("mlflow_parent_run_id", parent)
        added = studies.enqueue_missing(study, spec)
        retried = studies.retry_failed(study) if retry_failed else 0
        console.print(f"study {spec.study!r} ({storage}): {added} new trial(s) enqueued"
                      + (f", {retried} failed trial(s) enqueued again" if retried else ""))

        while True:
            for lost in studies.lost_trials(study):
                reason = "worker lost (process gone or no heartbeat)"
                for run_id in lost.user_attrs.get("mlflow_run_ids", [])[-1:]:
                    finish_run(client, run_id, "FAIL", reason)
                studies.requeue(study, lost, reason)
                console.print(f"[yellow]trial {lost.number}: {reason}; enqueued again")
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if waiting:
                logs = Path("runs") / "sweeps" / spec.study
                logs.mkdir(parents=True, exist_ok=True)
                n = min(workers, len(waiting))
                procs = [subprocess.Popen([sys.executable, "-m", "atlas_lab.sweep.worker", str(spec.path),
                                           "--storage", storage, "--tracking-uri", log_uri, "--parent", parent],
                                          stdout=open(logs / f"worker-{i}.log", "ab"), stderr=subprocess.STDOUT,
                                          env=worker_env(n))
                         for i in range(n)]
                console.print(f"{len(procs)} worker(s) running {len(waiting)} trial(s); logs in {logs}/worker-*.log")
                reported = {t.number for t in study.get_trials(deepcopy=False, states=studies.FINISHED)}
                while any(p.poll() is None for p in procs):
                    time.sleep(2.0)
                    reported |= _report_finished(study, reported, console)
                _report_finished(study, reported, console)
            elif running:  # trials of workers elsewhere (or not yet known to be lost): wait for them
                time.sleep(min(5.0, studies.HEARTBEAT_SECONDS))
            else:
                break
        summarize(study, client, parent, console=console)
        client.set_terminated(parent, status="FINISHED")
    finally:
        stop_server(server)
    return 0
