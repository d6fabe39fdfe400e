"""The LightningModule that trains and evaluates any preset on any task.

Batches follow ``atlas_lab.data``'s contract: ``input_ids`` [B, L], ``labels`` [B, L] (−100 = ignored;
the output at position t is scored against labels[t]), optional ``slice`` [B] for per-slice accuracy,
optional ``document_start`` [B, L] bool for packed documents (True where one begins: each document is read as a
sequence of its own), and for generation tasks ``answer_start`` / ``answer_length`` [B] (greedy exact match).
With ``target="compression"`` (MAD compression) the last hidden state alone is decoded back into all
L tokens by a position embedding + MLP head.
"""
from __future__ import annotations

import math
import resource
import sys
import time
from pathlib import Path
from typing import Literal, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary, ThroughputMonitor
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from ..data.base import AnswerMixin
from ..layers import MemoryMixer
from ..memory.cost import flops_text
from ..models import LanguageModel, ModelConfig, compile_blocks
from ..models.lm import CompileOptions
from .metrics import ExactMatch, SliceAccuracy, TokenMetrics, metric_key

STAGES = ("val", "test")


class TokenReadout(nn.Module):
    """logits[b, t] = the language model's head at h[b, t]: [B, T, d] -> [B, T, V] (no parameters of its own)."""

    def __init__(self, d_model: int, max_len: int, vocab_size: int):
        super().__init__()

    def forward(self, model: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return model.head(h)


class CompressionHead(nn.Module):
    """logits[b, i] = MLP(h_b + P_i): decodes the last hidden state h[:, -1] [B, d] into T tokens [B, T, V]."""

    def __init__(self, d_model: int, max_len: int, vocab_size: int):
        super().__init__()
        self.positions = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, vocab_size))

    def forward(self, model: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h[:, -1, None, :] + self.positions[None, :h.shape[1]])


# the data's target -> how logits are read from the hidden states (linked from the data module)
READOUTS = {"next_token": TokenReadout, "positions": TokenReadout, "compression": CompressionHead}


class LearningRates(L.Callback):
    """Logs each distinct learning rate once per logging step, named after the hyper-parameter that sets it:
    ``train/lr`` and, for a model with ``memory_lr``, ``train/memory_lr`` (not one line per AdamW group)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rates = {}
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                rates.setdefault(group.get("name", "lr"), group["lr"])
        for name, lr in rates.items():
            pl_module.log(f"train/{name}", float(lr), on_step=True, on_epoch=False, batch_size=1)


def ends_fit(trainer: L.Trainer) -> bool:
    """Whether the training batch just run is the fit's last: max_steps reached, or the last batch of the last
    epoch (max_epochs)."""
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    last_batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready >= trainer.num_training_batches
    return last_batch and trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs


class ValidateAtEnd(L.Callback):
    """Validates the fit's last training batch when no validation was due there (max_steps, max_epochs): the
    validation metrics, logged and returned, are then those of the model as trained, and a short trial gets its
    metric. It asks Lightning's own loop for that validation (``trainer.should_stop`` after the last batch, which the
    loop answers with a validation, as it does for early stopping), so the validation is logged at that batch's step
    and a checkpoint written during it records the loop as any validation step's does. A fit whose last step is
    validated anyway is not validated twice; max_time and early stopping validate on their own. The CLI adds it to
    every fit unless ``validate_at_end: false``.

    In an epoch that ``check_val_every_n_epoch`` leaves unvalidated the loop validates on no request: there the
    validation runs when the fit ends (``on_train_end``), logged at the last batch's step."""

    def __init__(self):
        self.validated_at: int | None = None  # the global step of the last validation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.enable_validation and ends_fit(trainer):
            trainer.should_stop = True

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated_at = trainer.global_step

    def on_train_end(self, trainer, pl_module):
        if self.validated_at == trainer.global_step or not trainer.enable_validation or trainer.global_step == 0:
            return
        # the fit loop's own validation, as it runs one between training batches (every rank decides alike), logged
        # at the step of the last batch; the checkpoint written in it records the loop as it was (resume_state)
        loop = trainer.fit_loop.epoch_loop
        trainer.validating = True
        loop._batches_that_stepped -= 1
        try:
            loop.val_loop.run()
        finally:
            loop._batches_that_stepped += 1
            trainer.training = True


