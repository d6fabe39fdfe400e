"""The MLflow side of a sweep: the tracking server, the study's parent run, a child run per trial."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from ..store import ServerError, init_store, resolve_uri, run_exists  # noqa: F401  (init_store: re-exported for driver.py and the tests)

ARTIFACTS = "runs/artifacts"
EXPERIMENT = "atlas-lab-sweeps"
# MLflow's job execution (huey consumer processes beside the server, for its GenAI jobs) is off: atlas-lab tracks runs
# only, and on 2 cores a server with them took about 27 s of CPU in its first 15 s against about 6 s without, CPU the
# trials the server tracks compete for.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The guard between the command and its tracking server: it starts the server in a session of its own (the server's
# uvicorn workers share its process group) and stops that whole group when its stdin ends:
# when the command closes it (stop_server), or when the command dies in any way, SIGKILL included, and the kernel
# closes it. A server can then never outlive the command that started it, as an orphan of PID 1.
GUARD = """
import os, signal, subprocess, sys, threading, time
server = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL)
def stop():
    sys.stdin.buffer.read()  # end of input: the command stopped the server, or is gone
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
threading.Thread(target=stop, daemon=True).start()
code = server.wait()
try:
    os.killpg(server.pid, signal.SIGKILL)  # what the server leaves behind
except ProcessLookupError:
    pass
