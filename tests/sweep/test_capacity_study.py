"""The capacity study (`atlas-lab capacity FILE`): the probe over component combinations, its state count, files,
MLflow run, and bad files."""
import csv
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.sweep.capacity import EXPERIMENT, load_capacity

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"study": "cap", "n_pairs": [2, 16], "head_dims": [4, 8], "trials": 2, "seed": 0,
         "combinations": {"delta rule": {}, "linear attention": {"attentional_bias": "dot"},
                          "poly 2, window 3": {"feature_map": {"name": "polynomial", "degree": 2}, "window": 3},
                          "mlp, momentum": {"architecture": {"name": "mlp", "expansion": 2}, "optimizer": "momentum",
                                            "eta": 0.5, "theta": 0.5, "normalize_eta": False}}}


def state_by_hand(combination: str, d: int) -> int:
    """The floats one head carries: W [d, D] of the linear memory (D = 1 + d + d(d+1)/2 for the degree-2
    polynomial map), the window's last c − 1 keys, values and γ; the MLP's W1 [2d, d], W2 [d, 2d] and a momentum of
    each."""
    if combination == "mlp, momentum":
        return 2 * (2 * d * d + 2 * d * d)
    if combination == "poly 2, window 3":
        return d * (1 + d + d * (d + 1) // 2) + 2 * (d + d + 1)
    return d * d


def test_a_capacity_study_counts_each_state_and_logs_its_table_plot_and_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("cap.yaml").write_text(yaml.safe_dump(SMALL))
    assert main(["capacity", "cap.yaml"]) == 0
    out = Path("runs/capacity/cap")
    rows = list(csv.DictReader((out / "capacity.csv").open()))
    assert len(rows) == 4 * 2 * 2
    for r in rows:
        assert int(r["state_floats"]) == state_by_hand(r["combination"], int(r["head_dim"])), r
        assert 0.0 <= float(r["retrieval_acc"]) <= 1.0
    assert (out / "capacity.png").stat().st_size > 0 and "chance 1/N: 0.500, 0.062" in (out / "capacity.md").read_text()
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    (run,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"capacity.csv", "capacity.md", "capacity.png"}
    history = client.get_metric_history(run.info.run_id, "acc/delta rule/d8")
    assert [(m.step, m.value) for m in history] == [(int(r["n_pairs"]), float(r["retrieval_acc"])) for r in rows
                                                    if r["combination"] == "delta rule" and r["head_dim"] == "8"]


BAD = {
    "unknown option": ({"combinations": {"x": {"architecture": "lstm"}}}, "combinations.x.architecture: unknown"),
    "gate type": ({"combinations": {"x": {"eta": "big"}}}, "combinations.x.eta: expected a number, got 'big'"),
    "n_pairs": ({"n_pairs": [0, 4]}, "n_pairs: expected a non-empty list of ints >= 1"),
    "top key": ({"pairs": [4]}, "unknown key(s) ['pairs']"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_capacity_file_is_one_line_exit_2_and_writes_nothing(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    changes, message = BAD[case]
    Path("bad.yaml").write_text(yaml.safe_dump(SMALL | changes))
    assert main(["capacity", "bad.yaml"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: bad.yaml: ") and message in errors[0], errors
    assert not Path("runs").exists()


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "sweeps" / "capacity").glob("*.yaml")))
def test_shipped_capacity_files_are_valid(path):
    spec = load_capacity(ROOT / "sweeps" / "capacity" / path)
    assert spec["combinations"]
