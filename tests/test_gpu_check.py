"""benchmarks/gpu_check.py (``make gpu-check``) on the CPU: each part called directly at tiny shapes (the kernels
under Triton's interpreter); the whole dry run, which runs a pytest subset of its own, is ``slow``."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402  (benchmarks/ is not a package)


def test_test_outcomes_are_counted_from_pytest_lines():
    log = "\n".join(["collected 4 items", "tests/a.py::test_x[1] PASSED [ 25%]", "tests/a.py::test_x[2] FAILED [ 50%]",
                     "tests/b.py::test_y SKIPPED (no GPU) [ 75%]", "tests/b.py::test_z PASSED [100%]",
                     "FAILED tests/a.py::test_x[2] - AssertionError", "1 failed, 2 passed, 1 skipped in 1.0s"])
    assert gpu_check.count_outcomes(log) == {"passed": 2, "failed": 1, "skipped": 1}  # not the summary's FAILED
    assert gpu_check.count_outcomes("1 passed in 0.1s") == {}


def test_kernel_rows_are_checked_before_they_are_timed():
    rows = gpu_check.run_kernels(gpu_check.Budget(600), tiny=True, Ts=None, repeats=1)
    assert [(r["case"], r["T"]) for r in rows] == [(c, 19) for c in ("deltanet", "omega", "atlas")]
    for r in rows:
        assert r["check"] == "correct" and r["max_rel_err"] <= gpu_check.KERNEL_CASES[r["case"]]["tol"], r
        assert r["triton_ms"] > 0 and r["chunked_ms"] > 0


def test_training_step_of_a_memory_model_is_finite_and_measured():
    row = gpu_check.train_child("atlas (read=chunk)", gpu_check.TRAIN_TINY, steps=1)
    assert row["finite"] and row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["peak_gib"] > 0
    assert row["parameters"] > 0


def test_tables_print_every_part(capsys):
    result = dict(device="cpu", tests=dict(device="cpu", counts={"passed": 3}, stopped_at_budget=False, log="x.log"),
                  kernels=[dict(case="deltanet", T=19, check="correct", chunked_ms=2.0, triton_ms=1.0)],
                  training_size=gpu_check.TRAIN_TINY,
                  training=[dict(model="transformer", parameters=1e6, step_s=0.1, tokens_per_s=640.0, peak_gib=0.5,
                                 speed_vs_transformer=1.0, memory_vs_transformer=1.0)])
    gpu_check.print_tables(result)
    out = capsys.readouterr().out
    for title in ("(a) memory and kernel tests", "(b) memorize forward+backward", "(c) one training step", "2.00×"):
        assert title in out


def gpu_check_run(tmp_path, *args):
    out = tmp_path / "gpu_check.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(out), *args],
                       capture_output=True, text=True, timeout=600)
    return p, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    p, result = gpu_check_run(tmp_path, "--budget", "900")  # an upper bound: on 2 idle cores it ends in about 2 min
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert result["device"] == "cpu" and result["tiny"] and "CPU / Triton interpreter" in p.stdout
    tests = result["tests"]
    assert tests["counts"].get("passed", 0) >= 20 and not tests["counts"].get("failed") and tests["returncode"] == 0
    assert {r["case"] for r in result["kernels"]} == {"deltanet", "omega", "atlas"}
    assert all(r["check"] == "correct" and r["triton_ms"] > 0 for r in result["kernels"])
    rows = {r["model"]: r for r in result["training"]}
    assert set(rows) == {"transformer", "gated_deltanet", "titans", "atlas", "atlas (read=chunk)"}
    for model, row in rows.items():
        assert row.get("finite") and row["tokens_per_s"] > 0 and row["peak_gib"] > 0, (model, row)
    assert rows["transformer"]["speed_vs_transformer"] == 1.0
    for title in ("(a) memory and kernel tests", "(b) memorize forward+backward", "(c) one training step"):
        assert title in p.stdout


def test_gpu_check_keeps_what_finished_when_the_budget_runs_out(tmp_path):
    p, result = gpu_check_run(tmp_path, "--budget", "0.001", "--parts", "kernels", "training")
    assert p.returncode == 0, p.stderr[-3000:]
    checks = [r["check"] for r in result["kernels"]]  # the row under way when the budget ends finishes
    assert checks[1:] == ["budget"] * 2 and checks[0] in ("correct", "budget")
    assert all(r["error"] == "budget" for r in result["training"])
    assert set(result["seconds"]) == {"kernels", "training", "total"}
