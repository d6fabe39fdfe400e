"""A study's cost before it starts: ``atlas-lab sweep FILE --estimate [STEPS]``, and the ``pilot`` part of
``make gpu-check`` (benchmarks/gpu_check.py), which runs the same code.

For each distinct configuration of the study (its grid points, and the tune candidates where they change more than
the rates: ``COST_NEUTRAL``) a **pilot** builds the trial's data and model from its config files and overrides, and
times a short Lightning fit on this machine (CPU or GPU, the trial's own ``trainer.accelerator`` and precision):
``STEPS`` training batches of every sequence length the epoch holds (the epoch's own first batches of each length,
the lengths in turn; the first of each length is a warm-up, not timed), then one validation of ``VAL_BATCHES``
batches of every length of the validation set (the first of each length not timed where there are two or more).
Every batch is timed from the end of the one before (data loading, forward, backward, optimizer step, the config's
callbacks that a sweep trial keeps; on a GPU after a synchronisation). Not counted: what the sweep does around a fit
(its config check, the MLflow run and its metrics, the learning-curve plot). A pilot given a time limit (gpu_check's)
stops its training early, once every length has two batches.

The projection is arithmetic on those timings and the trial's schedule (``trial_plan``, Lightning's rules for
max_epochs, max_steps, limit_train_batches, val_check_interval, check_val_every_n_epoch and the CLI's
validate_at_end):

    trial seconds = setup + Σ_L batches_L × s/step_L + validations × (Σ_L val batches_L × s/batch_L + overhead)
    study hours   = Σ_configurations  fits × trial seconds / 3600

capped at ``trainer.max_time`` per trial. ``fits``: the runs of a configuration (grid: ``repeats`` per point plus
``tune.seeds`` per tune candidate; tpe/random: ``trials × repeats``). A tuned point's reported seeds are counted at
its first tune candidate. Pruning is not foreseen (the figure is an upper bound for a pruned study). One worker: with
``--workers N`` on a machine that has the cores for N, the wall time is at best the figure over N.

Nothing of the pilots is written to runs/ or the MLflow store (no logger, no checkpoint; Lightning's root is a
temporary folder); the command keeps its figures in ``runs/sweeps/<study>/estimate.json`` (``save_estimate``), which
``atlas-lab report`` compares with what the study then took and logs to its parent run (``costs``).
This module imports yaml, torch and Lightning only — never Optuna, MLflow or jsonargparse: the pilot runs on a bare
CUDA image. The config is read as the CLI reads it (files in order, then the overrides as dotted keys; a mapping
merges into a mapping, a ``model.memory.<component>.<option>`` key becomes the memory's dotted option), and the data
module's vocab_size, slice_names, bytes_per_token and target are passed to the model as the CLI links them.

    python -m atlas_lab.sweep.estimate SWEEP_FILE [--set K=V] [--study NAME] --overrides JSON [--steps N] [--seconds S]

runs one pilot and prints its result as one JSON line (gpu_check runs each pilot so, in a process of its own).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .spec import SweepSpec, short_names

STEPS = 20  # training batches per length (the first untimed)
VAL_BATCHES = 3  # validation batches per length (the first untimed)
# override keys that change what a trial learns, not what a step costs: configurations that differ only in these
# share one pilot
COST_NEUTRAL = ("model.lr", "model.memory_lr", "model.weight_decay", "model.betas", "model.warmup_steps",
                "model.min_lr_ratio", "model.schedule_steps", "model.memory.eta_max", "seed_everything",
                "data.init_args.seed")
# the trainer's keys a pilot takes from the trial's config (the rest is the pilot's own: one device, no logger)
TRAINER_KEYS = ("accelerator", "precision", "gradient_clip_val", "gradient_clip_algorithm", "accumulate_grad_batches",
                "deterministic", "benchmark", "inference_mode", "log_every_n_steps")
SWEEP_DROPS = ("ProgressBar", "ModelCheckpoint", "ModelSummary")  # callbacks a sweep trial leaves out (worker.py)
LIGHTNING_MAX_EPOCHS = 1000  # Lightning's max_epochs when neither max_epochs nor max_steps is given
TRAIN_SHARE = 0.6  # of a time-limited pilot's time after its setup: the rest is the validation's
BUSY = 0.8  # a CPU pilot with less than this share of its threads' cores says that the machine was busy
UNBOUNDED = 10**15  # the batches of an epoch whose loader has no length


# ---------------------------------------------------------------- the config, without jsonargparse

def merge(into: Any, value: Any) -> Any:
    """``value`` over ``into``: a mapping merges into a mapping key by key (a mapping with another ``class_path``
    replaces it whole); anything else replaces."""
    if not isinstance(into, dict) or not isinstance(value, dict):
        return value
    if "class_path" in value and value["class_path"] != into.get("class_path"):
        return dict(value)
    out = dict(into)
    for key, v in value.items():
        out[key] = merge(out.get(key), v)
    return out


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """One override (``model.d_model``, ``data.init_args.train_slices``) into the config ``tree``; below
    ``model.memory`` a two-part key (``optimizer.ns_steps``) is the memory's dotted option, as the CLI reads it."""
    parts = key.split(".")
    if parts[:2] == ["model", "memory"] and len(parts) > 3:
        parts = parts[:2] + [".".join(parts[2:])]
    node = tree
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = merge(node.get(parts[-1]), value)


