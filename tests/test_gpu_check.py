"""benchmarks/gpu_check.py (``make gpu-check``) on the CPU: its control flow with fake rows and a fake clock (a row's
exception is its error, a row that cannot finish in its share is not started, every test file is reached, the pilot's
projection), the kernels part at tiny shapes under Triton's interpreter with a stand-in for fla in bfloat16, the model
part's measured-beside-predicted rows and its refit, the pilot part on a machine without MLflow, Optuna or
jsonargparse, and ``atlas-lab fit --trainer.logger=false`` without
MLflow. The whole dry run, which runs a pytest subset of its own, is ``slow``."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402  (benchmarks/ is not a package)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_test_outcomes_are_counted_from_pytest_lines():
    log = "\n".join(["collected 4 items", "tests/a.py::test_x[1] PASSED [ 25%]", "tests/a.py::test_x[2] FAILED [ 50%]",
                     "tests/b.py::test_y SKIPPED (no GPU) [ 75%]", "tests/b.py::test_z PASSED [100%]",
                     "FAILED tests/a.py::test_x[2] - AssertionError", "1 failed, 2 passed, 1 skipped in 1.0s"])
    assert gpu_check.count_outcomes(log) == {"passed": 2, "failed": 1, "skipped": 1}  # not the summary's FAILED
    assert gpu_check.count_outcomes("1 passed in 0.1s") == {}


def test_a_rows_exception_is_its_error_and_the_rows_after_it_run():
    clock = FakeClock()
    cost = {"a": 10, "b": 5, "c": 20}
    given = {}

    def work(row, seconds):
        given[row["name"]] = seconds
        clock.now += cost[row["name"]]
        if row["name"] == "b":
            raise AssertionError("q.dtype != torch.float32")

    rows = gpu_check.run_rows(gpu_check.Share(100, clock), [dict(name=n) for n in "abc"], work)
    assert rows[1]["error"] == "AssertionError: q.dtype != torch.float32" and "error" not in rows[2]
    assert [r["seconds"] for r in rows] == [10, 5, 20]
    assert given == {"a": 100 / 3, "b": 90 / 2, "c": 85}  # an equal part of what is left; the last row: all of it


def test_a_row_that_cannot_finish_in_its_share_is_not_started():
    clock = FakeClock()
    ran = []

    def work(row, seconds):
        ran.append(row["T"])
        clock.now += row["T"] / 100  # a kernel row's time grows with T

    rows = [dict(case="deltanet", T=T) for T in (1024, 4096, 16384)] + [dict(case="omega", T=1024)]
    gpu_check.run_rows(gpu_check.Share(100, clock), rows, work, gpu_check.kernel_estimate)
    # 10.24 s at 1K, so ≈ 41 s at 4K (fits in 89.76), ≈ 164 s at 16K (48.8 s left): skipped; omega has no row done
    assert ran == [1024, 4096, 1024]
    assert rows[2]["check"] == "budget" and rows[2]["skipped"] == "needs ≈ 164 s, 49 s left"
    clock.now = 1000  # the share is spent: nothing starts
    late = gpu_check.run_rows(gpu_check.Share(0, clock), [dict(case="atlas", T=19)], work)
    assert late[0]["skipped"] == "share spent" and ran == [1024, 4096, 1024]
    assert gpu_check.fastest_done({}, [dict(seconds=30.0), dict(seconds=12.0), dict(seconds=1.0, error="x")]) == 12.0


def test_every_test_file_is_reached_kernels_first(tmp_path):
    clock = FakeClock()
    calls = []

    def run_file(path, device, log_path, timeout):
        calls.append((path, timeout))
        clock.now += timeout  # each file runs over and is stopped at its part of the share
        return dict(counts={"passed": 2}, returncode=None, stopped_at_budget=True, log=str(log_path))

    n = len(gpu_check.TEST_FILES)
    result = gpu_check.run_tests(gpu_check.Share(10 * n, clock), "cuda", tmp_path, run_file)
    assert [c[0] for c in calls] == gpu_check.TEST_FILES and calls[0][0] == "tests/kernels/test_kernels.py"
    assert gpu_check.TEST_FILES[2:4] == ["tests/memory/test_memory_equivalence.py",
                                         "tests/memory/test_memory_identities.py"]
    assert "tests/memory/test_plan.py" in gpu_check.TEST_FILES[-1].split()  # the others in one pytest, last
    assert [c[1] for c in calls] == [10] * n
    assert result["counts"] == {"passed": 2 * n} and result["stopped_at_budget"] and result["returncode"] == 0


def test_kernel_rows_are_checked_before_they_are_timed_and_a_peers_error_stays_in_its_row():
    def fla_refuses(x):
        raise AssertionError("ChunkDeltaRuleFunction does not support float32. Please use bfloat16.")

    rows = gpu_check.run_kernels(gpu_check.Share(600), tiny=True, Ts=None, repeats=1, fla=fla_refuses)
    assert [(r["case"], r["T"]) for r in rows] == [(c, 19) for c in ("deltanet", "omega", "atlas", "atlas (study)")]
    # at full size each case's shortest row first, the study's after atlas's (a spent share: none runs)
    order = gpu_check.run_kernels(gpu_check.Share(0), tiny=False, Ts=[1024, 4096], repeats=1, fla=fla_refuses)
    assert [(r["case"], r["T"]) for r in order] == [("deltanet", 1024), ("omega", 1024), ("atlas", 1024),
                                                    ("atlas (study)", 256), ("deltanet", 4096), ("omega", 4096),
                                                    ("atlas", 4096)]
    for r in rows:
        assert r["check"] == "correct" and r["max_rel_err"] <= gpu_check.KERNEL_CASES[r["case"]]["tol"], r
        assert r["triton_ms"] > 0 and r["chunked_ms"] > 0 and "error" not in r
    assert rows[0]["fla_error"].startswith("AssertionError: ChunkDeltaRuleFunction does not support float32")
    # the study's case (tiny here) timed on tf32 dots too, beside the model's bounds: its scratch from HBM costs more
    study = rows[-1]
    assert study["triton_tf32_ms"] > 0 and study["tflop"] > 0 and study["hbm_ms"] > study["l2_ms"] > 0


def test_fla_is_compared_in_bfloat16_at_the_bfloat16_tolerance():
    """A stand-in for fla: the exact delta rule from the bf16 inputs, its results rounded to bf16 (what fla returns)."""
    d, options = 8, dict(architecture="linear", feature_map="identity", attentional_bias="l2", window=1,
                         optimizer="gd")
    seen = []

    def fla_in_bf16(x):
        seen.append({n: t.dtype for n, t in x.items()})
        out = gpu_check.memorize_fwd_bwd(gpu_check.as_dtype(x, torch.float32), "triton", {**options, "chunk_size": 1})
        return tuple(t.to(torch.bfloat16) for t in out)

    check = gpu_check.fla_check(1, 2, d, options, "cpu", fla_in_bf16, T=16)
    assert seen == [dict.fromkeys(("q", "k", "v", "eta"), torch.bfloat16)]
    assert check["fla_ok"] and 0 < check["fla_check"] <= gpu_check.BF16_U / 2  # one rounding of each result
    assert gpu_check.FLA_BF16_TOL == 8 * 2.0 ** -8


def pilot_record(step_s, batches, val_s=0.5):
    return dict(timing=dict(step_s=step_s, val_batch_s={64: val_s}, val_overhead_s=1.0, setup_s=2.0),
                schedule=dict(train_batches=batches, val_batches={64: 10},
                              trainer=dict(max_epochs=4, val_check_interval=0.25)),
                device="cpu", threads=1)


def test_pilot_part_projects_the_study_and_goes_on_past_a_failed_configuration(tmp_path):
    sweep = tmp_path / "s.yaml"
    (tmp_path / "lightning_config.yaml").write_text((ROOT / "lightning_config.yaml").read_text())
    (tmp_path / "e.yaml").write_text("model: {preset: atlas}\n")
    sweep.write_text(textwrap.dedent(f"""\
        study: s
        base: [{tmp_path / 'e.yaml'}]
        metric: val/acc
        grid: {{model.preset: [atlas, titans, transformer]}}
        repeats: 3
        """))

    def pilot(spec, point, seconds):
        if point.label == "preset=titans":
            raise RuntimeError("CUDA out of memory")
        step = {"preset=atlas": 0.2, "preset=transformer": 0.01}[point.label]
        return pilot_record({64: step, 128: 2 * step}, {64: 300, 128: 100})

    result = gpu_check.run_pilot(gpu_check.Share(600), str(sweep), 20, pilot)
    atlas, titans, transformer = result["rows"]
    assert titans["error"] == "RuntimeError: CUDA out of memory" and "projection" in transformer
    # 4 epochs of 400 batches (300 at 0.2 s, 100 at 0.4 s); every 100 batches a validation of 10 × 0.5 s + 1 s:
    # 16, the last batch among them
    p = atlas["projection"]
    assert (p["batches"], p["validations"]) == (1600, 16)
    assert p["total"] == pytest.approx(2.0 + 4 * (300 * 0.2 + 100 * 0.4) + 16 * 6.0)
    assert atlas["mean_step_s"] == pytest.approx(0.25) and atlas["step_vs_transformer"] == pytest.approx(20.0)
    assert result["hours"] == pytest.approx(3 * (p["total"] + transformer["projection"]["total"]) / 3600)
    assert (result["piloted"], result["configurations"]) == (2, 3)
    json.dumps(result)  # kept in the JSON as it is


def test_the_pilot_takes_a_change_to_its_sweep_file(tmp_path):
    """``--set fixed.model.compile=true`` reaches every configuration's overrides (the study compiled), under a study
    name of its own."""
    sweep = tmp_path / "s.yaml"
    (tmp_path / "e.yaml").write_text("model: {preset: atlas}\n")
    sweep.write_text(f"study: s\nbase: [{tmp_path / 'e.yaml'}]\nmetric: val/acc\n"
                     "grid: {model.preset: [atlas, transformer]}\n")
    seen = []

    def pilot(spec, point, seconds):
        seen.append((spec.study, point.overrides))
        return pilot_record({64: 0.1}, {64: 100})

    result = gpu_check.run_pilot(gpu_check.Share(600), str(sweep), 20, pilot, sets=("fixed.model.compile=true",))
    assert [(study, o["model.compile"], o["model.preset"]) for study, o in seen] == \
        [("gpu-check-pilot", True, "atlas"), ("gpu-check-pilot", True, "transformer")]
    assert result["sets"] == ["fixed.model.compile=true"] and result["piloted"] == 2


BLOCKER = """\
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlflow", "optuna", "jsonargparse"):
            raise ModuleNotFoundError(f"No module named {name!r} (not on this machine)", name=name)

