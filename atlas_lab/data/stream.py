"""Language modelling on a prepared corpus of litdata shards, streamed from disk (docs/tasks.md §7)."""
from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.item_loader import TokensLoader

from .checks import check
from .shards import load_tokenizer, read_corpus
from .tokenizers import check_text_data_state, text_data_state


def window_batch(windows: list, eos_id: int, reset_at_document: bool) -> dict[str, torch.Tensor]:
    """Windows w [B][T+1] of the packed token stream -> input_ids = w[:, :-1], labels = w[:, 1:] [B, T]; with
    reset_at_document, document_start [B, T] bool: True at t = 0 and where input_ids[t-1] is <eos>."""
    w = torch.as_tensor(np.stack([np.asarray(x) for x in windows]).astype(np.int64))
    batch = {"input_ids": w[:, :-1], "labels": w[:, 1:]}
    if reset_at_document:
        start = torch.ones_like(batch["input_ids"], dtype=torch.bool)
        start[:, 1:] = batch["input_ids"][:, :-1] == eos_id
        batch["document_start"] = start
    return batch


class ResumableStreamingDataLoader(StreamingDataLoader):
    """litdata's StreamingDataLoader whose restored position (load_state_dict) applies to the next pass only.

    load_state_dict sets litdata's ``restore``: the next pass continues the saved epoch. litdata 0.2.76 clears it only
    when a pass runs to its end; Lightning ends an epoch after len(loader) batches without asking for another, so
    with litdata's loader every later epoch would continue counting from the restored position (repeating and
    skipping windows, and a state saved then is refused on resume: "num_samples_yielded ... greater than the
    dataset length"). Here every pass after the restored one starts a new epoch.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.restored_pass = False

    def load_state_dict(self, obj: dict) -> None:
        super().load_state_dict(obj)
        self.restored_pass = self.restore

    def __iter__(self):
        if not self.restored_pass:
            self.restore = False
        self.restored_pass = False
        yield from super().__iter__()


class StreamingLMDataModule(L.LightningDataModule):
    """Next-token prediction on the shards of ``atlas-lab data prepare`` (``atlas_lab.data.shards``).

    The documents of a split, each followed by <eos>, are packed back to back; litdata's TokensLoader cuts each
    chunk of that stream into windows w of seq_len + 1 tokens (a chunk's last < seq_len + 1 tokens are not read).
    Batch: input_ids = w[:, :-1], labels = w[:, 1:] [B, seq_len] (every position scored); with reset_at_document,
    document_start [B, seq_len] bool (True at t = 0 and after every <eos>: where a memory starts afresh).
    Training windows are shuffled (litdata: chunk order and windows within a chunk, drawn from (seed, epoch));
    validation windows are in order. There are two splits (prepare holds documents out once): ``test`` scores the
    held-out split, the validation windows (``atlas-lab test`` on a prepared corpus). Under DDP each rank reads its
    own part: litdata's StreamingDataset reads the world size and rank from torch.distributed when it is built, so
    the loaders are built in *_dataloader(), after the Trainer has set up the process group (every rank then reads
    as many windows).
    Resuming: Lightning's fit loop saves the training loader's position (StreamingDataLoader.state_dict, under
    checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]) and loads it into the new loader on resume,
    so a fit resumed from a mid-epoch checkpoint trains on exactly the batches it had not seen; the data module's own
    state is its tokenizer (``state_dict``: a checkpoint carries it), never the loader's position (a second
    load_state_dict of the same position would shift litdata's worker order).

    Attributes: vocab_size, pad_id, eos_id (from corpus.json); seq_len; tokenizer (``shards.load_tokenizer``);
    bytes_per_token (UTF-8 bytes per token of the validation split, <eos> included: bits per byte =
    loss_nats / ln 2 / bytes_per_token); slice_names = [].
    """

    def __init__(self, data_dir: str, seq_len: int = 2048, batch_size: int = 8, num_workers: int = 2,
                 seed: int = 0, reset_at_document: bool = False):
        """
        Args:
            data_dir: a folder written by ``atlas-lab data prepare`` (train/, val/, corpus.json).
            seq_len: training context length T (windows of T + 1 tokens).
            batch_size: windows per batch (per process under DDP).
            num_workers: DataLoader worker processes.
            seed: the training order.
            reset_at_document: add ``document_start`` to every batch.
        """
        super().__init__()
        self.save_hyperparameters(logger=False)  # checkpoints keep the arguments: an evaluation finds the tokenizer
        check(seq_len >= 1, "seq_len", f"expected an int >= 1, got {seq_len}")
        check(batch_size >= 1, "batch_size", f"expected an int >= 1, got {batch_size}")
        check(num_workers >= 0, "num_workers", f"expected an int >= 0, got {num_workers}")
        check(seed >= 0, "seed", f"expected an int >= 0, got {seed}")
        corpus = read_corpus(data_dir)
        self.data_dir = Path(data_dir).expanduser()
        self.hparams.data_dir = str(self.data_dir.resolve())  # checkpoints: the same folder from any other
        self.seq_len, self.batch_size, self.num_workers, self.seed = seq_len, batch_size, num_workers, seed
        self.reset_at_document = reset_at_document
        self.vocab_size, self.pad_id, self.eos_id = corpus["vocab_size"], corpus["pad_id"], corpus["eos_id"]
        val = corpus["splits"]["val"]
        self.bytes_per_token = val["bytes"] / val["tokens"]
        self.slice_names: list[str] = []
        self.tokenizer = load_tokenizer(self.data_dir)

    @property
    def train_length(self) -> int:
        """T of every training window (the model summary counts FLOPs at it)."""
        return self.seq_len

    def dataset(self, split: str, shuffle: bool) -> StreamingDataset:
        return StreamingDataset(str(self.data_dir / split), item_loader=TokensLoader(block_size=self.seq_len + 1),
                                shuffle=shuffle, seed=self.seed)

    def setup(self, stage: str | None = None) -> None:
        """Check that every split read by the stage holds at least one window (validate and test read val alone)."""
        for split in ("val",) if stage in ("validate", "test") else ("train", "val"):
            check(len(self.dataset(split, shuffle=False)) > 0, "seq_len",
                  f"{self.seq_len} leaves no window of seq_len + 1 tokens in {str(self.data_dir / split)!r}")

    def _loader(self, split: str) -> ResumableStreamingDataLoader:
        collate = functools.partial(window_batch, eos_id=self.eos_id, reset_at_document=self.reset_at_document)
        return ResumableStreamingDataLoader(self.dataset(split, shuffle=split == "train"),
                                            batch_size=self.batch_size, num_workers=self.num_workers,
                                            collate_fn=collate)

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        """The held-out split (prepare writes no third one): the validation windows."""
        return self._loader("val")

    def decode(self, ids) -> str:
        """Token ids (list or 1-D tensor) -> text."""
        return self.tokenizer.decode([int(i) for i in ids])

    def state_dict(self) -> dict:
        """The corpus's tokenizer (``tokenizers.text_data_state``), which Lightning saves in every checkpoint: an
        evaluation of the checkpoint needs no corpus folder. (The loader's position is Lightning's, not in here.)"""
        return text_data_state(self.tokenizer)

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint continued or scored on this corpus: ValueError where it was tokenised otherwise."""
        check_text_data_state(state, self.tokenizer, f"data_dir: {str(self.data_dir)!r}")
