"""Forward+backward time of ``memorize``: chunked vs reference, side by side in one process.

    python benchmarks/memory_ops.py [--T 1024] [--repeats 3] [--threads N] [--tiny]

Settings (docs/memory.md §5; the engine issue's speed table):
  titans: B=2, T, H=4, d_k=d_v=64, mlp depth 2 expansion 4, l2, window 1, momentum, chunk 64
  atlas:  B=2, T, H=4, d_k=d_v=16, polynomial degree 2 (D=153), mlp depth 2 expansion 4, l2, window 8,
          muon (quintic, 5 steps), chunk 16
All gates are data-dependent [B, T, H] tensors that require gradients. Correctness is checked first
(chunked vs reference at T=2·chunk+5, float64). For muon, the Newton–Schulz work alone (every token's
momentum orthogonalised, forward and backward) is timed too: it is shared by every exact implementation,
so reference / NS-alone bounds the speed-up. Prints a table and writes runs/bench/memory_ops.json.
--tiny (B=1, T=32, H=1, 1 repeat; writes runs/bench/memory_ops.tiny.json) only checks that the script runs.
"""
from __future__ import annotations

import argparse

import torch
from common import (add_common_args, apply_tiny, median_time, out_path, print_table, rel_err, set_threads,
                    write_json)

from atlas_lab.memory import memorize
TINY = dict(B=1, T=32, H=1, repeats=1, reference_repeats=1)

SETTINGS = {
    "titans": dict(d=64, architecture="mlp", feature_map="identity", attentional_bias="l2", window=1,
                   optimizer="momentum", chunk_size=64),
    "atlas": dict(d=16, architecture="mlp", feature_map="polynomial", attentional_bias="l2", window=8,
                  optimizer="muon", chunk_size=16),
}


def inputs(B, T, H, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    x = dict(q=r(B, T, H, d), k=torch.nn.functional.normalize(r(B, T, H, d), dim=-1), v=r(B, T, H, d),
             alpha=torch.sigmoid(r(B, T, H) + 5), eta=0.1 * torch.sigmoid(r(B, T, H)),
             theta=torch.sigmoid(r(B, T, H) + 2), gamma=torch.sigmoid(r(B, T, H)))
    return {n: t.requires_grad_() for n, t in x.items()}


def fwd_bwd(x, impl, options):
    o, state = memorize(x["q"], x["k"], x["v"],
                        impl=impl, **options,
                        gates={"alpha": x["alpha"], "eta": x["eta"], "theta": x["theta"], "gamma": x["gamma"]})
    o.square().mean().backward()
    return o


def timed(x, impl, options, repeats):
    return median_time(lambda: fwd_bwd(x, impl, options), repeats)  # one warm-up, then the median


def newton_schulz_floor(options, B, T, H, d, repeats):
    """Time of the Newton–Schulz work alone that any exact muon implementation must do: NS_k (forward and
    backward) of every token's momentum of every weight matrix, batched per chunk as the chunked path does."""
    from atlas_lab.memory import MemoryConfig, newton_schulz

    config = MemoryConfig(**options)
    mem, fmap, _, optimizer = config.components()
    shapes = mem.shapes(fmap.dim(d), d, d)
    b = config.chunk_size
    S = {n: torch.randn(B * H * b, *shape, requires_grad=True) for n, shape in shapes.items()}

    def work():
        for _ in range(T // b):
            total = sum(newton_schulz(s, optimizer.ns_steps).sum() for s in S.values())
            total.backward()

    return median_time(work, repeats)


def check(options, d):
    """chunked == reference (outputs and the gradient of q) before anything is timed."""
    x = inputs(1, 2 * options["chunk_size"] + 5, 2, d, torch.float64, seed=1)
    o1 = fwd_bwd(x, "chunked", options)
    g1 = x["q"].grad.clone()
    x["q"].grad = None
    o2 = fwd_bwd(x, "reference", options)
    return max(rel_err(o1, o2), rel_err(g1, x["q"].grad))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--reference-repeats", type=int, default=1)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    add_common_args(ap, repeats=3)  # --tiny, --repeats (of the chunked path), --threads, --out
    args = ap.parse_args()
    apply_tiny(args, TINY)
    set_threads(args.threads)

    cells = []
    rows = []
    for name in args.settings:
        options = dict(SETTINGS[name])
        d = options.pop("d")
        err = check(options, d)
        if not err < 1e-8:
            raise SystemExit(f"{name}: chunked and reference disagree (relative error {err:.2e}); not timing")
        x = inputs(args.B, args.T, args.H, d, torch.float32)
        chunked = timed(x, "chunked", options, args.repeats)
        reference = timed(x, "reference", options, args.reference_repeats)
        floor = newton_schulz_floor(options, args.B, args.T, args.H, d, args.repeats) \
            if options["optimizer"] == "muon" else None
        rows.append(dict(setting=name, options=options, d=d, T=args.T, B=args.B, H=args.H, check_rel_err=err,
                         chunked_s=chunked, reference_s=reference, ratio=reference / chunked, ns_alone_s=floor))
        cells.append([name, f"{err:.1e}", f"{chunked:.3f}", f"{reference:.3f}", f"{reference / chunked:.1f}×",
                      "—" if floor is None else f"{floor:.3f}",
                      "—" if floor is None else f"{reference / floor:.1f}× (the most any exact path can gain)"])
    print_table(f"memorize forward+backward, float32, B={args.B} T={args.T} H={args.H}, "
                f"{torch.get_num_threads()} threads",
                ("setting", "check (rel err)", "chunked (s)", "reference (s)", "reference / chunked",
                 "NS alone (s)", "reference / NS alone"), cells)
    write_json(out_path("memory_ops", args),
               dict(threads=torch.get_num_threads(), torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
