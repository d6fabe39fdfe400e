"""Forward+backward time of a whole Titans memory layer: atlas-lab's MemoryMixer against titans-pytorch's NeuralMemory.

    python benchmarks/titans_layer.py [--B 2] [--T 1024] [--d-model 256] [--heads 4] [--chunk 64]
                                      [--repeats 3] [--threads N] [--tiny]

Settings (float32, one process, side by side):
  atlas-lab:       MemoryMixer(d_model, heads, config), config = the `titans` preset's MemoryConfig
                   (resolve_preset("titans", {"chunk_size": 64, "depth": 2, "expansion": 4})): mlp memory depth 2
                   expansion 4 (residual), identity φ, l2, window 1, momentum, learned α, η (η_max 0.1), θ, chunk 64.
  titans-pytorch:  NeuralMemory(dim=d_model, heads=4, dim_head=64, chunk_size=64, batch_size=64, momentum=True,
                   default_model_kwargs=dict(depth=2, expansion_factor=4.)) (version 0.5.5): the weights commit
                   once per chunk of 64 tokens, as in atlas-lab's chunk.
  memorize op:     atlas-lab's bare memory op (impl="chunked") at the same shapes (B, T, H=heads, d=d_model/heads,
                   benchmarks/memory_ops.py's `titans` setting), every gate a [B, T, H] tensor requiring gradients.
Each is x [B, T, d_model] (requires grad) -> output, then ``.square().mean().backward()``; parameter gradients
are cleared before every call. Correctness first: the memorize op chunked == reference (float64, T = 2·chunk+5),
and both layers return a finite [B, T, d_model] output with finite gradients. The two layers are not the same
function (different projections, gates, norms), so only their cost is compared: ratio = atlas-lab / titans-pytorch
(< 1: atlas-lab is faster). If titans_pytorch is not importable its column is skipped (`make bench` installs it).
Writes runs/bench/titans_layer.json.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
from importlib.metadata import version

import torch
from common import (add_common_args, apply_tiny, console, median_time, meta, out_path, peer, print_table, set_threads,
                    write_json)
from memory_ops import SETTINGS as OP_SETTINGS
from memory_ops import check as op_check
from memory_ops import inputs as op_inputs

from atlas_lab.layers.memory_mixer import MemoryMixer
from atlas_lab.memory import memorize
from atlas_lab.models import resolve_preset

TINY = dict(B=1, T=64, d_model=64, heads=2, chunk=16, depth=2, expansion=4, repeats=1)


def atlas_layer(d_model, heads, chunk, depth, expansion):
    _, config = resolve_preset("titans", {"chunk_size": chunk, "architecture.depth": depth,
                                          "architecture.expansion": expansion})
    return MemoryMixer(d_model, heads, config), config


def titans_layer(titans_pytorch, d_model, heads, chunk, depth, expansion):
    # titans_pytorch/neural_memory.py, NeuralMemory.__init__ (0.5.5): dim, chunk_size, batch_size, dim_head, heads,
    # momentum=True, default_model_kwargs=dict(depth, expansion_factor) -> MemoryMLP(dim_head, depth, expansion_factor)
    return titans_pytorch.NeuralMemory(dim=d_model, chunk_size=chunk, batch_size=chunk, dim_head=d_model // heads,
                                       heads=heads, momentum=True,
                                       default_model_kwargs=dict(depth=depth, expansion_factor=float(expansion)))


def layer_fwd_bwd(layer, x):
    layer.zero_grad(set_to_none=True)
    x.grad = None
    # MemoryMixer.forward(x, cache=None) -> (y, cache); NeuralMemory.forward(seq, ...) -> (retrieved, NeuralMemState)
    y, _ = layer(x)
    y.square().mean().backward()
    return y


def op_fwd_bwd(x, options):
    for t in x.values():
        t.grad = None
    o, _ = memorize(x["q"], x["k"], x["v"],
                    impl="chunked", **options,
                    gates={"alpha": x["alpha"], "eta": x["eta"], "theta": x["theta"], "gamma": x["gamma"]})
    o.square().mean().backward()
    return o


def layer_ok(layer, x):
    """A finite output of x's shape, finite gradients of x and of every parameter that got one."""
    y = layer_fwd_bwd(layer, x)
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.grad is not None]
    return (tuple(y.shape) == tuple(x.shape) and bool(torch.isfinite(y).all())
            and all(bool(torch.isfinite(g).all()) for g in grads))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--d-model", dest="d_model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=64,
                    help="atlas-lab chunk_size = titans-pytorch chunk_size = batch_size")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--expansion", type=int, default=4)
    add_common_args(ap, repeats=3)
    args = ap.parse_args()
    apply_tiny(args, TINY)
    threads = set_threads(args.threads)
    B, T, D, H, b = args.B, args.T, args.d_model, args.heads, args.chunk
    d = D // H
    dims = (args.d_model, H, b, args.depth, args.expansion)

    # correctness first
    options = dict(OP_SETTINGS["titans"], chunk_size=b,
                   architecture={"name": "mlp", "depth": args.depth, "expansion": args.expansion})
    options.pop("d")
    op_err = op_check(options, d)
    if not op_err < 1e-8:
        raise SystemExit(f"memorize: chunked and reference disagree (relative error {op_err:.2e}); not timing")
    torch.manual_seed(0)
    ours, config = atlas_layer(*dims)
    titans_pytorch = peer("titans_pytorch", "titans-pytorch NeuralMemory column")
    theirs = titans_layer(titans_pytorch, *dims) if titans_pytorch is not None else None
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1)).requires_grad_()
    small = torch.randn(1, 2 * b, D, generator=torch.Generator().manual_seed(2)).requires_grad_()
    checks = {"atlas-lab layer": layer_ok(ours, small)}
    if theirs is not None:
        checks["titans-pytorch layer"] = layer_ok(theirs, small)
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise SystemExit(f"{', '.join(bad)}: non-finite or wrongly shaped output/gradients; not timing")

    # timing, side by side
    t_ours = median_time(lambda: layer_fwd_bwd(ours, x), args.repeats)
    t_theirs = median_time(lambda: layer_fwd_bwd(theirs, x), args.repeats) if theirs is not None else None
    xo = op_inputs(B, T, H, d, torch.float32)
    t_op = median_time(lambda: op_fwd_bwd(xo, options), args.repeats)

    def n_params(m):
        return None if m is None else sum(p.numel() for p in m.parameters())

    ratio = None if t_theirs is None else t_ours / t_theirs
    row = dict(B=B, T=T, d_model=D, heads=H, head_dim=d, chunk=b, depth=args.depth, expansion=args.expansion,
               atlas_layer_s=t_ours, titans_pytorch_layer_s=t_theirs, memorize_op_s=t_op,
               ratio_atlas_over_titans=ratio, memorize_check_rel_err=op_err, layer_checks=checks,
               atlas_params=n_params(ours), titans_pytorch_params=n_params(theirs),
               atlas_config=asdict(config),
               titans_pytorch_version=version("titans-pytorch") if titans_pytorch is not None else None)
    print_table(
        f"Titans memory layer forward+backward, float32, B={B} T={T} d_model={D} heads={H} (head dim {d}), "
        f"mlp depth {args.depth} expansion {args.expansion}, momentum, chunk {b}, {threads} threads",
        ("check", "atlas-lab layer (s)", "titans-pytorch layer (s)", "atlas-lab memorize op (s)",
         "atlas-lab / titans-pytorch", "params atlas-lab / titans-pytorch"),
        [[f"op {op_err:.1e}, layers finite", f"{t_ours:.3f}", None if t_theirs is None else f"{t_theirs:.3f}",
          f"{t_op:.3f}", None if ratio is None else f"{ratio:.2f}×",
          f"{n_params(ours):,} / {'—' if theirs is None else format(n_params(theirs), ',')}"]],
        caption="ratio < 1: atlas-lab is faster" + ("" if theirs is not None else "; titans-pytorch skipped"))
    if args.tiny:
        console().print("[dim]--tiny: shapes too small to mean anything; not a measurement[/dim]")
    write_json(out_path("titans_layer", args), dict(meta(args), rows=[row]))


if __name__ == "__main__":
    main()
