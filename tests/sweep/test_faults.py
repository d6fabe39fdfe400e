"""Faults end a sweep cleanly and never lose a study, each with the real processes: the `atlas-lab sweep` command,
its workers and the MLflow tracking server it starts for them.

- Ctrl-C (SIGINT to the command's process group, as a terminal sends it) and SIGTERM: one line, exit 130 / 143, no
  process left, no MLflow run RUNNING, the running trials failed and queued again; the next command runs them, and
  no point twice.
- SIGKILL of the command: its workers and the tracking server (with its uvicorn worker) die
  with it, and nothing claims a trial after it.
- A torn journal record (a write cut short, more records appended after it): one warning naming the file and line,
  every complete trial kept, the study resumed.
- A read-only or full runs folder: one line naming the folder, exit 1, nothing written. Both are made in a mount
  namespace of the test's own (``unshare --mount``: a read-only bind mount, a small tmpfs filled up), which changes
  nothing outside the command it runs and needs root (or user namespaces); the tests skip without it. A folder made
  read-only with chmod would not do: root, which runs these tests, ignores permissions.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from sweep_helpers import (alive, load, process_tree, runs_of, store_uri, sweep_command, trials_now, tree_digest,
                           wait_for, write_sweep)


def can_unshare_mount() -> bool:
    return subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                          capture_output=True).returncode == 0


needs_mount_namespace = pytest.mark.skipif(not can_unshare_mount(), reason="needs `unshare --mount` (root) to "
                                                                           "make a read-only or full folder")


def running_with_runs(n: int):
    """Trials of study s running with their MLflow run made: at least n, else None."""
    running = [t for t in trials_now() if t.state == TrialState.RUNNING and t.user_attrs.get("mlflow_run_ids")]
    return running if len(running) >= n else None


@pytest.mark.parametrize("sig", [pytest.param("SIGINT", marks=pytest.mark.slow), "SIGTERM"])  # one path: ~50 s each
def test_an_interrupted_sweep_stops_cleanly_and_the_next_command_finishes_it(sig, workdir):
    """2 points, 2 workers (so a tracking server), trials of 60 epochs: the signal arrives once both run. The command
    prints one line (what finished, the command that resumes), exits 128 + the signal within seconds, and leaves
    no process and no MLflow run RUNNING: the parent and the two interrupted trials' runs end KILLED, their Optuna
    trials FAIL, superseded, and queued again. (SIGINT) The same command then runs those two points, once each."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3]}, fixed={"trainer.max_epochs": 60})
    proc = subprocess.Popen(sweep_command("sweep", sweep, "--workers", "2"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        running = wait_for(lambda: running_with_runs(2), timeout=300)
        assert running, proc.stdout.read() if proc.poll() is not None else "no trial started"
        tree = process_tree(proc.pid)
        assert len(tree) >= 6  # the command, the server's guard, the server and its uvicorn worker, the 2 workers
        started = time.monotonic()
        if sig == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the command's process group
        else:
            proc.terminate()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    code = 128 + getattr(signal, sig)
    assert proc.returncode == code, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted ({sig}) study 's': 0 of 2 trial(s) finished, 2 "
                                                   "running trial(s) stopped and queued to run again; resume with: "
                                                   f"atlas-lab sweep {sweep} --workers 2"), err
    assert "Traceback" not in out + err and took < 60, took
    print(f"{sig}: exit {proc.returncode} {took:.1f} s after the signal: {lines[0]}")
    assert wait_for(lambda: not alive(tree), timeout=10), alive(tree)
    _, parents, children = runs_of()
    assert parents[0].info.status == "KILLED"
    assert sorted(c.info.status for c in children) == ["KILLED", "KILLED"], [c.data.tags for c in children]
    assert all("interrupted" in c.data.tags["failure_reason"] for c in children)
    trials = load().get_trials()
    stopped = {t.number for t in running}
    assert {t.number for t in trials if t.state == TrialState.FAIL} == stopped
    assert set(load().user_attrs["superseded_trials"]) == stopped
    assert sorted(t.state.name for t in trials) == ["FAIL", "FAIL", "WAITING", "WAITING"]
    if sig == "SIGTERM":
        return
    done = subprocess.run(sweep_command("sweep", sweep, "--set", "fixed.trainer.max_epochs=2", "--study", "s"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2  # a shortened resume would be another study: refused, nothing run
    done = subprocess.run(sweep_command("sweep", sweep), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = load().get_trials()
    complete = sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE)
    assert complete == [1e-3, 2e-3] and len(trials) == 4  # each point ran to the end once
    assert runs_of()[1][0].info.status == "FINISHED"


def test_a_killed_sweep_takes_its_workers_and_tracking_server_along(workdir):
    """SIGKILL the command (nothing of it runs afterwards): its workers (PR_SET_PDEATHSIG) and the MLflow server
    with every process it started (its guard stops the server's process group) are gone within seconds, and no
    trial is claimed after the kill. Before, the server, uvicorn, the job runner and 7 huey consumers ran on under
    PID 1 for good; the server now starts without MLflow's job execution, so no huey consumer at all."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3, 3e-3]}, fixed={"trainer.max_epochs": 60})
    proc = subprocess.Popen(sweep_command("sweep", sweep, "--workers", "2"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: running_with_runs(2), timeout=300), "no trial started"
        tree = process_tree(proc.pid)
        commands = " ".join(alive(tree))
        assert "mlflow server" in commands and "uvicorn" in commands and "atlas_lab.sweep.worker" in commands
        assert "huey" not in commands
        claimed = {t.number for t in load().get_trials() if t.state != TrialState.WAITING}
        proc.kill()
        proc.wait()
        started = time.monotonic()
        assert wait_for(lambda: not alive(tree), timeout=40), alive(tree)
        print(f"every process of the sweep gone {time.monotonic() - started:.1f} s after SIGKILL")
        time.sleep(2)
        assert {t.number for t in load().get_trials() if t.state != TrialState.WAITING} == claimed
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid, _ in process_tree(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_command_died_while_it_started_claims_nothing(workdir):
    """SIGKILL the command the moment its worker process exists, while the worker still imports torch and
    Lightning: the worker dies with it (before, it finished its imports, claimed a trial and only then saw its
    parent gone), and every trial stays WAITING for the next command."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3]})
    proc = subprocess.Popen(sweep_command("sweep", sweep), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def worker_started():
            tree = process_tree(proc.pid)
            return tree if any("atlas_lab.sweep.worker" in line for line in alive(tree)) else None

        tree = wait_for(worker_started, timeout=300, every=0.05)
        assert tree, "no worker started"
        proc.kill()
        proc.wait()
        assert wait_for(lambda: not alive(tree), timeout=10), alive(tree)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(3)  # past the imports the worker would have finished
    assert sorted(t.state.name for t in load().get_trials()) == ["WAITING", "WAITING"]


@pytest.mark.slow  # 47 s; a journal torn at its end: test_journal_repair
def test_a_torn_journal_record_is_skipped_and_the_study_resumes(workdir):
    """A study of 1 complete trial; then a write cut short (half a record, no line end) and complete records
    appended after it, the first on the same line, as Optuna's own journal writer leaves them (here the study's
    attributes `note` and `more`). Plain Optuna can no longer read the journal (JSONDecodeError: the study is
    lost). The next `atlas-lab sweep`, with repeats 2, warns once, naming the file and the line, keeps both trials
    and the records after the torn one, and runs the new repeat: 2 trials, each repeat once."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    import optuna

    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]})
    assert subprocess.run(sweep_command("sweep", sweep), capture_output=True, timeout=600).returncode == 0
    before = {t.number: t.value for t in load().get_trials()}
    assert len(before) == 1
    journal = Path("runs/optuna/s.journal")
    lines = journal.read_bytes().splitlines(keepends=True)
    notes = [{"op_code": 2, "worker_id": "another-writer", "study_id": 0, "user_attr": {key: "after the tear"}}
             for key in ("note", "more")]
    with open(journal, "ab") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])  # torn: the writer was killed in the middle of its write
        for note in notes:  # the next writers append right after it
            f.write((json.dumps(note, separators=(",", ":")) + "\n").encode())
    with pytest.raises(json.JSONDecodeError):
        optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal)))).get_trials()
    write_sweep("grid.yaml", grid={"model.lr": [1e-3]}, repeats=2)
    done = subprocess.run(sweep_command("sweep", sweep), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    assert warnings == [f"warning: runs/optuna/s.journal:{len(lines) + 1}: a torn journal record (a write cut short "
                        "by a kill or a full disk) is skipped; the complete record after it on that line is kept"], \
        done.stderr
    study = load()
    trials = study.get_trials()
    assert {t.number: t.value for t in trials if t.number in before} == before
    assert sorted((t.params["model.lr"], t.user_attrs["repeat"]) for t in trials if t.state == TrialState.COMPLETE) \
        == [(1e-3, 0), (1e-3, 1)]
    assert study.user_attrs["note"] == study.user_attrs["more"] == "after the tear"
    assert runs_of()[1][0].info.status == "FINISHED"


def namespace_run(script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A shell script in a mount namespace of its own: its mounts vanish with it, nothing outside changes."""
    return subprocess.run(["unshare", "--mount", "sh", "-ec", script], capture_output=True, text=True,
                          timeout=timeout)


def one_error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stdout + done.stderr, \
        (done.returncode, done.stdout, done.stderr)
    return lines[0]


@needs_mount_namespace
def test_a_read_only_runs_folder_is_one_line_and_nothing_is_written(workdir):
    """runs/ bind-mounted read-only over a complete study: `atlas-lab sweep` (resuming with 2 workers) and
    `atlas-lab report` each print one line naming runs and the reason, exit 1, and the folder is unchanged (before:
    an OSError traceback from each)."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]})
    assert subprocess.run(sweep_command("sweep", sweep), capture_output=True, timeout=600).returncode == 0
    before = tree_digest("runs")
    python = " ".join(sweep_command())
    ro = "mount --bind runs runs; mount -o remount,bind,ro runs; "
    for args, command, folder in ((f"sweep {sweep} --workers 2", "sweep", "runs"),
                                  ("report s", "report", "runs/sweeps/s")):
        done = namespace_run(ro + f"exec {python} {args}")
        assert one_error(done) == f"error: {folder}: Read-only file system; atlas-lab {command} writes there " \
                                  "(nothing was written)"
    assert tree_digest("runs") == before


@pytest.mark.slow  # ~30 s; the default suite has the read-only folder, the same check of a folder it cannot write
@needs_mount_namespace
def test_a_full_runs_folder_is_one_line_and_nothing_is_written(workdir):
    """runs/ on a small tmpfs, filled up: a fresh sweep with 2 workers (before: `RuntimeError: mlflow server exited
    with code 1`), and the resume of a complete study copied there (before: the command hung, retrying MLflow with
    back-off while it held the study's lock), each print one line naming runs, exit 1, and write nothing: the
    folder's files are the same after the command (listed inside the namespace, where the tmpfs lives)."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]})
    assert subprocess.run(sweep_command("sweep", sweep), capture_output=True, timeout=600).returncode == 0
    os.rename("runs", "done")
    Path("runs").mkdir()
    python = " ".join(sweep_command())
    listing = "find runs -type f ! -name fill -exec sha256sum {} + | sort"
    for setup in ("", "cp -a done/. runs/; "):
        script = (f"mount -t tmpfs -o size=8m tmpfs runs; {setup}dd if=/dev/zero of=runs/fill bs=64k 2>/dev/null "
                  f"|| true; {listing} > before.txt; {python} sweep {sweep} --workers 2 && rc=0 || rc=$?; "
                  f"{listing} > after.txt; exit $rc")
        done = namespace_run(script)
        error = one_error(done)
        assert error.startswith("error: runs: No space left on device (0 bytes free; at least 1,048,576 needed); "
                                "atlas-lab sweep writes there (nothing was written)"), error
        assert Path("before.txt").read_text() == Path("after.txt").read_text()
        assert (setup == "") == (Path("before.txt").read_text() == "")
    assert not any(Path("runs").iterdir())  # the tmpfs went with its namespace


@pytest.mark.slow  # ~15 s; the default suite ends the runs KILLED through a tracking server (SIGTERM, above)
def test_mlflow_runs_of_the_killed_trials_are_not_left_running_in_the_store(workdir):
    """The store the interrupted sweep used directly (1 worker, no server): SIGTERM ends the parent and the trial's
    run KILLED in runs/mlflow.db itself."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]}, fixed={"trainer.max_epochs": 60})
    proc = subprocess.Popen(sweep_command("sweep", sweep), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: running_with_runs(1), timeout=300), "no trial started"
        proc.terminate()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err.count("\n") == 1, err
    client = MlflowClient(store_uri())
    runs = client.search_runs([client.get_experiment_by_name("atlas-lab-sweeps").experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]
