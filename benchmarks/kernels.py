"""Forward+backward time of the Triton kernels against the chunked PyTorch path (docs/memory.md §5.3).

    python benchmarks/kernels.py [--T 1024 4096 16384] [--cases ...] [--repeats 10]     (on a GPU)
    python benchmarks/kernels.py --interpret --tiny                                      (CPU, Triton interpreter)

Cases (float32, B=2, H=4, every gate a data-dependent [B, T, H] tensor that requires gradients):
  deltanet:  linear memory, identity φ, l2, window 1, gd, α = 1, η = β       d_k = d_v = 64, chunk 64
  omega:     linear memory, identity φ, l2, window 16, momentum, α, η, θ, γ   d_k = d_v = 64, chunk 64
  atlas:     mlp memory (depth 2, expansion 4), polynomial φ (degree 2), l2, window 8, muon (quintic, 5 steps)
             d_k = d_v = 16, chunk 16 — the batched Newton–Schulz kernel inside the chunked loop
Every row is checked before it is timed: triton against chunked at the timed size, outputs and the gradients
of q, k, v and every gate (relative error ≤ tol). For deltanet, when flash-linear-attention is installed and
a GPU is present, fla's ``chunk_delta_rule`` is timed too; it computes the exact delta rule, so it is
checked against triton with chunk_size = 1 (the exact online rule) at T = 256 (tolerance 1e-2: fla's dots
are tf32) before it is timed at its own chunk of 64 (fla keeps the delta rule exact inside a chunk, ours
freezes the gradients at W̃: same cost class, not the same function).
GPU times are medians of CUDA-event timings after warm-up; under --interpret they are CPU wall times.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

SETTINGS = {
    "deltanet": dict(d=64, memory="linear", feature_map="identity", objective="l2", window=1, optimizer="gd",
                     chunk_size=64, gates=("eta",), tol=1e-4),
    "omega": dict(d=64, memory="linear", feature_map="identity", objective="l2", window=16, optimizer="momentum",
                  chunk_size=64, gates=("alpha", "eta", "theta", "gamma"), tol=1e-4),
    # quintic NS amplifies float32 rounding (~a^k ≈ 480×) in the gradients: a looser tolerance for those
    "atlas": dict(d=16, memory="mlp", depth=2, expansion=4, feature_map="polynomial", degree=2, objective="l2",
                  window=8, optimizer="muon", ns_steps=5, chunk_size=16, gates=("alpha", "eta", "theta", "gamma"),
                  tol=2e-3),
}
FLA_TOL = 1e-2  # fla's kernels use tf32 dots in float32
TINY = dict(B=1, H=2, T=[19, 33], d=8, chunk_size=8, window_cap=4)


def inputs(B, T, H, d, gates, device, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g)

    x = dict(q=r(B, T, H, d), k=torch.nn.functional.normalize(r(B, T, H, d), dim=-1), v=r(B, T, H, d),
             alpha=torch.sigmoid(r(B, T, H) + 5), eta=0.5 * torch.sigmoid(r(B, T, H)),
             theta=torch.sigmoid(r(B, T, H) + 2),
             gamma=torch.sigmoid(r(B, T, H)))
    x = {n: t for n, t in x.items() if n in ("q", "k", "v") or n in gates}
    return {n: t.to(device).requires_grad_() for n, t in x.items()}


def memorize_fwd_bwd(x, impl, options):
    """Output and gradients of every input for a fixed random loss."""
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


def max_rel_err(a, b):
    return max(((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-12)).item() for x, y in zip(a, b))


def timed(fn, repeats, cuda):
    for _ in range(2):  # warm-up (compilation, autotuning, allocator)
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--cases", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--interpret", action="store_true", help="run the kernels under Triton's CPU interpreter")
    ap.add_argument("--tiny", action="store_true", help=f"tiny sizes for the interpreter: {TINY}")
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (its helpers are decorated then)
    from atlas_lab.kernels import INTERPRETED
    cuda = torch.cuda.is_available() and not INTERPRETED
    if not (cuda or INTERPRETED):
        sys.exit("benchmarks/kernels.py needs a CUDA GPU, or --interpret to run the kernels on the CPU")
    device = "cuda" if cuda else "cpu"
    B, H, Ts = (TINY["B"], TINY["H"], TINY["T"]) if args.tiny else (args.B, args.H, args.T)
    repeats = 1 if args.interpret else args.repeats
    with_fla = cuda and importlib.util.find_spec("fla") is not None

    header = ["case", "T", "check", "chunked ms", "triton ms", "chunked/triton"] + (["fla ms", "fla/triton"] if with_fla
                                                                                     else [])
    rows = []
    for name in args.cases:
        options = {n: v for n, v in SETTINGS[name].items() if n not in ("d", "gates", "tol")}
        d, gates, tol = SETTINGS[name]["d"], SETTINGS[name]["gates"], SETTINGS[name]["tol"]
        if args.tiny:
            d, options["chunk_size"] = TINY["d"], TINY["chunk_size"]
            options["window"] = min(options["window"], TINY["window_cap"])
        fla_ok = with_fla and name == "deltanet"
        if fla_ok:  # the exact delta rule: fla against triton at chunk 1
            x = inputs(B, 256, H, d, gates, device, seed=1)
            err = max_rel_err(fla_fwd_bwd(x), memorize_fwd_bwd(x, "triton", {**options, "chunk_size": 1}))
            fla_ok = err <= FLA_TOL
        for T in Ts:
            x = inputs(B, T, H, d, gates, device)
            err = max_rel_err(memorize_fwd_bwd(x, "triton", options), memorize_fwd_bwd(x, "chunked", options))
            row = [name, str(T), "correct" if err <= tol else f"WRONG ({err:.1e})"]
            if err > tol:  # never time a wrong kernel
                rows.append(row + ["-"] * (len(header) - len(row)))
                continue
            t_chunked = timed(lambda: memorize_fwd_bwd(x, "chunked", options), repeats, cuda)
            t_triton = timed(lambda: memorize_fwd_bwd(x, "triton", options), repeats, cuda)
            row += [f"{t_chunked:.2f}", f"{t_triton:.2f}", f"{t_chunked / t_triton:.2f}×"]
            if with_fla and name == "deltanet" and fla_ok:
                t_fla = timed(lambda: fla_fwd_bwd(x), repeats, cuda)
                row += [f"{t_fla:.2f}", f"{t_fla / t_triton:.2f}×"]
            elif with_fla:
                row += ["-", "-"] if name != "deltanet" else ["WRONG", "-"]
            rows.append(row)
    title = (f"memorize forward+backward, float32, B={B} H={H}, "
             + ("Triton interpreter on the CPU (times are not GPU times)" if INTERPRETED
                else torch.cuda.get_device_name()))
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print(title)
    for r in [header, ["-" * w for w in widths]] + rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if not with_fla:
        print("fla: not timed (" + ("flash-linear-attention is not installed" if cuda else "needs a CUDA GPU") + ")")
    if any(r[2] != "correct" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
