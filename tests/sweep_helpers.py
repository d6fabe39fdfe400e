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
