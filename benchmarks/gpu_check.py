"""The GPU path in one run (``make gpu-check``): tests on the device, kernel timings, training steps, the pilot of a
sweep, one JSON.

    python benchmarks/gpu_check.py [--budget 450] [--parts tests kernels training pilot model] [--sweep FILE]
                                   [--set KEY=VALUE ...]

(a) tests     the kernel and memory tests (tests/kernels, tests/memory) and the compiled blocks' (tests/models/
              test_compile.py) with ``--device cuda``: one pytest per file
              for tests/kernels/test_kernels.py first, then fla's, the memories' equivalence and identity tests, then
              one for the other files, each given an equal part of what is left of the share (one that runs over it
              is stopped and the next one starts), so each is reached; passed / failed /
              skipped counted from pytest's per-test lines. Triton's compiled kernels persist in ``TRITON_CACHE_DIR``
              (default runs/triton-cache, ignored by git): a second run compiles nothing it compiled before.
(b) kernels   forward+backward of ``memorize`` for the deltanet, omega and atlas cases at T ∈ {1K, 4K, 16K}:
              triton against chunked, both float32, each row checked before it is timed (outputs and the gradients of
              q, k, v and every gate; a wrong kernel is never timed); and atlas's call at the study's shape (B 64,
              8 heads, T 256: 512 programs; checked on its first 4 sequences, the chunked path's time there its
              column's error if it does not fit), its fused kernel timed again on tf32 dots beside the GPU model's two
              bounds of it (its dots as issued at the stated tf32 rate, its scratch in L2 or from HBM). Rows run
              shortest first: each case's at 1K (and atlas's at the study's shape, after atlas's first, whose compiled
              float32 kernel it reuses), then each at 4K, then at 16K. Where fla-core is installed, its
              ``chunk_delta_rule`` for the deltanet rows in bfloat16, the only dtype it accepts: checked once against
              our triton kernel at chunk 1 (the exact delta rule; float32 on the same bf16-rounded inputs, T = 256) at
              ``FLA_BF16_TOL`` (its error model below), then timed at each T at its own chunk of 64.
(c) training  one training step (forward, backward, AdamW) of transformer, gated_deltanet, titans, atlas and atlas
              with chunk-start reads (``read="chunk"``) at a 125M-class size (d_model 768, 12 layers, 12 heads,
              vocab 32,000, T = 4096, batch 1) under bf16 autocast, each in its own process: median step time,
              tokens/s, peak memory, and the ratios to the transformer.
(d) pilot     the Lightning fit of each distinct configuration of a sweep file (``--sweep``, default
              sweeps/mqar_gpu.yaml) at its fixed sizes, each in its own process: ``--pilot-steps`` batches of every
              training length and one validation of 3 batches a length (atlas_lab/sweep/estimate.py, the code of
              ``atlas-lab sweep FILE --estimate``): s/step by length, one validation's seconds, and the projected hours
              of each configuration and of the whole study. ``--set KEY=VALUE`` changes the sweep file as ``atlas-lab
              sweep --set`` does (``--set fixed.model.compile=true``: the study with compiled blocks).
(e) model     the GPU model (benchmarks/gpu_model.py): each pilot configuration's and each training model's step
              counted on the CPU (launches, FLOPs; the meta device, the plan asked as on CUDA), in a process of its own
              beside the other parts (on the CPU: after them), given ``MODEL_GRACE`` seconds after the parts (what it
              counted by then is used): measured beside predicted, with the constants fitted to the H200 table and, on
              a GPU, refitted to this run's pilot (``gpu_model.fit``). No share of the budget.
(f) one JSON, runs/bench/gpu_check.json (gpu_check.cpu.json without CUDA), and the tables.

Budget. Each part has its share of ``--budget`` (seconds; tests 30 %, kernels 20 %, training 20 %, pilot 30 %) and
keeps what finished. A row is not started when it cannot finish in what is left of its share, by an estimate from
the rows done (a kernel row: the last row of its case scaled by T; a process row: the fastest row done); such a row
is marked ``budget``. An exception in a row is that row's error, and the run goes on; an exception that stops a part
is that part's error, and the next part runs.

Needs torch, lightning, triton, numpy, pyyaml, rich and pytest only (not mlflow, optuna or jsonargparse): atlas_lab is
imported from this checkout. Without CUDA the same code runs at tiny shapes on the CPU — the kernels under Triton's
interpreter, a test subset, sweeps/demo.yaml's pilot at 3 steps — so CI proves the script runs; those times mean
nothing. Exit status 1 if a test fails or one of our kernels is wrong or raises.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # atlas_lab from this checkout, installed or not
    sys.path.insert(1, str(ROOT))
CUDA = torch.cuda.is_available()
if not CUDA:  # before triton is first imported: the kernels then run under its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
# compiled kernels kept between runs (this process and the pytest and child processes it starts)
os.environ.setdefault("TRITON_CACHE_DIR", str(ROOT / "runs" / "triton-cache"))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])

import common  # noqa: E402  (benchmarks/common.py; TRITON_INTERPRET must be set first)

SHARES = {"tests": 0.3, "kernels": 0.2, "training": 0.2, "pilot": 0.3}
FIRST_TESTS = ["tests/kernels/test_kernels.py", "tests/memory/test_fla_kernels.py",
               "tests/memory/test_memory_equivalence.py", "tests/memory/test_memory_identities.py"]
# one pytest each for the kernels' tests, fla's and the memories' equivalence and identities, in this order; then one
# for every other file of tests/kernels and tests/memory and the compiled blocks' tests (each pytest costs its start:
# torch, triton, the conftest)
OTHER_TESTS = sorted(str(p.relative_to(ROOT)) for d in ("tests/kernels", "tests/memory") for p in (ROOT / d).glob(
    "test_*.py") if str(p.relative_to(ROOT)) not in FIRST_TESTS) + ["tests/models/test_compile.py"]
TEST_FILES = [f for f in FIRST_TESTS if (ROOT / f).is_file()] + ([" ".join(OTHER_TESTS)] if OTHER_TESTS else [])
# on the CPU: a subset of the same files that runs in about a minute (the whole default suite covers them in CI)
CPU_TESTS = "newton_schulz_matches_reference or chunk_size_one_is_the_online_rule or linear_attention or " \
            "split_into_calls and triton"
# a -v line starts with the test id; a summary line ("FAILED path::test - …") starts with the outcome
OUTCOME = re.compile(r"^\S+::\S+ .*?\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")

KERNEL_CASES = {
    "deltanet": dict(d=64, architecture="linear", feature_map="identity", attentional_bias="l2", window=1,
                     optimizer="gd", chunk_size=64, gates=("eta",), tol=1e-4),
    "omega": dict(d=64, architecture="linear", feature_map="identity", attentional_bias="l2", window=16,
                  optimizer="momentum", chunk_size=64, gates=("alpha", "eta", "theta", "gamma"), tol=1e-4),
    # quintic NS amplifies float32 rounding (~a^k ≈ 480×) in the gradients: a looser tolerance for those
    "atlas": dict(d=16, architecture="mlp", feature_map="polynomial", attentional_bias="l2", window=8,
                  optimizer="muon", chunk_size=16, gates=("alpha", "eta", "theta", "gamma"), tol=2e-3),
}
# atlas's memory call at the study's shape (sweeps/mqar_gpu.yaml: B 64, 8 memory heads of 16, T 256; W1 64 × 153 on
# the fused muon kernel, 512 programs): checked and timed as the rows above, then the fused kernel timed again on tf32
# dots beside what the GPU model says of it — its dots as issued at the stated tf32 rate, and that plus its scratch
# moved at HBM's bandwidth (gpu_model.TF32_RATE, gpu_model.HBM): the measurement atlas's step verdict waits on
KERNEL_CASES["atlas (study)"] = dict(KERNEL_CASES["atlas"], shape=dict(B=64, H=8, T=256), tf32=True)
CHECK_B = 4  # sequences a case at its own shape is checked on
# fla's chunk_delta_rule in bfloat16 against our float32 exact delta rule on the same bf16-rounded inputs. Error model:
# bf16's unit roundoff u = 2^-8; fla keeps every stored intermediate in the inputs' dtype (forward: the WY factors w
# and u, the chunk states h, the output o; backward: dh, dv, the gradients of q, k, w, u, v and β), each rounding
# costs ≤ u/2 relative, and the delta rule does not amplify it (‖I − β k kᵀ‖ ≤ 1 for ‖k‖ = 1, β ∈ (0, 1)). The
# longest chain to a gradient passes ≤ 10 such roundings: ≤ 5u ≈ 2.0e-2, against a tolerance of 8u ≈ 3.1e-2.
BF16_U = 2.0 ** -8
FLA_BF16_TOL = 8 * BF16_U
FLA_CHECK_T = 256
KERNEL_TINY = dict(B=1, H=2, T=[19], d=8, chunk_size=8, window_cap=4)

TRAIN_MODELS = {"transformer": None, "gated_deltanet": None, "titans": None, "atlas": None,
                "atlas (read=chunk)": ("atlas", {"read": "chunk"})}
TRAIN_SIZE = dict(d_model=768, n_layers=12, n_heads=12, vocab=32000, T=4096, batch=1)
TRAIN_TINY = dict(d_model=32, n_layers=2, n_heads=2, vocab=256, T=64, batch=1)
PILOT_SWEEP, PILOT_SWEEP_TINY = "sweeps/mqar_gpu.yaml", "sweeps/demo.yaml"
PILOT_STEPS, PILOT_STEPS_TINY = 20, 3
PILOT_OWN = 0.8  # of a pilot row's time: the pilot's own limit (the rest: its process's start and imports)
PARTS = list(SHARES) + ["model"]  # model: counted on the CPU beside the other parts, no share of the budget
MODEL_GRACE = 60.0  # seconds the model's count may run on after the other parts (then what it counted is used)


class Share:
    """Seconds left of one part's share (``clock``: seconds, a fake one in the tests)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.end = clock() + seconds

    def left(self) -> float:
        return self.end - self.clock()


