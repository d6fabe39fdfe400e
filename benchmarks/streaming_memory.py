"""Peak resident memory and throughput of streaming inference: a model reads N tokens in pieces with its cache.

    python benchmarks/streaming_memory.py [--preset atlas] [--d-model 128] [--n-layers 4] [--n-heads 16] \
        [--lengths 100000 1000000] [--piece 2048] [--threads N] [--tiny]

Each length runs in a fresh process (so peak RSS is its own); random byte tokens, batch 1, no grad, float32.
A recurrent model's state is constant, so its peak memory must not grow with the length read (full attention's
KV cache does). Prints a table (peak RSS, peak above the built model, tokens/s, each against the first length)
and the summary "last length vs first" (by default 1M tokens vs 100K: peak memory ×, tokens/s ×), and writes
runs/bench/streaming_<preset>.json. The training-step counterpart is benchmarks/memory_scaling.py.
--tiny (d_model 32, 2 layers, 2 heads, 512 and 2048 tokens in pieces of 256, 1 thread) only checks that the script runs.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from common import add_common_args, apply_tiny, console, meta, out_path, print_table, set_threads, write_json

TINY = dict(d_model=32, n_layers=2, n_heads=2, lengths=[512, 2048], piece=256)


def stream(preset: str, d_model: int, n_layers: int, n_heads: int, length: int, piece: int, seed: int,
           threads: int | None = None) -> dict:
    """Read ``length`` random byte tokens in pieces; returns peak RSS (MiB) and throughput."""
    import torch

    from atlas_lab.models import LanguageModel

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = LanguageModel(256, preset, d_model=d_model, n_layers=n_layers, n_heads=n_heads).eval()
    g = torch.Generator().manual_seed(seed)
    baseline_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB; interpreter + model
    cache, read, checksum = None, 0, 0.0
    start = time.perf_counter()
    with torch.no_grad():
        while read < length:
            n = min(piece, length - read)
            logits, cache = model(torch.randint(0, 256, (1, n), generator=g), cache)
            checksum += logits[0, -1, 0].item()
            read += n
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(preset=preset, length=length, piece=piece, peak_rss_mib=peak_mib, baseline_mib=baseline_mib,
                above_baseline_mib=peak_mib - baseline_mib, seconds=seconds, tokens_per_s=length / seconds,
                state_bytes=model.state_bytes(), finite=bool(checksum == checksum), threads=torch.get_num_threads())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="atlas")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=16)  # head dim 8: D = 45 polynomial features
    ap.add_argument("--lengths", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--piece", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    add_common_args(ap, repeats=1)  # --repeats is accepted for uniformity; each length is read once
    args = ap.parse_args()
    apply_tiny(args, TINY)
    if args.child is not None:
        print(json.dumps(stream(args.preset, args.d_model, args.n_layers, args.n_heads, args.child, args.piece,
                                args.seed, args.threads)))
        return
    threads = set_threads(args.threads)

    rows = []
    for length in args.lengths:
        cmd = [sys.executable, __file__, "--preset", args.preset, "--d-model", str(args.d_model), "--n-layers",
               str(args.n_layers), "--n-heads", str(args.n_heads), "--piece", str(args.piece), "--seed",
               str(args.seed), "--child", str(length)] + (["--threads", str(args.threads)] if args.threads else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)  # each length as soon as it is measured
    first, last = rows[0], rows[-1]
    cells = [[f"{r['length']:,}", f"{r['peak_rss_mib']:.1f}", f"{r['peak_rss_mib'] / first['peak_rss_mib']:.3f}×",
              f"{r['above_baseline_mib']:.1f}", f"{r['tokens_per_s']:.0f}",
              f"{r['tokens_per_s'] / first['tokens_per_s']:.3f}×", f"{r['seconds']:.1f}"] for r in rows]
    print_table(f"streaming {args.preset} (d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads), "
                f"pieces of {args.piece}, batch 1, float32, no grad, {threads} threads",
                ("tokens read", "peak RSS (MiB)", "vs first", "above model (MiB)", "tokens/s", "vs first", "seconds"),
                cells, left=0)
    summary = dict(first_length=first["length"], last_length=last["length"],
                   peak_rss_ratio=last["peak_rss_mib"] / first["peak_rss_mib"],
                   above_model_ratio=last["above_baseline_mib"] / max(first["above_baseline_mib"], 1e-9),
                   tokens_per_s_ratio=last["tokens_per_s"] / first["tokens_per_s"])
    print_table(f"streaming {args.preset}: {last['length']:,} tokens against {first['length']:,}",
                ("", f"{first['length']:,} tokens", f"{last['length']:,} tokens", "ratio"),
                [["tokens/s", f"{first['tokens_per_s']:.0f}", f"{last['tokens_per_s']:.0f}",
                  f"{summary['tokens_per_s_ratio']:.3f}×"],
                 ["peak RSS (MiB)", f"{first['peak_rss_mib']:.1f}", f"{last['peak_rss_mib']:.1f}",
                  f"{summary['peak_rss_ratio']:.3f}×"],
                 ["peak above the model (MiB)", f"{first['above_baseline_mib']:.1f}",
                  f"{last['above_baseline_mib']:.1f}", f"{summary['above_model_ratio']:.3f}×"]])
    if args.tiny:
        console().print("[dim]--tiny: sizes too small to mean anything; not a measurement[/dim]")
    write_json(out_path(f"streaming_{args.preset}", args),
               dict(meta(args), preset=args.preset, d_model=args.d_model, n_layers=args.n_layers,
                    n_heads=args.n_heads, piece=args.piece, rows=rows, summary=summary))


if __name__ == "__main__":
    main()
