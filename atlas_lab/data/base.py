"""Shared pieces of the DataModules: datasets of token sequences, batching and seeds (argument checks: checks.py)."""
from __future__ import annotations

import functools

import lightning as L
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from .checks import check

IGNORE_INDEX = -100
SPLITS = ("train", "val", "test")
STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",), None: SPLITS}


def split_rng(seed: int, split: str, *stream: int) -> np.random.Generator:
    """An independent generator per (seed, split, stream): splits never share random numbers."""
    return np.random.default_rng([seed, SPLITS.index(split), *stream])


def distinct_integers(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """[n, k]: each row k distinct integers drawn uniformly from [low, high).

    Few per range (2k <= high − low): draw with replacement and redraw repeats until none is left — the
    law of the result is invariant under relabelling the integers, so it is uniform over distinct k-tuples.
    Otherwise: the first k of a row-wise shuffle of the range.
    """
    span = high - low
    if 2 * k > span:
        return rng.permuted(np.broadcast_to(np.arange(low, high), (n, span)), axis=1)[:, :k]
    x = rng.integers(low, high, size=(n, k))
    rows = np.arange(n)  # rows that may still hold repeats
    while rows.size:
        sub = x[rows]
        order = np.argsort(sub, axis=1, kind="stable")
        s = np.take_along_axis(sub, order, axis=1)
        repeat_sorted = np.zeros_like(sub, dtype=bool)
        repeat_sorted[:, 1:] = s[:, 1:] == s[:, :-1]
        repeat = np.zeros_like(repeat_sorted)
        np.put_along_axis(repeat, order, repeat_sorted, axis=1)
        sub[repeat] = rng.integers(low, high, size=int(repeat.sum()))
        x[rows] = sub
        rows = rows[repeat.any(axis=1)]
    return x


class SequenceDataset(Dataset):
    """Token sequences with aligned labels and per-sample integer fields.

    input_ids, labels: one int array [L_i] per sample (a 2-D array [n, L] works too); fields: name -> [n]
    ints put in every batch (e.g. slice, answer_start, answer_length); group: [n] batching key (one length
    per batch) or None; meta: name -> per-sample values kept out of batches (e.g. needle depth, answer text).
    """

    def __init__(self, input_ids, labels, fields: dict[str, np.ndarray] | None = None,
                 group: np.ndarray | None = None, meta: dict[str, list] | None = None):
        self.input_ids, self.labels = input_ids, labels
        self.fields = fields or {}
        self.group = group
        self.meta = meta or {}

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": torch.as_tensor(np.asarray(self.input_ids[i], dtype=np.int64)),
                "labels": torch.as_tensor(np.asarray(self.labels[i], dtype=np.int64))}
        for name, values in self.fields.items():
            item[name] = torch.tensor(int(values[i]))
        return item


