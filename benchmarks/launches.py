"""Kernel launches per chunk of the chunked memory path, counted by gpu_model.py's counter (every dispatched operator
but views, allocations and metadata: each is a kernel launch on a GPU; a select's or slice's backward two),
forward and backward, per added chunk.

    python benchmarks/launches.py [--presets atlas titans] [--chunks 4] [--tiny]
    python benchmarks/launches.py --newton-schulz    (the atlas preset's Newton–Schulz launches on a GPU)

For each preset's memory layer (the model's memory mixer, its own projections included) the count is taken at T = n
and at T = (n + k) chunks; (difference) / k is what each further chunk costs, the rest is the call's fixed part.
Counted on the CPU, the CPU's path (the chunked path; the CPU Newton–Schulz kernel, one operator per chunk, counts as
one launch; on a GPU the Triton kernel of ``memory/ops/newton_schulz/triton.py``, one launch per chunk). A whole
training step as on CUDA: benchmarks/gpu_model.py.
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch

import common
import gpu_model
from atlas_lab.layers import MemoryMixer
from atlas_lab.lit import SequenceModel


def op_launches(fn) -> Counter:
    """{operator: launches} of what ``fn()`` dispatches on CPU tensors (gpu_model's counter)."""
    count = gpu_model.Count()
    with gpu_model.counting_mode(count, "cpu"):
        fn()
    return count.ops


def memory_layer(preset: str, d_model: int, heads: int) -> MemoryMixer:
    model = SequenceModel(vocab_size=64, preset=preset, d_model=d_model, n_layers=1, n_heads=heads,
                          memory_heads=heads)
    return next(m for m in model.modules() if isinstance(m, MemoryMixer))


def count(layer: MemoryMixer, T: int, batch: int) -> tuple[Counter, Counter]:
    """(forward, backward) launches of one call of ``layer`` on [batch, T, d_model], by operator."""
    x = torch.randn(batch, T, layer.q_proj.in_features, requires_grad=True)
    forward = op_launches(lambda: layer(x))
    out, _ = layer(x)
    backward = op_launches(lambda: out.square().mean().backward())
    return forward, backward


NS_SHAPES = {  # (batch, d_model, memory heads): the study's, a call of B·H = 8 at d 64, a 125M-class model's
    "study (sweeps/mqar_gpu.yaml: B 64, d_model 128, 8 memory heads)": (64, 128, 8),
    "B·H = 8 (B 2, 4 heads of 64)": (2, 256, 4),
    "125M-class (B 8, d_model 768, 12 heads)": (8, 768, 12),
}


def newton_schulz_launches(preset: str = "atlas", sms: int = 132) -> list[list[str]]:
    """Per weight matrix of ``preset``'s memory, its Newton–Schulz launch on a GPU with per-token reads: one program
    per matrix, every token of a chunk and every sequence and head at once (M = B·H·chunk), the forward's FLOPs
    (``direction_flops`` × M), and whether the Triton kernel takes the matrix (else the plan keeps the call on the
    chunked path, batched matmuls)."""
    from atlas_lab.memory.ops.limits import MAX_COLS, MAX_ROWS
    from atlas_lab.models import resolve_preset

    _, config = resolve_preset(preset)
    mem, fmap, _, optimizer = config.components()
    rows = []
    for label, (B, d_model, H) in NS_SHAPES.items():
        d = d_model // H
        for name, (out, into) in mem.shapes(fmap.dim(d), d, d).items():
            M = B * H * config.chunk_size
            kernel = min(out, into) <= MAX_ROWS and max(out, into) <= MAX_COLS
            rows.append([label, f"{name} [{out}, {into}]", f"{M:,} ({M / sms:.1f})",
                         f"{optimizer.direction_flops(out, into) * M / 1e9:.2f}",
                         "yes" if kernel else f"no: larger than {MAX_ROWS} × {MAX_COLS}"])
    return rows


def main(argv=None):
    ap = common.add_common_args(argparse.ArgumentParser(description=__doc__), repeats=1)
    ap.add_argument("--presets", nargs="+", default=["atlas", "titans", "omeganet", "deltanet"])
    ap.add_argument("--chunks", type=int, default=4, help="chunks added between the two counts")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--top", type=int, default=6, help="operators listed per preset")
    ap.add_argument("--newton-schulz", action="store_true", help="print the atlas preset's Newton–Schulz launches "
                                                                  "on a GPU (programs, FLOPs) and stop")
    args = common.apply_tiny(ap.parse_args(argv), {"presets": ["atlas", "titans"], "chunks": 2, "d_model": 32,
                                                   "heads": 4})
    if args.newton_schulz:
        common.print_table("atlas's Newton–Schulz launches per chunk on a GPU (read token, forward)",
                           ["shape", "weight", "programs (per SM of 132)", "GFLOP", "Triton kernel"],
                           newton_schulz_launches())
        return
    common.set_threads(args.threads)
    rows, results = [], []
    for preset in args.presets:
        torch.manual_seed(0)
        layer = memory_layer(preset, args.d_model, args.heads)
        chunk = layer.config.chunk_size
        f1, b1 = count(layer, chunk, args.batch)
        f2, b2 = count(layer, chunk * (1 + args.chunks), args.batch)
        per_f = (sum(f2.values()) - sum(f1.values())) / args.chunks
        per_b = (sum(b2.values()) - sum(b1.values())) / args.chunks
        top = ((f2 + b2) - (f1 + b1)).most_common(args.top)
        rows.append([preset, str(chunk), f"{per_f:.0f}", f"{per_b:.0f}", f"{per_f + per_b:.0f}",
                     f"{sum(f1.values()) + sum(b1.values())}",
                     ", ".join(f"{name[6:]} {n / args.chunks:.0f}" for name, n in top)])
        results.append({"preset": preset, "chunk_size": chunk, "forward_per_chunk": per_f,
                        "backward_per_chunk": per_b, "one_chunk_total": sum(f1.values()) + sum(b1.values()),
                        "top_per_chunk": {name: n / args.chunks for name, n in top}})
    common.print_table(f"kernel launches per chunk (gpu_model's counter), batch {args.batch}, d_model "
                       f"{args.d_model}, {args.heads} heads" + (" (--tiny)" if args.tiny else ""),
                       ["preset", "chunk", "forward", "backward", "total", "one-chunk call", "most per chunk"],
                       rows)
    common.write_json(common.out_path("launches", args), {"meta": common.meta(args), "results": results})


if __name__ == "__main__":
    main()