class CheckpointOnSigterm(L.Callback):
    """A fit stopped by SIGTERM (a scheduler's preemption, ``kill``) writes ``last.ckpt`` in each ModelCheckpoint's
    folder that keeps one: Lightning lets the running batch finish and stops between batches, so the checkpoint
    resumes the fit as if it had not stopped (``resume_state``). The exception Lightning raises then carries
    ``stopped``: one line saying where the fit stopped and how to resume it. The CLI adds it to every fit."""

    def on_exception(self, trainer, pl_module, exception):
        if not isinstance(exception, SIGTERMException):
            return
        saved = []
        for callback in trainer.checkpoint_callbacks:
            if callback.save_last and callback.dirpath is not None:
                path = str(Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
                trainer.save_checkpoint(path, weights_only=False)
                saved.append(path)
        where = f"fit stopped by SIGTERM after step {trainer.global_step}"
        exception.stopped = (f"{where}; resume it with --ckpt_path={saved[0]}" if saved else
                             f"{where}; no checkpoint written (no ModelCheckpoint with save_last)")


def resume_state(checkpoint: dict, trainer: L.Trainer) -> None:
    """The fit loop's state in ``checkpoint`` written as Lightning's loop resumes it exactly, wherever the checkpoint
    was written (a validation, the end of an epoch or of the fit, an interrupt): as after the last training batch's
    ``on_train_batch_end`` — that batch not yet counted as completed, ``_batches_that_stepped`` one short of the
    optimizer steps — so that the resumed loop continues with the next batch, logs at the uninterrupted fit's steps
    and does not validate the last batch again.

    Mid-epoch (max_steps or a signal ended the fit before the epoch's last batch) the epoch stays in progress:
    Lightning counts it as finished and would start the next epoch, with another order, on resume. After an epoch's
    last batch the epoch is finished and the next one not begun (the training loader, restored at the end of its
    pass, starts the next); ``resume_boundary`` fits that state to the resuming trainer. The epoch counter and
    checkpoint names are then those of the uninterrupted fit."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    run = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # batches of the epoch in progress run so far
    if fit is None or trainer.global_step == 0 or run == 0:  # between epochs: Lightning's own state resumes
        return
    batches = fit["epoch_loop.batch_progress"]
    for counts in (batches["total"], batches["current"]):
        counts["ready"] = counts["started"] = counts["processed"]
        counts["completed"] = counts["processed"] - 1
    accumulating = run % trainer.accumulate_grad_batches != 0 and run < trainer.num_training_batches
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] = trainer.global_step - (0 if accumulating else 1)
    epoch_done = run >= trainer.num_training_batches
    for counts in (fit["epoch_progress"]["total"], fit["epoch_progress"]["current"]):
        counts["processed"] = counts["completed"] = counts["started"] - (0 if epoch_done else 1)
    if epoch_done:
        batches["is_last_batch"] = True
        fit["epoch_loop.val_loop.batch_progress"]["is_last_batch"] = True  # the epoch is not counted again
    checkpoint["epoch_boundary"] = epoch_done


def resume_boundary(checkpoint: dict, trainer: L.Trainer) -> None:
    """A checkpoint written after an epoch's last batch (``resume_state``), fitted to the trainer that resumes it:
    Lightning restarts its loop in place only for a fit bounded by max_steps; a fit bounded by epochs alone starts
    the next epoch as new, with every batch that stepped counted."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if fit is not None and checkpoint.get("epoch_boundary") and trainer.max_steps == -1:
        batches = fit["epoch_loop.batch_progress"]
        for counts in (batches["total"], batches["current"]):
            counts["completed"] = counts["processed"]
        fit["epoch_loop.state_dict"]["_batches_that_stepped"] = checkpoint["global_step"]
        checkpoint["epoch_boundary"] = False


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary of one training sequence — its FLOPs counted by torch's FlopCounterMode in a
    forward pass of [1, T] tokens at the data's training length T (``train_length``, every data module has one) —
    then one line of what a token costs: the forward FLOPs per token of the model's memory and attention cores at
    that T (atlas_lab.memory.cost)."""

    def on_fit_start(self, trainer, pl_module):
        T = getattr(trainer.datamodule, "train_length", None)
        if T is None or not isinstance(pl_module, SequenceModel):
            return super().on_fit_start(trainer, pl_module)
        pl_module.example_input_array = torch.zeros(1, T, dtype=torch.long)
        try:  # eager: compiling blocks (model.compile) under the FLOP counter would leave them uncompiled for the fit
            with torch.compiler.set_stance("force_eager"):
                super().on_fit_start(trainer, pl_module)
        finally:
            pl_module.example_input_array = None
        if trainer.is_global_zero:
            flops = pl_module.model.flops_per_token(T)
            print(f"forward FLOPs per token at T = {T} (matrix products of the token mixers, all layers): memory "
                  f"{flops_text(flops['memory'])}, attention {flops_text(flops['attention'])}")


# Lightning's throughput names (stage "train", separator "/") -> the names a run logs them under
COST_NAMES = {"device/samples_per_sec": "samples_per_s", "device/items_per_sec": "tokens_per_s",
              "device/flops_per_sec": "flops_per_s", "device/mfu": "mfu"}


def peak_memory_mib(device: torch.device) -> float:
    """The fit's peak memory in MiB: on CUDA the most the allocator held for tensors (``max_memory_allocated``, its
    count reset as the fit starts); elsewhere the process's peak resident set (``getrusage``: Linux counts KiB, macOS
    bytes), the Python process and its libraries included."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def batch_samples(batch) -> int:
    """A batch's sequences: the rows of its ``input_ids`` [B, L] (a module-level function: ddp_spawn pickles the
    callbacks)."""
    return batch["input_ids"].shape[0]