sys.exit(code)
"""


def _last_line(path: str | None) -> str:
    if not path:
        return ""
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return f": {lines[-1]}"
    return ""


def start_server(backend_uri: str, port: int | None = None, artifacts: str = ARTIFACTS, log_path: str | None = None,
                 create: bool = True):
    """Start ``mlflow server`` on loopback behind its guard (``GUARD``), without MLflow's job execution
    (``SERVER_ENV``); returns (the guard's process, http URI) once it answers /health. The guard's process stands
    for the server: it exits with the server's code, and ``stop_server`` stops both; the server dies with the process
    that started it, even when that one is killed. ``create``: make the artifacts folder first (a server that only
    shows runs, ``atlas-lab ui``, leaves it to the runs). A server that exits or does not answer is a ServerError
    naming its log and the log's last line."""
    port = port or free_port()
    if create:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
    with open(log_path or os.devnull, "ab") as log:  # the server keeps its own copy of the file
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", GUARD, sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
             backend_uri, "--artifacts-destination", artifacts, "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **SERVER_ENV})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise ServerError(f"mlflow server exited with code {proc.returncode} (log: {log_path})"
                                  f"{_last_line(log_path)}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, uri
            time.sleep(0.5)
        raise ServerError(f"mlflow server on {uri} did not answer within 120 s (log: {log_path})"
                          f"{_last_line(log_path)}")
    except BaseException:  # a server that failed, or the command interrupted while it starts: stopped, not left
        stop_server(proc)
        raise


MODEL_TRAINING = "custom_model_development"  # the MLflow UI's "Model training" experiment kind (not GenAI)


def runs_view(url: str, study: str | None = None) -> str:
    """Mark every experiment of the server at ``url`` as model training (the UI otherwise opens it in GenAI mode,
    on an empty traces page) and return the URL of the sweeps' runs view, or of the home page when there is no
    sweep yet. With ``study``: a saved view of that study's runs (MLflow's shared view state, an experiment tag):
    its parent run and children, with the grid axes, the metric and the best value as columns. KeyError: no such
    study."""
    client = MlflowClient(url)
    sweeps = client.get_experiment_by_name(EXPERIMENT)
    found = None
    if study is not None:  # looked up before anything is written: an unknown study changes nothing
        found = sweeps and client.search_runs([sweeps.experiment_id], max_results=1, filter_string=(
            f"tags.`atlas_lab.study` = '{study}' and tags.`atlas_lab.role` = 'study'"))
        if not found:
            raise KeyError(study)
    for exp in client.search_experiments():
        if exp.tags.get("mlflow.experimentKind") is None:
            client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", MODEL_TRAINING)
    if sweeps is None:
        return url
    view = f"{url}/#/experiments/{sweeps.experiment_id}/runs?workflowType=machine_learning"
    if found is None:
        return view
    params = found[0].data.params
    metric = params.get("study.metric", "")
    axes = [k[len("grid."):] for k in params if k.startswith("grid.")]
    state = {"searchFilter": f"tags.`atlas_lab.study` = '{study}'", "orderByKey": "attributes.start_time",
             "orderByAsc": False,
             "selectedColumns": [f"params.`{k}`" for k in axes] + [f"metrics.`{metric}`", f"metrics.`best/{metric}`"],
             "columnWidths": {"attributes.`Run Name`": 360}}
    key = "atlas-lab-" + re.sub(r"[^\w.-]", "_", study)
    client.set_experiment_tag(sweeps.experiment_id, f"mlflow.sharedViewState.{key}", json.dumps(state))
    return f"{view}&viewStateShareKey={urllib.parse.quote(key)}"


def browse_hint(study: str, tracking_uri: str | None = None) -> str:
    """Where a study's runs are seen: ``atlas-lab ui --study NAME`` (with ``--tracking-uri`` for a store other than the
    project's), or the tracking server given, which outlives the sweep (unlike the server a sweep starts)."""
    from .study import shown

    if tracking_uri is None or tracking_uri == resolve_uri(None, create=False):
        return f"atlas-lab ui --study {study}"
    if tracking_uri.startswith("http"):
        return f"the MLflow server {shown(tracking_uri)}"
    return f"atlas-lab ui --study {study} --tracking-uri {shown(tracking_uri)}"


def stop_server(proc) -> None:
    """Stop the server and every process it started (its process group: uvicorn's worker): its guard's input ends,
    the guard sends SIGTERM to the group, then SIGKILL after 20 s."""
    if proc is None:
        return
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def experiment_id(client: MlflowClient, name: str = EXPERIMENT) -> str:
    """The sweeps' experiment, created where missing: with its artifacts in runs/artifacts for a database store (the
    sweep command creates it so before it starts a server, whose experiments would keep theirs behind the server,
    where a worker writing to the database directly cannot reach them)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    Path(ARTIFACTS).mkdir(parents=True, exist_ok=True)
    try:
        return client.create_experiment(name, artifact_location=Path(ARTIFACTS).resolve().as_uri()
                                        if not client.tracking_uri.startswith("http") else None,
                                        tags={"mlflow.experimentKind": MODEL_TRAINING})
    except mlflow.exceptions.MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


def parent_run(client: MlflowClient, study: str, storage: str) -> str:
    """The study's parent run: found by its tag, or created (marked RUNNING either way). Reads, then writes: the sweep
    command calls it under the storage's lock, so several commands create one parent run."""
    exp = experiment_id(client)
    found = client.search_runs([exp], filter_string=f"tags.`atlas_lab.study` = '{study}' and "
                                                    f"tags.`atlas_lab.role` = 'study'", max_results=1)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(exp, run_name=study, tags={"atlas_lab.study": study, "atlas_lab.role": "study",
                                                       "optuna.storage": storage})
    return run.info.run_id


def child_run(client: MlflowClient, parent: str, study: str, trial_number: int, name: str, tags: dict[str, str]) -> str:
    """A trial's run under the study's parent run, named ``name`` (``SweepSpec.run_name``)."""
    exp = client.get_run(parent).info.experiment_id
    run = client.create_run(exp, run_name=name, tags={
        "mlflow.parentRunId": parent, "atlas_lab.study": study, "atlas_lab.role": "trial",
        "optuna.trial_number": str(trial_number), "optuna.state": "RUNNING", **tags})
    return run.info.run_id


def finish_run(client: MlflowClient, run_id: str, state: str, reason: str | None = None,
               status: str | None = None) -> None:
    """Tag a trial's run with its Optuna state (and failure reason) and close it (``status``: FINISHED for COMPLETE,
    KILLED for PRUNED, else FAILED, unless given: an interrupted trial's run ends KILLED); nothing for a run the
    store does not hold (a lost trial's run, when the journal is resumed against another MLflow store)."""
    if not run_exists(client, run_id):
        return
    client.set_tag(run_id, "optuna.state", state)
    if reason:
        client.set_tag(run_id, "failure_reason", reason[:5000])
    client.set_terminated(run_id, status=status or {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}.get(state, "FAILED"))