def run_rows(share: Share, rows: list[dict], work: Callable[[dict, float], None],
             estimate: Callable[[dict, list[dict]], float | None] = lambda row, done: None) -> list[dict]:
    """Each row in turn: skipped (``check`` = "budget", ``skipped`` says why) when the share is spent or
    ``estimate(row, rows done)`` seconds (None: no estimate) are more than what is left; else ``work(row, seconds
    it may take)``, its exception the row's ``error``; ``seconds`` the row's wall time. Returns ``rows``."""
    done: list[dict] = []
    for i, row in enumerate(rows):
        left = share.left()
        guess = estimate(row, done) if done else None
        if left <= 0 or (guess is not None and guess > left):
            row["check"] = "budget"
            row["skipped"] = "share spent" if left <= 0 else f"needs ≈ {guess:.0f} s, {left:.0f} s left"
            continue
        started = share.clock()
        try:
            work(row, left / (len(rows) - i) if i < len(rows) - 1 else left)
        except Exception as e:  # this row's error; the next row runs
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        row["seconds"] = share.clock() - started
        done.append(row)
    return rows


def fastest_done(row: dict, done: list[dict]) -> float | None:
    """A process row's estimate: the fastest row done (a row that cannot finish in that cannot finish at all)."""
    times = [r["seconds"] for r in done if "error" not in r]
    return min(times) if times else None