def collate(samples: list[dict[str, torch.Tensor]], pad_id: int | None = None) -> dict[str, torch.Tensor]:
    """Stack samples into a batch; sequences of different lengths are right-padded (input pad_id, label −100)."""
    lengths = {s["input_ids"].shape[0] for s in samples}
    if len(lengths) > 1:
        if pad_id is None:
            raise ValueError(f"collate: sequences of lengths {sorted(lengths)} in one batch and no pad_id")
        T = max(lengths)
        pad = torch.nn.functional.pad
        samples = [dict(s, input_ids=pad(s["input_ids"], (0, T - len(s["input_ids"])), value=pad_id),
                        labels=pad(s["labels"], (0, T - len(s["labels"])), value=IGNORE_INDEX)) for s in samples]
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class GroupedBatchSampler(BatchSampler):
    """Batches drawn from one group at a time (e.g. one sequence length per batch), sharded across ranks.

    The batches are formed globally, the same on every rank: the samples of a group (shuffled or in order) are cut
    into global batches of batch_size × num_replicas, whose order is shuffled; rank r takes part r of each global
    batch. So every rank sees its own samples, every rank has the same number of batches (DDP needs it), and a run
    on W processes sees, step by step, the batches of one process with batch_size × W. A global batch with fewer
    samples than ranks (the tail of a small group) repeats samples, as DistributedSampler pads.

    shuffle: a new order every epoch, drawn from (seed, epoch), so a run is reproducible from its seed and
    resumable from a checkpoint. Without shuffle: groups and samples in order.
    sampler: a DistributedSampler naming this process's shard (num_replicas, rank) and carrying the epoch; Lightning
    calls its set_epoch, and with ``use_distributed_sampler`` puts its own in its place. Only those three are read:
    the order is this class's. None: one process.
    """

    def __init__(self, group: np.ndarray, batch_size: int, shuffle: bool, seed: int,
                 sampler: DistributedSampler | None = None):
        group = np.asarray(group)
        sampler = sampler if sampler is not None else DistributedSampler(group, num_replicas=1, rank=0, shuffle=False)
        if not isinstance(sampler, DistributedSampler):
            raise TypeError(f"GroupedBatchSampler: sampler must be a DistributedSampler, got {type(sampler).__name__}")
        super().__init__(sampler, batch_size, drop_last=False)
        self.group, self.shuffle, self.seed = group, shuffle, seed
        self.skip = 0  # batches of the next pass not to yield (ResumableDataLoader: the restored position)

    def set_epoch(self, epoch: int) -> None:
        """The order depends on (seed, epoch) only, so a run resumed from a checkpoint sees the same batches as an
        uninterrupted one."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        size = self.batch_size * self.sampler.num_replicas
        return sum(-(-int(n) // size) for n in np.unique(self.group, return_counts=True)[1])

    def __iter__(self):
        replicas, rank = self.sampler.num_replicas, self.sampler.rank
        rng = np.random.default_rng([self.seed, self.sampler.epoch])
        size = self.batch_size * replicas
        batches = []
        for g in np.unique(self.group):
            idx = np.flatnonzero(self.group == g)
            if self.shuffle:
                idx = rng.permutation(idx)
            batches += [idx[i:i + size] for i in range(0, len(idx), size)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        skip, self.skip = self.skip, 0
        for batch in batches[skip:]:
            if len(batch) < replicas:
                batch = np.resize(batch, replicas)
            yield np.array_split(batch, replicas)[rank].tolist()


class ResumableDataLoader(DataLoader):
    """A DataLoader over a GroupedBatchSampler that knows its position in the pass: ``state_dict()`` = {"epoch",
    "batches"} (the sampler's epoch and the batches this pass has yielded, counted where they are consumed, not where
    workers prefetch them); ``load_state_dict`` makes the next pass start after those batches, the order being the
    same function of (seed, epoch). Lightning saves the training loader's state in a checkpoint and restores it on
    resume, so a fit resumed mid-epoch trains on exactly the batches the uninterrupted fit would."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.yielded = 0

    def state_dict(self) -> dict:
        return {"epoch": self.batch_sampler.sampler.epoch, "batches": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        """A position inside a pass: the next pass continues it; at a pass's end: the next pass is a new one."""
        self.batch_sampler.set_epoch(state["epoch"])
        self.batch_sampler.skip = state["batches"] if state["batches"] < len(self) else 0

    def __iter__(self):
        self.yielded = self.batch_sampler.skip
        for batch in super().__iter__():
            self.yielded += 1
            yield batch


class TaskDataModule(L.LightningDataModule):
    """Base of every task: builds missing splits in setup() and serves them.

    Subclasses set vocab_size (and slice_names, pad_id where they apply) in __init__ and implement
    build(split) -> SequenceDataset.
    """

    def __init__(self, batch_size: int, seed: int, num_workers: int):
        super().__init__()
        # every subclass's arguments (and, built by LightningCLI, its class path): checkpoints keep them as
        # ``datamodule_hyper_parameters``, so an evaluation rebuilds the data's tokenizer from a checkpoint alone
        self.save_hyperparameters(logger=False)
        check(batch_size >= 1, "batch_size", f"expected an int >= 1, got {batch_size}")
        check(num_workers >= 0, "num_workers", f"expected an int >= 0, got {num_workers}")
        check(seed >= 0, "seed", f"expected an int >= 0, got {seed}")
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.pad_id: int | None = None
        self.slice_names: list[str] = []
        self.datasets: dict[str, SequenceDataset] = {}

    def build(self, split: str) -> SequenceDataset:
        raise NotImplementedError

    @property
    def train_length(self) -> int:
        """T of the longest training sequence (the model summary counts FLOPs at it)."""
        self.setup("fit")
        ids = self.datasets["train"].input_ids
        return ids.shape[1] if getattr(ids, "ndim", 1) == 2 else max(len(x) for x in ids)

    def setup(self, stage: str | None = None) -> None:
        for split in STAGE_SPLITS[stage]:
            if split not in self.datasets:
                self.datasets[split] = self.build(split)

    def _loader(self, split: str) -> DataLoader:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        ds = self.datasets[split]
        train = split == "train"
        common = dict(num_workers=self.num_workers, collate_fn=functools.partial(collate, pad_id=self.pad_id),
                      persistent_workers=self.num_workers > 0)
        group = ds.group if ds.group is not None else np.zeros(len(ds), dtype=np.int64)
        trainer = self.trainer  # None outside a Trainer
        shard = DistributedSampler(ds, num_replicas=trainer.world_size if trainer else 1,
                                   rank=trainer.global_rank if trainer else 0, shuffle=False)
        sampler = GroupedBatchSampler(group, self.batch_size, shuffle=train, seed=self.seed, sampler=shard)
        return ResumableDataLoader(ds, batch_sampler=sampler, **common)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


def qa_sequence(prompt: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """prompt [P], answer [A] -> (input_ids = prompt + answer [P+A], labels [P+A]): the output at t scores
    the next token, so labels[P−1 .. P+A−2] = answer and everything else is −100."""
    input_ids = np.concatenate([prompt, answer]).astype(np.int32)
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    labels[len(prompt) - 1:len(input_ids) - 1] = answer
    return input_ids, labels


class AnswerMixin:
    """Decoding for tasks whose batches carry answer_start / answer_length (NIAH, BABILong).

    The prompt of sample b is input_ids[b, :answer_start[b]]; its answer is the next answer_length[b] tokens
    (atlas_lab.lit.metrics.exact_matches scores generated answers).
    """

    tokenizer = None  # set by the DataModule

    def decode(self, ids) -> str:
        """Token ids (list or 1-D tensor) -> text."""
        return self.tokenizer.decode([int(i) for i in ids])

    def answers(self, batch: dict[str, torch.Tensor]) -> list[str]:
        """The answer text of every sample of a batch (taken from input_ids), stripped."""
        return [self.decode(ids[s:s + n]).strip() for ids, s, n in
                zip(batch["input_ids"], batch["answer_start"].tolist(), batch["answer_length"].tolist())]