def batch_tokens(batch) -> int:
    """A batch's tokens: the elements of its ``input_ids`` [B, L]."""
    return batch["input_ids"].numel()


class RunCost(ThroughputMonitor):
    """What a fit costs, in every fit (the CLI adds it): Lightning's ``ThroughputMonitor`` over the training batches
    (a batch's samples: ``input_ids`` rows; its tokens: ``input_ids`` elements; its FLOPs: ``flops_per_batch``, set
    here before each batch from the model's own count, ``SequenceModel.sequence_flops``), logged at the logging
    interval (``trainer.log_every_n_steps``) as ``cost/tokens_per_s``, ``cost/samples_per_s``, ``cost/s_per_step``
    (an optimizer step: ``accumulate_grad_batches`` batches), ``cost/flops_per_s``, ``cost/mfu`` (on a GPU whose
    peak Lightning knows: FLOP/s over the device's peak at the trainer's precision) and ``cost/peak_memory_mib``
    (``peak_memory_mib``). Each is the rate over the batches since the last log (the monitor's window: the interval
    plus one batch end); validation time is left out, as the monitor leaves it out.

    When the fit ends, its summary: ``cost/steady/<name>`` for each rate, over the steady steps (every training batch
    after the first logging interval, which holds the warm-up: allocation, kernel builds, compilation; a fit shorter
    than two intervals drops its first batch only), ``cost/peak_memory_mib`` at the last step, ``cost/flops_per_token``
    (training FLOPs per token at the longest length trained), the tags ``cost.device`` and ``cost.steady_steps``; and
    one printed line. Rank 0 measures and logs (its device's rates)."""

    def __init__(self):
        super().__init__(batch_size_fn=batch_samples, length_fn=batch_tokens)
        self.flops, self.lengths = 0.0, set()
        self.record: list[tuple[float, int, int, int, float]] = []  # per training batch: (s, batches, samples,
        #                                                             tokens, FLOPs), cumulative since the fit began

    def setup(self, trainer, pl_module, stage):
        if stage == TrainerFn.FITTING:
            self.kwargs["window_size"] = trainer.log_every_n_steps * trainer.accumulate_grad_batches + 1
        super().setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer, pl_module):
        self.record, self.flops, self.lengths = [], 0.0, set()
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        ids = batch["input_ids"]
        self.lengths.add(ids.shape[1])
        pl_module.flops_per_batch = ids.shape[0] * pl_module.sequence_flops(ids.shape[1]) \
            if isinstance(pl_module, SequenceModel) else None

    def _update(self, trainer, pl_module, batch, iter_num):
        super()._update(trainer, pl_module, batch, iter_num)
        stage = trainer.state.stage
        if stage == RunningStage.TRAINING:
            self.flops += pl_module.flops_per_batch or 0.0
            self.record.append((self._throughputs[stage]._time[-1], self._batches[stage], self._samples[stage],
                                self._lengths[stage], self.flops))

    def _compute(self, trainer, iter_num=None):
        """The training rates since the last log, under the run's names (``COST_NAMES``), logged with the step's
        other metrics (one write to the store per logging step); validation's are not logged."""
        if trainer.state.stage != RunningStage.TRAINING or not trainer._logger_connector.should_update_logs:
            return
        computed = self._throughputs[RunningStage.TRAINING].compute()
        metrics = {f"cost/{name}": computed[key] for key, name in COST_NAMES.items() if key in computed}
        if "device/batches_per_sec" in computed:
            metrics["cost/s_per_step"] = trainer.accumulate_grad_batches / computed["device/batches_per_sec"]
        metrics["cost/peak_memory_mib"] = peak_memory_mib(trainer.strategy.root_device)
        trainer.lightning_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def steady(self, trainer) -> tuple[dict[str, float], tuple[int, int]] | None:
        """The rates over the steady steps (see the class) and the first and last batch they cover (1-based), or
        None below two timed batches."""
        record = self.record
        if len(record) < 2:
            return None
        window = self.kwargs["window_size"] - 1
        first = window - 1 if len(record) > 2 * window else 0  # the record of the last batch left out
        t0, b0, s0, n0, f0 = record[first]
        t1, b1, s1, n1, f1 = record[-1]
        seconds = t1 - t0
        if seconds <= 0:
            return None
        rates = {"tokens_per_s": (n1 - n0) / seconds, "samples_per_s": (s1 - s0) / seconds,
                 "s_per_step": seconds / (b1 - b0) * trainer.accumulate_grad_batches}
        if f1 > f0:
            rates["flops_per_s"] = (f1 - f0) / seconds
            if self.available_flops:
                rates["mfu"] = rates["flops_per_s"] / self.available_flops
        return rates, (b0 + 1, b1)

    @rank_zero_only
    def on_train_end(self, trainer, pl_module):
        found = self.steady(trainer)
        if found is None:
            return
        rates, (first, last) = found
        device = trainer.strategy.root_device
        peak = peak_memory_mib(device)
        metrics = {f"cost/steady/{k}": v for k, v in rates.items()} | {"cost/peak_memory_mib": peak}
        if isinstance(pl_module, SequenceModel) and self.lengths:
            T = max(self.lengths)
            metrics["cost/flops_per_token"] = pl_module.sequence_flops(T) / T
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
            f"cpu, {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() != 1)}"
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id is not None:  # one write: metrics and tags
                from mlflow.entities import Metric, RunTag

                now = int(time.time() * 1000)
                logger.experiment.log_batch(logger.run_id, metrics=[
                    Metric(k, v, now, trainer.global_step) for k, v in metrics.items()], tags=[
                    RunTag("cost.device", where), RunTag("cost.steady_steps", f"batches {first}-{last}")])
            else:
                logger.log_metrics(metrics, step=trainer.global_step)
        flops = f", {rates['flops_per_s'] / 1e9:.3g} GFLOP/s" if "flops_per_s" in rates else ""
        mfu = f", MFU {rates['mfu']:.1%}" if "mfu" in rates else ""
        print(f"cost: {rates['tokens_per_s']:,.0f} tokens/s, {rates['samples_per_s']:,.1f} samples/s, "
              f"{rates['s_per_step']:.4g} s/step{flops}{mfu} over batches {first}-{last}; peak memory {peak:,.0f} MiB "
              f"({where})", flush=True)


