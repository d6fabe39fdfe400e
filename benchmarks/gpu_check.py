"""The GPU path in one run (``make gpu-check``): tests on the device, kernel timings, training steps, one JSON.

    python benchmarks/gpu_check.py [--budget 480] [--parts tests kernels training]

(a) tests     the memory and kernel tests (``pytest -m "not slow" tests/memory tests/kernels --device cuda``);
              passed / failed / skipped counted from pytest's per-test lines.
(b) kernels   forward+backward of ``memorize`` for the deltanet, omega and atlas cases at T ∈ {1K, 4K, 16K}:
              triton against chunked, and flash-linear-attention's ``chunk_delta_rule`` for deltanet when it is
              installed. Every row is checked before it is timed (triton against chunked at the timed size, outputs
              and the gradients of q, k, v and every gate); a wrong kernel is never timed. fla computes the exact
              delta rule, so it is checked against triton at chunk 1 (T = 256, tolerance 1e-2: its dots are tf32)
              and timed at its own chunk of 64 (same cost class, not the same function: ours takes chunk-start
              gradients).
(c) training  one training step (forward, backward, AdamW) of transformer, gated_deltanet, titans, atlas and atlas
              with chunk-start reads (``read="chunk"``) at a 125M-class size (d_model 768, 12 layers, 12 heads,
              vocab 32,000, T = 4096, batch 1) under bf16 autocast: median step time, tokens/s, peak memory, and
              the ratios to the transformer. Each model runs in its own process with what is left of the budget.
(d) one JSON, runs/bench/gpu_check.json (gpu_check.cpu.json without CUDA), and the tables.

Each part stops at its share of ``--budget`` (seconds; tests 40 %, kernels 30 %, training 30 %) and keeps what
finished: a row past the budget is marked "budget". Without CUDA the same code runs at tiny shapes on the CPU —
the kernels under Triton's interpreter, a test subset — so CI proves the script runs; those times mean nothing.
Exit status 1 if a test fails or a kernel is wrong.
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

import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # before triton is first imported: the kernels then run under its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import common  # noqa: E402  (benchmarks/common.py; TRITON_INTERPRET must be set first)

SHARES = {"tests": 0.4, "kernels": 0.3, "training": 0.3}
TEST_FILES = ["tests/memory/test_memory_equivalence.py", "tests/memory/test_memory_identities.py",
              "tests/kernels/test_kernels.py"]
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
FLA_TOL = 1e-2
KERNEL_TINY = dict(B=1, H=2, T=[19], d=8, chunk_size=8, window_cap=4)

TRAIN_MODELS = {"transformer": None, "gated_deltanet": None, "titans": None, "atlas": None,
                "atlas (read=chunk)": ("atlas", {"read": "chunk"})}
TRAIN_SIZE = dict(d_model=768, n_layers=12, n_heads=12, vocab=32000, T=4096, batch=1)
TRAIN_TINY = dict(d_model=32, n_layers=2, n_heads=2, vocab=256, T=64, batch=1)


class Budget:
    """Seconds left of one part's share."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---------------------------------------------------------------- (a) tests

