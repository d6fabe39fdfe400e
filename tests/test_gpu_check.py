"""benchmarks/gpu_check.py (``make gpu-check``) runs through on the CPU: the same code as on a GPU at tiny shapes,
the kernels under Triton's interpreter; every part lands in its JSON, and a part past its budget keeps its rows."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(tmp_path, *args):
    out = tmp_path / "gpu_check.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(out), *args],
                       capture_output=True, text=True, timeout=600)
    return p, json.loads(out.read_text()) if out.exists() else None


def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    p, result = gpu_check(tmp_path, "--budget", "900")  # an upper bound: on 2 idle cores it ends in about 2 min
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
    p, result = gpu_check(tmp_path, "--budget", "0.001", "--parts", "kernels", "training")
    assert p.returncode == 0, p.stderr[-3000:]
    checks = [r["check"] for r in result["kernels"]]  # the row under way when the budget ends finishes
    assert checks[1:] == ["budget"] * 2 and checks[0] in ("correct", "budget")
    assert all(r["error"] == "budget" for r in result["training"])
    assert set(result["seconds"]) == {"kernels", "training", "total"}