sys.meta_path.insert(0, Block())
"""


def test_pilot_part_runs_without_mlflow_optuna_or_jsonargparse(tmp_path):
    """The bare CUDA image's packages: the pilot part (and the process it starts) with those three unimportable."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), OMP_NUM_THREADS="1")
    out = tmp_path / "gpu_check.json"
    # the demo's grid: two points, each configuration a child process that imports Lightning (~4 s)
    two = (ROOT / "sweeps" / "demo.yaml").read_text()
    (tmp_path / "two.yaml").write_text(two.replace("base: [experiments/", f"base: [{ROOT}/experiments/"))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--parts", "pilot", "--out",
                        str(out), "--pilot-steps", "2", "--budget", "300", "--sweep", str(tmp_path / "two.yaml")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    pilot = json.loads(out.read_text())["pilot"]
    assert pilot["piloted"] == pilot["configurations"] >= 2, pilot
    assert "hours projected for one worker" in p.stdout


def test_fit_without_a_logger_never_imports_mlflow(tmp_path):
    (tmp_path / "tiny.yaml").write_text(textwrap.dedent("""\
        model: {preset: gla, d_model: 16, n_layers: 1, n_heads: 2, warmup_steps: 2}
        trainer: {max_steps: 2, enable_checkpointing: false, enable_progress_bar: false, callbacks: []}
        data:
          class_path: atlas_lab.data.mqar.MQARDataModule
          init_args: {vocab_size: 64, train_slices: [[16, 2, 64]], test_slices: [[16, 2, 32]], batch_size: 16}
        """))
    code = ("import sys; from atlas_lab.cli import main; "
            f"rc = main(['fit', '-c', {str(ROOT / 'lightning_config.yaml')!r}, '-c', 'tiny.yaml', "
            "'--trainer.logger=false']); "
            "print('mlflow modules:', sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow')); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "mlflow modules: []" in p.stdout
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_tables_print_every_part(capsys):
    result = dict(device="cpu",
                  tests=dict(device="cpu", counts={"passed": 3}, stopped_at_budget=False, log="x",
                             files=[dict(file="tests/kernels/test_kernels.py", counts={"passed": 3}, seconds=1.0,
                                         log="x.log")]),
                  kernels=[dict(case="deltanet", T=19, check="correct", chunked_ms=2.0, triton_ms=1.0, fla_ms=0.5),
                           dict(case="atlas (study)", T=256, check="correct", chunked_ms=150.0, triton_ms=90.0,
                                triton_tf32_ms=60.0, tflop=10.2, scratch_gb=211.0, l2_ms=41.0, hbm_ms=85.0)],
                  training_size=gpu_check.TRAIN_TINY,
                  training=[dict(model="transformer", parameters=1e6, step_s=0.1, tokens_per_s=640.0, peak_gib=0.5,
                                 speed_vs_transformer=1.0, memory_vs_transformer=1.0)],
                  pilot=dict(sweep="sweeps/x.yaml", steps=20, hours=1.5, piloted=1, configurations=2,
                             rows=[dict(point="preset=atlas", fits=9, step_s={"64": 0.1}, mean_step_s=0.1,
                                        projection=dict(total=600.0, one_validation=3.0)),
                                   dict(point="preset=titans", fits=9, check="budget", skipped="needs ≈ 90 s")]))
    gpu_check.print_tables(result)
    out = capsys.readouterr().out
    for title in ("(a) kernel and memory tests", "(b) memorize forward+backward", "(c) one training step", "2.00×",
                  "0.50×", "(b) the fused kernel on tf32 dots beside the GPU model", "170.0", "1.46×",
                  "(d) pilot of sweeps/x.yaml", "64: 0.1", "needs ≈ 90 s", "1.50 hours projected",
                  "1 of 2 configurations not piloted"):
        assert title in out


def gpu_check_run(tmp_path, *args):
    out = tmp_path / "gpu_check.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(out), *args],
                       capture_output=True, text=True, timeout=2400)
    return p, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    # an upper bound (each part ends when its rows are done): on 2 cores shared with other jobs it took 7 min
    p, result = gpu_check_run(tmp_path, "--budget", "1800")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert result["device"] == "cpu" and result["tiny"] and "CPU / Triton interpreter" in p.stdout
    tests = result["tests"]
    assert tests["counts"].get("passed", 0) > 0 and not tests["counts"].get("failed") and tests["returncode"] == 0
    # every pytest started (a file that runs over its part of the share on a busy machine is stopped, its tests kept)
    assert [f["file"] for f in tests["files"]] == gpu_check.TEST_FILES
    assert all(f.get("check") != "budget" and "counts" in f for f in tests["files"])
    assert {r["case"] for r in result["kernels"]} == {"deltanet", "omega", "atlas", "atlas (study)"}
    assert all(r["check"] == "correct" and r["triton_ms"] > 0 for r in result["kernels"])
    rows = {r["model"]: r for r in result["training"]}
    assert set(rows) == {"transformer", "gated_deltanet", "titans", "atlas", "atlas (read=chunk)"}
    for model, row in rows.items():
        assert row.get("finite") and row["tokens_per_s"] > 0 and row["peak_gib"] > 0, (model, row)
    assert rows["transformer"]["speed_vs_transformer"] == 1.0
    assert result["pilot"]["piloted"] == result["pilot"]["configurations"] >= 2 and result["pilot"]["hours"] > 0
    for title in ("(a) kernel and memory tests", "(b) memorize forward+backward", "(c) one training step",
                  "(d) pilot of sweeps/demo.yaml"):
        assert title in p.stdout


