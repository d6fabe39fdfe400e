"""Sliding-window attention: the dense T × T mask against the blocked O(T·w) path, side by side.

    python benchmarks/swa.py [--T 4096 16384 65536] [--window 64] [--d-model 128] [--n-heads 8] [--threads N] \
        [--max-gib G] [--tiny]

Each (path, T) runs in a fresh process: one forward and backward of an SWA layer's attention (q, k, v of
[1, H, T, d_model/H] in float32, the same tensors for both paths), its peak resident memory above the process
before the call, and the time. Both paths compute the same function (tests/layers/test_attention.py); the dense one is
``sliding_window_attention_dense`` (the layer's former path, now used only for T ≤ w), the blocked one
``sliding_window_attention_blocked``. A child that runs out of its address-space cap is a row with the error.
Prints the table with the dense / blocked ratios and writes runs/bench/swa.json.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from common import (add_child_args, add_common_args, apply_tiny, cap_address_space, meta, out_path, print_table,
                    release_freed_memory, run_child, set_threads, write_json)

TINY = dict(T=[256, 1024], window=16, d_model=32, n_heads=2)
PATHS = ("dense", "blocked")


def child(path: str, T: int, args) -> dict:
    cap_address_space(args.max_gib)
    release_freed_memory(64 << 10)
    import torch

    from atlas_lab.layers.attention import sliding_window_attention_blocked, sliding_window_attention_dense

    set_threads(args.threads)
    fn = {"dense": sliding_window_attention_dense, "blocked": sliding_window_attention_blocked}[path]
    d = args.d_model // args.n_heads
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.n_heads, T, d, generator=g, requires_grad=True) for _ in range(3))
    warm = [x[:, :, :2 * args.window].detach().requires_grad_() for x in (q, k, v)]
    fn(*warm, args.window).sum().backward()  # one-off buffers into the baseline
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    o = fn(q, k, v, args.window)
    o.square().sum().backward()
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(peak_mib=(peak_kib - base_kib) / 1024, seconds=seconds, checksum=o.double().sum().item(),
                threads=torch.get_num_threads())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--d-model", dest="d_model", type=int, default=128)
    ap.add_argument("--n-heads", dest="n_heads", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each child")
    add_child_args(ap, ("PATH", "T"))
    add_common_args(ap, repeats=1)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return
    apply_tiny(args, TINY)
    threads = set_threads(args.threads)
    out, rows = out_path("swa", args), []
    for T in args.T:
        for path in PATHS:
            cmd = [sys.executable, __file__, "--child", path, str(T), "--window", str(args.window), "--d-model",
                   str(args.d_model), "--n-heads", str(args.n_heads), "--max-gib", str(args.max_gib or 0)]
            cmd += ["--threads", str(args.threads)] if args.threads else []
            rows.append(dict(path=path, T=T, **run_child(cmd, args.timeout)))
            print(rows[-1], flush=True)
            write_json(out, meta(args, threads=threads, window=args.window, rows=rows), quiet=True)

    def cell(r, key, fmt):
        if "error" not in r:
            return fmt.format(r[key])
        return "out of memory" if "allocate" in r["error"] else r["error"][:30]

    table = []
    for T in args.T:
        dense, blocked = (next(r for r in rows if r["T"] == T and r["path"] == p) for p in PATHS)
        both = "error" not in dense and "error" not in blocked
        table.append((T, cell(dense, "peak_mib", "{:.1f}"), cell(blocked, "peak_mib", "{:.1f}"),
                      f"{dense['peak_mib'] / max(blocked['peak_mib'], 0.1):.1f}×" if both else "",
                      cell(dense, "seconds", "{:.3f}"), cell(blocked, "seconds", "{:.3f}"),
                      f"{dense['seconds'] / blocked['seconds']:.1f}×" if both else ""))
    print_table(f"SWA forward+backward, window {args.window}, {args.n_heads} heads of {args.d_model // args.n_heads}, "
                f"batch 1, float32, {threads} thread(s)",
                ["T", "dense MiB", "blocked MiB", "MiB ×", "dense s", "blocked s", "time ×"], table)
    write_json(out, meta(args, threads=threads, window=args.window, rows=rows))


if __name__ == "__main__":
    main()
