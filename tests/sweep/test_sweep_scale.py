"""Sweeps on several processes and machines: commands racing on one study (journal and PostgreSQL storage), a
trial of two DDP processes as one job, lost trials found by worker identity, a driver's death, plain-text reasons.

Machines are stood in for by processes with their own host name and PID namespace (``unshare --uts --pid``,
root only; the tests that need it skip without it) against real servers: PostgreSQL (tests/postgres.py) and
an MLflow tracking server.
"""
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from atlas_lab.cli import main
from atlas_lab.sweep.study import open_storage, study_lock, trial_key
from atlas_lab.sweep.tracking import start_server, stop_server
from sweep_helpers import ROOT, load, runs_of, store_uri, write_sweep


def trials_so_far() -> list:
    """The trials of study s, or none while the first command has not created it yet."""
    try:
        return load().get_trials() if Path("runs/optuna/s.journal").exists() else []
    except KeyError:
        return []

N_PROCESSES, ROUNDS = 3, 2
GRID = {"model.lr": [1e-3, 2e-3, 3e-3]}


def can_unshare() -> bool:
    return subprocess.run(["unshare", "--uts", "--pid", "--fork", "true"], capture_output=True).returncode == 0


def command(args, start_at=None, hostname=None):
    """`atlas-lab ARGS` in a fresh interpreter that waits, imports done, until the instant start_at (a time
    barrier), optionally as another machine: its own host name and PID namespace."""
    code = ("import sys, time\nfrom atlas_lab.cli import main\n"
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))\nsys.exit(main(sys.argv[2:]))")
    cmd = [sys.executable, "-c", code, str(start_at or 0), *args]
    if hostname:
        cmd = ["unshare", "--uts", "--pid", "--fork", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *cmd]
    return cmd


def fast_heartbeats(monkeypatch, beat=0.5, grace=4.0):
    monkeypatch.setenv("ATLAS_LAB_HEARTBEAT_SECONDS", str(beat))
    monkeypatch.setenv("ATLAS_LAB_HEARTBEAT_GRACE_SECONDS", str(grace))


@pytest.fixture
def mlflow_server(workdir):
    """A real MLflow tracking server (SQLite backend) on loopback; yields its URI."""
    server, uri = start_server(store_uri(), log_path=str(workdir / "mlflow-server.log"))
    yield uri
    stop_server(server)


def race(workdir, storages, tracking_uri):
    """N_PROCESSES processes, released together by a barrier for each of ROUNDS rounds, each creating a fresh MLflow
    store and preparing study race-r on storages[r]. Returns {round: [(parent, enqueued) per process]}."""
    for r in range(len(storages)):
        write_sweep(f"race-{r}.yaml", study=f"race-{r}", repeats=2, grid=GRID)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(N_PROCESSES, timeout=300), ctx.Queue()
    from sweep_race import prepare_rounds

    procs = [ctx.Process(target=prepare_rounds, args=(str(workdir), storages, tracking_uri, barrier, results))
             for _ in range(N_PROCESSES)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(N_PROCESSES * len(storages)):
        r, parent, added = results.get(timeout=600)
        out.setdefault(r, []).append((parent, added))
    for p in procs:
        p.join(timeout=60)
    return out


def check_race(out, storages, tracking_uri, workdir):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("atlas-lab-sweeps").experiment_id
    for r, storage in enumerate(storages):
        assert all(parent != "error" for parent, _ in out[r]), out[r]
        parents = {parent for parent, _ in out[r]}
        assert len(parents) == 1 and sum(added for _, added in out[r]) == 6  # every point enqueued by exactly one
        trials = optuna.load_study(study_name=f"race-{r}", storage=open_storage(storage)).get_trials()
        assert len(trials) == 6 and len({trial_key(t) for t in trials}) == 6
        found = client.search_runs([exp], filter_string=f"tags.`atlas_lab.study` = 'race-{r}' and "
                                                        "tags.`atlas_lab.role` = 'study'")
        assert [run.info.run_id for run in found] == list(parents)
        MlflowClient(f"sqlite:///{workdir}/fresh-{r}.db").search_experiments()  # the raced store is whole


def test_the_study_lock_of_a_journal_is_not_optunas_own_lock(workdir):
    """Optuna's journal writes take ``STORE.lock`` themselves; the study lock must be another file, or every write
    made under it (enqueueing the grid, a heartbeat beside it) waits 30 s and then breaks Optuna's lock."""
    storage = "runs/optuna/s.journal"
    study = optuna.create_study(study_name="s", storage=open_storage(storage))
    lock = study_lock(storage)
    for x in (1.0, 2.0):  # one lock, taken as often as the sweep command needs it
        with lock:
            started = time.monotonic()
            study.enqueue_trial({"x": x})
            assert time.monotonic() - started < 5.0
    assert len(study.get_trials()) == 2 and not Path(storage + ".lock").exists()


def test_a_journal_writer_killed_holding_the_write_lock_blocks_nobody(workdir):
    """SIGKILL a process while it holds the journal's write lock: the next write goes through at once (with Optuna's
    symbolic-link lock and a relative path, every later writer spun forever)."""
    storage = "runs/optuna/s.journal"
    optuna.create_study(study_name="s", storage=open_storage(storage))
    code = ("import sys, time\nfrom atlas_lab.sweep.study import open_storage\n"
            "open_storage(sys.argv[1])._backend._lock.acquire()\nprint('held', flush=True)\ntime.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, storage], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    write = threading.Thread(target=lambda: load().enqueue_trial({"x": 1.0}), daemon=True)
    write.start()
    write.join(timeout=30)
    assert not write.is_alive() and len(load().get_trials()) == 1


@pytest.mark.slow  # the store's lock itself is raced in the default suite (the PostgreSQL race, fresh-<r>.db)
def test_fits_started_at_one_instant_on_a_fresh_store_both_run(workdir):
    """Two `atlas-lab fit` commands, released together, both create the fresh runs/mlflow.db: it is created and
    migrated once, under its lock (otherwise one of them may crash in MLflow's migration, `duplicate column`)."""
    start = time.time() + 15  # past both interpreters' imports
    args = ["fit", "-c", "lightning_config.yaml", "-c", "experiments/tiny.yaml", "--trainer.max_steps=1",
            "--trainer.limit_val_batches=1", "--trainer.callbacks=[]"]
    procs = [subprocess.Popen(command(args, start), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-1500:] for o in outs)
    client = MlflowClient(store_uri())
    assert len(client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])) == 2


