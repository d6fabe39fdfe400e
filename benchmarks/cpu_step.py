"""The study-size training step on the CPU, every variant side by side in one process, against the transformer's.

    python benchmarks/cpu_step.py [--config experiments/mqar.yaml] [--variants transformer atlas atlas:read=chunk
                                  titans omeganet] [--repeats 7] [--threads 1] [--tiny]

A training step as a fit runs it (``SequenceModel`` built from the config file's ``model`` section, one batch of its
data module): the module's forward, next-token cross-entropy in float32, the finite-loss check, backward, gradient
clipping at lightning_config.yaml's norm (1.0), AdamW on the module's parameter groups, zero_grad and the learning
rate schedule; no Lightning loop, logging or callbacks around it. A variant is a preset, with memory options after a
colon (``atlas:read=chunk`` is ``--model.memory.read=chunk``). One thread by default (the study's setting on this
machine). Each variant is built and stepped once (the warm-up: the Newton–Schulz kernel's build, allocator growth),
then the variants take turns, one timed step each per round, ``--repeats`` rounds: a neighbour's load falls on every
variant alike. Columns: median ms/step, the spread (min–max over the rounds), the median ÷ the transformer's median,
and for atlas (per-token reads) the issue-52 target, ≤ 15× the transformer's step. Writes runs/bench/cpu_step.json
(--tiny: cpu_step.tiny.json, tiny shapes, a run-through in seconds).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml
from common import ROOT, add_common_args, apply_tiny, meta, out_path, print_table, set_threads, write_json
from torch import nn

from atlas_lab.data import MQARDataModule
from atlas_lab.lit.module import SequenceModel
from atlas_lab.models import PRESETS

VARIANTS = ["transformer", "atlas", "atlas:read=chunk", "titans", "omeganet"]
ATLAS_TARGET = 15.0  # issue 52: atlas (per-token reads) at most this many transformer steps on one thread
GRAD_CLIP = 1.0  # lightning_config.yaml's gradient_clip_val
# --tiny: a 2-layer model at d_model 32, 4 memory heads, batch 4 of 16 tokens
TINY = dict(repeats=1, sizes=dict(d_model=32, n_layers=2, n_heads=2, memory_heads=4, swa_window=8),
            data=dict(train_slices=[[16, 2, 64]], test_slices=[[16, 2, 8]], batch_size=4))


def parse_variant(text: str) -> tuple[str, dict]:
    """'atlas:read=chunk,chunk_size=8' -> ('atlas', {'read': 'chunk', 'chunk_size': 8}) (values read as YAML).
    ValueError, naming what is wrong, for an unknown preset or an option without '='."""
    preset, _, options = text.partition(":")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    memory = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"expected preset:key=value[,key=value], got {item!r}")
        memory[key] = yaml.safe_load(value)
    return preset, memory


def config_sections(path: str, tiny: bool) -> tuple[dict, dict]:
    """(the model's arguments but the preset, the data module's init_args) of a config file (--tiny: shrunk)."""
    config = yaml.safe_load((ROOT / path).read_text() if not Path(path).is_absolute() else Path(path).read_text())
    model = {k: v for k, v in config["model"].items() if k != "preset"}
    data = dict(config["data"]["init_args"])
    if tiny:
        model.update(TINY["sizes"])
        data.update(TINY["data"])
    return model, data


class Step:
    """One variant's module, optimiser and schedule; ``__call__`` is one training step."""

    def __init__(self, variant: str, model_args: dict, vocab_size: int, batch: dict):
        preset, memory = parse_variant(variant)
        torch.manual_seed(0)
        args = dict(model_args, preset=preset)
        if memory:
            args["memory"] = {**args.get("memory", {}), **memory}
        self.module = SequenceModel(vocab_size, **args)
        self.module.train()
        self.optimizer = torch.optim.AdamW(self.module.parameter_groups(), betas=self.module.hparams.betas)
        warmup = self.module.hparams.warmup_steps
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.batch = batch
        self.params = sum(p.numel() for p in self.module.parameters())

    def __call__(self) -> None:
        logits = self.module(self.batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), self.batch["labels"].flatten(),
                                           ignore_index=-100)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()}")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()


def main(argv=None):
    ap = add_common_args(argparse.ArgumentParser(description=__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter), repeats=7)
    ap.add_argument("--config", default="experiments/mqar.yaml", help="the config file whose model and data it steps")
    ap.add_argument("--variants", nargs="+", default=VARIANTS,
                    help="presets, with memory options after a colon: atlas:read=chunk")
    args = apply_tiny(ap.parse_args(argv), dict(repeats=TINY["repeats"]))
    for variant in args.variants:
        try:
            parse_variant(variant)
        except ValueError as e:
            ap.error(f"--variants {variant}: {e}")
    if args.threads is None:
        args.threads = 1
    threads = set_threads(args.threads)
    model_args, data_args = config_sections(args.config, args.tiny)
    data = MQARDataModule(**data_args)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    B, T = batch["input_ids"].shape
    if "transformer" not in [parse_variant(v)[0] for v in args.variants]:
        args.variants = ["transformer", *args.variants]

    steps = {}
    for variant in args.variants:
        steps[variant] = Step(variant, model_args, data_args["vocab_size"], batch)
        steps[variant]()  # warm-up
    times = {v: [] for v in steps}
    for _ in range(max(1, args.repeats)):
        for variant, step in steps.items():
            began = time.perf_counter()
            step()
            times[variant].append(1e3 * (time.perf_counter() - began))

    base = statistics.median(times["transformer"])
    rows, records = [], []
    for variant, ms in times.items():
        median, ratio = statistics.median(ms), statistics.median(ms) / base
        target = None
        if variant == "atlas":
            target = f"≤ {ATLAS_TARGET:g}×: {'met' if ratio <= ATLAS_TARGET else 'not met'}"
        rows.append([variant, f"{steps[variant].params:,}", f"{median:.1f}", f"{min(ms):.1f}–{max(ms):.1f}",
                     f"{ratio:.1f}×", target])
        records.append(dict(variant=variant, params=steps[variant].params, ms_median=median, ms_all=ms,
                            ratio_to_transformer=ratio, target=ATLAS_TARGET if variant == "atlas" else None))
    sizes = ", ".join(f"{k} {v}" for k, v in model_args.items() if k in ("d_model", "n_layers", "memory_heads"))
    print_table(f"training step ({args.config}: B {B}, T {T}, {sizes}), float32, {threads} thread(s), "
                f"{len(times['transformer'])} alternating rounds",
                ["variant", "params", "ms/step", "spread", "÷ transformer", "target"], rows)
    write_json(out_path("cpu_step", args), dict(meta(args), config=args.config, B=B, T=T, model=model_args,
                                                threads=threads, rows=records))


if __name__ == "__main__":
    main()