def test_gpu_check_keeps_what_finished_when_the_budget_runs_out(tmp_path):
    p, result = gpu_check_run(tmp_path, "--budget", "0.001", "--parts", "kernels", "training")
    assert p.returncode == 0, p.stderr[-3000:]
    checks = [r.get("check") for r in result["kernels"]]  # the first row may start (no estimate yet) and finishes
    assert checks[1:] == ["budget"] * 3 and checks[0] in ("correct", "budget")
    assert all(r["error"].startswith("budget") for r in result["training"])
    assert set(result["seconds"]) == {"kernels", "training", "total"}


def test_the_model_part_puts_measured_beside_predicted_and_refits_on_the_pilot(capsys):
    """The model's record (counts by configuration and length, the H200 fit) against a pilot and training rows: each
    measured step with its prediction; refitted to the pilot's points (steps made by known constants: the refit finds
    them), and a configuration the count did not reach has no prediction."""
    import gpu_model

    known = gpu_model.Constants(C0=2e-3, C_launch=20e-6, R=50e12)
    counts = {"transformer": {"64": dict(launches=300, flops=4e10), "128": dict(launches=300, flops=8e10)},
              "titans": {"64": dict(launches=3000, flops=4e10), "128": dict(launches=6000, flops=9e10)}}
    rec = dict(fit=gpu_model.fit_report([dict(preset=n, L=int(L), measured=known.predict(c["launches"], c["flops"]),
                                              **c) for n, by_L in counts.items() for L, c in by_L.items()]),
               counts=counts, train={"transformer": dict(launches=1500, flops=5e12)},
               train_size=dict(T=4096), seconds={})
    pilot = [dict(point=f"preset={n}", step_s={L: known.predict(c["launches"], c["flops"]) for L, c in by_L.items()})
             for n, by_L in counts.items()] + [dict(point="preset=atlas", step_s={"64": 1.5})]
    result = dict(device="cuda", pilot=dict(rows=pilot), training=[dict(model="transformer", step_s=0.2),
                                                                   dict(model="atlas", error="budget")])
    model = gpu_check.model_rows(rec, result, refit=True)
    rows = {(r["part"], r["name"], r["L"]): r for r in model["rows"]}
    assert set(rows) == {("pilot", "transformer", 64), ("pilot", "transformer", 128), ("pilot", "titans", 64),
                         ("pilot", "titans", 128), ("pilot", "atlas", 64), ("training", "transformer", 4096)}
    assert rows[("pilot", "titans", 128)]["predicted"] == pytest.approx(rows[("pilot", "titans", 128)]["measured"])
    assert model["refit"]["constants"]["C_launch"] == pytest.approx(known.C_launch, rel=1e-9)
    assert "predicted" not in rows[("pilot", "atlas", 64)]
    assert rows[("training", "transformer", 4096)]["predicted"] == pytest.approx(known.predict(1500, 5e12))
    assert gpu_check.model_rows(rec, result, refit=False)["refit"] is None  # the CPU's times fit no GPU
    gpu_check.print_tables(dict(device="cuda", model=model))
    out = capsys.readouterr().out
    assert "(e) one training step, measured beside the GPU model" in out and "refitted to this pilot" in out
