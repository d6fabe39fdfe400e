"""Peak resident memory of streaming inference: a model reads N tokens in pieces with its cache.

    python benchmarks/streaming_memory.py --preset atlas --d-model 128 --n-layers 4 \
        --lengths 65536 524288 --piece 2048

Each length runs in a fresh process (so peak RSS is its own); random byte tokens, batch 1, no grad.
A recurrent model's state is constant, so its peak memory must not grow with the length read.
Prints a table (peak RSS, tokens/s, ratio to the first length) and writes JSON under runs/bench/.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def stream(preset: str, d_model: int, n_layers: int, n_heads: int, length: int, piece: int, seed: int) -> dict:
    """Read ``length`` random byte tokens in pieces; returns peak RSS (MiB) and throughput."""
    import torch

    from atlas_lab.models import LanguageModel

    torch.manual_seed(seed)
    model = LanguageModel(256, preset, d_model=d_model, n_layers=n_layers, n_heads=n_heads).eval()
    g = torch.Generator().manual_seed(seed)
    cache, read, checksum = None, 0, 0.0
    start = time.perf_counter()
    with torch.no_grad():
        while read < length:
            n = min(piece, length - read)
            logits, cache = model(torch.randint(0, 256, (1, n), generator=g), cache)
            checksum += logits[0, -1, 0].item()
            read += n
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return dict(preset=preset, length=length, piece=piece, peak_rss_mib=peak_mib, seconds=seconds,
                tokens_per_s=length / seconds, state_bytes=model.state_bytes(), finite=bool(checksum == checksum))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="atlas")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--lengths", type=int, nargs="+", default=[65536, 524288])
    ap.add_argument("--piece", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(stream(args.preset, args.d_model, args.n_layers, args.n_heads, args.child, args.piece,
                                args.seed)))
        return

    from rich.console import Console
    from rich.table import Table

    rows = []
    for length in args.lengths:
        cmd = [sys.executable, __file__, "--preset", args.preset, "--d-model", str(args.d_model), "--n-layers",
               str(args.n_layers), "--n-heads", str(args.n_heads), "--piece", str(args.piece), "--seed",
               str(args.seed), "--child", str(length)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)  # each length as soon as it is measured
    table = Table(title=f"streaming {args.preset} (d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads), "
                        f"pieces of {args.piece}, batch 1, float32, no grad")
    for col in ("tokens read", "peak RSS (MiB)", "vs first", "tokens/s", "seconds"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['length']:,}", f"{r['peak_rss_mib']:.1f}", f"{r['peak_rss_mib'] / rows[0]['peak_rss_mib']:.3f}×",
                      f"{r['tokens_per_s']:.0f}", f"{r['seconds']:.1f}")
    Console().print(table)
    out = Path(args.out or f"runs/bench/streaming_{args.preset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
