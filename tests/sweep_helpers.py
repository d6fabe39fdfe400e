"""The sweep tests' helpers: a tiny MQAR experiment, sweep files, the study and its MLflow runs."""
from pathlib import Path

import optuna
import yaml
from mlflow.tracking import MlflowClient

from atlas_lab.sweep.study import open_storage

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "model": {"preset": "gla", "d_model": 16, "n_layers": 1, "n_heads": 2, "lr": 3.0e-3, "warmup_steps": 2},
    "trainer": {"max_epochs": 1, "log_every_n_steps": 1},
    "data": {"class_path": "atlas_lab.data.mqar.MQARDataModule",
             "init_args": {"vocab_size": 64, "train_slices": [[16, 2, 64]], "test_slices": [[16, 2, 32]],
                           "batch_size": 16, "seed": 0}},
}


def write_sweep(path, **fields):
    spec = {"study": "s", "base": ["experiments/tiny.yaml"], "metric": "val/acc", "direction": "maximize",
            "sampler": "grid", **fields}
    Path(path).write_text(yaml.safe_dump(spec))
    return str(path)


def load(study="s"):
    return optuna.load_study(study_name=study, storage=open_storage(f"runs/optuna/{study}.journal"))


def store_uri():
    """Absolute: MLflow caches stores by URI in a process, and every test has its own folder."""
    return "sqlite:///" + str(Path("runs/mlflow.db").resolve())


def runs_of(study="s"):
    client = MlflowClient(store_uri())
    exp = client.get_experiment_by_name("atlas-lab-sweeps")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`atlas_lab.study` = '{study}'")
    parents = [r for r in runs if r.data.tags.get("atlas_lab.role") == "study"]
    children = [r for r in runs if r.data.tags.get("atlas_lab.role") == "trial"]
    return client, parents, children


def sweep_command(*args):
    """The real `atlas-lab sweep` (or report) command line, as a user runs it."""
    import sys

    return [sys.executable, "-m", "atlas_lab.cli", *args]


def process_tree(root: int) -> set:
    """(pid, start time) of ``root`` and every process below it, read from /proc: the start time tells a process
    from a later one that reuses its PID."""
    import os

    children, started = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        children.setdefault(int(fields[1]), []).append(int(entry))
        started[int(entry)] = fields[19]
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in started:
            out.add((pid, started[pid]))
        todo += children.get(pid, [])
    return out


def alive(processes: set) -> list:
    """Those of ``processes`` (from process_tree) still running (not exited, not a zombie), as their command lines."""
    out = []
    for pid, start in processes:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[19] == start and fields[0] != "Z":
            out.append(f"{pid}: {cmdline[:160]}")
    return out


def wait_for(condition, timeout: float, every: float = 0.5):
    """Poll ``condition`` until it returns something true (returned) or ``timeout`` seconds pass (None)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    return None


def trials_now(study="s") -> list:
    """The trials of a study, or none while its journal or the study is not there yet."""
    try:
        return load(study).get_trials() if Path(f"runs/optuna/{study}.journal").exists() else []
    except KeyError:
        return []


def tree_digest(folder) -> dict:
    """Every file under ``folder`` and a hash of its bytes: to show that a command wrote nothing."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}