def _positive(x) -> bool:
    return x > 0


def _non_negative_int(x) -> bool:
    return isinstance(x, int) and x >= 0


RANGES = {  # argument: (holds, what is expected); None passes where the signature allows it
    "lr": (_positive, "a number > 0"),
    "memory_lr": (lambda x: x >= 0, "null or a number >= 0 (0 freezes the memory mixers)"),
    "weight_decay": (lambda x: x >= 0, "a number >= 0"),
    "betas": (lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two numbers in [0, 1)"),
    "warmup_steps": (_non_negative_int, "an int >= 0"),
    "min_lr_ratio": (lambda x: 0 <= x <= 1, "a number in [0, 1]"),
    "schedule_steps": (lambda x: isinstance(x, int) and x >= 1, "null or an int >= 1"),
    "max_len": (lambda x: isinstance(x, int) and x >= 1, "an int >= 1"),
    "eval_piece": (_non_negative_int, "an int >= 0 (0: one call)"),
}


def check_ranges(**values) -> None:
    """ValueError ``model.<name>: expected ..., got ...`` for the first argument out of its range (``RANGES``)."""
    for name, value in values.items():
        holds, expected = RANGES[name]
        if value is not None and not holds(value):
            raise ValueError(f"model.{name}: expected {expected}, got {value!r}")


class SequenceModel(L.LightningModule):
    """A language model (``ModelConfig``: a preset at a given size) trained with AdamW (linear warm-up, cosine decay).

    ``SequenceModel(vocab_size, preset, d_model=..., lr=...)``: after vocab_size, the model's arguments are
    ModelConfig's fields (atlas_lab/models/lm.py: preset, memory, layers, d_model, n_layers, n_heads, ...), given by
    name or, in its order, by position; the CLI lists them as ``model.<field>``.

    Args:
        vocab_size: linked from the data module.
        memory_lr: the peak learning rate of the memory mixers' parameters (memory layers and MAG's memory branch:
            projections, gates, initial memory weights); null: lr. Models without memory layers ignore it, so one
            config can give attention and memory layers the rates each trains best at.
        lr, weight_decay, betas, warmup_steps, min_lr_ratio: AdamW and the schedule (cosine to
            lr·min_lr_ratio over schedule_steps, by default the trainer's total steps; set it when a run will
            be stopped and resumed into a longer one, so every segment follows the same schedule).
        target: "next_token" or "positions" (output t scored against labels[t]) or "compression" (linked from data).
        slice_names: names of the data's slices for per-slice accuracy (linked from the data module).
        bytes_per_token: for bits per byte (linked from language-modelling data).
        max_len: longest sequence the compression head decodes.
        generate_answers: run greedy decoding for exact match on batches that carry answers.
        eval_piece: evaluate sequences longer than this in streaming pieces of this size (0: one call; a batch with
            document_start is read in one call).
        compile: torch.compile each block (``compile_blocks``): the memory's per-chunk kernels fused, fewer launches
            on a GPU; each sequence length compiles on its first step (about a minute a length for a memory model on
            a CPU core). true, or torch.compile's options (``CompileOptions``): ``{mode: reduce-overhead}`` runs each
            block as a CUDA graph on a GPU.
    """

    def __init__(self, vocab_size: int = 256, *model_args, lr: float = 1e-3, memory_lr: Optional[float] = None,
                 weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95), warmup_steps: int = 100,
                 min_lr_ratio: float = 0.1, schedule_steps: Optional[int] = None,
                 target: Literal[tuple(READOUTS)] = "next_token", slice_names: Optional[list[str]] = None,
                 bytes_per_token: Optional[float] = None, max_len: int = 4096, generate_answers: bool = True,
                 eval_piece: int = 0, compile: bool | CompileOptions = False, **model_kwargs):
        super().__init__()
        check_ranges(lr=lr, memory_lr=memory_lr, weight_decay=weight_decay, betas=betas, warmup_steps=warmup_steps,
                     min_lr_ratio=min_lr_ratio, schedule_steps=schedule_steps, max_len=max_len, eval_piece=eval_piece)
        try:
            config = ModelConfig(*model_args, **model_kwargs)
            self.model = LanguageModel(vocab_size, **vars(config))
        except ValueError as e:  # its messages start with the argument's name: here an argument of model
            raise ValueError(f"model.{e}") from None
        if compile is not False:
            try:
                compile_blocks(self.model, None if compile is True else compile)
            except ValueError as e:
                raise ValueError(f"model.{e}") from None
        self.save_hyperparameters()
        self.hparams.update(vars(config))  # every field of the model, defaults included: a checkpoint rebuilds it
        self.readout = READOUTS[target](config.d_model, max_len, vocab_size)
        self.token_metrics = nn.ModuleDict({s: TokenMetrics(bytes_per_token) for s in STAGES})
        self.slice_metrics = nn.ModuleDict({s: SliceAccuracy(len(slice_names)) for s in STAGES}) if slice_names \
            else None
        self.exact_match = nn.ModuleDict({s: ExactMatch() for s in STAGES})

    def sequence_flops(self, T: int) -> float:
        """The training FLOPs of one sequence of T tokens: torch's FlopCounterMode over a forward and backward of
        [1, T] tokens (the matrix products; what the counter does not see, a custom kernel's products, is not
        counted), run eager and apart from the fit (the gradients taken, not accumulated; the random state kept).
        Counted once per T."""
        counted = self.__dict__.setdefault("_sequence_flops", {})
        if T not in counted:
            from torch.utils.flop_counter import FlopCounterMode

            ids = torch.zeros(1, T, dtype=torch.long, device=self.device)
            params = [p for p in self.parameters() if p.requires_grad]
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), torch.compiler.set_stance("force_eager"), \
                    torch.enable_grad(), FlopCounterMode(display=False) as counter:
                torch.autograd.grad(self(ids).float().sum(), params, allow_unused=True)
            counted[T] = float(counter.get_total_flops())
        return counted[T]

    def forward(self, input_ids: torch.Tensor, document_start: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, L, V] for the batch's labels (next-token or compression decoding). document_start: [B, L] bool
        or None (LanguageModel.hidden_states); packed documents are read in one call, never in eval_piece pieces
        (the logits are the same: only the memory a call takes differs)."""
        piece = self.hparams.eval_piece
        if document_start is not None:
            h, _ = self.model.hidden_states(input_ids, document_start=document_start)
        elif not self.training and piece and input_ids.shape[1] > piece:
            h = torch.cat(list(self.model.hidden_pieces(input_ids, piece)), 1)
        else:
            h, _ = self.model.hidden_states(input_ids)
        return self.readout(self.model, h)

    def training_step(self, batch, batch_idx):
        logits = self(batch["input_ids"], batch.get("document_start"))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)
        # one host synchronisation a step, outside the compiled blocks: it raises, naming the step, before a
        # non-finite loss reaches the weights; Lightning's progress bar reads the logged loss every step anyway
        # (docs/performance.md, "n. Compiled blocks"), so a check at the logging interval would save none
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()} at step {self.global_step}")
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # the mean over ranks under DDP
        return loss

    def _eval_step(self, stage: str, batch):
        logits = self(batch["input_ids"], batch.get("document_start"))
        self.token_metrics[stage].update(logits, batch["labels"])
        if self.slice_metrics is not None and "slice" in batch:
            self.slice_metrics[stage].update(logits, batch["labels"], batch["slice"])
        if self.hparams.generate_answers and "answer_start" in batch:
            generated = []
            for ids, start, length in zip(batch["input_ids"], batch["answer_start"].tolist(),
                                          batch["answer_length"].tolist()):
                tokens, _ = self.model.generate(ids[None, :start], length)
                generated.append(tokens[0])
            self.exact_match[stage].update(generated, batch)

    def validation_step(self, batch, batch_idx):
        self._eval_step("val", batch)

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch)

    def _log_epoch(self, stage: str):
        values = self.token_metrics[stage].compute()
        # values are global already (torchmetrics syncs on compute); sync_dist only tells Lightning so under DDP
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, prog_bar=True, sync_dist=True)
        self.token_metrics[stage].reset()
        if self.slice_metrics is not None:
            per_slice = self.slice_metrics[stage].compute().reshape(-1)  # torchmetrics squeezes a single slice
            counts = self.slice_metrics[stage].count.reshape(-1)
            self.log_dict({metric_key(f"{stage}/acc/{name}"): acc for name, acc, n in
                           zip(self.hparams.slice_names, per_slice, counts) if n > 0}, sync_dist=True)
            self.slice_metrics[stage].reset()
        if self.exact_match[stage].total > 0:
            self.log(f"{stage}/exact_match", self.exact_match[stage].compute(), sync_dist=True)
        self.exact_match[stage].reset()

    def logged_metrics(self, datamodule) -> list[str]:
        """The metrics a fit with this data logs: train/loss, and per validation the token metrics, the per-slice
        accuracies and (for tasks with answers) exact match."""
        token = ["loss", "ppl", "acc"] + ["bpb"] * bool(self.hparams.bytes_per_token)
        names = ["train/loss"] + [f"val/{k}" for k in token]
        names += [metric_key(f"val/acc/{name}") for name in self.hparams.slice_names or []]
        if self.hparams.generate_answers and isinstance(datamodule, AnswerMixin):
            names.append("val/exact_match")
        return names

    def on_validation_epoch_end(self):
        self._log_epoch("val")

    def on_test_epoch_end(self):
        self._log_epoch("test")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Records the fit's MLflow run in the checkpoint, ``checkpoint["mlflow_run"]`` = {tracking_uri,
        experiment_id, run_id}, so that an evaluation of the checkpoint (``atlas-lab eval``) logs to the run that
        trained it. Nothing without an MLflow logger. A fit's loop state is written as ``resume_state`` says."""
        if self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING:
            resume_state(checkpoint, self._trainer)
        for logger in self.trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
                checkpoint["mlflow_run"] = {"tracking_uri": logger.experiment.tracking_uri,
                                            "experiment_id": logger.experiment_id, "run_id": logger.run_id}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A fit resumed from ``checkpoint``: its loop state fitted to this trainer (``resume_boundary``)."""
        if self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING:
            resume_boundary(checkpoint, self._trainer)

    def parameter_groups(self) -> list[dict]:
        """AdamW groups: weight decay on matrices only; memory_lr (if set) on the memory mixers' parameters."""
        memory = {id(p) for m in self.modules() if isinstance(m, MemoryMixer) for p in m.parameters()}
        lr, memory_lr = self.hparams.lr, self.hparams.memory_lr
        groups = []
        for is_memory, group_lr in ((False, lr), (True, lr if memory_lr is None else memory_lr)):
            for decay in (True, False):
                params = [p for p in self.parameters() if (id(p) in memory) == is_memory and (p.dim() >= 2) == decay]
                if params:  # name: the hyper-parameter that sets the group's rate (LearningRates logs it)
                    name = "memory_lr" if is_memory and memory_lr is not None else "lr"
                    groups.append({"params": params, "lr": group_lr, "name": name,
                                   "weight_decay": self.hparams.weight_decay if decay else 0.0})
        return groups

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameter_groups(), betas=self.hparams.betas)
        total = max(1, self.hparams.schedule_steps or int(self.trainer.estimated_stepping_batches))
        warmup, floor = min(self.hparams.warmup_steps, total // 2), self.hparams.min_lr_ratio

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