# ---------------------------------------------------------------- (a) tests

def pytest_file(path: str, device: str, log_path: Path, timeout: float) -> dict:
    """pytest on one test file (or several, space-separated) with ``--device``; counts from its -v lines (kept when
    stopped at ``timeout``)."""
    cmd = [sys.executable, "-m", "pytest", *path.split(), "-m", "not slow", "-v", "-p", "no:cacheprovider", "-p",
           "no:xdist", "--device", device]
    if device == "cpu":
        cmd += ["-k", CPU_TESTS]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:  # unbuffered: the lines written before a stop are all there
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            proc.wait(timeout=max(1.0, timeout))
            stopped = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped = True
    return dict(counts=count_outcomes(log_path.read_text(errors="replace")),
                returncode=None if stopped else proc.returncode, stopped_at_budget=stopped, log=str(log_path))


def run_tests(share: Share, device: str, log_dir: Path, run_file: Callable = pytest_file) -> dict:
    """Every file of ``TEST_FILES`` in order, each with an equal part of what is left of the share; the counts
    summed. ``run_file(path, device, log_path, timeout)``: one file's result (a fake one in the tests)."""
    files = [dict(file=f) for f in TEST_FILES]

    def work(row, seconds):
        name = Path(row["file"]).stem if " " not in row["file"] else "other_tests"
        row.update(run_file(row["file"], device, log_dir / f"{name}.log", seconds))

    run_rows(share, files, work)
    counts: dict[str, int] = {}
    for f in files:
        for outcome, n in f.get("counts", {}).items():
            counts[outcome] = counts.get(outcome, 0) + n
    return dict(device=device, counts=counts, files=files,
                stopped_at_budget=any(f.get("stopped_at_budget") or f.get("check") == "budget" for f in files),
                returncode=next((f["returncode"] for f in files if f.get("returncode") not in (None, 0, 5)), 0),
                log=str(log_dir))  # 5: pytest collected nothing (a file without a test of the CPU subset)


def count_outcomes(log: str) -> dict[str, int]:
    """{outcome: count} from the per-test lines of ``pytest -v`` (``path::test PASSED [ 5%]``)."""
    counts = {}
    for line in log.splitlines():
        m = OUTCOME.match(line)
        if m:
            counts[m.group(1).lower()] = counts.get(m.group(1).lower(), 0) + 1
    return counts


# ---------------------------------------------------------------- (b) kernels

def kernel_inputs(B, T, H, d, gates, device, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g)

    x = dict(q=r(B, T, H, d), k=torch.nn.functional.normalize(r(B, T, H, d), dim=-1), v=r(B, T, H, d),
             alpha=torch.sigmoid(r(B, T, H) + 5), eta=0.5 * torch.sigmoid(r(B, T, H)),
             theta=torch.sigmoid(r(B, T, H) + 2), gamma=torch.sigmoid(r(B, T, H)))
    return {n: t.to(device).requires_grad_() for n, t in x.items() if n in ("q", "k", "v") or n in gates}


def as_dtype(x: dict, dtype) -> dict:
    return {n: t.detach().to(dtype).requires_grad_() for n, t in x.items()}


def memorize_fwd_bwd(x, impl, options):
    """Output and the gradients of every input for a fixed linear loss."""
    from atlas_lab.memory import memorize

    o, _ = memorize(x["q"], x["k"], x["v"], gates={n: x[n] for n in ("alpha", "eta", "theta", "gamma") if n in x},
                    impl=impl, **options)
    w = torch.linspace(-1, 1, o.shape[-1], device=o.device)
    return (o.detach(), *torch.autograd.grad((o * w).sum(), list(x.values())))


def fla_fwd_bwd(x):
    """fla's chunk_delta_rule on the same problem (its state is our Wᵀ; scale 1 = no q scaling), in the inputs'
    dtype (bfloat16: fla 0.6 refuses float32)."""
    from fla.ops.delta_rule import chunk_delta_rule

    o, _ = chunk_delta_rule(x["q"], x["k"], x["v"], x["eta"], scale=1.0, output_final_state=True)
    w = torch.linspace(-1, 1, o.shape[-1], device=o.device, dtype=o.dtype)
    return (o.detach(), *torch.autograd.grad((o * w).sum(), list(x.values())))


