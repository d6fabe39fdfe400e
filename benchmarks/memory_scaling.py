"""Peak memory of one training step (forward + backward) against the sequence length T.

    python benchmarks/memory_scaling.py [--presets atlas titans transformer] [--T 1024 2048 4096 8192 16384]
                                        [--d-model 256] [--n-layers 4] [--n-heads 16] [--no-checkpoint]
                                        [--threads N] [--tiny]

Each (preset, T) runs in a fresh Python process (``subprocess``), so its peak resident memory is its own: the child
builds LanguageModel(256, preset, d_model 256, 4 layers, 16 heads), draws batch-1 random byte tokens, reads
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (the baseline: interpreter, torch, model), runs one step
(next-token cross-entropy, backward, no optimizer, float32) and reads ru_maxrss again; the step's peak is the
difference. The table gives MiB, MiB per 1K tokens, and the growth from the previous T:
  ×MiB / ×T:        (M_i / M_{i-1}) ÷ (T_i / T_{i-1})        — ≤ 1 when memory grows no faster than T;
  increment ratio:  (ΔM_i / ΔM_{i-1}) ÷ (ΔT_i / ΔT_{i-1})   — from the third T on: ≈ 1 for linear growth (whatever
                    the constant part), ≈ 2 per doubling for quadratic growth;
  growth: "≤ linear" when the increment ratio (or, for the second T, ×MiB / ×T) is ≤ 1.1, else "super-linear".
A child that fails (an exception, a kill by the out-of-memory killer, the --max-gib address-space cap, the
--timeout) is a row with its error. Writes runs/bench/memory_scaling.json after every point ("complete": false
until the end).
--checkpoint (the default; --no-checkpoint to switch it off): the memory presets keep only each chunk's inputs for
the backward (MemoryConfig.checkpoint).
Children serve buffers of 64 KiB and more by mmap and give them back to the OS when freed (``release_freed_memory``):
with glibc's default the many small per-chunk buffers of a memory layer fragment its heap, and the resident peak
measures the fragmentation (titans at T=1024: 386 MiB with a 1 MiB threshold, 257 MiB with 64 KiB, for 246 MiB of
tensors saved for the backward).

Streaming inference (no grad, the model reads its input in pieces with its cache) is measured by
benchmarks/streaming_memory.py: peak memory and tokens/s at 100K and 1M tokens.
"""
from __future__ import annotations

import argparse
import json
import resource
import time

from common import (add_checkpoint_arg, add_child_args, add_common_args, apply_tiny, cap_address_space, child_command,
                    child_record, console, out_path, preset_model, print_table, release_freed_memory, run_child,
                    set_threads, write_json)

TINY = dict(T=[16, 32, 64], d_model=32, n_layers=2, n_heads=2)
VOCAB = 256
MMAP_THRESHOLD = 64 << 10
SLACK = 1.1  # measurement noise allowed before growth is called super-linear


def child(preset: str, T: int, args) -> dict:
    """Runs in the fresh process: one training step; the step's peak RSS above the baseline."""
    cap_address_space(args.max_gib)
    release_freed_memory(MMAP_THRESHOLD)
    import torch
    import torch.nn.functional as F

    set_threads(args.threads)
    model = preset_model(preset, args, VOCAB)
    warm = torch.randint(0, VOCAB, (1, 17))  # a tiny step first: the libraries' one-off buffers go into the baseline
    F.cross_entropy(model(warm[:, :-1])[0].reshape(-1, VOCAB), warm[:, 1:].reshape(-1)).backward()
    model.zero_grad(set_to_none=True)
    tokens = torch.randint(0, VOCAB, (1, T + 1), generator=torch.Generator().manual_seed(T))
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    start = time.perf_counter()
    logits, _ = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(preset=preset, T=T, step_peak_mib=(peak_kib - base_kib) / 1024, baseline_mib=base_kib / 1024,
                total_peak_mib=peak_kib / 1024, seconds=seconds, loss=loss.item(),
                params=model.num_parameters(), threads=torch.get_num_threads())


