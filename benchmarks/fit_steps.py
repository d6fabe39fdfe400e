"""The step of an ``atlas-lab fit`` as a user runs it, eager against ``--model.compile=true``, side by side.

    python benchmarks/fit_steps.py [--presets transformer titans gated_deltanet atlas] [--steps 100] [--skip 40]
                                   [--config experiments/mqar.yaml] [--threads 1] [--tiny]

Each (preset, eager or compiled) is one ``atlas-lab fit -c lightning_config.yaml -c CONFIG --model.preset=P
[--model.compile=true] --trainer.max_steps=STEPS --trainer.val_check_interval=SKIP --trainer.limit_val_batches=2
--trainer.logger=false`` in a fresh process, with lightning_config.yaml's callbacks (progress bar, model summary,
learning rates, checkpoints): ms/step is the wall time from the start of batch SKIP to the end of the fit over the
steps between (the validations every SKIP steps included, and with them their compile), and the whole command's
seconds (data set-up and every compile included). The table gives each row's step ÷ the eager transformer's and, for
a compiled row, the eager step ÷ the compiled one. Run from the checkout's root (its lightning_config.yaml and
experiments/); nothing is logged to MLflow, checkpoints land in a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from common import (add_child_args, add_common_args, apply_tiny, out_path, print_table, run_child, set_threads,
                    write_json)

TINY = dict(presets=["transformer", "titans"], steps=6, skip=3, repeats=1)


def measure(preset: str, compiled: bool, args) -> dict:
    """In the fresh process: {ms_per_step, command_s} of one fit."""
    import lightning as L

    import atlas_lab.lit.cli as lit_cli
    from atlas_lab.cli import main

    timing = {}

    class StepClock(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == args.skip and "start" not in timing:
                timing["start"] = (time.perf_counter(), trainer.global_step)

        def on_train_end(self, trainer, pl_module):
            start, step = timing["start"]
            timing["ms_per_step"] = 1e3 * (time.perf_counter() - start) / (trainer.global_step - step)

    build = lit_cli.AtlasCLI.instantiate_classes

    def with_clock(cli):
        build(cli)
        cli.trainer.callbacks.append(StepClock())

    lit_cli.AtlasCLI.instantiate_classes = with_clock
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        code = main(["fit", "-c", "lightning_config.yaml", "-c", args.config, f"--model.preset={preset}",
                     f"--model.compile={str(compiled).lower()}", f"--trainer.max_steps={args.steps}",
                     f"--trainer.val_check_interval={args.skip}", "--trainer.limit_val_batches=2",
                     "--trainer.logger=false", f"--trainer.default_root_dir={root}"])
    if code != 0 or "ms_per_step" not in timing:
        return dict(error=f"atlas-lab fit exited {code}")
    return dict(ms_per_step=timing["ms_per_step"], command_s=time.perf_counter() - began)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["transformer", "titans", "gated_deltanet", "atlas"])
    ap.add_argument("--config", default="experiments/mqar.yaml")
    ap.add_argument("--steps", type=int, default=100, help="training steps of each fit")
    ap.add_argument("--skip", type=int, default=40, help="steps before the clock starts (and between validations)")
    add_child_args(ap, ("PRESET", "COMPILED"))
    add_common_args(ap, repeats=1)
    args = ap.parse_args()
    if args.child is not None:
        set_threads(args.threads)
        print(json.dumps(measure(args.child[0], args.child[1] == "1", args)))
        return
    apply_tiny(args, TINY)
    threads = set_threads(args.threads)
    rows = []
    for preset in args.presets:
        for compiled in (False, True):
            cmd = [sys.executable, __file__, "--child", preset, str(int(compiled)), "--config", args.config,
                   "--steps", str(args.steps), "--skip", str(args.skip), "--threads", str(threads)]
            rows.append(dict(preset=preset, compiled=compiled, **run_child(cmd)))
            print(f"  {preset}{' compiled' if compiled else ''}: {rows[-1]}", file=sys.stderr, flush=True)
    base = next((r.get("ms_per_step") for r in rows if r["preset"] == "transformer" and not r["compiled"]), None)
    cells = []
    for r in rows:
        eager = next(x for x in rows if x["preset"] == r["preset"] and not x["compiled"])
        if "error" in r:
            cells.append([r["preset"] + (" compiled" if r["compiled"] else ""), "failed", None, None, None, r["error"]])
            continue
        cells.append([r["preset"] + (" compiled" if r["compiled"] else ""), f"{r['ms_per_step']:.1f}",
                      f"{r['ms_per_step'] / base:.1f}×" if base else None,
                      f"{eager['ms_per_step'] / r['ms_per_step']:.2f}×" if r["compiled"] and "ms_per_step" in eager
                      else None, f"{r['command_s']:.1f}", ""])
    columns = ["fit", "ms/step", "step ÷ eager transformer's", "eager ÷ compiled", "whole command s", "error"]
    if not any(c[-1] for c in cells):  # the error column only when something failed
        columns, cells = columns[:-1], [c[:-1] for c in cells]
    print_table(f"atlas-lab fit ({args.config}), ms/step over steps {args.skip}..{args.steps} (validations every "
                f"{args.skip} included), {threads} threads", columns, cells)
    if args.tiny:
        print("--tiny: too few steps to mean anything; not a measurement", file=sys.stderr)
    write_json(out_path("fit_steps", args), dict(rows=rows, threads=threads, steps=args.steps, skip=args.skip,
                                                 config=args.config))


if __name__ == "__main__":
    main()