def run_tests(budget: Budget, device: str, log_path) -> dict:
    """pytest on the memory and kernel test files with ``--device``; counts from its -v lines (kept when stopped)."""
    cmd = [sys.executable, "-m", "pytest", *TEST_FILES, "-m", "not slow", "-v", "-p", "no:cacheprovider",
           "-p", "no:xdist", "--device", device]
    if device == "cpu":
        cmd += ["-k", CPU_TESTS]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:  # unbuffered: the lines written before a stop are all there
        proc = subprocess.Popen(cmd, cwd=common.ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            proc.wait(timeout=max(1.0, budget.left()))
            stopped = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped = True
    return dict(command=" ".join(cmd[1:]), counts=count_outcomes(log_path.read_text(errors="replace")),
                returncode=None if stopped else proc.returncode, stopped_at_budget=stopped, log=str(log_path))


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


def memorize_fwd_bwd(x, impl, options):
    """Output and the gradients of every input for a fixed linear loss."""
    from atlas_lab.memory import memorize

    o, _ = memorize(x["q"], x["k"], x["v"], **{n: x[n] for n in ("alpha", "eta", "theta", "gamma") if n in x},
                    impl=impl, **options)
    w = torch.linspace(-1, 1, o.shape[-1], device=o.device)
    return (o.detach(), *torch.autograd.grad((o * w).sum(), list(x.values())))


def fla_fwd_bwd(x):
    """fla's chunk_delta_rule on the same problem (its state is our Wᵀ; scale 1 = no q scaling)."""
    from fla.ops.delta_rule import chunk_delta_rule

    o, _ = chunk_delta_rule(x["q"], x["k"], x["v"], x["eta"], scale=1.0, output_final_state=True)
    w = torch.linspace(-1, 1, o.shape[-1], device=o.device)
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


def run_kernels(budget: Budget, tiny: bool, Ts, repeats: int) -> list[dict]:
    """One row per (case, T): the check, then chunked / triton (/ fla) times and their ratios."""
    import importlib.util

    device = "cuda" if CUDA else "cpu"
    B, H = (KERNEL_TINY["B"], KERNEL_TINY["H"]) if tiny else (2, 4)
    Ts = KERNEL_TINY["T"] if tiny else Ts
    with_fla = CUDA and importlib.util.find_spec("fla") is not None
    rows = []
    for name, setting in KERNEL_CASES.items():
        options = {n: v for n, v in setting.items() if n not in ("d", "gates", "tol")}
        d = setting["d"]
        if tiny:
            d, options["chunk_size"] = KERNEL_TINY["d"], KERNEL_TINY["chunk_size"]
            options["window"] = min(options["window"], KERNEL_TINY["window_cap"])
        fla_check = None
        if with_fla and name == "deltanet" and budget.left() > 0:  # the exact delta rule: fla vs triton at chunk 1
            x = kernel_inputs(B, 256, H, d, setting["gates"], device, seed=1)
            fla_check = max_rel_err(fla_fwd_bwd(x), memorize_fwd_bwd(x, "triton", {**options, "chunk_size": 1}))
        for T in Ts:
            row = dict(case=name, T=T)
            rows.append(row)
            if budget.left() <= 0:
                row["check"] = "budget"
                continue
            x = kernel_inputs(B, T, H, d, setting["gates"], device)
            results, cold = {}, {}
            for impl in ("triton", "chunked"):  # the check's own calls are timed too: the times of a tiny run
                t = time.perf_counter()
                results[impl] = memorize_fwd_bwd(x, impl, options)
                cold[impl] = 1e3 * (time.perf_counter() - t)
            err = max_rel_err(results["triton"], results["chunked"])
            row.update(check="correct" if err <= setting["tol"] else "WRONG", max_rel_err=err)
            if err > setting["tol"]:  # never time a wrong kernel
                continue
            if tiny:
                row.update(chunked_ms=cold["chunked"], triton_ms=cold["triton"])
                continue
            row["chunked_ms"] = timed_ms(lambda: memorize_fwd_bwd(x, "chunked", options), repeats)
            row["triton_ms"] = timed_ms(lambda: memorize_fwd_bwd(x, "triton", options), repeats)
            if fla_check is not None:
                row["fla_check"] = fla_check
                if fla_check <= FLA_TOL:
                    row["fla_ms"] = timed_ms(lambda: fla_fwd_bwd(x), repeats)
    return rows


# ---------------------------------------------------------------- (c) training steps

def train_child(label: str, size: dict, steps: int) -> dict:
    """One model's training step at ``size`` (in this process): median seconds of ``steps`` steps after a warm-up,
    tokens/s and peak memory (CUDA: max allocated; CPU: the process's peak resident set)."""
    from atlas_lab.models import LanguageModel

    preset, memory = TRAIN_MODELS[label] or (label, None)
    device = "cuda" if CUDA else "cpu"
    if not CUDA:
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LanguageModel(size["vocab"], preset, d_model=size["d_model"], n_layers=size["n_layers"],
                          n_heads=size["n_heads"], memory=dict(memory or {}, checkpoint=True)
                          if preset != "transformer" else None).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, size["vocab"], (size["batch"], size["T"] + 1), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
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


def run_training(budget: Budget, size: dict, steps: int) -> list[dict]:
    """Each model in a fresh process (an out-of-memory or a slow model costs only its own row), given what is left
    of the budget split over the models still to run."""
    rows = []
    labels = list(TRAIN_MODELS)
    for i, label in enumerate(labels):
        left = budget.left()
        row = dict(model=label)
        rows.append(row)
        if left <= 1:
            row["error"] = "budget"
            continue
        cmd = [sys.executable, __file__, "--child", label, "--size", json.dumps(size), "--steps", str(steps)]
        timeout = left / (len(labels) - i) if label != labels[-1] else left
        row.update(common.run_child(cmd, timeout=timeout))
        if "timed out" in row.get("error", ""):
            row["error"] = f"budget ({timeout:.0f} s: a step did not finish)"
    base = next((r for r in rows if r["model"] == "transformer" and "tokens_per_s" in r), None)
    for r in rows:
        if base and "tokens_per_s" in r:
            r["speed_vs_transformer"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["memory_vs_transformer"] = r["peak_gib"] / base["peak_gib"]
    return rows


# ---------------------------------------------------------------- tables

def fmt(x, spec=".2f", suffix=""):
    return None if x is None else f"{x:{spec}}{suffix}"


def print_tables(result: dict) -> None:
    where = result["device"] + ("" if CUDA else " — CPU / Triton interpreter, tiny shapes: times mean nothing")
    if "tests" in result:
        t = result["tests"]
        c = t["counts"]
        common.print_table(f"(a) memory and kernel tests on {t['device']}", ["passed", "failed", "errors", "skipped",
                                                                              "stopped at budget", "log"],
                           [[c.get("passed", 0), c.get("failed", 0), c.get("error", 0), c.get("skipped", 0),
                             "yes" if t["stopped_at_budget"] else "no", t["log"]]], left=0)
    if "kernels" in result:
        rows = result["kernels"]
        common.print_table(f"(b) memorize forward+backward, float32 — {where}",
                           ["case", "T", "check", "chunked ms", "triton ms", "chunked/triton", "fla ms",
                            "fla/triton"],
                           [[r["case"], r["T"], r.get("check"), fmt(r.get("chunked_ms")), fmt(r.get("triton_ms")),
                             fmt(r.get("chunked_ms") and r.get("triton_ms") and r["chunked_ms"] / r["triton_ms"],
                                 suffix="×"),
                             fmt(r.get("fla_ms")),
                             fmt(r.get("fla_ms") and r["fla_ms"] / r["triton_ms"], suffix="×")] for r in rows], left=3)
    if "training" in result:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    ap.add_argument("--parts", nargs="+", default=list(SHARES), choices=list(SHARES))
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384], help="kernel lengths")
    ap.add_argument("--repeats", type=int, default=5, help="timed kernel calls (median)")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per model (median)")
    ap.add_argument("--out", default=None, help="JSON path (default runs/bench/gpu_check.json, .cpu.json on a CPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(train_child(args.child, json.loads(args.size), args.steps)))
        return 0
    tiny = not CUDA
    device = "cuda" if CUDA else "cpu"
    if tiny:
        torch.set_num_threads(1)
    result = common.meta(None, device=torch.cuda.get_device_name() if CUDA else "cpu", budget_s=args.budget)
    result["tiny"] = tiny
    out = common.BENCH_DIR / "gpu_check.json" if CUDA else common.BENCH_DIR / "gpu_check.cpu.json"
    out = Path(args.out) if args.out else out
    share = {p: SHARES[p] / sum(SHARES[q] for q in args.parts) for p in args.parts}
    started = time.monotonic()
    for part in args.parts:
        budget = Budget(share[part] * args.budget)
        t = time.monotonic()
        if part == "tests":
            result["tests"] = dict(run_tests(budget, device, out.with_suffix(".tests.log")), device=device)
        elif part == "kernels":
            result["kernels"] = run_kernels(budget, tiny, args.T, 1 if tiny else args.repeats)
        else:
            size = TRAIN_TINY if tiny else TRAIN_SIZE
            result["training_size"] = size
            result["training"] = run_training(budget, size, 1 if tiny else args.steps)
        result.setdefault("seconds", {})[part] = round(time.monotonic() - t, 1)
        common.write_json(out, result, quiet=True)  # what finished is kept if a later part dies
    result["seconds"]["total"] = round(time.monotonic() - started, 1)
    print_tables(result)
    common.write_json(out, result)
    failed = result.get("tests", {}).get("counts", {})
    bad = failed.get("failed", 0) + failed.get("error", 0) or result.get("tests", {}).get("returncode") not in (0, None)
    wrong = any(r.get("check") == "WRONG" for r in result.get("kernels", []))
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
