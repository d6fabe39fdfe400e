"""Long-context stability of every preset: a freshly built model reads a long text in streaming pieces.

    python benchmarks/long_context.py [--presets atlas titans ...] [--length 16384] [--piece 512] \
        [--d-model 128] [--n-layers 4] [--n-heads 8] [--memory-heads 32] [--seed 0] [--threads N] [--tiny]

The text is the held-out Shakespeare of experiments/lm.yaml (bytes); the model is the lm.yaml size (float32, no grad).
For each preset: the first token of the piece whose logits are not all finite ("finite" when none), the largest
|logit| and the largest |memory weight| (the weights W_t of every memory layer) over the pieces read, its growth
(whole read / first quarter: 4 is linear growth), whether that is bounded (atlas_lab.models.stability), and the
seconds it took. Writes runs/bench/long_context.json after every row. The same check is a test
(tests/models/test_stability.py); this script prints the table for every preset at once.
"""
from __future__ import annotations

import argparse
import time

from common import add_common_args, apply_tiny, meta, out_path, print_table, set_threads, write_json

TINY = dict(length=1024, piece=256, d_model=32, n_layers=2, n_heads=2, memory_heads=8)


def main() -> None:
    from atlas_lab.models import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--piece", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--memory-heads", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = apply_tiny(add_common_args(ap, repeats=1).parse_args(), TINY)
    threads = set_threads(args.threads)

    import torch

    from atlas_lab.data.corpus import held_out_bytes
    from atlas_lab.models import LanguageModel
    from atlas_lab.models.stability import read_long

    x = held_out_bytes(args.length)
    rows, path = [], out_path("long_context", args)
    for preset in args.presets:
        torch.manual_seed(args.seed)
        model = LanguageModel(256, preset, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                              memory_heads=args.memory_heads).eval()
        start = time.perf_counter()
        r = read_long(model, x, args.piece)
        rows.append(dict(preset=preset, first_nonfinite=r.first_nonfinite, max_abs_logit=r.max_abs_logit,
                         max_abs_weight=r.max_abs_weight, growth=r.growth, bounded=r.bounded,
                         seconds=time.perf_counter() - start))
        write_json(path, meta(args, threads=threads, length=args.length, piece=args.piece, rows=rows), quiet=True)
        print(rows[-1], flush=True)
    print_table(f"{args.length} tokens in pieces of {args.piece}, d_model {args.d_model}, {args.n_layers} layers, "
                f"{args.n_heads} attention / {args.memory_heads} memory heads, float32",
                ["preset", "first non-finite piece", "max |logit|", "max |memory weight|", "growth", "bounded", "s"],
                [(r["preset"], "finite" if r["first_nonfinite"] is None else
                  f"{r['first_nonfinite']}–{r['first_nonfinite'] + args.piece - 1}",
                  f"{r['max_abs_logit']:.3g}", f"{r['max_abs_weight']:.3g}", f"{r['growth']:.2f}",
                  "yes" if r["bounded"] else "no", f"{r['seconds']:.1f}") for r in rows])
    write_json(path, meta(args, threads=threads, length=args.length, piece=args.piece, rows=rows))


if __name__ == "__main__":
    main()
