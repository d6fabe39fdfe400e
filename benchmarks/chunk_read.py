"""What a token reads inside a chunk (docs/memory.md §4.1): per-token weights (read="token", the exact rule) against
the chunk-start weights with one commit per chunk (read="chunk"), side by side in one process.

    python benchmarks/chunk_read.py [--T 1024] [--chunks 4 16 64] [--repeats 3] [--threads N] [--tiny]

Setting: the atlas memory of memory_ops.py (B=2, H=4, d_k=d_v=16, polynomial degree 2, mlp depth 2 expansion 4, l2,
window 8, muon quintic 5 steps), every gate a data-dependent [B, T, H] tensor that requires gradients. For each chunk
size b: forward+backward time of both reads (median), their ratio, the forward FLOPs per token of both
(atlas_lab.memory.cost), and how far the chunk read's outputs are from the exact rule's, ‖o_chunk − o_token‖ /
‖o_token‖, on the same inputs. Writes runs/bench/chunk_read.json (--tiny: chunk_read.tiny.json, a run-through).
"""
from __future__ import annotations

import argparse

from common import add_common_args, apply_tiny, median_time, out_path, print_table, rel_err, set_threads, write_json
from memory_ops import SETTINGS, fwd_bwd, inputs

import torch

from atlas_lab.memory import MemoryConfig
from atlas_lab.memory.cost import flops_text
from atlas_lab.memory.plan import Shapes, plan


def main(argv=None):
    ap = add_common_args(argparse.ArgumentParser(description=__doc__), repeats=3)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--chunks", type=int, nargs="+", default=[4, 16, 64])
    args = apply_tiny(ap.parse_args(argv), dict(T=40, B=1, H=1, chunks=[4, 16], repeats=1))
    threads = set_threads(args.threads)
    setting = dict(SETTINGS["atlas"])
    d = setting.pop("d")
    x = inputs(args.B, args.T, args.H, d, torch.float32)
    rows, records = [], []
    for b in args.chunks:
        options = {**setting, "chunk_size": b}
        with torch.no_grad():
            o_token = fwd_bwd_output(x, {**options, "read": "token"})
            o_chunk = fwd_bwd_output(x, {**options, "read": "chunk"})
        diff = rel_err(o_chunk, o_token)
        t_token = median_time(lambda: fwd_bwd(x, "chunked", {**options, "read": "token"}), args.repeats)
        t_chunk = median_time(lambda: fwd_bwd(x, "chunked", {**options, "read": "chunk"}), args.repeats)
        config = MemoryConfig(**{k: v for k, v in options.items()})
        f_token, f_chunk = (plan(config.replace(read=r), Shapes(1, args.T, 1, d, d), impl="chunked").flops
                            for r in ("token", "chunk"))
        records.append(dict(chunk_size=b, token_s=t_token, chunk_s=t_chunk, speedup=t_token / t_chunk,
                            token_flops_per_token=f_token, chunk_flops_per_token=f_chunk, rel_output_diff=diff))
        rows.append([b, f"{t_token * 1e3:.1f}", f"{t_chunk * 1e3:.1f}", f"{t_token / t_chunk:.2f}×",
                     flops_text(f_token), flops_text(f_chunk), f"{f_token / f_chunk:.1f}×", f"{diff:.3f}"])
    print_table(f"atlas memory, read=token vs read=chunk: forward+backward, B={args.B} T={args.T} H={args.H} d={d}, "
                f"float32, {threads} thread(s)",
                ["b", "token ms", "chunk ms", "token/chunk", "token FLOPs/tok", "chunk FLOPs/tok", "FLOPs ratio",
                 "‖Δo‖/‖o‖"], rows)
    write_json(out_path("chunk_read", args), dict(setting=setting, B=args.B, T=args.T, H=args.H, d=d,
                                                  threads=threads, tiny=args.tiny, rows=records))


def fwd_bwd_output(x, options):
    from atlas_lab.memory import memorize

    o, _ = memorize(x["q"], x["k"], x["v"],
                    **options, gates={"alpha": x["alpha"], "eta": x["eta"], "theta": x["theta"], "gamma": x["gamma"]})
    return o


if __name__ == "__main__":
    main()
