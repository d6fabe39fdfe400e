"""The compiled CPU Newton–Schulz kernel against the batched-matmul path, side by side (float32, CPU).

    python benchmarks/newton_schulz_cpu.py [--threads 1] [--repeats 5] [--tiny]

1. NS_5 (quintic) forward + backward of a batch of matrices, at the shapes of an MLP memory's weights (depth 2,
   expansion 4, degree-2 polynomial features) for memory heads of 4, 8 and 16 dims: W1 [4d, D] and W2 [d, 4d],
   D = (d+1)(d+2)/2. Each row is checked (kernel against bmm, values and gradients) before it is timed.
2. One training step (forward + backward) of the MQAR model of ``experiments/mqar.yaml`` (atlas, d_model 64,
   2 layers, 16 memory heads of 4, batch 32 × 32 tokens) with each path.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (add_common_args, apply_tiny, median_time, meta, out_path, print_table, rel_err,  # noqa: E402
                    set_threads, write_json)

from atlas_lab.memory import newton_schulz  # noqa: E402
from atlas_lab.memory.feature_maps import Polynomial  # noqa: E402
from atlas_lab.models import LanguageModel  # noqa: E402

IMPLS = ("bmm", "cpu")


def ns_row(m, n, elements, repeats):
    """Times of NS_5 forward+backward on [M, m, n] (M·m·n ≈ elements) with each impl, and the check."""
    M = max(1, elements // (m * n))
    G = torch.randn(M, m, n, requires_grad=True)
    weight = torch.randn(M, m, n)
    out, grads = {}, {}
    for impl in IMPLS:
        out[impl] = newton_schulz(G, impl=impl)
        (grads[impl],) = torch.autograd.grad((out[impl] * weight).sum(), G)
    err = max(rel_err(out["cpu"], out["bmm"]), rel_err(grads["cpu"], grads["bmm"]))
    times = {impl: median_time(lambda: (newton_schulz(G, impl=impl) * weight).sum().backward(), repeats)
             for impl in IMPLS}
    return M, err, times


def step_time(batch, T, repeats):
    """Seconds per forward+backward of the mqar.yaml atlas model, for ATLAS_LAB_NS_KERNEL=0 (bmm) and unset."""
    torch.manual_seed(0)
    model = LanguageModel(64, "atlas", d_model=64, n_layers=2, n_heads=4, memory_heads=16)
    ids = torch.randint(0, 64, (batch, T))

    def step():
        model.zero_grad(set_to_none=True)
        model(ids)[0].square().mean().backward()

    times = {}
    for impl in IMPLS:
        os.environ["ATLAS_LAB_NS_KERNEL"] = "0" if impl == "bmm" else "1"
        times[impl] = median_time(step, repeats)
    os.environ.pop("ATLAS_LAB_NS_KERNEL")
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, nargs="+", default=[4, 8, 16], help="memory head dims d")
    ap.add_argument("--elements", type=int, default=1 << 21, help="matrix elements per NS batch")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--T", type=int, default=32)
    args = apply_tiny(add_common_args(ap, repeats=5).parse_args(),
                      dict(heads=[4], elements=1 << 14, batch=2, T=16, repeats=1))
    threads = set_threads(args.threads)

    rows, cells = [], []
    for d in args.heads:
        D = Polynomial(2).dim(d)
        for name, (m, n) in (("W1", (4 * d, D)), ("W2", (d, 4 * d))):
            M, err, t = ns_row(m, n, args.elements, args.repeats)
            rows.append(dict(d=d, weight=name, shape=[m, n], matrices=M, check_rel_err=err,
                             bmm_s=t["bmm"], cpu_s=t["cpu"]))
            cells.append([f"d={d} {name} [{m}, {n}]", M, f"{err:.1e}", f"{t['bmm'] * 1e3:.1f}",
                          f"{t['cpu'] * 1e3:.1f}", f"{t['bmm'] / t['cpu']:.2f}×"])
    print_table(f"NS_5 forward+backward, float32, {threads} threads",
                ("matrices", "M", "check (rel err)", "bmm (ms)", "kernel (ms)", "bmm / kernel"), cells)

    steps = step_time(args.batch, args.T, args.repeats)
    print_table(f"mqar.yaml atlas model, forward+backward of a {args.batch}×{args.T} batch, {threads} threads",
                ("path", "s per step", "bmm / path"),
                [[impl, f"{steps[impl]:.3f}", f"{steps['bmm'] / steps[impl]:.2f}×"] for impl in IMPLS])
    write_json(out_path("newton_schulz_cpu", args), dict(meta=meta(args), rows=rows, step_s=steps))


if __name__ == "__main__":
    main()
