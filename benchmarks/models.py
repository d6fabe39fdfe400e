"""Training throughput of every named model (``atlas_lab.models.PRESETS``) next to the transformer.

    python benchmarks/models.py [--T 1024 4096] [--presets atlas titans ...] [--d-model 256] [--n-layers 4]
                                [--n-heads 16] [--memory-heads H] [--batch 1] [--repeats 3] [--no-checkpoint]
                                [--compile] [--threads N] [--tiny]

At experiments/mqar.yaml's sizes: --T 32 --batch 32 --d-model 64 --n-layers 2 --n-heads 4 --memory-heads 16
--no-checkpoint --threads 1 (vocab 256 here, 64 there: the embedding and the output layer only).

One step = forward + backward of the next-token cross-entropy on random byte tokens (vocab 256), no optimizer,
float32, batch 1, d_model 256, 4 layers, 16 heads of 16 (LanguageModel defaults otherwise: SwiGLU, tied embeddings,
SWA window 64, every memory at the preset's chunk 16). For each T the `transformer` preset is always timed
first (it is the baseline); then each preset, each in a fresh process: parameters, ms/step (median after a warm-up
step), tokens/s = batch·T / step, and its tokens/s ÷ the transformer's at the same T (> 1: faster than the
transformer).
A preset that fails (an exception, e.g. out of memory) is a row with its error; the others go on. Each measurement's
process has its address space capped (--max-gib, default 3/4 of the machine's memory) so that running out of memory
is an exception rather than a kill by the kernel's out-of-memory killer. (In one process for every preset, glibc's
heap, fragmented by the presets before, made atlas_pp fail to allocate at T=1024; handing freed buffers back to the
OS instead slowed atlas by a third.)
--compile: each preset also with its blocks compiled (``atlas_lab.models.compile_blocks``, torch.compile with
inductor), in a process of its own, as the row "<preset> compiled": its first step (the compile) in seconds, its
ms/step after it, and the eager step ÷ the compiled step.
Nothing to check for correctness here beyond a finite loss (the memory op is checked in memory_ops.py).
--checkpoint (the default; --no-checkpoint to switch it off): the memory presets keep only each chunk's inputs for
the backward (without it the muon presets need several GiB per 1K tokens). Writes runs/bench/models.json after every
row ("complete": false until the end).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from rich.text import Text
from common import (add_checkpoint_arg, add_child_args, add_common_args, apply_tiny, cap_address_space, child_command,
                    child_record, console, median_time, out_path, preset_model, print_table, run_child, set_threads,
                    write_json)

from atlas_lab.models import PRESETS, compile_blocks

BASELINE = "transformer"
VOCAB = 256
TINY = dict(T=[32], d_model=32, n_layers=2, n_heads=2, batch=1, repeats=1)


def step(model, tokens):
    """One optimizer-free training step: forward, next-token cross-entropy, backward; returns the loss."""
    model.zero_grad(set_to_none=True)
    logits, _ = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    return loss.item()


def measure(preset, T, args):
    """Runs in the fresh process: {params, seconds, tokens_per_s, loss} or {params, error}."""
    cap_address_space(args.max_gib)
    set_threads(args.threads)
    params = None
    try:
        model = preset_model(preset, args, VOCAB)
        params = model.num_parameters()
        if args.compiled:
            compile_blocks(model)
        g = torch.Generator().manual_seed(T)
        tokens = torch.randint(0, VOCAB, (args.batch, T + 1), generator=g)  # T inputs, T targets
        first = time.perf_counter()
        loss = step(model, tokens)
        first = time.perf_counter() - first
        if not math.isfinite(loss):
            return dict(params=params, error=f"non-finite loss {loss}")
        seconds = median_time(lambda: step(model, tokens), args.repeats, warmup=0)  # the step above was the warm-up
        return dict(params=params, seconds=seconds, tokens_per_s=args.batch * T / seconds, loss=loss,
                    first_step_s=first)
    except Exception as e:  # noqa: BLE001 — a failing preset (incl. out of memory) is a row, not a crash
        first = (str(e).strip().splitlines() or [""])[0]
        return dict(params=params, error=f"{type(e).__name__}: {first[:200]}")


def measure_in_child(preset, T, args, compiled=False):
    r = run_child(child_command(__file__, preset, T, args, "--batch", str(args.batch),
                                "--repeats", str(args.repeats), *(["--compiled"] if compiled else [])))
    r.setdefault("params", None)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--d-model", dest="d_model", type=int, default=256)
    ap.add_argument("--n-layers", dest="n_layers", type=int, default=4)
    ap.add_argument("--n-heads", dest="n_heads", type=int, default=16)
    ap.add_argument("--memory-heads", dest="memory_heads", type=int, default=None,
                    help="heads of the memory layers (default: --n-heads; experiments/mqar.yaml: 16 beside 4)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also time each preset with its blocks compiled")
    ap.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)  # a child: compile the blocks
    add_checkpoint_arg(ap)
    add_child_args(ap, ("PRESET", "T"))
    add_common_args(ap, repeats=3)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args)))
        return
    apply_tiny(args, TINY)
    threads = set_threads(args.threads)
    presets = [BASELINE] + [p for p in dict.fromkeys(args.presets) if p != BASELINE]

    path = out_path("models", args)
    rows = []
    for T in args.T:
        cells = []
        base = None
        for preset, compiled in ((p, c) for p in presets for c in ((False, True) if args.compile else (False,))):
            r = dict(preset=preset, T=T, compiled=compiled, **measure_in_child(preset, T, args, compiled))
            if preset == BASELINE and not compiled:
                base = r.get("tokens_per_s")
            eager = next((x for x in rows if x["preset"] == preset and x["T"] == T and not x["compiled"]), {})
            r["vs_transformer"] = r["tokens_per_s"] / base if "tokens_per_s" in r and base else None
            r["vs_eager"] = eager["seconds"] / r["seconds"] if compiled and "seconds" in r and "seconds" in eager \
                else None
            label = f"{preset} compiled" if compiled else preset
            rows.append(r)
            # an interrupted run keeps its rows
            write_json(path, child_record(args, rows, False, batch=args.batch, vocab=VOCAB), quiet=True)
            if "error" in r:
                cells.append([label, None if r["params"] is None else f"{r['params']:,}", "failed", None, None, None,
                              None, r["error"]])
            else:
                cells.append([label, f"{r['params']:,}", f"{1e3 * r['seconds']:.1f}", f"{r['tokens_per_s']:,.0f}",
                              None if r["vs_transformer"] is None else f"{r['vs_transformer']:.2f}×",
                              f"{r['first_step_s']:.1f}", None if r["vs_eager"] is None else f"{r['vs_eager']:.2f}×",
                              ""])
            console().print(Text(f"  T={T} {label}: " + (r["error"] if "error" in r
                                                          else f"{1e3 * r['seconds']:.1f} ms/step"), style="dim"))
        columns = ["preset", "params", "ms/step", "tokens/s", "tokens/s ÷ transformer", "first step s",
                   "eager ÷ compiled", "error"]
        if not args.compile:  # the compile columns only with --compile
            columns, cells = columns[:5] + columns[7:], [c[:5] + c[7:] for c in cells]
        if not any(c[-1] for c in cells):  # the error column only when something failed
            columns, cells = columns[:-1], [c[:-1] for c in cells]
        print_table(f"training step (fwd+bwd, cross-entropy, no optimizer), T={T}, batch {args.batch}, d_model "
                    f"{args.d_model}, {args.n_layers} layers, {args.n_heads} heads"
                    + (f" ({args.memory_heads} in memories)" if args.memory_heads else "")
                    + f", float32, {threads} threads",
                    columns, cells, caption="> 1: faster than the transformer at this T")
    if args.tiny:
        console().print("[dim]--tiny: shapes too small to mean anything; not a measurement[/dim]")
    write_json(path, child_record(args, rows, True, batch=args.batch, vocab=VOCAB))


if __name__ == "__main__":
    main()