def max_rel_err(a, b) -> float:
    return max(common.rel_err(x, y) for x, y in zip(a, b))


def timed_ms(fn, repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of ``repeats`` calls after ``warmup`` (CUDA events on a GPU, wall time on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def fla_check(B, H, d, options, device, fla=fla_fwd_bwd, T=FLA_CHECK_T) -> dict:
    """fla (bfloat16) against our exact delta rule (triton, chunk 1, float32) on the same bf16-rounded inputs."""
    x = as_dtype(kernel_inputs(B, T, H, d, ("eta",), device, seed=1), torch.bfloat16)
    err = max_rel_err(fla(x), memorize_fwd_bwd(as_dtype(x, torch.float32), "triton", {**options, "chunk_size": 1}))
    return dict(fla_check=err, fla_ok=err <= FLA_BF16_TOL)


def kernel_estimate(row: dict, done: list[dict]) -> float | None:
    """The last row done of the same case, scaled by T (the kernels' cost grows linearly in T)."""
    same = [r for r in done if r["case"] == row["case"] and "error" not in r]
    return same[-1]["seconds"] * row["T"] / same[-1]["T"] if same else None


def model_bounds(B: int, T: int, H: int, d: int, gates: dict, options: dict) -> dict:
    """What the GPU model says of a memory call on the chunk kernels (float32 on tf32 dots, as planned on CUDA): its
    launches, its dots as issued (TFLOP), its scratch's bytes (GB), and its milliseconds at gpu_model's stated tf32
    rate with the scratch kept in L2 (``l2_ms``) and moved at HBM's bandwidth (``hbm_ms``). ``gates``: the call's
    gate tensors."""
    import gpu_model
    from atlas_lab.memory import MemoryConfig
    from atlas_lab.memory.plan import CANDIDATES, Shapes, acting, call_problem

    config = MemoryConfig(**options)
    problem = call_problem(config, Shapes(B, T, H, d, d), torch.float32, "cuda", acting(config.resolve().specs,
                                                                                       gates))
    cost = CANDIDATES["triton"].cost(problem)
    l2 = cost.seconds_at(gpu_model.TF32_RATE)
    return dict(tflop=cost.flops / 1e12, scratch_gb=cost.scratch / 1e9, l2_ms=1e3 * l2,
                hbm_ms=1e3 * (l2 + cost.scratch / gpu_model.HBM))


def run_kernels(share: Share, tiny: bool, Ts, repeats: int, fla: Callable | None = None) -> list[dict]:
    """One row per (case, T): the check, then chunked / triton times (/ fla's in bf16 for deltanet) and ratios.
    ``fla``: fla's forward+backward (default: ``fla_fwd_bwd`` where fla-core is installed and CUDA is there)."""
    import importlib.util

    device = "cuda" if CUDA else "cpu"
    B, H = (KERNEL_TINY["B"], KERNEL_TINY["H"]) if tiny else (2, 4)
    Ts = KERNEL_TINY["T"] if tiny else Ts
    if fla is None and CUDA and importlib.util.find_spec("fla") is not None:
        fla = fla_fwd_bwd
    by_case, settings = {}, {}
    for name, setting in KERNEL_CASES.items():
        options = {n: v for n, v in setting.items() if n not in ("d", "gates", "tol", "shape", "tf32")}
        d, shape = setting["d"], dict(B=B, H=H) if tiny else setting.get("shape", dict(B=B, H=H))
        if tiny:
            d, options["chunk_size"] = KERNEL_TINY["d"], KERNEL_TINY["chunk_size"]
            options["window"] = min(options["window"], KERNEL_TINY["window_cap"])
        settings[name] = (d, options, shape)
        by_case[name] = [dict(case=name, T=T) for T in ([shape["T"]] if "T" in shape else Ts)]
    # every case's shortest row first, then the next length of each: the share is spent in order, and a case's
    # first row (atlas at the study's shape among them, after atlas's first, whose compiled kernel it reuses) comes
    # before any case's longer ones
    rows = [r for i in range(max(map(len, by_case.values()))) for case in by_case.values() for r in case[i:i + 1]]
    fla_state: dict = {}

    def work(row, seconds):
        setting = KERNEL_CASES[row["case"]]
        d, options, shape = settings[row["case"]]
        x = kernel_inputs(shape["B"], row["T"], shape["H"], d, setting["gates"], device)
        # a case at its own shape is checked on its first CHECK_B sequences (each sequence its own problem: the
        # chunked path's per-token intermediates at the study's B would be tens of GB), then timed whole
        checked = {n: t.detach()[:CHECK_B].requires_grad_() for n, t in x.items()} if "T" in shape else x
        results, cold = {}, {}
        for impl in ("triton", "chunked"):  # the check's own calls are timed too: the times of a tiny run
            t = time.perf_counter()
            results[impl] = memorize_fwd_bwd(checked, impl, options)
            cold[impl] = 1e3 * (time.perf_counter() - t)
        err = max_rel_err(results["triton"], results["chunked"])
        row.update(check="correct" if err <= setting["tol"] else "WRONG", max_rel_err=err)
        if err > setting["tol"]:  # never time a wrong kernel
            return
        if tiny:
            row.update(chunked_ms=cold["chunked"], triton_ms=cold["triton"])
        else:
            row["triton_ms"] = timed_ms(lambda: memorize_fwd_bwd(x, "triton", options), repeats)
            try:  # the chunked path at a case's own shape may not fit the device: its column's error, not the row's
                row["chunked_ms"] = timed_ms(lambda: memorize_fwd_bwd(x, "chunked", options), repeats)
            except torch.OutOfMemoryError as e:
                row["chunked_error"] = f"{type(e).__name__}: {e}"[:300]
                torch.cuda.empty_cache()
        if setting.get("tf32"):
            before = torch.get_float32_matmul_precision()
            try:
                torch.set_float32_matmul_precision("high")
                row["triton_tf32_ms"] = timed_ms(lambda: memorize_fwd_bwd(x, "triton", options), repeats,
                                                 warmup=0 if tiny else 2)  # tiny: one call (the interpreter's)
            finally:
                torch.set_float32_matmul_precision(before)
            row.update(model_bounds(shape["B"], row["T"], shape["H"], d, {g: x[g] for g in setting["gates"]},
                                    options))
        if fla is None or row["case"] != "deltanet":
            return
        try:  # a peer's failure is its columns' error; our row stands
            if not fla_state:
                fla_state.update(fla_check(B, H, d, options, device, fla, T=Ts[0] if tiny else FLA_CHECK_T))
            row["fla_check"] = fla_state["fla_check"]
            if fla_state["fla_ok"]:
                xb = as_dtype(x, torch.bfloat16)
                row["fla_ms"] = timed_ms(lambda: fla(xb), 1 if tiny else repeats)
        except Exception as e:
            fla_state.setdefault("fla_check", None)
            fla_state.setdefault("fla_ok", False)
            row["fla_error"] = f"{type(e).__name__}: {e}"[:300]

    return run_rows(share, rows, work, kernel_estimate)


# ---------------------------------------------------------------- (c) training steps

def train_model(label: str, size: dict, device: str):
    """A model of ``TRAIN_MODELS`` at ``size`` on ``device`` (seeded; memory layers recompute each chunk in the
    backward) and its AdamW (torch's foreach choice: foreach on CUDA)."""
    from atlas_lab.models import LanguageModel

    preset, memory = TRAIN_MODELS[label] or (label, None)
    torch.manual_seed(0)
    model = LanguageModel(size["vocab"], preset, d_model=size["d_model"], n_layers=size["n_layers"],
                          n_heads=size["n_heads"], memory=dict(memory or {}, checkpoint=True)
                          if preset != "transformer" else None).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True if device != "cpu" else None)


def train_step(model, opt, ids, device_type: str):
    """One training step (part c's): forward under bf16 autocast, next-token cross-entropy in float32, backward,
    AdamW; returns the loss (not read: no synchronisation)."""
    with torch.autocast(device_type, dtype=torch.bfloat16):
        logits, _ = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def train_child(label: str, size: dict, steps: int) -> dict:
    """One model's training step at ``size`` (in this process): median seconds of ``steps`` steps after a warm-up,
    tokens/s and peak memory (CUDA: max allocated; CPU: the process's peak resident set)."""
    device = "cuda" if CUDA else "cpu"
    if not CUDA:
        torch.set_num_threads(1)
    model, opt = train_model(label, size, device)
    ids = torch.randint(0, size["vocab"], (size["batch"], size["T"] + 1), device=device)

    def step():
        loss = train_step(model, opt, ids, device)
        if CUDA:
            torch.cuda.synchronize()
        return loss.item()

    loss = step()  # warm-up: allocator, autotuning, compilation of the CPU NS kernel
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    if CUDA:
        peak = torch.cuda.max_memory_allocated()
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = statistics.median(times)
    return dict(parameters=model.num_parameters(), step_s=seconds, tokens_per_s=size["batch"] * size["T"] / seconds,
                peak_gib=peak / 2**30, loss=loss, finite=bool(torch.isfinite(torch.tensor(loss))))


def run_training(share: Share, size: dict, steps: int) -> list[dict]:
    """Each model in a fresh process (an out-of-memory or a slow model costs only its own row), given an equal part
    of what is left of the share."""
    def work(row, seconds):
        cmd = [sys.executable, __file__, "--child", row["model"], "--size", json.dumps(size), "--steps", str(steps)]
        row.update(common.run_child(cmd, timeout=seconds))
        if "timed out" in row.get("error", ""):
            row["error"] = f"budget ({seconds:.0f} s: a step did not finish)"

    rows = run_rows(share, [dict(model=label) for label in TRAIN_MODELS], work, fastest_done)
    for r in rows:
        if r.get("check") == "budget":
            r["error"] = "budget"
    base = next((r for r in rows if r["model"] == "transformer" and "tokens_per_s" in r), None)
    for r in rows:
        if base and "tokens_per_s" in r:
            r["speed_vs_transformer"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["memory_vs_transformer"] = r["peak_gib"] / base["peak_gib"]
    return rows


# ---------------------------------------------------------------- (d) pilot of a sweep

def run_pilot(share: Share, sweep: str, steps: int, pilot: Callable | None = None, sets: tuple[str, ...] = ()) -> dict:
    """Each distinct configuration of ``sweep`` (changed by ``sets``, ``KEY=VALUE`` as ``atlas-lab sweep --set`` takes
    them) piloted (``pilot(spec, point, seconds)``: its record; default ``estimate.pilot`` in a process of its own,
    stopped at ``seconds``), then its projection and the study's hours over the configurations piloted."""
    from atlas_lab.sweep import estimate
    from atlas_lab.sweep.spec import load_sweep

    spec = load_sweep(ROOT / sweep if not Path(sweep).is_absolute() else sweep, sets,
                      study="gpu-check-pilot" if sets else None)
    points = estimate.study_points(spec)

    def in_child(spec, point, seconds):
        # the pilot stops its training early to finish in its time (its process starts and builds first)
        record = common.run_child(estimate.pilot_command(spec, point, steps, seconds=PILOT_OWN * seconds),
                                  timeout=seconds)
        if "error" in record:
            raise RuntimeError(record["error"])
        return record

    pilot = pilot or in_child

    def work(row, seconds):
        row.update(estimate.estimate_row(row["_point"], pilot(spec, row["_point"], seconds)))

    rows = run_rows(share, [dict(point=p.label, fits=p.fits, _point=p) for p in points], work, fastest_done)
    for r in rows:
        del r["_point"]
        if "step_s" in r:
            r["step_s"] = {str(k): v for k, v in r["step_s"].items()}
    base = next((r for r in rows if r["point"].endswith("=transformer") and "projection" in r), None)
    for r in rows:
        if "projection" in r:
            r["mean_step_s"] = r["projection"]["training"] / max(1, r["projection"]["batches"])
            if base:
                r["step_vs_transformer"] = r["mean_step_s"] / (base["projection"]["training"]
                                                               / max(1, base["projection"]["batches"]))
    return dict(sweep=sweep, sets=list(sets), steps=steps, rows=rows, hours=estimate.study_hours(rows),
                piloted=sum("projection" in r for r in rows), configurations=len(rows))


# ---------------------------------------------------------------- (e) the GPU model

def start_model(record: Path, sweep: str, sets: tuple[str, ...], size: dict, log: Path) -> subprocess.Popen:
    """benchmarks/gpu_model.py counting, on the CPU (the meta device), the pilot's configurations and the training
    models at ``size``, in a process of its own that writes ``record`` as it goes; started beside the other parts."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_model.py"), "--record", str(record), "--sweep", sweep,
           "--train-size", json.dumps(size), *(a for s in sets for a in ("--set", s))]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))


def finish_model(proc: subprocess.Popen, record: Path, grace: float | None) -> dict:
    """Wait ``grace`` seconds at most (None: until it ends) for ``start_model``'s process (then stop it), and read
    what it counted."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if not record.is_file():
        raise RuntimeError(f"the model's count wrote nothing (log: {record.with_suffix('.log')})")
    return json.loads(record.read_text())


def model_rows(rec: dict, result: dict, refit: bool) -> dict:
    """Measured beside predicted: each pilot row's s/step by length and each training row's step against the model
    with the constants fitted to the H200 table, and (``refit``: on a GPU) with constants refitted to this run's
    pilot. Rows the count did not reach have no prediction."""
    import gpu_model as gm

    h200 = gm.Constants(**rec["fit"]["constants"]) if rec.get("fit") else None
    rows = []
    for r in (result.get("pilot") or {}).get("rows", []):
        counts = gm.int_keys(rec["counts"].get(gm.point_name(r["point"]), {}))
        for L, s in sorted((int(L), s) for L, s in (r.get("step_s") or {}).items()):
            rows.append(dict(part="pilot", name=gm.point_name(r["point"]), L=L, measured=s, **counts.get(L, {})))
    size = rec.get("train_size") or {}
    for r in result.get("training") or []:
        if "step_s" in r:
            rows.append(dict(part="training", name=r["model"], L=size.get("T"), measured=r["step_s"],
                             **rec["train"].get(r["model"], {})))
    points = [dict(r, preset=r["name"]) for r in rows if r["part"] == "pilot" and "launches" in r]
    report = gm.fit_report(points) if refit and len({p["preset"] for p in points}) >= 2 else None
    fitted = gm.Constants(**report["constants"]) if report else None
    for r in rows:
        if "launches" in r:
            r["predicted"] = h200 and h200.predict(r["launches"], r["flops"], walk=r.get("walk", 0))
            r["refitted"] = fitted and fitted.predict(r["launches"], r["flops"], walk=r.get("walk", 0))
    return dict(h200=rec.get("fit"), refit=report, rows=rows, counted=sorted(rec.get("seconds", {})))


# ---------------------------------------------------------------- tables

def tests_label(files: str) -> str:
    names = files.split()
    return names[0] if len(names) == 1 else f"{len(names)} more files of tests/kernels and tests/memory"


def fmt(x, spec=".2f", suffix=""):
    return None if x is None else f"{x:{spec}}{suffix}"


def print_tables(result: dict) -> None:
    where = result["device"] + ("" if CUDA else " — CPU / Triton interpreter, tiny shapes: times mean nothing")
    for part in PARTS:
        if isinstance(result.get(part), dict) and "error" in result[part] and len(result[part]) == 1:
            common.console().print(f"({part}) did not run: {result[part]['error']}", markup=False)
    if "counts" in result.get("tests", {}):
        t = result["tests"]
        common.print_table(f"(a) kernel and memory tests on {t['device']}",
                           ["file", "passed", "failed", "errors", "skipped", "stopped at budget", "seconds", "log"],
                           [[tests_label(f["file"]), *(f.get("counts", {}).get(k, 0) for k in ("passed", "failed",
                                                                                                 "error", "skipped")),
                             "yes" if f.get("stopped_at_budget") or f.get("check") == "budget" else "no",
                             fmt(f.get("seconds"), ".0f"), f.get("log") or f.get("error")] for f in t["files"]],
                           left=1)
    if isinstance(result.get("kernels"), list):
        rows = result["kernels"]
        common.print_table(f"(b) memorize forward+backward, float32 (fla: bfloat16) — {where}",
                           ["case", "T", "check", "chunked ms", "triton ms", "chunked/triton", "fla bf16 ms",
                            "fla/triton", "error"],
                           [[r["case"], r["T"], r.get("check"), fmt(r.get("chunked_ms")), fmt(r.get("triton_ms")),
                             fmt(r.get("chunked_ms") and r.get("triton_ms") and r["chunked_ms"] / r["triton_ms"],
                                 suffix="×"),
                             fmt(r.get("fla_ms")),
                             fmt(r.get("fla_ms") and r.get("triton_ms") and r["fla_ms"] / r["triton_ms"], suffix="×"),
                             (r.get("error") or r.get("fla_error") or r.get("chunked_error") or r.get("skipped")
                              or "")[:100]] for r in rows],
                           left=3)
        bounded = [r for r in rows if "tflop" in r]
        if bounded:
            import gpu_model

            common.print_table(f"(b) the fused kernel on tf32 dots beside the GPU model (its dots as issued at "
                               f"{gpu_model.TF32_RATE / 1e12:.0f} TFLOP/s; its scratch in L2, or moved at "
                               f"{gpu_model.HBM / 1e12:.1f} TB/s) — {where}",
                               ["case", "T", "triton tf32 ms", "TFLOP", "TFLOP/s", "scratch GB", "model: in L2 ms",
                                "from HBM ms", "measured / in L2"],
                               [[r["case"], r["T"], fmt(r.get("triton_tf32_ms")), fmt(r["tflop"], ".3f"),
                                 fmt(r.get("triton_tf32_ms") and r["tflop"] / r["triton_tf32_ms"] * 1e3, ".1f"),
                                 fmt(r["scratch_gb"], ".1f"), fmt(r["l2_ms"]), fmt(r["hbm_ms"]),
                                 fmt(r.get("triton_tf32_ms") and r["triton_tf32_ms"] / r["l2_ms"], suffix="×")]
                                for r in bounded], left=1)
    if isinstance(result.get("training"), list):
        s = result["training_size"]
        common.print_table(f"(c) one training step, bf16 autocast, d_model {s['d_model']}, {s['n_layers']} layers, "
                           f"T = {s['T']}, batch {s['batch']} — {where}",
                           ["model", "params (M)", "step s", "tokens/s", "peak GiB", "speed / transformer",
                            "memory / transformer", "error"],
                           [[r["model"], fmt(r.get("parameters") and r["parameters"] / 1e6, ".1f"),
                             fmt(r.get("step_s"), ".3f"), fmt(r.get("tokens_per_s"), ".0f"),
                             fmt(r.get("peak_gib")), fmt(r.get("speed_vs_transformer"), ".3f", "×"),
                             fmt(r.get("memory_vs_transformer"), ".2f", "×"), r.get("error") and r["error"][:100]]
                            for r in result["training"]])
    if "rows" in result.get("pilot", {}):
        p = result["pilot"]
        common.print_table(f"(d) pilot of {p['sweep']}: {p['steps']} batches a length, one validation — {where}",
                           ["configuration", "s/step by length", "steps timed", "mean s/step", "× transformer",
                            "one validation s", "fits", "hours a fit", "hours", "error"],
                           [[r["point"], " / ".join(f"{L}: {v:.3g}" for L, v in r["step_s"].items())
                             if "step_s" in r else None, sum((r.get("timed") or {}).values()) or None,
                             fmt(r.get("mean_step_s"), ".4f"),
                             fmt(r.get("step_vs_transformer"), ".1f", "×"),
                             fmt(r.get("projection", {}).get("one_validation"), ".1f"), r["fits"],
                             fmt(r.get("projection") and r["projection"]["total"] / 3600, ".3f"),
                             fmt(r.get("projection") and r["fits"] * r["projection"]["total"] / 3600, ".2f"),
                             (r.get("error") or r.get("skipped") or "")[:100]] for r in p["rows"]])
        missing = p["configurations"] - p["piloted"]
        common.console().print(f"study {p['sweep']}: {p['hours']:.2f} hours projected for one worker" +
                               (f" ({missing} of {p['configurations']} configurations not piloted, not counted)"
                                if missing else ""), markup=False)
    if "rows" in result.get("model", {}):
        m = result["model"]
        import gpu_model as gm

        for label, report in (("constants fitted to the H200 table", m["h200"]),
                              ("refitted to this pilot", m["refit"])):
            if report:
                gm.print_fit(report, label)
        common.print_table("(e) one training step, measured beside the GPU model (benchmarks/gpu_model.py: "
                           "C0 + C_launch · launches + FLOPs / R)" + ("" if CUDA else " — measured on the CPU: "
                                                                         "not a GPU's step, no refit"),
                           ["part", "configuration", "L", "launches", "GFLOP", "measured s", "predicted s",
                            "pred / meas", "refitted s", "refit / meas"],
                           [[r["part"], r["name"], r["L"], r.get("launches"), fmt(r.get("flops") and r["flops"] / 1e9,
                                                                                 ",.1f"),
                             fmt(r["measured"], ".4f"), fmt(r.get("predicted"), ".4f"),
                             fmt(r.get("predicted") and r["predicted"] / r["measured"]),
                             fmt(r.get("refitted"), ".4f"),
                             fmt(r.get("refitted") and r["refitted"] / r["measured"])] for r in m["rows"]], left=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for the parts (default 450: with the "
                                                                "start and the tables, under 8 minutes)")
    ap.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384], help="kernel lengths")
    ap.add_argument("--repeats", type=int, default=5, help="timed kernel calls (median)")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per model (median)")
    ap.add_argument("--sweep", default=None, help=f"the sweep file the pilot part estimates (default {PILOT_SWEEP}; "
                                                  f"{PILOT_SWEEP_TINY} without CUDA)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="a change to the pilot's sweep file, as atlas-lab sweep --set takes it (repeatable): "
                         "--set fixed.model.compile=true")
    ap.add_argument("--pilot-steps", type=int, default=None,
                    help=f"pilot batches of each training length (default {PILOT_STEPS}; {PILOT_STEPS_TINY} without "
                         "CUDA)")
    ap.add_argument("--out", default=None, help="JSON path (default runs/bench/gpu_check.json, .cpu.json on a CPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(train_child(args.child, json.loads(args.size), args.steps)))
        return 0
    tiny = not CUDA
    device = "cuda" if CUDA else "cpu"
    given = Path(args.out).resolve() if args.out else None
    os.chdir(ROOT)  # the sweep files name their configs from the repository's root
    if tiny:
        torch.set_num_threads(1)
    result = common.meta(None, device=torch.cuda.get_device_name() if CUDA else "cpu", budget_s=args.budget)
    result["tiny"] = tiny
    out = common.BENCH_DIR / "gpu_check.json" if CUDA else common.BENCH_DIR / "gpu_check.cpu.json"
    out = given or out
    timed = [p for p in args.parts if p in SHARES]
    share = {p: SHARES[p] / sum(SHARES[q] for q in timed) for p in timed}
    started = time.monotonic()
    sweep = args.sweep or (PILOT_SWEEP_TINY if tiny else PILOT_SWEEP)
    record = out.parent / f"{out.stem}.model.json"
    def count():
        return start_model(record, sweep, tuple(args.sets), TRAIN_TINY if tiny else TRAIN_SIZE,
                           record.with_suffix(".log"))
    # on a GPU machine the count runs on a CPU core beside the parts; on the CPU after them (not to slow their rows)
    counting = count() if "model" in args.parts and CUDA else None
    for part in timed:
        budget = Share(share[part] * args.budget)
        t = time.monotonic()
        try:
            if part == "tests":
                result["tests"] = run_tests(budget, device, out.parent / f"{out.stem}.tests")
            elif part == "kernels":
                result["kernels"] = run_kernels(budget, tiny, args.T, 1 if tiny else args.repeats)
            elif part == "training":
                size = TRAIN_TINY if tiny else TRAIN_SIZE
                result["training_size"] = size
                result["training"] = run_training(budget, size, 1 if tiny else args.steps)
            else:
                result["pilot"] = run_pilot(budget, sweep, args.pilot_steps or (PILOT_STEPS_TINY if tiny
                                                                                 else PILOT_STEPS),
                                            sets=tuple(args.sets))
        except Exception as e:  # this part's error; the next part runs
            result[part] = dict(error=f"{type(e).__name__}: {e}"[:500])
        result.setdefault("seconds", {})[part] = round(time.monotonic() - t, 1)
        common.write_json(out, result, quiet=True)  # what finished is kept if a later part dies
    if "model" in args.parts:
        t = time.monotonic()
        try:
            counting = counting or count()
            result["model"] = model_rows(finish_model(counting, record, MODEL_GRACE if CUDA else None), result,
                                         refit=CUDA)
        except Exception as e:
            result["model"] = dict(error=f"{type(e).__name__}: {e}"[:500])
        result.setdefault("seconds", {})["model"] = round(time.monotonic() - t, 1)
    result["seconds"]["total"] = round(time.monotonic() - started, 1)
    print_tables(result)
    common.write_json(out, result)
    tests = result.get("tests", {})
    failed = tests.get("counts", {})
    bad = failed.get("failed", 0) + failed.get("error", 0) or tests.get("returncode") not in (0, None)
    kernels = result.get("kernels") if isinstance(result.get("kernels"), list) else []
    wrong = any(r.get("check") == "WRONG" or "error" in r for r in kernels)
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
