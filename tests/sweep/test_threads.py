"""The sweep workers of every command on a machine share its cores: two `atlas-lab sweep` commands started side by
side on 2 cores took 6 times as long, each worker training with every core (4 threads on 2)."""
import os
import subprocess

import pytest
from optuna.trial import TrialState

from sweep_helpers import load, sweep_command, trials_now, wait_for, write_sweep


@pytest.mark.slow  # two sweeps side by side: ~30 s; the thread arithmetic stays in the default suite
def test_workers_of_two_sweeps_share_the_cores(workdir, tmp_path_factory, monkeypatch):
    """Sweep a starts alone (OMP_NUM_THREADS not set) and trains with every core; sweep b starts beside it: b's
    worker trains with cores // 2, and a's follows within seconds, mid-fit (each trial records its thread counts,
    in order); a takes its cores back once b is done. A registry of the test's own keeps other tests' workers out
    of the count."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ATLAS_LAB_WORKER_REGISTRY", str(tmp_path_factory.mktemp("registry")))
    cores = len(os.sched_getaffinity(0))
    write_sweep("a.yaml", study="a", grid={"model.lr": [1e-3]}, fixed={"trainer.max_epochs": 80})
    (workdir / "b").mkdir()
    for name in ("lightning_config.yaml", "experiments"):
        os.symlink(workdir / name, workdir / "b" / name)
    write_sweep("b/b.yaml", study="b", grid={"model.lr": [1e-3]}, fixed={"trainer.max_epochs": 4})
    a = subprocess.Popen(sweep_command("sweep", "a.yaml"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        assert wait_for(lambda: [t for t in trials_now("a") if t.state == TrialState.RUNNING], timeout=300)
        b = subprocess.run(sweep_command("sweep", "b.yaml"), cwd="b", capture_output=True, text=True, timeout=600)
        assert b.returncode == 0, b.stdout + b.stderr
        out, _ = a.communicate(timeout=600)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, out
    (trial_a,) = load("a").get_trials()
    os.chdir("b")
    (trial_b,) = load("b").get_trials()
    assert trial_b.user_attrs["threads"] == [max(1, cores // 2)]
    if cores >= 2:  # a went from every core to its half while b ran
        assert trial_a.user_attrs["threads"][:2] == [cores, cores // 2], trial_a.user_attrs["threads"]


@pytest.mark.parametrize("user", [None, "3"])
def test_a_workers_threads_divide_the_cores_unless_the_user_set_them(user, monkeypatch):
    """Each of N workers of one command starts with OMP_NUM_THREADS = cores // N (at least 1) and shares the cores
    with every sweep worker of the machine; an OMP_NUM_THREADS the user set is passed on as it is, and the worker
    then keeps it."""
    from atlas_lab.sweep.driver import worker_env

    if user is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user)
    cores = len(os.sched_getaffinity(0))
    for workers in (1, 2, 64):
        env = worker_env(workers)
        assert env["OMP_NUM_THREADS"] == (user or str(max(1, cores // workers)))
        assert env.get("ATLAS_LAB_SHARE_CORES") == (None if user else "1")