@pytest.mark.slow  # ~2 minutes on 2 cores; the PostgreSQL race and the PID-namespace case stay in the default suite
def test_racing_commands_enqueue_once_and_create_one_parent_on_a_journal(workdir, mlflow_server):
    storages = [f"runs/optuna/race-{r}.journal" for r in range(ROUNDS)]
    check_race(race(workdir, storages, mlflow_server), storages, mlflow_server, workdir)


def test_racing_commands_enqueue_once_and_create_one_parent_on_postgresql(workdir, postgres):
    """The same on PostgreSQL: a fresh database per round (Optuna creates its tables under the lock too), and the
    MLflow server's backend store on PostgreSQL as well."""
    server, uri = start_server(postgres.database(), log_path=str(workdir / "mlflow-server.log"))
    try:
        storages = [postgres.database() for _ in range(ROUNDS)]
        check_race(race(workdir, storages, uri), storages, uri, workdir)
    finally:
        stop_server(server)


@pytest.mark.slow
@pytest.mark.skipif(not can_unshare(), reason="needs `unshare --uts --pid` (root) to stand in for machines")
def test_machines_share_one_study_on_postgresql_and_one_mlflow_server(workdir, postgres, monkeypatch):
    """Three `atlas-lab sweep` commands, each with its own host name and PID namespace, started at one instant
    on one PostgreSQL study and one MLflow server (PostgreSQL backend): each point runs once, one parent run,
    which ends FINISHED."""
    fast_heartbeats(monkeypatch)
    server, uri = start_server(postgres.database(), log_path=str(workdir / "mlflow-server.log"))
    try:
        storage = postgres.database()
        sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3, 3e-3, 4e-3]})
        start = time.time() + 25  # past every interpreter's imports
        procs = [subprocess.Popen(command(["sweep", sweep, "--storage", storage, "--tracking-uri", uri], start,
                                          hostname=f"machine-{i}"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for i in range(3)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        trials = optuna.load_study(study_name="s", storage=open_storage(storage)).get_trials()
        assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
        assert sorted(t.params["model.lr"] for t in trials) == [1e-3, 2e-3, 3e-3, 4e-3]
        assert {t.user_attrs["host"] for t in trials} <= {"machine-0", "machine-1", "machine-2"}
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("atlas-lab-sweeps").experiment_id])
        parents = [r for r in runs if r.data.tags["atlas_lab.role"] == "study"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(runs) == 5
    finally:
        stop_server(server)


@pytest.mark.skipif(not can_unshare(), reason="needs `unshare --uts --pid` (root) to stand in for containers")
def test_a_live_trial_in_another_pid_namespace_is_never_lost(workdir, monkeypatch):
    """Two commands on one host name, each in its own PID namespace (containers with host networking): the second
    finds the first's trial running under a PID it cannot see, and waits for it instead of declaring it lost."""
    fast_heartbeats(monkeypatch, beat=0.5, grace=6.0)
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]}, fixed={"trainer.max_epochs": 25})
    first = subprocess.Popen(command(["sweep", sweep], hostname="node"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.5)
        if any("heartbeat" in t.user_attrs and t.state == TrialState.RUNNING for t in trials_so_far()):
            break
    second = subprocess.Popen(command(["sweep", sweep], hostname="node"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    outs = [p.communicate(timeout=600)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    trials = load().get_trials()
    reasons = [t.user_attrs.get("fail_reason") for t in trials]
    assert [t.state for t in trials] == [TrialState.COMPLETE], (reasons, outs)  # run once, never failed as lost
    assert "worker lost" not in outs[1]


@pytest.mark.slow  # ~2 minutes on 2 cores; the PostgreSQL race and the PID-namespace case stay in the default suite
@pytest.mark.parametrize("stop", ["SIGKILL the command", "SIGTERM the command and its worker"])
def test_a_killed_driver_takes_its_worker_along_and_the_resume_reruns_the_lost_trial(stop, workdir, monkeypatch):
    """SIGKILL the sweep command alone: its worker (and trial) stops within seconds instead of running on as an
    orphan; the same command again fails the lost trial (stale heartbeat) and completes every point once. SIGTERM to
    the command and its worker (`pkill -f`, a scheduler ending the job): the command itself fails the interrupted
    trial (its MLflow run KILLED, "interrupted") and queues its point again, which the same command then runs once."""
    fast_heartbeats(monkeypatch)
    sweep = write_sweep("kill.yaml", grid={"model.lr": [1e-3, 2e-3]}, fixed={"trainer.max_epochs": 60})
    proc = subprocess.Popen([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline, running = time.time() + 300, None
    while time.time() < deadline and running is None:
        time.sleep(0.5)
        running = next((t for t in trials_so_far() if t.state == TrialState.RUNNING
                        and t.user_attrs.get("mlflow_run_ids")), None)
    assert running is not None, "no trial started"
    worker = running.user_attrs["pid"]
    if stop.startswith("SIGKILL"):
        proc.kill()
    else:
        time.sleep(2)  # well inside the fit
        proc.terminate()
        os.kill(worker, signal.SIGTERM)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and Path(f"/proc/{worker}").exists() and \
            "zombie" not in Path(f"/proc/{worker}/status").read_text(errors="replace").lower():
        time.sleep(0.2)
    assert not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text().lower()
    # claimed nothing more: the one trial that ran, still RUNNING after SIGKILL, failed by the command after SIGTERM
    assert [t.number for t in load().get_trials() if t.state != TrialState.WAITING] == [running.number]
    assert main(["sweep", sweep]) == 0  # the same file: a changed one is another study, refused
    trials = load().get_trials()
    lost = next(t for t in trials if t.number == running.number)
    assert lost.state == TrialState.FAIL and lost.number in load().user_attrs["superseded_trials"]
    assert sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE) == [1e-3, 2e-3]
    run = MlflowClient(store_uri()).get_run(lost.user_attrs["mlflow_run_ids"][-1])
    if stop.startswith("SIGKILL"):
        assert run.info.status == "FAILED" and "worker lost" in run.data.tags["failure_reason"]
    else:
        assert run.info.status == "KILLED" and "interrupted" in run.data.tags["failure_reason"]


@pytest.mark.slow
def test_a_trial_of_two_ddp_processes_is_one_job(workdir):
    """trainer.devices=2 (ddp, gloo) on a 2-point grid: two trials, each claimed once, its two ranks training it
    together (world size 2 in its one MLflow run); no rank claims a trial or runs the driver."""
    sweep = write_sweep("ddp.yaml", grid={"model.lr": [1e-3, 3e-3]},
                        fixed={"trainer.devices": 2, "trainer.strategy": "ddp", "trainer.accelerator": "cpu"})
    assert main(["sweep", sweep]) == 0
    trials = load().get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    _, parents, children = runs_of()
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 2
    assert all(c.data.tags["trainer.world_size"] == "2" and "val/acc" in c.data.metrics for c in children)


def test_failure_reasons_are_text_and_the_parent_run_ends(workdir, capsys, monkeypatch):
    """A trial fails with a reason that reads as rich markup ([/__w/…] closes a tag): printed verbatim, the study
    goes on, and the parent run ends FINISHED; a command that itself fails leaves its parent run FAILED."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ["PYTHONPATH"]]))
    boom = [{"class_path": "dist_probe.Fail", "init_args": {"message": "[/__w/x/pair.cc:553] Connection closed"}}]
    sweep = write_sweep("fail.yaml", grid={"trainer.callbacks": {"boom": boom, "none": []}})
    assert main(["sweep", sweep]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "FAIL RuntimeError: [/__w/x/pair.cc:553] Connection closed" in out
    _, parents, _ = runs_of()
    assert parents[0].info.status == "FINISHED"
    import atlas_lab.sweep.driver as driver

    def broken(*args, **kwargs):
        raise RuntimeError("summary failed")

    monkeypatch.setattr(driver, "summarize", broken)
    with pytest.raises(RuntimeError, match="summary failed"):
        main(["sweep", sweep])
    assert runs_of()[1][0].info.status == "FAILED"


def test_postgresql_without_its_driver_is_one_line_and_exit_2(workdir):
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]})
    code = ("import sys; sys.modules['psycopg'] = None; sys.modules['psycopg2'] = None\n"
            "from atlas_lab.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "sweep", sweep, "--storage",
                           "postgresql://atlas:secret@127.0.0.1:1/study"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: --storage postgresql://atlas:***@")
    assert "pip install 'atlas-lab[postgres]'" in errors[0] and "secret" not in done.stderr
    assert not Path("runs/optuna").exists() and not Path("runs/mlflow.db").exists()