def run_config(base: list[Path], overrides: dict[str, Any]) -> dict:
    """A trial's config: the files of ``base`` in order (lightning_config.yaml first), then ``overrides``."""
    tree: dict = {}
    for path in base:
        tree = merge(tree, yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
    for key, value in overrides.items():
        set_dotted(tree, key, value)
    return tree


# ---------------------------------------------------------------- the study's configurations

@dataclass
class Point:
    """One configuration to pilot: its name, its overrides, how many fits of the study run it and the grid labels of
    every point that runs it (configurations that differ only in ``COST_NEUTRAL`` keys share one pilot)."""
    label: str
    overrides: dict[str, Any]
    fits: int
    labels: list[dict] = field(default_factory=list)


def cost_key(overrides: dict[str, Any]) -> str:
    """What a step's cost depends on: the overrides without the ``COST_NEUTRAL`` keys."""
    return json.dumps({k: v for k, v in overrides.items() if k not in COST_NEUTRAL}, sort_keys=True, default=str)


def _middle(search: dict) -> Any:
    """The value a pilot takes for a search range: the first choice, or the middle (geometric for log ranges)."""
    if "choices" in search:
        return search["choices"][0]
    low, high = search["low"], search["high"]
    mid = math.sqrt(low * high) if search.get("log") else (low + high) / 2
    return int(round(mid)) if search.get("int") or (isinstance(low, int) and isinstance(high, int)
                                                    and not search.get("log")) else mid


def study_points(spec: SweepSpec) -> list[Point]:
    """The study's distinct configurations in the file's order, each with the fits that run it."""
    runs: list[tuple[str, dict, int, dict]] = []  # (label, overrides, fits, grid labels)
    if spec.sampler == "grid":
        for labels in spec.grid_points():
            name = " ".join(f"{k}={v}" for k, v in zip(short_names(list(labels)), labels.values()))
            fixed = spec.overrides(labels, {})
            candidates = spec.tune_candidates()
            runs.append((name, fixed | (candidates[0] if candidates else {}), spec.repeats, labels))
            runs += [(name, fixed | c, spec.tune_seeds, labels) for c in candidates]
    else:
        sampled = {k: _middle(s) for k, s in spec.search.items()}
        runs.append(("search (middle of each range)", spec.overrides({}, sampled), spec.trials * spec.repeats, {}))
    points: dict[str, Point] = {}
    for label, overrides, fits, labels in runs:
        point = points.setdefault(cost_key(overrides), Point(label, overrides, 0))
        point.fits += fits
        if labels not in point.labels:
            point.labels.append(labels)
    return list(points.values())


# ---------------------------------------------------------------- a trial's schedule (arithmetic only)

def epoch_batches(batches: int, limit) -> int:
    """The training batches of an epoch: the data's ``batches`` cut by ``trainer.limit_train_batches``."""
    if isinstance(limit, bool) or limit is None:
        return batches
    if isinstance(limit, int):
        return min(batches, limit)
    return int(batches * float(limit))


def trial_plan(epoch: int, max_epochs: int | None = None, max_steps: int | None = -1, accumulate: int = 1,
               val_check_interval: int | float | None = 1.0, check_val_every_n_epoch: int | None = 1,
               validate_at_end: bool = True) -> tuple[int, int]:
    """(training batches, validations) of one fit whose epoch holds ``epoch`` batches, by Lightning's rules: the fit
    ends at ``max_epochs`` epochs or ``max_steps`` optimizer steps (``accumulate`` batches each), whichever comes
    first; a float ``val_check_interval`` f validates every max(1, int(epoch·f)) batches of an epoch, an int n every
    n batches of an epoch or, with ``check_val_every_n_epoch`` null, every n batches of the fit; an epoch is
    validated only every ``check_val_every_n_epoch``-th; ``validate_at_end`` adds one where the last batch was not
    validated."""
    if epoch <= 0:
        return 0, 0
    if max_epochs is None:
        max_epochs = LIGHTNING_MAX_EPOCHS if max_steps in (None, -1) else -1
    limits = []
    if max_epochs != -1:
        limits.append(max_epochs * epoch)
    if max_steps not in (None, -1):
        limits.append(max_steps * max(1, accumulate))
    if not limits:
        raise ValueError("trainer: max_epochs -1 and no max_steps: the fit never ends by itself; set trainer.max_steps "
                         "or trainer.max_epochs")
    total = min(limits)
    interval = 1.0 if val_check_interval is None else val_check_interval
    across = check_val_every_n_epoch is None
    if across:
        every = int(interval) if not isinstance(interval, float) else max(1, int(epoch * interval))
        validations, last_validated = total // every, total % every == 0
    else:
        every = max(1, int(epoch * interval)) if isinstance(interval, float) else int(interval)
        full, rest = divmod(total, epoch)
        due = [(e + 1) % check_val_every_n_epoch == 0 for e in range(full + (rest > 0))]
        validations = sum(epoch // every for e in range(full) if due[e]) + (rest // every if rest and due[-1] else 0)
        last = rest if rest else epoch
        last_validated = due[-1] and last % every == 0
    if validate_at_end and not last_validated:
        validations += 1
    return total, validations


def max_time_seconds(value) -> float | None:
    """Lightning's ``max_time`` ("DD:HH:MM:SS" or {days, hours, minutes, seconds}) in seconds; None without one."""
    if value is None:
        return None
    if isinstance(value, dict):
        return 86400 * value.get("days", 0) + 3600 * value.get("hours", 0) + 60 * value.get("minutes", 0) + \
            value.get("seconds", 0)
    days, hours, minutes, seconds = (int(x) for x in str(value).split(":"))
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


@dataclass
class Timing:
    """A pilot's measurements: seconds per training batch and per validation batch by sequence length, the
    validation's fixed overhead, the trial's setup (data and model built), and on a CPU the share of its threads'
    cores the pilot had (about 1 on an idle machine; less where other processes ran: the figure is then for a machine
    as busy)."""
    step_s: dict[int, float]
    val_batch_s: dict[int, float]
    val_overhead_s: float = 0.0
    setup_s: float = 0.0
    cpu_share: float | None = None  # CPU only: the CPU time of the training batches over their wall time × threads


@dataclass
class Schedule:
    """What one fit of the configuration runs: its epoch's training batches by length, one validation's batches by
    length, and the trainer's schedule keys."""
    train_batches: dict[int, int]
    val_batches: dict[int, int]
    trainer: dict[str, Any] = field(default_factory=dict)
    validate_at_end: bool = True


def _at(times: dict[int, float], length: int) -> float:
    """The time measured at ``length``, else at the nearest length measured (a length the pilot did not reach)."""
    if length in times:
        return times[length]
    if not times:
        raise ValueError("the pilot timed no batch")
    return times[min(times, key=lambda L: (abs(L - length), -L))]


def project(timing: Timing, schedule: Schedule) -> dict[str, float]:
    """One fit's projected seconds (``setup``, ``training``, ``validation``, ``total``, capped at max_time),
    its training batches, validations and one validation's seconds."""
    t = schedule.trainer
    epoch = epoch_batches(sum(schedule.train_batches.values()), t.get("limit_train_batches"))
    batches, validations = trial_plan(epoch, t.get("max_epochs"), t.get("max_steps", -1),
                                      t.get("accumulate_grad_batches") or 1, t.get("val_check_interval", 1.0),
                                      t.get("check_val_every_n_epoch", 1), schedule.validate_at_end)
    whole = sum(schedule.train_batches.values())
    if whole >= UNBOUNDED and t.get("max_steps") in (None, -1):
        raise ValueError("the training data has no length (a stream) and trainer.max_steps is not set: the fit's "
                         "length is unknown; set trainer.max_steps")
    training = sum(batches * n / whole * _at(timing.step_s, L) for L, n in schedule.train_batches.items()) \
        if whole else 0.0
    one_val = sum(n * _at(timing.val_batch_s, L) for L, n in schedule.val_batches.items()) + timing.val_overhead_s \
        if schedule.val_batches else 0.0
    run = training + validations * one_val
    cap = max_time_seconds(t.get("max_time"))
    if cap is not None:
        run = min(run, cap)
    return dict(setup=timing.setup_s, training=training, validation=validations * one_val, one_validation=one_val,
                batches=batches, validations=validations, cap=cap, total=timing.setup_s + run)


def study_hours(rows: list[dict]) -> float:
    """Σ fits × one fit's projected seconds, in hours, over the rows that have a projection."""
    return sum(r["fits"] * r["projection"]["total"] for r in rows if "projection" in r) / 3600


def busy_free_hours(rows: list[dict]) -> float:
    """The study's hours at the pilots' CPU time: each configuration's fits × a fit whose training and validations
    are scaled by its pilot's share of its threads' cores, then capped at max_time (about the wall time where the
    pilots would have had their cores to themselves)."""
    total = 0.0
    for r in rows:
        if "projection" in r:
            p = r["projection"]
            run = (p["training"] + p["validation"]) * (r.get("cpu_share") or 1.0)
            total += r["fits"] * (p["setup"] + (run if p.get("cap") is None else min(run, p["cap"])))
    return total / 3600


# ---------------------------------------------------------------- the pilot

def _length(batch) -> int:
    ids = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    return int(ids.shape[-1])


def batch_times(clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time):
    """A Lightning callback: the seconds of every training and validation batch with its sequence length
    (``.train``, ``.val``: [(length, seconds)]), each from the end of the batch before (the first from its own start),
    the validation's total (``.val_total``) and the process's CPU seconds of each training batch (``.train_cpu``).
    ``clock``, ``cpu_clock``: seconds (fake ones in the tests)."""
    import lightning as L
    import torch

    class BatchTimes(L.Callback):
        def __init__(self):
            self.train, self.val, self.val_total, self.train_cpu = [], [], 0.0, []
            self._last = self._vlast = self._vstart = self._cpu = None
            self.stop_at, self.lengths = None, set()  # stop training at clock() >= stop_at, once every length is timed

        def now(self, module) -> float:
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)
            return clock()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self._last is None:
                self._last, self._cpu = self.now(pl_module), cpu_clock()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            t, cpu = self.now(pl_module), cpu_clock()
            self.train.append((_length(batch), t - self._last))
            self.train_cpu.append(cpu - self._cpu)
            self._last, self._cpu = t, cpu
            if self.stop_at is not None and t >= self.stop_at:
                done = [L for L, _ in self.train]
                if all(done.count(L) >= 2 for L in self.lengths):
                    trainer.should_stop = True

        def on_validation_start(self, trainer, pl_module):
            self._vstart = self.now(pl_module)
            self._vlast = None

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if self._vlast is None:
                self._vlast = self.now(pl_module)

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            t = self.now(pl_module)
            self.val.append((_length(batch), t - self._vlast))
            self._vlast = t

        def on_validation_end(self, trainer, pl_module):
            self.val_total = self.now(pl_module) - self._vstart

    return BatchTimes()


def per_length(times: list[tuple[int, float]]) -> dict[int, float]:
    """{length: the median seconds of its batches after the first (a warm-up: allocation, compilation)}; a length
    with one batch: that batch."""
    by: dict[int, list[float]] = {}
    for length, seconds in times:
        by.setdefault(length, []).append(seconds)
    return {L: statistics.median(s[1:] if len(s) > 1 else s) for L, s in sorted(by.items())}


def timing_of(times, setup_s: float, threads: int | None = None) -> Timing:
    """A pilot's ``Timing`` from its callback's record: the validation's overhead is its total less its batches;
    ``threads``: torch's threads on a CPU (None on a GPU: no cpu_share), whose share is taken over the timed batches."""
    val = per_length(times.val)
    seen, wall, cpu = set(), 0.0, 0.0
    for (length, seconds), cpu_seconds in zip(times.train, times.train_cpu):
        if length in seen:  # the timed batches (a warm-up may wait on a compiler's process)
            wall, cpu = wall + seconds, cpu + cpu_seconds
        seen.add(length)
    share = cpu / (wall * threads) if threads and wall > 0 else None
    return Timing(per_length(times.train), val, max(0.0, times.val_total - sum(s for _, s in times.val)), setup_s,
                  share)


class Batches:
    """A loader's batches as index lists with their lengths (a map-style dataset with ``input_ids`` batched by a
    batch sampler, as every TaskDataModule's); TypeError for any other loader (a stream: ``Stream``)."""

    def __init__(self, loader):
        self.loader = loader
        ds, sampler = getattr(loader, "dataset", None), getattr(loader, "batch_sampler", None)
        ids = getattr(ds, "input_ids", None)
        if ids is None or sampler is None:
            raise TypeError("not a map-style loader of token sequences")
        fixed = getattr(ids, "ndim", 1) == 2
        self.batches = [list(b) for b in sampler]
        self.lengths = [ids.shape[1] if fixed else max(len(ids[i]) for i in b) for b in self.batches]

    def counts(self, limit=None) -> dict[int, int]:
        """{length: batches} of the loader, cut by a trainer's ``limit_*_batches`` (an int: the first ones)."""
        return self.tally(self.lengths[:_val_limit(len(self.lengths), limit)])

    @staticmethod
    def tally(lengths) -> dict[int, int]:
        out: dict[int, int] = {}
        for length in lengths:
            out[length] = out.get(length, 0) + 1
        return dict(sorted(out.items()))

    def sample(self, per_length: int):
        """A loader of the first ``per_length`` batches of each length (in this loader's order), the lengths taken in
        turn (a pilot stopped early has timed every length alike)."""
        from torch.utils.data import DataLoader

        taken: dict[int, list] = {}
        for batch, length in zip(self.batches, self.lengths):
            if len(taken.setdefault(length, [])) < per_length:
                taken[length].append(batch)
        chosen = [b[i] for i in range(per_length) for b in taken.values() if i < len(b)]
        return DataLoader(self.loader.dataset, batch_sampler=chosen, collate_fn=self.loader.collate_fn)


class Stream:
    """A loader without index batches (an iterable dataset, e.g. a litdata stream): one length, its first batch's;
    its batch count where it has a length, else ``UNBOUNDED`` (the trial's max_steps must end the fit); a sample is
    its first batches."""

    def __init__(self, loader):
        self.loader = loader
        self.lengths = [_length(next(iter(loader)))]
        try:
            self.total = len(loader)
        except TypeError:
            self.total = UNBOUNDED

    def counts(self, limit=None) -> dict[int, int]:
        return {self.lengths[0]: _val_limit(self.total, limit)}

    def sample(self, per_length: int) -> list:
        import itertools

        return list(itertools.islice(iter(self.loader), per_length))


def batches_of(loader):
    try:
        return Batches(loader)
    except TypeError:
        return Stream(loader)


def _val_limit(count: int, limit) -> int:
    if limit is None or isinstance(limit, bool):
        return count
    return min(count, limit) if isinstance(limit, int) else int(count * float(limit))


def pilot(base: list[Path], overrides: dict[str, Any], steps: int = STEPS, val_batches: int = VAL_BATCHES,
          clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time,
          seconds: float | None = None) -> dict:
    """Build one trial's data and model and time its pilot fit on this machine (see the module's docstring);
    returns {"timing": Timing's fields, "schedule": Schedule's fields, "timed": {length: training batches timed},
    "device": …, "threads": …}. ``seconds``: a limit on the whole pilot; its training then stops, once every
    length has two batches, after ``TRAIN_SHARE`` of what the setup left (the validation takes the rest)."""
    import logging

    import lightning as L
    import torch

    from ..memory.components import import_class
    from ..noise import quiet

    quiet()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "GPU available: …"
    start = clock()
    config = run_config(base, overrides)
    L.seed_everything(config.get("seed_everything", 0) if isinstance(config.get("seed_everything", 0), int) else 0,
                      verbose=False)
    data_config = config.get("data") or {}
    datamodule = import_class(data_config["class_path"], "data")(**(data_config.get("init_args") or {}))
    links = dict(vocab_size=datamodule.vocab_size, slice_names=getattr(datamodule, "slice_names", None),
                 bytes_per_token=getattr(datamodule, "bytes_per_token", None),
                 target=getattr(datamodule, "target", "next_token"))
    from ..lit.module import SequenceModel

    model = SequenceModel(**links, **(config.get("model") or {}))
    trainer_config = dict(config.get("trainer") or {})
    datamodule.prepare_data()
    datamodule.setup("fit")
    train = batches_of(datamodule.train_dataloader())
    vals = datamodule.val_dataloader()
    vals = [batches_of(v) for v in (vals if isinstance(vals, (list, tuple)) else [vals])]
    limit = trainer_config.get("limit_val_batches")
    val_counts: dict[int, int] = {}
    for v in vals:
        for length, n in v.counts(limit).items():
            val_counts[length] = val_counts.get(length, 0) + n
    setup_s = clock() - start
    pilot_train = train.sample(steps)
    pilot_vals = [v.sample(val_batches) for v in vals]
    datamodule.train_dataloader = lambda: pilot_train
    datamodule.val_dataloader = lambda: pilot_vals if len(pilot_vals) > 1 else pilot_vals[0]
    times = batch_times(clock, cpu_clock)
    times.lengths = set(train.lengths)
    if seconds is not None:
        times.stop_at = clock() + TRAIN_SHARE * (seconds - (clock() - start))
    kept = [c for c in trainer_config.get("callbacks") or [] if isinstance(c, dict) and "class_path" in c
            and not any(s in c["class_path"] for s in SWEEP_DROPS)]  # the config's callbacks a sweep trial keeps
    callbacks = [times] + [import_class(c["class_path"], "trainer.callbacks")(**(c.get("init_args") or {}))
                           for c in kept]
    options = {k: trainer_config[k] for k in TRAINER_KEYS if k in trainer_config}
    with tempfile.TemporaryDirectory(prefix="atlas-lab-estimate-") as root:
        common = dict(options, devices=1, num_nodes=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      default_root_dir=root, callbacks=callbacks)
        L.Trainer(**common, max_epochs=1, limit_val_batches=0).fit(model, datamodule=datamodule)
        evaluator = L.Trainer(**common)
        evaluator.validate(model, datamodule=datamodule, verbose=False)
        device = str(evaluator.strategy.root_device)
    timing = timing_of(times, setup_s, None if device.startswith("cuda") else torch.get_num_threads())
    schedule = Schedule(train.counts(), val_counts, {k: trainer_config.get(k) for k in (
        "max_epochs", "max_steps", "limit_train_batches", "accumulate_grad_batches", "val_check_interval",
        "check_val_every_n_epoch", "max_time") if k in trainer_config},
        validate_at_end=config.get("validate_at_end", True) is not False)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    timed = {L: n - 1 for L, n in Batches.tally(L for L, _ in times.train).items()}
    return dict(timing=vars(timing), schedule=vars(schedule), timed=timed, device=name,
                threads=torch.get_num_threads())


def _int_keys(d: dict) -> dict:
    return {int(k): v for k, v in d.items()}


def from_record(record: dict) -> tuple[Timing, Schedule]:
    """A pilot's record (``pilot``'s return, also read back from JSON: lengths as strings) as (Timing, Schedule)."""
    t, s = dict(record["timing"]), dict(record["schedule"])
    t["step_s"], t["val_batch_s"] = _int_keys(t["step_s"]), _int_keys(t["val_batch_s"])
    s["train_batches"], s["val_batches"] = _int_keys(s["train_batches"]), _int_keys(s["val_batches"])
    return Timing(**t), Schedule(**s)


def estimate_row(point: Point, record: dict) -> dict:
    """One table row: the point, its fits, its pilot's s/step by length and the projection of one fit."""
    timing, schedule = from_record(record)
    return dict(point=point.label, labels=point.labels, fits=point.fits, step_s=timing.step_s,
                device=record.get("device"),
                threads=record.get("threads"), cpu_share=timing.cpu_share, timed=record.get("timed"),
                projection=project(timing, schedule))


def pilot_command(spec: SweepSpec, point: Point, steps: int = STEPS, seconds: float | None = None) -> list[str]:
    """The command that runs one pilot in a process of its own (its last stdout line: the record as JSON)."""
    return [sys.executable, "-m", "atlas_lab.sweep.estimate", *spec.argv(), "--overrides",
            json.dumps(point.overrides), "--steps", str(steps)] + ([] if seconds is None else ["--seconds",
                                                                                               f"{seconds:.1f}"])


# ---------------------------------------------------------------- the table

def step_text(step_s: dict[int, float]) -> str:
    return " / ".join(f"{L}: {s:.3g}" for L, s in step_s.items())


def print_estimate(spec: SweepSpec, steps: int = STEPS, run: Callable[[Point], dict] | None = None,
                   console=None) -> list[dict]:
    """``atlas-lab sweep FILE --estimate``: a pilot of each distinct configuration (``run``: point -> the pilot's
    record; default ``pilot`` in this process), then the table and the study's projected hours; returns the rows.
    A pilot that fails is its row's error; the others go on."""
    from rich.console import Console

    from ..tables import print_table

    console = console or Console()
    run = run or (lambda p: pilot(spec.base, p.overrides, steps))
    points = study_points(spec)
    console.print(f"{spec.study}: {len(points)} configuration(s) to pilot, {steps} training batches of each length "
                  "(the first untimed) and one short validation each", markup=False)
    rows = []
    for point in points:
        started = time.monotonic()
        try:
            row = estimate_row(point, run(point))
        except Exception as e:  # the other configurations are still estimated
            row = dict(point=point.label, labels=point.labels, fits=point.fits,
                       error=f"{type(e).__name__}: {e}"[:300])
        row["pilot_s"] = time.monotonic() - started
        rows.append(row)
        console.print(f"  {point.label}: " + (f"{step_text(row['step_s'])} s/step" if "step_s" in row
                                              else row["error"]), markup=False)
    hours = study_hours(rows)
    where = next((f"{r['device']}, {r['threads']} thread{'s' * (r['threads'] != 1)}" for r in rows if "device" in r),
                 "no pilot finished")
    table = []
    for r in rows:
        p = r.get("projection")
        table.append([r["point"], r["fits"], step_text(r["step_s"]) if p else None,
                      f"{p['batches']:,}" if p else None, p["validations"] if p else None,
                      f"{p['one_validation']:.1f}" if p else None, f"{p['setup']:.1f}" if p else None,
                      f"{p['total'] / 3600:.3f}" if p else None, f"{r['fits'] * p['total'] / 3600:.2f}" if p else None,
                      r.get("error")])
    columns = ("configuration", "fits", "s/step by length", "steps a fit", "validations", "one validation s",
               "setup s", "hours a fit", "hours", "error")
    print_table(console, f"{spec.study}: projected cost on this machine ({where})", columns, table,
                right=columns[1:2] + columns[3:9], keys=1)
    shares = [r["cpu_share"] for r in rows if r.get("cpu_share") is not None]
    if shares and min(shares) < BUSY:
        console.print(f"the pilots had {min(shares):.0%}-{max(shares):.0%} of their threads' cores (other processes "
                      "ran beside them): the figure is for a machine as busy as this one; at their CPU time (each "
                      f"configuration's steps and validations × its share) {busy_free_hours(rows):.2f} hours",
                      markup=False)
    failed = sum("error" in r for r in rows)
    console.print(f"study {spec.study}: {hours:.2f} hours projected in all (one worker; no pruning foreseen"
                  + (f"; {failed} configuration(s) without a pilot are not counted" if failed else "") + ")",
                  markup=False)
    path = save_estimate(spec, rows, steps, hours)
    console.print(f"figures kept in {path}: atlas-lab report {spec.study} sets the study's measured hours beside them "
                  "and logs them to its MLflow parent run", markup=False)
    return rows


ESTIMATE = "estimate.json"  # runs/sweeps/<study>/estimate.json: the figures of the last --estimate


def estimate_path(study: str) -> Path:
    return Path("runs") / "sweeps" / study / ESTIMATE


def save_estimate(spec: SweepSpec, rows: list[dict], steps: int, hours: float) -> Path:
    """The figures of ``print_estimate`` as ``runs/sweeps/<study>/estimate.json``: when, how (pilot steps, device,
    threads), the hours projected in all and per configuration its grid labels, fits and projected hours a fit."""
    from datetime import datetime, timezone

    device = next((f"{r['device']}, {r['threads']} thread{'s' * (r['threads'] != 1)}" for r in rows
                   if "device" in r), None)
    record = {"study": spec.study, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "steps": steps, "device": device, "hours": hours, "pilot_seconds": sum(r["pilot_s"] for r in rows),
              "points": [{"label": r["point"], "labels": r.get("labels", []), "fits": r["fits"],
                          "hours_a_fit": r["projection"]["total"] / 3600 if "projection" in r else None,
                          "error": r.get("error")} for r in rows]}
    path = estimate_path(spec.study)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def main(argv=None) -> int:
    from .spec import load_sweep

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--study", default=None)
    ap.add_argument("--overrides", required=True, help="the configuration's overrides (JSON)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seconds", type=float, default=None, help="a limit on the pilot (its training stops early)")
    args = ap.parse_args(argv)
    spec = load_sweep(args.sweep, args.sets, args.study)
    record = pilot(spec.base, json.loads(args.overrides), args.steps, seconds=args.seconds)
    print(json.dumps(record, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