def measure(preset: str, T: int, args) -> dict:
    return {"preset": preset, "T": T, **run_child(child_command(__file__, preset, T, args), args.timeout)}


def growth(rows: list[dict]) -> None:
    """Adds per_1k_mib, x_mem_over_x_T, increment_ratio and growth to each measured row (sorted by T)."""
    ok = [r for r in rows if "error" not in r]
    for i, r in enumerate(ok):
        r["per_1k_mib"] = r["step_peak_mib"] / (r["T"] / 1024)
        r["x_mem_over_x_T"] = r["increment_ratio"] = r["growth"] = None
        if i == 0:
            continue
        p = ok[i - 1]
        if p["step_peak_mib"] > 0:
            r["x_mem_over_x_T"] = (r["step_peak_mib"] / p["step_peak_mib"]) / (r["T"] / p["T"])
        if i >= 2:
            pp = ok[i - 2]
            dm_prev = p["step_peak_mib"] - pp["step_peak_mib"]
            if dm_prev > 0:
                r["increment_ratio"] = ((r["step_peak_mib"] - p["step_peak_mib"]) / dm_prev) / \
                                       ((r["T"] - p["T"]) / (p["T"] - pp["T"]))
        judge = r["increment_ratio"] if r["increment_ratio"] is not None else r["x_mem_over_x_T"]
        if judge is not None:
            r["growth"] = "≤ linear" if judge <= SLACK else "super-linear"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["atlas", "titans", "transformer"])
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d-model", dest="d_model", type=int, default=256)
    ap.add_argument("--n-layers", dest="n_layers", type=int, default=4)
    ap.add_argument("--n-heads", dest="n_heads", type=int, default=16)
    add_checkpoint_arg(ap)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each child")
    add_child_args(ap, ("PRESET", "T"))
    add_common_args(ap, repeats=1)  # --repeats is accepted for uniformity; each point is one step in a fresh process
    args = ap.parse_args()
    if args.child is not None:  # keep the child free of rich and of anything it does not need
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return
    apply_tiny(args, TINY)

    threads = set_threads(args.threads)

    path = out_path("memory_scaling", args)
    rows = []
    for preset in args.presets:
        mine = []
        for T in sorted(args.T):
            r = measure(preset, T, args)
            mine.append(r)
            write_json(path, child_record(args, rows + mine, False), quiet=True)  # an interrupted run keeps its points
            console().print(f"  {preset} T={T}: " + (r["error"] if "error" in r else
                                                      f"{r['step_peak_mib']:.1f} MiB, {r['seconds']:.1f} s"),
                            style="dim", markup=False)
        growth(mine)
        rows += mine

    def f(x, fmt):
        return None if x is None else format(x, fmt)

    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["preset"], f"{r['T']:,}", "failed", None, None, None, None, r["error"]])
        else:
            cells.append([r["preset"], f"{r['T']:,}", f"{r['step_peak_mib']:.1f}", f"{r['per_1k_mib']:.1f}",
                          f(r["x_mem_over_x_T"], ".2f"), f(r["increment_ratio"], ".2f"), r["growth"], ""])
    columns = ["preset", "T", "step peak (MiB)", "MiB per 1K tokens", "×MiB / ×T", "increment ratio", "growth", "error"]
    if not any(c[-1] for c in cells):
        columns, cells = columns[:-1], [c[:-1] for c in cells]
    print_table(f"peak resident memory of one training step (fwd+bwd) above the built model, batch 1, d_model "
                f"{args.d_model}, {args.n_layers} layers, {args.n_heads} heads, float32, {threads} threads"
                + (", memory presets checkpointed per chunk" if args.checkpoint else ""),
                columns, cells,
                caption="each point in a fresh process; increment ratio ≈ 1: linear in T, ≈ 2 per doubling: quadratic")
    if args.tiny:
        console().print("[dim]--tiny: shapes too small to mean anything; not a measurement[/dim]")
    write_json(path, child_record(args, rows, True))


if __name__ == "__main__":
    main()
